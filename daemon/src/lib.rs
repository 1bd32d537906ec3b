//! nix-sandbox-mcp: an MCP server that runs code in bubblewrap sandboxes whose
//! toolchains come from Nix (or, without Nix, from the host).
//!
//! Modules, each with one job: `cli` (the command line: `serve`, `run`,
//! `doctor`, …), `config` (TOML, and every environment variable the server
//! reads, in `config/knobs.rs`), `environment` (one toolchain: its store
//! paths, root filesystem and limits), `registry` (environments by name),
//! `jail` (environment + call → a typed plan of the sandbox, rendered to
//! bubblewrap's argv), `exec` (every sandboxed process, from admission to
//! reaping), `limits` (cgroups and rlimits), `seccomp` (the syscall filter),
//! `platform` (what the host offers), `server` (the MCP surface), `app`
//! (start-up wiring), `doctor` (diagnostics), `audit` (the run log), `jobs`
//! (background runs), `sessions` (state across calls), `commands` (declared
//! commands), `clients` (MCP clients' configuration), `network` (which hosts
//! a sandbox may reach, and the proxy that holds it to that), `changes` (what
//! a run changed in the project), `caches` (directories kept between calls),
//! `metrics` (what a fleet watches, at /metrics),
//! `mountinfo` (the mount table), `sync` (locks that outlive a panic),
//! `trust` (the certificate authorities the server's TLS clients trust),
//! `stamp` (whether a file changed, without reading it),
//! `userns` (what keeps a host from giving sandboxes user namespaces).

pub mod app;
pub mod audit;
pub mod caches;
pub mod changes;
pub mod cli;
pub mod clients;
pub mod commands;
pub mod config;
pub mod doctor;
pub mod environment;
pub mod exec;
pub mod jail;
pub mod jobs;
pub mod limits;
pub mod metrics;
mod mountinfo;
pub mod network;
pub mod platform;
pub mod registry;
pub mod seccomp;
pub mod server;
pub mod sessions;
#[cfg(test)]
mod skip;
mod stamp;
pub mod sync;
pub mod trust;
pub mod userns;
