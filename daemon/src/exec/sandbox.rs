//! A sandbox from set-up to death: [`Prepared`] (bubblewrap has built the
//! namespaces and mounts and waits to start the command) and [`Sandbox`]
//! (the command runs; the supervisor reads its channels). Killing a sandbox
//! kills its init, which takes down its whole pid namespace, with the
//! process group and the cgroup as backstops.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::net::unix::pipe;

use super::spawn::{Exit, Process, Watched};
use super::status::Status;
use crate::limits::{Fired, Lease};

/// How long a killed sandbox's init may take to tear its namespace down
/// before bubblewrap itself is killed.
const TEARDOWN_GRACE: Duration = Duration::from_secs(2);

/// A sandbox set up ahead of time: bubblewrap has built its namespaces and
/// mounts and waits on `block` before starting the command.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) process: Process,
    /// The sandbox's init (pid 1 of its pid namespace), when bubblewrap reported it.
    pub(super) init: Option<Watched>,
    pub(super) lease: Lease,
    /// The file mounted as the code file; the call writes the code into it.
    pub(super) code: tempfile::NamedTempFile,
    /// Write end of bubblewrap's `--block-fd`: a byte starts the command.
    pub(super) block: OwnedFd,
    pub(super) status: Status,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
}

impl Prepared {
    /// False when the sandbox died while it waited (killed from outside, or
    /// its set-up failed).
    pub(super) fn is_alive(&mut self) -> bool {
        self.process.try_exit().is_none()
    }

    /// Writes the code into the (empty) code file.
    pub(super) fn write_code(&mut self, code: &[u8]) -> std::io::Result<()> {
        self.code.as_file_mut().write_all(code)
    }

    /// Kills a sandbox that was never started and waits for it to end.
    pub(super) async fn discard(mut self) {
        if let Some(init) = &self.init {
            init.kill();
        }
        self.process.kill();
        self.process.exit().await;
    }

    /// Starts the command. Needs the tokio runtime (the pipes join its reactor).
    pub(super) fn start(self, control: Option<Control>) -> std::io::Result<Sandbox> {
        let channel = |fd: OwnedFd| -> std::io::Result<Channel> {
            Ok(Channel {
                pipe: pipe::Receiver::from_owned_fd(fd)?,
                open: true,
            })
        };
        let sandbox = Sandbox {
            stdout: channel(self.stdout)?,
            stderr: channel(self.stderr)?,
            process: self.process,
            init: self.init,
            lease: self.lease,
            status: self.status,
            control,
            _code: self.code,
        };
        // A failed write means bubblewrap is gone, which its exit explains.
        let _ = rustix::io::write(&self.block, b"x");
        Ok(sandbox)
    }
}

/// One output stream of the sandbox.
#[derive(Debug)]
pub(super) struct Channel {
    pub(super) pipe: pipe::Receiver,
    /// False once the program closed it (a session's stays closed).
    pub(super) open: bool,
}

/// A session's control channel: requests go in on one pipe, replies come
/// back on another, never on the program's own output.
#[derive(Debug)]
pub(super) struct Control {
    pub(super) requests: pipe::Sender,
    pub(super) replies: pipe::Receiver,
    /// Bytes of a reply line not yet complete.
    pub(super) partial: Vec<u8>,
}

/// A started sandbox. Dropped, it is killed.
#[derive(Debug)]
pub struct Sandbox {
    pub(super) process: Process,
    pub(super) init: Option<Watched>,
    pub(super) lease: Lease,
    pub(super) status: Status,
    pub(super) stdout: Channel,
    pub(super) stderr: Channel,
    pub(super) control: Option<Control>,
    _code: tempfile::NamedTempFile,
}

impl Sandbox {
    /// Kills everything in the sandbox and waits until bubblewrap has ended.
    pub async fn kill(&mut self) -> Exit {
        if let Some(e) = self.process.try_exit() {
            return e;
        }
        if let Some(init) = &self.init {
            // The kernel kills every process of the pid namespace and waits
            // for them before the init can be reaped; bubblewrap, which waits
            // for the init, then exits.
            init.kill();
            if let Ok(e) = tokio::time::timeout(TEARDOWN_GRACE, self.process.exit()).await {
                return e;
            }
        }
        self.process.kill();
        self.lease.kill_all();
        self.process.exit().await
    }

    /// Limits that fired since the last check (memory, processes).
    pub fn fired(&mut self) -> Fired {
        self.lease.check()
    }

    /// Ends the sandbox's hold on its cgroup once it has ended: the limits
    /// that fired, and the group goes back to the pool.
    pub(super) fn finish(&mut self) -> Fired {
        self.lease.release()
    }

    /// The sandbox's end, if it has ended.
    pub fn try_exit(&mut self) -> Option<Exit> {
        self.process.try_exit()
    }

    /// True when bubblewrap reported that the program ran (see `status`).
    pub(super) fn program_ran(&mut self) -> bool {
        self.status.program_exited()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.process.try_exit().is_none()
            && let Some(init) = &self.init
        {
            init.kill();
        }
        // The process, the lease and the init's pidfd kill and reap the rest.
    }
}
