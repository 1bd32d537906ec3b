//! rlimits: per-process limits. Those set on bubblewrap before it builds the
//! sandbox are inherited by everything it starts: always CPU time, file
//! size, open files and core dumps, and memory (RLIMIT_DATA) when no cgroup
//! enforces it. The process limit (RLIMIT_NPROC), when no cgroup enforces
//! it, is set instead on the sandbox's init once its user namespace exists:
//! the kernel (5.14 and later) then counts only the processes of that
//! namespace, where set on bubblewrap it would count every process the
//! host user has, and fail under load.

use crate::limits::Limits;

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
    /// Memory and processes are limited by rlimits (no cgroup does).
    memory_and_processes: bool,
}

impl Policy {
    pub(super) fn with_cgroups() -> Policy {
        Policy {
            memory_and_processes: false,
        }
    }

    pub(super) fn without_cgroups() -> Policy {
        Policy {
            memory_and_processes: true,
        }
    }

    /// The rlimits for the sandbox's init, set once its user namespace exists.
    pub(super) fn for_init(&self, limits: &Limits) -> Vec<Rlimit> {
        if !self.memory_and_processes {
            return Vec::new();
        }
        vec![Rlimit {
            resource: rustix::process::Resource::Nproc,
            value: limits.pids,
        }]
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
        if self.memory_and_processes {
            out.push(Rlimit {
                resource: Resource::Data,
                value: limits.memory_bytes,
            });
        }
        out
    }
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
        assert!(Policy::with_cgroups().for_init(&l).is_empty());
        let without = Policy::without_cgroups();
        let on_bwrap = without.for_limits(&l);
        let get = |res| on_bwrap.iter().find(|r| r.resource == res).unwrap().value;
        assert_eq!(get(Resource::Data), l.memory_bytes);
        assert_eq!(get(Resource::Cpu), l.cpu_seconds);
        // Never on bubblewrap, where it would count the host user's processes.
        assert!(!on_bwrap.iter().any(|r| r.resource == Resource::Nproc));
        let on_init = without.for_init(&l);
        assert_eq!(on_init.len(), 1);
        assert_eq!(
            (on_init[0].resource, on_init[0].value),
            (Resource::Nproc, l.pids)
        );
    }
}
