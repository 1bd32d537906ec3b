//! cgroup v2: per-sandbox groups in a container of a delegated subtree of
//! the unified hierarchy; memory (without swap) and pids limits, the
//! `memory.events` and `pids.events` counters, and `cgroup.kill`.

use std::io;
use std::path::PathBuf;

use super::groups::{Hierarchy, read_key, write_file};
use super::{Counters, Mechanism};
use crate::environment::Limits;

#[derive(Debug)]
pub(super) struct CgroupV2 {
    /// Groups live here, a directory of the unified hierarchy.
    pub(super) container: PathBuf,
}

impl Hierarchy for CgroupV2 {
    fn mechanism(&self) -> Mechanism {
        Mechanism::CgroupV2
    }

    fn describe(&self) -> String {
        format!(
            "cgroup v2 (memory, pids) under {}",
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
        write_file(&d.join("pids.max"), &limits.pids.to_string())
    }

    fn counters(&self, dirs: &[PathBuf]) -> Counters {
        Counters {
            oom_kills: read_key(&dirs[0].join("memory.events"), "oom_kill").unwrap_or(0),
            pids_max_hits: read_key(&dirs[0].join("pids.events"), "max").unwrap_or(0),
        }
    }

    fn kill_at_once(&self, dirs: &[PathBuf]) -> bool {
        write_file(&dirs[0].join("cgroup.kill"), "1").is_ok()
    }
}
