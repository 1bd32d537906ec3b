//! What a process the daemon starts does before it execs its program: its
//! rlimits, entering the nest (and staging the sandbox's filesystems
//! there), joining its cgroup (cgroup v1), giving up root, dying with the
//! daemon, and inheriting exactly the descriptors it is meant to.
//! Everything is prepared before the child starts (see `launch.rs`); the
//! child only makes system calls.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Command;
use std::sync::Arc;

use rustix::process::{Pid, Signal};

use super::nest::Entry;
use crate::limits::Rlimit;

/// Everything the child does before exec, prepared in the parent.
pub(super) struct ChildPlan {
    pub(super) rlimits: Vec<Rlimit>,
    /// The daemon's hard limits, read before the child starts: it must not allocate.
    pub(super) hard: Vec<Option<u64>>,
    /// Descriptors the program must inherit (their close-on-exec flag is cleared).
    pub(super) inherit: Arc<Vec<OwnedFd>>,
    pub(super) run_as: Option<(u32, u32)>,
    /// The nest to enter, and what to stage there, when there is one.
    pub(super) nest: Option<Entry>,
    /// The sandbox's cgroup, which the program joins itself after staging
    /// (see [`crate::limits::Lease::join_at_exec`]), where it does.
    pub(super) join_cgroup: Option<Arc<Vec<OwnedFd>>>,
    /// The daemon: the program must not outlive it.
    pub(super) parent: Pid,
}

impl ChildPlan {
    /// A plan that only gives up root (with `run_as`), dies with the daemon
    /// and closes inherited descriptors.
    pub(super) fn bare(run_as: Option<(u32, u32)>) -> ChildPlan {
        ChildPlan {
            rlimits: Vec::new(),
            hard: Vec::new(),
            inherit: Arc::new(Vec::new()),
            run_as,
            nest: None,
            join_cgroup: None,
            parent: rustix::process::getpid(),
        }
    }

    /// Makes `cmd` follow a plan without a nest in its forked child (for
    /// helpers started once; sandboxes start through [`super::launch`]).
    pub(super) fn install(self, cmd: &mut Command) {
        debug_assert!(self.nest.is_none(), "a nest is entered by launch only");
        // SAFETY: the closure runs between fork and exec in the child.
        // `enter` and `prepare` make only async-signal-safe system calls on
        // data prepared before the fork, and do not allocate, lock, or touch
        // the parent's threads.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                self.enter()?;
                self.prepare()
            });
        }
    }

    /// In the first child: sets the rlimits and joins the nest, whose pid
    /// namespace is then its children's (see [`Entry::join`]). The nest
    /// comes first: a root daemon's nest is root's (see `nest`), and
    /// staging needs its capabilities there.
    pub(super) fn enter(&self) -> io::Result<()> {
        use rustix::process::{Resource, setrlimit};
        for (r, hard) in self.rlimits.iter().zip(&self.hard) {
            let cap = |v: u64| hard.map_or(v, |h| v.min(h));
            // CPU: the soft limit sends SIGXCPU (reported as "cpu"); the hard
            // limit, a little later, SIGKILL for programs that ignore it.
            let max = if r.resource == Resource::Cpu {
                r.value + 2
            } else {
                r.value
            };
            let limit = rustix::process::Rlimit {
                current: Some(cap(r.value)),
                maximum: Some(cap(max)),
            };
            setrlimit(r.resource, limit)?;
        }
        if let Some(nest) = &self.nest {
            nest.join()?;
        }
        Ok(())
    }

    /// In the process that becomes the program: stages its filesystems in
    /// the nest, joins its cgroup where it does so itself, gives up root if
    /// we have it, and passes the program exactly the descriptors it needs
    /// (any the daemon itself inherited stay out of the sandbox).
    pub(super) fn prepare(&self) -> io::Result<()> {
        if let Some(nest) = &self.nest {
            nest.stage()?;
        }
        // After staging, whose kernel objects stay charged where they were
        // before (the daemon's groups), as when the daemon moved the process.
        for thread_file in self.join_cgroup.iter().flat_map(|files| files.iter()) {
            rustix::io::write(thread_file, b"0")?;
        }
        if let Some((uid, gid)) = self.run_as {
            let gid = rustix::process::Gid::from_raw(gid);
            rustix::thread::set_thread_groups(&[])?;
            rustix::thread::set_thread_res_gid(gid, gid, gid)?;
            let uid = rustix::process::Uid::from_raw(uid);
            rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        }
        // Until bubblewrap has read its options (and set its own parent-death
        // signal) nothing else would kill it if the daemon died. Set after
        // the identity switch and entering the nest, which both clear it;
        // the check catches a daemon that died before.
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
        let parent_alive = match &self.nest {
            Some(nest) => nest.daemon_alive(),
            None => rustix::process::getppid() == Some(self.parent),
        };
        if !parent_alive {
            // The daemon is gone (no allocation here: an errno).
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        close_inherited_descriptors();
        for fd in self.inherit.iter() {
            rustix::io::fcntl_setfd(fd.as_fd(), rustix::io::FdFlags::empty())?;
        }
        Ok(())
    }
}

/// Marks every descriptor above stderr close-on-exec.
fn close_inherited_descriptors() {
    // SAFETY: close_range only changes descriptor flags; it touches no memory.
    // Called in the child before exec, where it is async-signal-safe.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r != 0 {
        // Kernels before 5.11: walk the usual range instead.
        for fd in 3..4096 {
            // SAFETY: fcntl on a possibly-closed descriptor fails harmlessly.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}
