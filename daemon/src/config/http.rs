//! `[http]`: serving over Streamable HTTP (`serve --http`): who may call
//! (a tokens file, an OAuth issuer, each principal's scopes), which Host
//! and Origin values are accepted, and the bounds on requests, connections
//! and each principal's share of the server.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

use super::values::{AbsolutePath, Positive};

/// The scopes a principal of the tokens file has when `[http.principals]`
/// does not name it: everything but restrictions.
pub const DEFAULT_SCOPES: [&str; 3] = ["sandbox:run", "sandbox:commands", "sandbox:confirm"];

#[derive(Debug, Clone, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Static bearer tokens: one line per principal, `NAME sha256:HEX` (the
    /// hex SHA-256 of the token; `#` starts a comment). Written by
    /// `nix-sandbox-mcp token add`; re-read on SIGHUP; refused when users
    /// other than its owner may write it.
    pub tokens_file: Option<AbsolutePath>,
    /// OAuth 2.1: JWT access tokens from this issuer.
    pub oauth: Option<OAuthSettings>,
    /// This server's URI as clients reach it, such as
    /// `https://sandbox.example.com/mcp`: the audience OAuth access tokens
    /// must name (RFC 8707) and the `resource` of its protected resource
    /// metadata. Required with `[http.oauth]`.
    pub resource: Option<String>,
    /// `Host` values accepted besides the loopback names (localhost,
    /// 127.0.0.1, [::1]) and the address served: the names clients reach
    /// this server by (DNS rebinding protection). `host` or `host:port`.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Browser origins accepted in `Origin` (`scheme://host[:port]`, `:*` for
    /// any port). A request with any other `Origin` is refused; a request
    /// without one (not from a browser) is not.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Largest request body, in bytes (default 16777216, as a message on stdio).
    pub max_body_bytes: Option<Positive>,
    /// Largest request head (request line and headers), in bytes (default 16384).
    pub max_header_bytes: Option<Positive>,
    /// Most request headers (default 64).
    pub max_headers: Option<Positive>,
    /// Time a connection may wait for a request's headers, idle between
    /// requests or not, before it is closed (default 30).
    pub idle_timeout_seconds: Option<Positive>,
    /// Time a request's body may take to arrive (default 30).
    pub body_timeout_seconds: Option<Positive>,
    /// Connections open at once, all principals together (default 1024).
    pub max_connections: Option<Positive>,
    /// Principals known at once (OAuth subjects come and go; default 4096).
    pub max_principals: Option<Positive>,
    /// This server's name among replicas behind one load balancer: 1 to 16
    /// lower-case letters and digits, put in the handles of its sessions
    /// and tasks (`s_NAME_…`, `t_NAME_…`) so that the balancer routes them
    /// back (default: derived from the host's name and the address served).
    pub replica: Option<String>,
    /// Serve `/metrics` (Prometheus' text format), to callers with
    /// credentials when the server requires them (default true).
    pub metrics: Option<bool>,
    /// Each principal's share of the server.
    #[serde(default)]
    pub per_principal: PerPrincipal,
    /// The scopes of principals of the tokens file, by name (default:
    /// sandbox:run, sandbox:commands and sandbox:confirm).
    #[serde(default)]
    pub principals: BTreeMap<String, PrincipalSettings>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuthSettings {
    /// The authorization server's issuer identifier (`iss`), an https URL
    /// (http only for a loopback address).
    pub issuer: String,
    /// Where its signing keys are (default: `jwks_uri` of its RFC 8414
    /// metadata, else of its OpenID configuration).
    pub jwks_uri: Option<String>,
    /// The audience access tokens must name (default: `resource`).
    pub audience: Option<String>,
    /// Leeway for `exp` and `nbf`, in seconds (default 60).
    pub clock_skew_seconds: Option<u64>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PerPrincipal {
    /// Connections open at once (default 256).
    pub max_connections: Option<Positive>,
    /// Requests in flight at once, open SSE streams included (default 64).
    pub max_streams: Option<Positive>,
    /// Runs executing or queued at once, commands included (default: half
    /// of the server's concurrent runs, at least 1).
    pub max_runs: Option<Positive>,
    /// Sandbox sessions open at once (default: the server's `max_sessions`);
    /// a new one past it closes the caller's least recently used.
    pub max_sessions: Option<Positive>,
    /// Background jobs running at once (default: half of `max_jobs`, at
    /// least 1). Finished jobs' output is kept within the server's own
    /// bounds, the oldest of whoever keeps the most let go first.
    pub max_jobs: Option<Positive>,
    /// MCP sessions (2025-11-25 `Mcp-Session-Id`) open at once (default 16).
    pub max_mcp_sessions: Option<Positive>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PrincipalSettings {
    /// What the principal may do: `sandbox:run` (the run and job tools),
    /// `sandbox:commands` (the declared commands), `sandbox:confirm`
    /// (approving the risky ones), and restrictions: with any
    /// `sandbox:env:NAME`, only those environments; with any
    /// `sandbox:project:NAME`, only those projects (`default` names the
    /// server's own).
    pub scopes: Vec<String>,
}

impl HttpSettings {
    pub fn tokens_path(&self) -> Option<PathBuf> {
        self.tokens_file.as_ref().map(|p| p.0.clone())
    }
}

/// A principal's name in the tokens file and `[http.principals]`: short,
/// and safe to show and log.
pub fn check_principal_name(name: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "._-@".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok) {
        return Err(format!(
            "a principal's name is 1 to 64 letters, digits, '.', '_', '-' or '@', not {name:?}"
        ));
    }
    Ok(())
}

/// Whether `scope` is one this server gives a meaning to.
pub fn check_scope(scope: &str) -> Result<(), String> {
    let named = |prefix: &str| {
        scope
            .strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.len() <= 64 && !n.contains(char::is_whitespace))
    };
    if DEFAULT_SCOPES.contains(&scope) || named("sandbox:env:") || named("sandbox:project:") {
        Ok(())
    } else {
        Err(format!(
            "unknown scope {scope:?} (expected sandbox:run, sandbox:commands, sandbox:confirm, sandbox:env:NAME or sandbox:project:NAME)"
        ))
    }
}

impl HttpSettings {
    /// The rules serde cannot say: names, scopes, URLs, what needs what.
    /// On failure, the key and what is wrong.
    pub(super) fn check(&self) -> Result<(), (String, String)> {
        for (name, p) in &self.principals {
            let key = format!("http.principals.{name}");
            check_principal_name(name).map_err(|m| (key.clone(), m))?;
            for s in &p.scopes {
                check_scope(s).map_err(|m| (format!("{key}.scopes"), m))?;
            }
        }
        if let Some(r) = &self.replica {
            crate::server::check_replica(r).map_err(|m| ("http.replica".to_string(), m))?;
        }
        if let Some(resource) = &self.resource {
            check_url(resource).map_err(|m| ("http.resource".to_string(), m))?;
        }
        if let Some(o) = &self.oauth {
            check_url(&o.issuer).map_err(|m| ("http.oauth.issuer".to_string(), m))?;
            if let Some(j) = &o.jwks_uri {
                check_url(j).map_err(|m| ("http.oauth.jwks_uri".to_string(), m))?;
            }
            if self.resource.is_none() {
                return Err((
                    "http.resource".to_string(),
                    "[http.oauth] needs `resource`: this server's URI, which access tokens must name as their audience".to_string(),
                ));
            }
        }
        for o in &self.allowed_origins {
            if !(o == "null" || o.starts_with("http://") || o.starts_with("https://")) {
                return Err((
                    "http.allowed_origins".to_string(),
                    format!(
                        "{o:?} is not an origin (expected scheme://host[:port], such as https://app.example.com)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// An https URL, or http to a loopback host (a test issuer, a local proxy).
pub fn check_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let host = uri.host().unwrap_or_default();
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => Ok(()),
        Some("http") if is_loopback_host(host) => Ok(()),
        Some("http") => Err(format!(
            "{url:?} is plain http to a host that is not loopback; use https"
        )),
        _ => Err(format!("{url:?} is not an https URL")),
    }
}

/// localhost, 127.0.0.0/8 or ::1 (brackets allowed).
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
