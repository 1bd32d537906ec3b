//! The resolved description of one environment: what the agent is told about it
//! and everything the jail and exec need to run code in it. Plain data, built by
//! the registry, read by everyone else.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::config::LimitSettings;
use crate::limits::Limits;
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
