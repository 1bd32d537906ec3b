//! cgroup v2: per-sandbox groups in a container of a delegated subtree of
//! the unified hierarchy: memory (without swap), pids and, where the cpu
//! controller is delegated, a CPU quota; the `memory.events` and
//! `pids.events` counters, `cpu.stat` and `memory.peak` for what a run used,
//! `cgroup.freeze` and `cgroup.kill`. `memory.peak` cannot be reset on most
//! kernels users have, so a group serves one sandbox only.

use std::io;
use std::path::PathBuf;

use super::groups::{ControlFiles, Hierarchy, write_file};
use super::{Counters, Mechanism};
use crate::limits::Limits;

#[derive(Debug)]
pub(super) struct CgroupV2 {
    /// Groups live here, a directory of the unified hierarchy.
    pub(super) container: PathBuf,
    /// The cpu controller is enabled for the groups.
    pub(super) cpu: bool,
}

/// The period of the CPU quota, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

impl Hierarchy for CgroupV2 {
    fn mechanism(&self) -> Mechanism {
        Mechanism::CgroupV2
    }

    fn describe(&self) -> String {
        let cpu = if self.cpu { ", cpu" } else { "" };
        format!(
            "cgroup v2 (memory, pids{cpu}) under {}",
            self.container.display()
        )
    }

    fn containers(&self) -> Vec<PathBuf> {
        vec![self.container.clone()]
    }

    fn apply(&self, dirs: &[PathBuf], limits: &Limits) -> io::Result<()> {
        let d = &dirs[0];
        write_file(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
        // No swap: the memory limit is the memory the run gets.
        let _ = write_file(&d.join("memory.swap.max"), "0");
        write_file(&d.join("pids.max"), &limits.pids.to_string())?;
        if self.cpu {
            let quota = u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1000;
            write_file(&d.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        }
        Ok(())
    }

    fn counters(&self, files: &ControlFiles) -> Counters {
        Counters {
            oom_kills: files.key(0, "memory.events", "oom_kill").unwrap_or(0),
            pids_max_hits: files.key(0, "pids.events", "max").unwrap_or(0),
            cpu_usec: files.key(0, "cpu.stat", "usage_usec"),
            peak_memory: files.number(0, "memory.peak"),
        }
    }

    fn reusable(&self, _files: &ControlFiles) -> bool {
        false
    }

    fn limits_cpu(&self) -> bool {
        self.cpu
    }

    fn kill_at_once(&self, dirs: &[PathBuf]) -> bool {
        write_file(&dirs[0].join("cgroup.kill"), "1").is_ok()
    }

    fn freeze(&self, dirs: &[PathBuf], frozen: bool) -> Option<io::Result<()>> {
        let file = dirs[0].join("cgroup.freeze");
        file.exists()
            .then(|| write_file(&file, if frozen { "1" } else { "0" }))
    }
}
