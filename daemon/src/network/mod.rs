//! network: a sandbox's only way out, an HTTP proxy run by the daemon that
//! lets through the hosts on the environment's allowlist and nothing else.
//!
//! The proxy (`proxy.rs`) takes CONNECT tunnels and plain HTTP requests in
//! absolute form, asks the policy (`policy.rs`) about the host, resolves
//! names itself (`resolve.rs`), refuses loopback, private, link-local and
//! metadata addresses after resolution (`address.rs`) unless the allowlist
//! names the range, connects to the address it checked, and keeps a
//! per-run record of allowed and denied hosts and bytes (`record.rs`).

mod address;
mod policy;
pub mod proxy;
mod record;
mod resolve;

pub use address::{Refused, refused_range};
pub use policy::{Bounds, Denial, Host, NetworkSetting, Policy, Rule};
pub use proxy::{Proxy, Serving};
pub use record::{DeniedHost, HostTraffic, NetworkLimit, NetworkReport, RunRecord};
pub use resolve::{Resolver, TEST_RESOLVE_VAR};
