//! cgroup v1: per-sandbox leaf groups in the memory and pids hierarchies,
//! and, where the host mounts them, cpu (a CPU quota), cpuacct (the CPU a
//! run used), each with a container of ours. The v1 freezer is not used:
//! a frozen v1 task does not die of SIGKILL, so a session paused there
//! would outlive a daemon killed outright; sessions pause by SIGSTOP.
//! Memory (and memory plus swap, where the kernel accounts it) and pids
//! limits, the OOM and pids counters, and the memory high-water mark,
//! which is reset when a group is reused. A sandbox's first process joins
//! its groups itself, through each hierarchy's `tasks` file: a move by pid
//! takes a process-wide lock, once per hierarchy.

use std::io;
use std::path::PathBuf;

use super::groups::{ControlFiles, Hierarchy, write_file};
use super::{Counters, Mechanism};
use crate::limits::Limits;

/// The containers, one per hierarchy, in the order of a group's directories.
#[derive(Debug)]
pub(super) struct CgroupV1 {
    pub(super) memory: PathBuf,
    pub(super) pids: PathBuf,
    /// The cpu and cpuacct hierarchies, which hosts often mount together
    /// (then both are the same directory).
    pub(super) cpu: Option<PathBuf>,
    pub(super) cpuacct: Option<PathBuf>,
}

const CPU_PERIOD_US: u64 = 100_000;

impl CgroupV1 {
    /// Where a group's directory for `container` is among its directories.
    fn slot(&self, container: Option<&PathBuf>) -> Option<usize> {
        let container = container?;
        self.containers().iter().position(|c| c == container)
    }
}

impl Hierarchy for CgroupV1 {
    fn mechanism(&self) -> Mechanism {
        Mechanism::CgroupV1
    }

    fn describe(&self) -> String {
        let mut s = format!(
            "cgroup v1 leaf groups (memory under {}, pids under {}",
            self.memory.display(),
            self.pids.display()
        );
        if let Some(d) = &self.cpu {
            s.push_str(&format!(", cpu under {}", d.display()));
        }
        s + ")"
    }

    /// Memory first, then pids, then the optional ones, each directory once.
    fn containers(&self) -> Vec<PathBuf> {
        let mut out = vec![self.memory.clone(), self.pids.clone()];
        for d in [&self.cpu, &self.cpuacct].into_iter().flatten() {
            if !out.contains(d) {
                out.push(d.clone());
            }
        }
        out
    }

    fn apply(&self, dirs: &[PathBuf], limits: &Limits) -> io::Result<()> {
        let mem = &dirs[0];
        let memsw = mem.join("memory.memsw.limit_in_bytes");
        let has_memsw = memsw.exists();
        // memsw must stay >= the memory limit: lift it, set, then match.
        if has_memsw {
            write_file(&memsw, "-1")?;
        }
        write_file(
            &mem.join("memory.limit_in_bytes"),
            &limits.memory_bytes.to_string(),
        )?;
        if has_memsw {
            write_file(&memsw, &limits.memory_bytes.to_string())?;
        }
        write_file(&dirs[1].join("pids.max"), &limits.pids.to_string())?;
        if let Some(cpu) = self.slot(self.cpu.as_ref()).and_then(|i| dirs.get(i)) {
            let quota = u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1000;
            write_file(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write_file(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
        }
        Ok(())
    }

    fn counters(&self, files: &ControlFiles) -> Counters {
        Counters {
            oom_kills: files.key(0, "memory.oom_control", "oom_kill").unwrap_or(0),
            pids_max_hits: files.key(1, "pids.events", "max").unwrap_or(0),
            cpu_usec: self
                .slot(self.cpuacct.as_ref())
                .and_then(|i| files.number(i, "cpuacct.usage"))
                .map(|ns| ns / 1000),
            peak_memory: files.number(0, "memory.max_usage_in_bytes"),
        }
    }

    /// The pids controller counts a process from fork until it is reaped,
    /// and every process of a sandbox is in its pids group: one number,
    /// where listing cgroup.procs builds a sorted pid array per hierarchy.
    fn populated(&self, files: &ControlFiles) -> bool {
        match files.number(1, "pids.current") {
            Some(n) => n > 0,
            None => files.lists_processes(),
        }
    }

    fn reusable(&self, files: &ControlFiles) -> bool {
        files.write(0, "memory.max_usage_in_bytes", "0").is_ok()
    }

    fn limits_cpu(&self) -> bool {
        self.cpu.is_some()
    }

    fn thread_file(&self) -> Option<&'static str> {
        Some("tasks")
    }
}
