//! A sandbox from set-up to death: [`Prepared`] (bubblewrap has built the
//! namespaces and mounts and waits to start the command) and [`Sandbox`]
//! (the command runs; the supervisor reads its channels). Killing a sandbox
//! kills its init, which takes down its whole pid namespace, with the
//! process group and the cgroup as backstops.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::unix::pipe;

use super::admission::Reservation;
use super::nest::network;
use super::process::{Exit, Process, Watched};
use super::status::Status;
use super::wiring::{CodeFile, Go, HeldNamespaces};
use crate::limits::{Fired, Lease, Usage};
use crate::network::{NetworkReport, Policy, Proxy, RunRecord, Serving};

/// How long a killed sandbox's init may take to tear its namespace down
/// before bubblewrap itself is killed.
const TEARDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long an ended sandbox's init may take to come to us to be reaped.
const INIT_REAP_WAIT: Duration = Duration::from_millis(50);

/// A sandbox set up ahead of time: bubblewrap has built its namespaces and
/// mounts and waits on `block` before starting the command.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) process: Process,
    /// The sandbox's init (pid 1 of its pid namespace), when bubblewrap reported it.
    pub(super) init: Option<Watched>,
    pub(super) lease: Lease,
    /// Where the call writes the code; none for a command run as is.
    pub(super) code: Option<CodeFile>,
    /// Write end of bubblewrap's `--block-fd`: a byte starts the command.
    pub(super) block: OwnedFd,
    pub(super) status: Status,
    pub(super) stdout: OwnedFd,
    pub(super) stderr: OwnedFd,
    /// Its share of the server's memory budget, held for its whole life.
    pub(super) reservation: Option<Reservation>,
    /// For a sandbox with network: the proxy's listener, on the sandbox's
    /// own loopback (its network namespace), not yet served.
    pub(super) proxy_listener: Option<std::net::TcpListener>,
    /// The root of its staged tmpfs (see `nest`), which this descriptor
    /// keeps readable, the project's changes with it, until dropped.
    pub(super) staged: Option<OwnedFd>,
    /// Mount namespaces held past the sandbox's processes (see `spawn`).
    pub(super) namespaces: HeldNamespaces,
    /// The network namespace the nest gave it (see `nest::network`).
    pub(super) network: Option<network::Held>,
    /// A pre-started interpreter's hook, waiting for its message.
    pub(super) go: Option<Go>,
    /// The command has started (a pre-started interpreter, waiting in its
    /// hook); otherwise it starts with the call.
    pub(super) released: bool,
}

impl Prepared {
    /// False when the sandbox died while it waited (killed from outside, or
    /// its set-up failed).
    pub(super) fn is_alive(&mut self) -> bool {
        self.process.try_exit().is_none()
    }

    /// Writes the code into the (empty) code file.
    pub(super) fn write_code(&mut self, code: &[u8]) -> std::io::Result<()> {
        match (&mut self.code, &self.staged) {
            (Some(CodeFile::Host(file)), _) => file.as_file_mut().write_all(code),
            (Some(CodeFile::Staged(at, owner)), Some(staged)) => {
                use rustix::fs::{Mode, OFlags};
                // Readable by everyone (a root server's sandbox runs as
                // another uid), never through a link.
                let flags = OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::WRONLY
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC;
                let file =
                    rustix::fs::openat(staged, at.as_c_str(), flags, Mode::from_raw_mode(0o444))?;
                if let Some((uid, gid)) = owner {
                    rustix::fs::fchown(
                        &file,
                        Some(rustix::fs::Uid::from_raw(*uid)),
                        Some(rustix::fs::Gid::from_raw(*gid)),
                    )?;
                }
                std::fs::File::from(file).write_all(code)
            }
            (Some(CodeFile::Staged(..)), None) => Err(std::io::Error::other(
                "the code file's staged tmpfs is gone",
            )),
            (None, _) if code.is_empty() => Ok(()),
            (None, _) => Err(std::io::Error::other(
                "this sandbox runs a command, which reads no code",
            )),
        }
    }

    /// Starts the command ahead of the call: a pre-started interpreter runs
    /// up to its hook and waits there. False (and nothing done) when the
    /// command has no hook.
    pub(super) fn release(&mut self) -> bool {
        if self.go.is_none() || self.released {
            return false;
        }
        // A failed write means bubblewrap is gone, which `is_alive` shows.
        let _ = rustix::io::write(&self.block, b"x");
        self.released = true;
        true
    }

    /// True for one started ahead of its call (see [`Prepared::release`]).
    pub(super) fn released(&self) -> bool {
        self.released
    }

    /// Kills a sandbox that was never started and waits for it to end.
    pub(super) async fn discard(mut self) {
        kill_tree(&mut self.process, self.init.as_ref(), &self.lease).await;
    }

    /// Starts the command, the proxy first when the sandbox has network.
    /// Needs the tokio runtime (the pipes join its reactor).
    pub(super) fn start(
        self,
        control: Option<Control>,
        network: Option<(&Proxy, &Arc<Policy>)>,
    ) -> std::io::Result<Sandbox> {
        let network = match (self.proxy_listener, network) {
            (Some(listener), Some((proxy, policy))) => {
                let record = RunRecord::new();
                let serving = proxy.serve(listener, policy.clone(), record.clone())?;
                Some((serving, record))
            }
            _ => None,
        };
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
            network,
            _reservation: self.reservation,
            paused: None,
            call_cpu_start: None,
            status: self.status.watch(),
            control,
            _code: self.code,
            staged: self.staged,
            _namespaces: self.namespaces,
            network_namespace: self.network,
        };
        // A failed write means bubblewrap is gone, which its exit explains.
        if !self.released {
            let _ = rustix::io::write(&self.block, b"x");
        }
        if let Some(go) = self.go {
            let _ = std::fs::File::from(go.pipe).write_all(&go.message);
        }
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
    /// The proxy serving a sandbox with network, and what it recorded.
    network: Option<(Serving, RunRecord)>,
    _reservation: Option<Reservation>,
    /// How the sandbox was paused, if it is.
    paused: Option<Pause>,
    /// CPU time its processes had used when the current call began (when
    /// the previous one ended: it was paused between them), where no
    /// cgroup counts it (see `pidns.rs`).
    call_cpu_start: Option<Duration>,
    pub(super) status: Status,
    pub(super) stdout: Channel,
    pub(super) stderr: Channel,
    pub(super) control: Option<Control>,
    _code: Option<CodeFile>,
    /// See [`Prepared::staged`].
    staged: Option<OwnedFd>,
    /// See [`Prepared::namespaces`].
    _namespaces: HeldNamespaces,
    /// See [`Prepared::network`].
    network_namespace: Option<network::Held>,
}

/// How a sandbox's processes were stopped between calls.
#[derive(Debug)]
enum Pause {
    /// Its cgroup is frozen.
    Frozen,
    /// Every process got SIGSTOP (no freezable cgroup).
    Stopped(super::pidns::Stopped),
}

impl Sandbox {
    /// Kills everything in the sandbox and waits until bubblewrap has ended.
    pub async fn kill(&mut self) -> Exit {
        self.resume();
        kill_tree(&mut self.process, self.init.as_ref(), &self.lease).await
    }

    /// Stops every process of the sandbox (a session between calls), so
    /// that nothing it left running uses the CPU until [`Sandbox::resume`].
    pub fn pause(&mut self) {
        if self.paused.is_some() {
            return;
        }
        if self.lease.freeze(true) {
            self.paused = Some(Pause::Frozen);
        } else if let Some(init) = &self.init {
            self.paused = Some(Pause::Stopped(super::pidns::stop_all(init.pid())));
        }
    }

    /// A descriptor on the project's overlay upper layer (its changes),
    /// when the project is a writable overlay.
    pub fn upper_layer(&self) -> Option<OwnedFd> {
        let root = self.staged.as_ref()?;
        rustix::fs::openat(
            root,
            super::nest::stage::UPPER,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ok()
    }

    /// Lets a paused sandbox run again.
    pub fn resume(&mut self) {
        match self.paused.take() {
            Some(Pause::Frozen) => {
                self.lease.freeze(false);
            }
            Some(Pause::Stopped(stopped)) => stopped.resume(),
            None => {}
        }
    }

    /// Starts counting a new call's CPU time. Where it was counted before,
    /// the total the previous call ended with stands (the sandbox was
    /// paused since), so only a first call reads it.
    pub fn begin_call(&mut self) {
        self.lease.begin_call();
        if !self.lease.counts_cpu() && self.call_cpu_start.is_none() {
            self.call_cpu_start = self.init.as_ref().map(|i| super::pidns::usage(i.pid()).0);
        }
    }

    /// Whether a cgroup counts the sandbox's CPU time.
    pub(super) fn counts_cpu(&self) -> bool {
        self.lease.counts_cpu()
    }

    /// What the current call used (its CPU time and the highest memory use
    /// of the sandbox so far) and the limits that fired during it (memory,
    /// processes): read once, at the call's end.
    pub fn settle_call(&mut self) -> (Usage, Fired) {
        let (usage, fired) = self.lease.settle();
        if usage.cpu.is_some() {
            return (usage, fired);
        }
        let usage = match (&self.init, self.call_cpu_start) {
            (Some(init), Some(start)) => {
                let (cpu, peak) = super::pidns::usage(init.pid());
                self.call_cpu_start = Some(cpu);
                Usage {
                    cpu: Some(cpu.saturating_sub(start)),
                    peak_memory_bytes: usage.peak_memory_bytes.or(Some(peak)),
                }
            }
            _ => usage,
        };
        (usage, fired)
    }

    /// The resource usage of the sandbox's init and all it waited for, which
    /// bubblewrap does not wait for itself: reaped here once it comes to us.
    pub(super) async fn reap_init_usage(&self) -> Option<(Duration, u64)> {
        match &self.init {
            Some(init) if self.process.has_exited() => init.reap_with_usage(INIT_REAP_WAIT).await,
            _ => None,
        }
    }

    /// What the proxy saw since the last call of this (a session's record
    /// starts afresh each call); `None` without network.
    pub fn network_report(&self) -> Option<NetworkReport> {
        self.network.as_ref().map(|(_, record)| record.take())
    }

    /// Waits, once the program has ended, until nothing else of the sandbox
    /// runs: its init has ended, which the kernel lets happen only after
    /// every other process of its pid namespace (bubblewrap's exit makes
    /// the init end). Kills the sandbox if that takes longer than
    /// [`TEARDOWN_GRACE`].
    pub(super) async fn emptied(&mut self) {
        let ended = match &self.init {
            Some(init) => init.ended_within(TEARDOWN_GRACE).await,
            None => true,
        };
        if !ended {
            self.kill().await;
        }
    }

    /// Waits for bubblewrap to exit once its program has ended, and reaps
    /// it; a bubblewrap still there after [`TEARDOWN_GRACE`] is killed
    /// with the sandbox.
    pub(super) async fn ended(&mut self) -> Exit {
        match tokio::time::timeout(TEARDOWN_GRACE, self.process.exit()).await {
            Ok(exit) => exit,
            Err(_) => self.kill().await,
        }
    }

    /// The end of a sandbox whose program has ended and whose call is
    /// settled: once bubblewrap has exited ([`Sandbox::ended`]), the cgroup
    /// goes back to the pool and every process is reaped. Its network
    /// namespace goes back to the nest's pool when its init, the last of
    /// its processes, is seen to have ended too.
    pub(super) async fn wind_down(mut self) {
        self.ended().await;
        if let (Some(init), Some(network)) = (&self.init, &mut self.network_namespace)
            && self.process.has_exited()
            && init.has_ended()
        {
            network.vacated();
        }
        self.lease.release();
        drop(self);
        super::process::reap_orphans();
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

/// Kills a sandbox through its init, so that bubblewrap reaps the init and
/// exits; bubblewrap's process group and the cgroup are the backstops.
async fn kill_tree(process: &mut Process, init: Option<&Watched>, lease: &Lease) -> Exit {
    // The init first, even when bubblewrap has ended: a bubblewrap killed
    // between creating the init and writing its uid map (when the thread
    // that started it ends, for one) leaves an init that waits for that
    // map for ever. The kernel kills every process of the pid namespace
    // and waits for them before the init can be reaped; bubblewrap, which
    // waits for the init, then exits.
    if let Some(init) = init {
        init.kill();
    }
    if let Some(e) = process.try_exit() {
        return e;
    }
    if init.is_some()
        && let Ok(e) = tokio::time::timeout(TEARDOWN_GRACE, process.exit()).await
    {
        return e;
    }
    process.kill();
    lease.kill_all();
    process.exit().await
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Whether or not bubblewrap is still there (see `kill_tree`).
        if let Some(init) = &self.init {
            init.kill();
        }
        // The process, the lease and the init's pidfd kill and reap the rest.
    }
}
