//! cgroup v1: per-sandbox leaf groups in the memory and pids hierarchies
//! (each with a container of ours); memory (and memory plus swap, where the
//! kernel accounts it) and pids limits, with the OOM and pids counters.

use std::io;
use std::path::PathBuf;

use super::groups::{Hierarchy, read_key, write_file};
use super::{Counters, Mechanism};
use crate::environment::Limits;

#[derive(Debug)]
pub(super) struct CgroupV1 {
    pub(super) memory: PathBuf,
    pub(super) pids: PathBuf,
}

impl Hierarchy for CgroupV1 {
    fn mechanism(&self) -> Mechanism {
        Mechanism::CgroupV1
    }

    fn describe(&self) -> String {
        format!(
            "cgroup v1 leaf groups (memory under {}, pids under {})",
            self.memory.display(),
            self.pids.display()
        )
    }

    /// Memory first, then pids: the order of a group's directories.
    fn containers(&self) -> Vec<PathBuf> {
        vec![self.memory.clone(), self.pids.clone()]
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
        write_file(&dirs[1].join("pids.max"), &limits.pids.to_string())
    }

    fn counters(&self, dirs: &[PathBuf]) -> Counters {
        Counters {
            oom_kills: read_key(&dirs[0].join("memory.oom_control"), "oom_kill").unwrap_or(0),
            pids_max_hits: read_key(&dirs[1].join("pids.events"), "max").unwrap_or(0),
        }
    }
}
