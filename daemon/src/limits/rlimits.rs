//! rlimits: the per-process limits set on bubblewrap before it builds the
//! sandbox, inherited by everything it starts. Always CPU time, file size,
//! open files and core dumps; memory (RLIMIT_DATA) and processes
//! (RLIMIT_NPROC) too when no cgroup enforces them.

use crate::environment::Limits;

/// One resource limit, applied to bubblewrap (and so to everything it starts)
/// before it sets the sandbox up.
#[derive(Debug, Clone, Copy)]
pub struct Rlimit {
    pub resource: rustix::process::Resource,
    pub value: u64,
}

/// Which rlimits a run gets.
#[derive(Debug)]
pub(super) struct Policy {
    /// Set when memory and processes are limited by rlimits: the number of
    /// processes the sandbox's host uid had at start-up. RLIMIT_NPROC counts
    /// every process of the uid, so the limit is set relative to those.
    nproc_baseline: Option<u64>,
}

impl Policy {
    pub(super) fn with_cgroups() -> Policy {
        Policy {
            nproc_baseline: None,
        }
    }

    pub(super) fn without_cgroups(sandbox_uid: u32) -> Policy {
        Policy {
            nproc_baseline: Some(count_processes_of(sandbox_uid)),
        }
    }

    pub(super) fn for_limits(&self, limits: &Limits) -> Vec<Rlimit> {
        use rustix::process::Resource;
        let mut out = vec![
            Rlimit {
                resource: Resource::Cpu,
                value: limits.cpu_seconds,
            },
            Rlimit {
                resource: Resource::Fsize,
                value: limits.file_size_bytes,
            },
            Rlimit {
                resource: Resource::Nofile,
                value: limits.open_files,
            },
            Rlimit {
                resource: Resource::Core,
                value: 0,
            },
        ];
        if let Some(baseline) = self.nproc_baseline {
            out.push(Rlimit {
                resource: Resource::Data,
                value: limits.memory_bytes,
            });
            out.push(Rlimit {
                resource: Resource::Nproc,
                value: baseline + limits.pids,
            });
        }
        out
    }
}

/// Processes currently owned by `uid` (for the RLIMIT_NPROC baseline).
fn count_processes_of(uid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| e.metadata().map(|m| m.uid() == uid).unwrap_or(false))
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::process::Resource;

    #[test]
    fn without_cgroups_memory_and_processes_are_rlimits_too() {
        let l = Limits::resolve(Default::default());
        let with = Policy::with_cgroups().for_limits(&l);
        assert!(!with.iter().any(|r| r.resource == Resource::Data));
        let without = Policy::without_cgroups(u32::MAX).for_limits(&l);
        let get = |res| without.iter().find(|r| r.resource == res).unwrap().value;
        assert_eq!(get(Resource::Data), l.memory_bytes);
        assert_eq!(get(Resource::Nproc), l.pids);
        assert_eq!(get(Resource::Cpu), l.cpu_seconds);
    }
}
