//! The limits of one run, resolved from their layers (built-in,
//! `[defaults]`, the environment's manifest, its config entry, the call):
//! plain values, which the mechanisms in this module's other files apply.

use std::time::Duration;

use crate::config::LimitSettings;

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

    #[test]
    fn the_limits_table_has_a_row_for_every_setting() {
        // Destructured whole: a new setting does not compile until it is named here.
        let LimitSettings {
            timeout_ms: _,
            memory_mb: _,
            pids: _,
            cpu_seconds: _,
            cpus: _,
            file_size_mb: _,
            open_files: _,
            workspace_mb: _,
            workspace_files: _,
            output_bytes: _,
            output_limit_mb: _,
        } = LimitSettings::default();
        let names = [
            "timeout_ms",
            "memory_mb",
            "pids",
            "cpu_seconds",
            "cpus",
            "file_size_mb",
            "open_files",
            "workspace_mb",
            "workspace_files",
            "output_bytes",
            "output_limit_mb",
        ];
        let table = include_str!("mod.rs");
        for name in names {
            assert!(
                table.contains(&format!("//! | `{name}` |")),
                "limits/mod.rs's table has no row for `{name}`"
            );
        }
    }
}
