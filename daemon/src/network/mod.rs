//! network: a sandbox's only way out, an HTTP proxy run by the daemon that
//! lets through the hosts on the environment's allowlist and nothing else.
//!
//! A proxied sandbox keeps its own network namespace with loopback only and
//! no route out. Inside it, the daemon listens on `127.0.0.1:PROXY_PORT`
//! (`entry.rs`); tools find the proxy through `HTTP_PROXY` and its kin
//! ([`proxy_env`]). The proxy (`proxy.rs`) takes CONNECT tunnels and plain
//! HTTP requests in absolute form, asks the policy (`policy.rs`) about the
//! host, resolves names itself (`resolve.rs`), refuses loopback, private,
//! link-local and metadata addresses after resolution (`address.rs`) unless
//! the allowlist names the range, connects to the address it checked, and
//! keeps a per-run record of allowed and denied hosts and bytes (`record.rs`).
//!
//! The jail's side, for the code that builds its argv: proxied sandboxes
//! need `--unshare-net` (the listener refuses a sandbox that shares the
//! daemon's namespace), the variables of [`proxy_env`], and of the host's
//! network files only certificates and the service tables (the platform's
//! `etc_network`): no resolver configuration, so that nothing inside tries
//! DNS.

mod address;
pub mod ca;
mod credentials;
pub mod entry;
mod policy;
pub mod proxy;
mod record;
mod resolve;

pub use address::{Refused, refused_range};
pub use ca::{Authority, CaError};
pub use credentials::{Interception, SecretSource};
pub use entry::listen_in;
pub use policy::{Bounds, Denial, Host, NetworkSetting, Policy, Rule};
pub use proxy::{Interceptor, Proxy, Serving};
pub use record::{DeniedHost, HostTraffic, NetworkLimit, NetworkReport, RunRecord};
pub use resolve::{Resolver, parse_fixed};

/// The port the proxy listens on inside every proxied sandbox. Each sandbox
/// has its own network namespace, so one fixed port serves them all; 3128 is
/// the port HTTP proxies traditionally use.
pub const PROXY_PORT: u16 = 3128;

/// Where a sandbox whose environment has credentials or request rules
/// finds the certificates it trusts: the system's and the proxy's
/// authority (the server writes it into the `/etc` sandboxes see).
pub const CA_BUNDLE: &str = "/etc/ssl/nix-sandbox-mcp-ca.pem";

/// The variables that point the common tools at [`CA_BUNDLE`]: OpenSSL
/// (Python's ssl, git's default), curl, requests, pip, Node, npm (whose
/// own connections ignore Node's), cargo, git and Nix each read one of them.
pub const CA_VARIABLES: [&str; 9] = [
    "SSL_CERT_FILE",
    "CURL_CA_BUNDLE",
    "NPM_CONFIG_CAFILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "CARGO_HTTP_CAINFO",
    "GIT_SSL_CAINFO",
    "NIX_SSL_CERT_FILE",
];

/// The proxy's variables for `policy`: [`proxy_env`], and for a policy
/// that intercepts some host the [`CA_VARIABLES`].
pub fn sandbox_env(policy: &Policy) -> Vec<(String, String)> {
    let mut vars = proxy_env(PROXY_PORT);
    if !policy.interception.is_empty() {
        vars.extend(
            CA_VARIABLES
                .iter()
                .map(|k| (k.to_string(), CA_BUNDLE.to_string())),
        );
    }
    vars
}

/// Variables that point the sandbox's tools at the proxy. Both spellings,
/// since tools disagree on which they read (curl ignores upper-case
/// `HTTP_PROXY`; Python and Go read either). `NO_PROXY` keeps the sandbox's
/// own servers on loopback direct. `NODE_USE_ENV_PROXY` makes Node's
/// built-in `fetch` and `http` honour the others (Node 22.21 and 24.5 on).
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let direct = "localhost,127.0.0.1,::1";
    let mut vars = Vec::new();
    for name in ["http_proxy", "https_proxy", "all_proxy"] {
        vars.push((name.to_string(), url.clone()));
        vars.push((name.to_ascii_uppercase(), url.clone()));
    }
    vars.push(("no_proxy".to_string(), direct.to_string()));
    vars.push(("NO_PROXY".to_string(), direct.to_string()));
    vars.push(("NODE_USE_ENV_PROXY".to_string(), "1".to_string()));
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_family_finds_the_proxy() {
        let vars = proxy_env(PROXY_PORT);
        let get = |k: &str| {
            vars.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .unwrap_or_else(|| panic!("{k} missing"))
        };
        for k in [
            "http_proxy",
            "HTTP_PROXY",
            "https_proxy",
            "HTTPS_PROXY",
            "all_proxy",
            "ALL_PROXY",
        ] {
            assert_eq!(get(k), "http://127.0.0.1:3128");
        }
        assert_eq!(get("NO_PROXY"), "localhost,127.0.0.1,::1");
        assert_eq!(get("no_proxy"), get("NO_PROXY"));
    }
}
