//! Setting a started bubblewrap's sandbox up, off the call's critical
//! path: its cgroup and limits, its options and seccomp filter, the mounts
//! from outside while it waits (see `outside.rs`), its init's rlimits and,
//! with network, the proxy's listener on its loopback.

use std::io::{self, Write};

use rustix::process::Pid;

use super::outside::mount_when_waited_for;
use super::{INIT_LIMIT, Spawned};
use crate::exec::process::watch_child_of;
use crate::exec::recipe::Recipe;
use crate::exec::sandbox::Prepared;
use crate::exec::status::Status;
use crate::exec::wiring::{Go, HeldNamespaces};
use crate::limits::Rlimit;

impl Spawned {
    /// Moves the waiting bubblewrap into its cgroup with the run's limits
    /// (unless it joined the group itself before exec; see
    /// [`crate::limits::Lease::join_at_exec`]), hands it its options and
    /// seccomp filter, and waits until it has created the sandbox's init;
    /// it then builds the mounts and waits to start the command. Blocking
    /// (the cgroup migration waits for the kernel; see
    /// [`crate::limits::Lease::adopt`]).
    pub(in crate::exec) fn set_up(
        mut self,
        recipe: &Recipe,
        run_as: Option<(u32, u32)>,
    ) -> io::Result<Prepared> {
        self.lease.apply(&recipe.env.limits)?;
        self.lease.adopt(self.process.pid())?;
        // A write fails only when bubblewrap has exited; the run reports why.
        let _ = std::fs::File::from(self.options).write_all(&self.options_data);
        let _ = std::fs::File::from(self.seccomp).write_all(&recipe.program.0);
        let mut status = Status::new(self.status);
        let bubblewrap = self.process.pid() as i32;
        let init = status.wait_for_init(INIT_LIMIT).and_then(|named| {
            // In the nest bubblewrap names it in the nest's pid namespace.
            let (pid, nest) = match &self.reaped {
                Some(reaped) => (
                    crate::exec::pidns::child_known_as(bubblewrap, named)?,
                    Some((named, reaped.clone())),
                ),
                None => (named, None),
            };
            watch_child_of(pid, &mut self.process, nest).map(|w| (pid, w))
        });
        // No init: bubblewrap failed to set the sandbox up, which the run reports.
        let mut listener = None;
        let mut namespaces = HeldNamespaces::default();
        let init = match init {
            Some((pid, watched)) => {
                namespaces = HeldNamespaces::hold(bubblewrap, pid);
                // In bubblewrap's order: the masks once /proc is mounted,
                // the store view after every other mount.
                if let Some((sync, attach)) = self.masks.take() {
                    mount_when_waited_for(sync, &attach, &namespaces)?;
                }
                if let Some((sync, attach)) = self.view.take() {
                    mount_when_waited_for(sync, &attach, &namespaces)?;
                }
                limit_init(pid, &recipe.init_rlimits, run_as)?;
                if recipe.env.network.policy().is_some() {
                    // The nest's owner has every capability in the
                    // sandboxes' namespaces; without the nest, bubblewrap's
                    // identity owns them.
                    let joiner = if self.reaped.is_some() { None } else { run_as };
                    listener = Some(crate::network::listen_in(
                        pid,
                        joiner,
                        crate::network::PROXY_PORT,
                    )?);
                }
                Some(watched)
            }
            None => None,
        };
        let go = match (&recipe.warm, self.go) {
            (Some(warm), Some((pipe, number))) => {
                if let Some(root) = &self.staged {
                    warm.stage(root, number, run_as)?;
                }
                Some(Go {
                    pipe,
                    message: warm.go(number),
                })
            }
            _ => None,
        };
        Ok(Prepared {
            process: self.process,
            init,
            lease: self.lease,
            code: self.code,
            block: self.block,
            status,
            stdout: self.stdout,
            stderr: self.stderr,
            reservation: None,
            proxy_listener: listener,
            staged: self.staged,
            namespaces,
            network: self.network,
            go,
            released: false,
        })
    }
}

/// Sets `rlimits` on the sandbox's init, which has not started the command
/// yet: the command and everything it starts inherit them, counted inside
/// the sandbox's user namespace. A daemon running as root without
/// CAP_SYS_RESOURCE may not change another user's limits, so this thread
/// takes the sandbox's identity for the call (only this thread: the
/// credential system calls act per thread).
fn limit_init(pid: i32, rlimits: &[Rlimit], run_as: Option<(u32, u32)>) -> io::Result<()> {
    let Some(pid) = Pid::from_raw(pid) else {
        return Ok(());
    };
    let apply = || -> io::Result<()> {
        for r in rlimits {
            let limit = rustix::process::Rlimit {
                current: Some(r.value),
                maximum: Some(r.value),
            };
            rustix::process::prlimit(Some(pid), r.resource, limit)?;
        }
        Ok(())
    };
    match (apply(), run_as) {
        (Ok(()), _) => Ok(()),
        (Err(e), Some((uid, gid))) if e.raw_os_error() == Some(libc::EPERM) => {
            as_sandbox_user(uid, gid, apply)
        }
        (Err(e), _) => Err(io::Error::other(format!(
            "cannot limit the sandbox's processes: {e}"
        ))),
    }
}

/// Runs `f` on this thread as `uid`/`gid` (keeping root as the saved
/// identity to return to). Aborts the process if the identity cannot be
/// restored: a daemon thread must never go on as another user.
fn as_sandbox_user(uid: u32, gid: u32, f: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    use rustix::process::{Gid, Uid};
    use rustix::thread::{set_thread_res_gid, set_thread_res_uid};
    let root = (Uid::ROOT, Gid::ROOT);
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    set_thread_res_gid(gid, gid, root.1)?;
    if let Err(e) = set_thread_res_uid(uid, uid, root.0) {
        let _ = set_thread_res_gid(root.1, root.1, root.1);
        return Err(e.into());
    }
    let result = f();
    if set_thread_res_uid(root.0, root.0, root.0).is_err()
        || set_thread_res_gid(root.1, root.1, root.1).is_err()
    {
        tracing::error!("cannot return to root after limiting a sandbox; stopping");
        std::process::abort();
    }
    result
}
