//! The resolved description of one environment: what the agent is told about it
//! and everything the jail and exec need to run code in it. Plain data, built by
//! the registry, read by everyone else.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::LimitSettings;
use crate::network::NetworkSetting;

#[derive(Debug, Clone)]
pub struct Environment {
    pub name: String,
    /// One line, with versions, shown to the agent.
    pub description: String,
    pub origin: Origin,
    /// Command run inside the jail; `{file}` is replaced by the code file's path.
    pub interpreter: Vec<String>,
    /// Name of the code file written into `/workspace`.
    pub file_name: String,
    pub root: RootFs,
    /// `PATH` inside the jail.
    pub path: Vec<String>,
    /// Extra variables set inside the jail (after the minimal ones).
    pub vars: BTreeMap<String, String>,
    pub limits: Limits,
    /// The limit layers below a config entry (built-in, `[defaults]`, manifest),
    /// from which `limits` was resolved.
    pub settings: LimitSettings,
    /// No network, or the hosts it may reach through the daemon's proxy.
    pub network: NetworkSetting,
    /// Syscalls let through although the default filter blocks them.
    pub seccomp_allow: Vec<String>,
    /// Directories kept between calls in one project (see `caches`).
    pub caches: Vec<crate::config::CachePath>,
    /// The most those caches may hold together, in bytes.
    pub cache_bytes: u64,
    /// Executables the environment offers, for the agent's benefit.
    pub tools: Vec<String>,
    /// The interpreter family, when known: decides whether sessions are possible.
    pub kind: Option<InterpreterKind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterpreterKind {
    Bash,
    Python,
    Node,
}

impl InterpreterKind {
    pub fn parse(s: &str) -> Option<InterpreterKind> {
        match s {
            "bash" | "shell" | "sh" => Some(InterpreterKind::Bash),
            "python" | "python3" => Some(InterpreterKind::Python),
            "node" | "nodejs" => Some(InterpreterKind::Node),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            InterpreterKind::Bash => "bash",
            InterpreterKind::Python => "python",
            InterpreterKind::Node => "node",
        }
    }
}

/// Where an environment came from, for `envs` and the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A preset or interpreter resolved on the host (no Nix).
    Host { program: PathBuf },
    /// A sandbox artifact built by Nix.
    Artifact { path: PathBuf },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Host { program } => write!(f, "host {}", program.display()),
            Origin::Artifact { path } => write!(f, "artifact {}", path.display()),
        }
    }
}

/// What the jail shows as the root filesystem (besides /proc, /dev, /workspace, /tmp).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootFs {
    /// The host's system directories, read-only, plus `extra` host directories
    /// (for interpreters installed outside them, such as under /opt).
    Host { extra: Vec<PathBuf> },
    /// Exactly these store paths, read-only, and symlinks such as `/bin/sh`
    /// pointing into them.
    Closure {
        store_paths: Vec<PathBuf>,
        links: Vec<(PathBuf, PathBuf)>,
    },
}

/// Concrete limits for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: u64,
    pub pids: u64,
    pub cpu_seconds: u64,
    /// CPU cores the sandbox may use at once, in thousandths (a cgroup quota).
    pub cpu_millis: u32,
    pub file_size_bytes: u64,
    pub open_files: u64,
    /// Size of the writable filesystems (/workspace, /tmp, /dev/shm and
    /// the project's changes together where the nest stages them; each
    /// otherwise).
    pub workspace_bytes: u64,
    /// Files and directories they may hold, where the nest stages them.
    pub workspace_files: u64,
    /// Bytes of each output stream kept in a result.
    pub output_bytes: usize,
    /// Total output after which the run is killed.
    pub output_limit_bytes: u64,
}

const MIB: u64 = 1024 * 1024;

impl Limits {
    pub const BUILT_IN: LimitSettings = {
        use crate::config::{Cpus, Millis, OpenFiles, OutputBytes, Positive};
        LimitSettings {
            timeout_ms: Some(Millis(30_000)),
            memory_mb: Some(Positive(1024)),
            pids: Some(Positive(256)),
            cpu_seconds: Some(Positive(300)),
            cpus: Some(Cpus(1000)),
            file_size_mb: Some(Positive(256)),
            open_files: Some(OpenFiles(1024)),
            workspace_mb: Some(Positive(512)),
            workspace_files: Some(Positive(131_072)),
            output_bytes: Some(OutputBytes(16 * 1024)),
            output_limit_mb: Some(Positive(256)),
        }
    };

    /// Resolves layered settings; fields missing from every layer take the built-in values.
    pub fn resolve(settings: LimitSettings) -> Limits {
        let s = Limits::BUILT_IN.overlay(settings);
        let get = |v: Option<crate::config::Positive>| v.map(|p| p.0).unwrap_or(1);
        Limits {
            timeout: Duration::from_millis(s.timeout_ms.map(|m| m.0).unwrap_or(30_000)),
            memory_bytes: get(s.memory_mb).saturating_mul(MIB),
            pids: get(s.pids),
            cpu_seconds: get(s.cpu_seconds),
            cpu_millis: s.cpus.map_or(1000, |c| c.0),
            file_size_bytes: get(s.file_size_mb).saturating_mul(MIB),
            open_files: s.open_files.map(|o| o.0).unwrap_or(1024),
            workspace_bytes: get(s.workspace_mb).saturating_mul(MIB),
            workspace_files: get(s.workspace_files),
            output_bytes: s.output_bytes.map(|o| o.0 as usize).unwrap_or(16 * 1024),
            output_limit_bytes: get(s.output_limit_mb).saturating_mul(MIB),
        }
    }
}

impl Environment {
    /// The interpreter argv with the code file's path substituted.
    pub fn command_for(&self, code_path: &str) -> Vec<String> {
        let mut argv: Vec<String> = self
            .interpreter
            .iter()
            .map(|a| a.replace("{file}", code_path))
            .collect();
        if !self.interpreter.iter().any(|a| a.contains("{file}")) {
            argv.push(code_path.to_string());
        }
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Millis, Positive};

    #[test]
    fn limits_layering() {
        let l = Limits::resolve(LimitSettings {
            timeout_ms: Some(Millis(1500)),
            memory_mb: Some(Positive(64)),
            ..Default::default()
        });
        assert_eq!(l.timeout, Duration::from_millis(1500));
        assert_eq!(l.memory_bytes, 64 * MIB);
        assert_eq!(l.pids, 256);
        assert_eq!(l.output_bytes, 16 * 1024);
    }
}
