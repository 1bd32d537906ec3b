//! network: which hosts a sandbox may reach. The allowlist of an
//! environment and the configuration value it is read from (`policy.rs`),
//! the addresses that stay refused whatever a name resolves to
//! (`address.rs`), and name resolution done by the daemon, never inside
//! the sandbox (`resolve.rs`).

mod address;
mod policy;
mod resolve;

pub use address::{Refused, refused_range};
pub use policy::{Bounds, Denial, Host, NetworkSetting, Policy, Rule};
pub use resolve::{Resolver, TEST_RESOLVE_VAR};
