//! Processes: starting bubblewrap for a recipe (the fork and exec, with the
//! rlimits, the identity switch and exactly the descriptors bubblewrap needs
//! set up between the two; then, off the call's critical path, moving the
//! waiting bubblewrap into its cgroup and handing it its options and seccomp
//! programs), and holding every process the daemon starts or inherits by
//! pidfd: exits are awaited on the runtime, signals reach the process a
//! descriptor names (never a recycled pid), and everything is reaped. A
//! process dropped while it still runs is killed and reaped later; with
//! [`become_subreaper`], the sandboxes' own init processes, which bubblewrap
//! may leave behind, come back to the daemon instead of the host's PID 1 and
//! are reaped here too. The only file of exec with `unsafe`.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};
use tokio::io::unix::AsyncFd;

use super::child::ChildPlan;
use super::nest::{Nest, Reaped, Reported};
use super::recipe::{Recipe, nul_separated};
use super::sandbox::{Go, Prepared};
use super::status::Status;
use crate::jail::{self, Call};
use crate::limits::{Enforcer, Lease, Rlimit};
use crate::platform::Platform;

/// How long bubblewrap may take to create the sandbox's namespaces.
const INIT_LIMIT: Duration = Duration::from_secs(10);

/// A bubblewrap just started, blocked reading its options, not yet in its cgroup.
pub(super) struct Spawned {
    process: Process,
    lease: Lease,
    code: Option<tempfile::NamedTempFile>,
    block: OwnedFd,
    status: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// Write ends: the options, the two seccomp programs.
    options: OwnedFd,
    seccomp: [OwnedFd; 2],
    options_data: Vec<u8>,
    staged: Option<OwnedFd>,
    /// A pre-started interpreter's pipe: the write end, and the number the
    /// interpreter knows the read end by.
    go: Option<(OwnedFd, i32)>,
    /// In the nest: what its init reaped (the sandbox's init ends up there).
    reaped: Option<Arc<Reaped>>,
}

/// Starts bubblewrap for `recipe`, passing `extra` descriptors on to the
/// command at their current numbers. Fast (one fork and exec); must run in
/// the tokio runtime, on a thread that outlives the sandbox (bubblewrap's
/// parent-death signal follows the thread that forked it).
pub(super) fn spawn(
    platform: &Platform,
    enforcer: &Enforcer,
    nest: Option<&Nest>,
    recipe: &Recipe,
    extra: Vec<OwnedFd>,
) -> io::Result<Spawned> {
    let lease = enforcer.reserve()?;
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(io::Error::from);
    let (options_r, options_w) = pipe()?;
    let (sc0_r, sc0_w) = pipe()?;
    let (sc1_r, sc1_w) = pipe()?;
    let (status_r, status_w) = pipe()?;
    let (block_r, block_w) = pipe()?;
    let go = match recipe.warm {
        Some(_) => {
            let (r, w) = pipe()?;
            // bash opens it again through /dev/fd, as the sandbox's user
            // (another one when the server runs as root). Only processes
            // holding the pipe can reach it there.
            rustix::fs::fchmod(&r, rustix::fs::Mode::from_raw_mode(0o444))?;
            Some((r, w))
        }
        None => None,
    };
    let hook_vars = match (&recipe.warm, &go) {
        (Some(warm), Some((go_r, _))) => warm.vars(go_r.as_raw_fd()),
        _ => Vec::new(),
    };
    rustix::fs::fcntl_setfl(&status_r, rustix::fs::OFlags::NONBLOCK)?;
    let code = match recipe.code_path {
        Some(_) => Some(platform.code_file()?),
        None => None,
    };
    let call = Call {
        env: &recipe.env,
        project: recipe.project.as_ref(),
        code_file: code
            .as_ref()
            .zip(recipe.code_path.as_deref())
            .map(|(file, at)| (file.path(), at)),
        block_fd: Some(block_r.as_raw_fd()),
        seccomp_fds: vec![sc0_r.as_raw_fd(), sc1_r.as_raw_fd()],
        status_fd: Some(status_w.as_raw_fd()),
        inherited: &recipe.inherited,
        workdir: recipe.workdir.as_deref(),
        staged: nest.map(|_| platform.stage_dir.as_path()),
        store_view: recipe.view.as_ref().map(|_| platform.view_dir.as_path()),
        protected: &recipe.protected,
        caches: &recipe.caches,
        hook_vars: &hook_vars,
    };
    let (entry, receipt) = match nest {
        Some(n) => {
            let (entry, receipt) =
                n.entry(recipe.stage.as_ref(), recipe.view.clone(), platform.run_as)?;
            (Some(entry), Some(receipt))
        }
        None => (None, None),
    };
    let options_data = nul_separated(jail::bwrap_options(&platform.layout, &call));
    let options_fd = options_r.as_raw_fd();
    let (go_r, go) = match go {
        Some((r, w)) => {
            let number = r.as_raw_fd();
            (Some(r), Some((w, number)))
        }
        None => (None, None),
    };
    let plan = ChildPlan {
        hard: recipe
            .rlimits
            .iter()
            .map(|r| rustix::process::getrlimit(r.resource).maximum)
            .collect(),
        rlimits: recipe.rlimits.clone(),
        inherit: Arc::new(
            [options_r, sc0_r, sc1_r, status_w, block_r]
                .into_iter()
                .chain(go_r)
                .chain(extra)
                .collect(),
        ),
        run_as: platform.run_as,
        nest: entry,
        parent: rustix::process::getpid(),
    };
    let mut cmd = std::process::Command::new(&platform.bwrap);
    cmd.arg("--args")
        .arg(options_fd.to_string())
        .arg("--")
        .args(&recipe.key.command)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    plan.install(&mut cmd);
    let spawned = cmd.spawn();
    // The child's end of the reports closes with the command.
    drop(cmd);
    let (mut child, reported) = match receipt {
        None => (spawned?, None),
        Some(receipt) => {
            let reported = receipt.collect(spawned.as_ref().ok().map(|c| c.id()));
            match spawned {
                Ok(child) => (child, Some(reported)),
                Err(e) => {
                    kill_and_reap(reported.bubblewrap);
                    let why = match reported.staged {
                        Some(Err(why)) => format!("{why}: {e}"),
                        _ => e.to_string(),
                    };
                    return Err(io::Error::new(e.kind(), why));
                }
            }
        }
    };
    let stdout = OwnedFd::from(child.stdout.take().expect("piped"));
    let stderr = OwnedFd::from(child.stderr.take().expect("piped"));
    // In the nest, bubblewrap is not the process spawned (that one has
    // exited) but the one it forked for us.
    let (pid, staged) = match reported {
        None => (Some(child.id() as i32), None),
        Some(Reported {
            bubblewrap: Some(pid),
            staged: Some(Ok(fd)),
        }) => (Some(pid), Some(fd)),
        Some(Reported {
            bubblewrap: Some(pid),
            staged: None,
        }) if recipe.stage.is_none() => (Some(pid), None),
        Some(r) => {
            kill_and_reap(r.bubblewrap);
            return Err(io::Error::other(match r.staged {
                Some(Err(why)) => why,
                _ => "bubblewrap did not start in the nest".to_string(),
            }));
        }
    };
    let pid = pid.unwrap_or_default() as u32;
    let process = match Process::adopt(pid) {
        Ok(p) => p,
        Err(e) => {
            kill_and_reap(Some(pid as i32));
            return Err(e);
        }
    };
    Ok(Spawned {
        process,
        lease,
        code,
        block: block_w,
        status: status_r,
        stdout,
        stderr,
        options: options_w,
        seccomp: [sc0_w, sc1_w],
        options_data,
        staged,
        go,
        reaped: nest.map(|n| n.reaped().clone()),
    })
}

/// Kills and reaps a child the daemon could not take charge of.
fn kill_and_reap(pid: Option<i32>) {
    if let Some(pid) = pid.and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, Signal::KILL);
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    }
}

impl Spawned {
    /// Moves the waiting bubblewrap into its cgroup with the run's limits,
    /// hands it its options and seccomp programs, and waits until it has
    /// created the sandbox's init; it then builds the mounts and waits to
    /// start the command. Blocking (the cgroup migration waits for the
    /// kernel; see [`Lease::adopt`]).
    pub(super) fn set_up(
        mut self,
        recipe: &Recipe,
        run_as: Option<(u32, u32)>,
    ) -> io::Result<Prepared> {
        self.lease.apply(&recipe.env.limits)?;
        self.lease.adopt(self.process.pid())?;
        // A write fails only when bubblewrap has exited; the run reports why.
        let _ = std::fs::File::from(self.options).write_all(&self.options_data);
        for (fd, program) in self.seccomp.into_iter().zip(&recipe.programs.0) {
            let _ = std::fs::File::from(fd).write_all(program);
        }
        let mut status = Status::new(self.status);
        let bubblewrap = self.process.pid() as i32;
        let init = status.wait_for_init(INIT_LIMIT).and_then(|named| {
            // In the nest bubblewrap names it in the nest's pid namespace.
            let (pid, nest) = match &self.reaped {
                Some(reaped) => (
                    super::pidns::child_known_as(bubblewrap, named)?,
                    Some((named, reaped.clone())),
                ),
                None => (named, None),
            };
            watch_child_of(pid, &mut self.process, nest).map(|w| (pid, w))
        });
        // No init: bubblewrap failed to set the sandbox up, which the run reports.
        let mut listener = None;
        let init = match init {
            Some((pid, watched)) => {
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

/// A pidfd on `pid`, provided it is the sandbox init that `parent`
/// (bubblewrap, alive) started: a pid read from a pipe could otherwise name
/// a process that has since been reaped and replaced.
fn watch_child_of(
    pid: i32,
    parent: &mut Process,
    nest: Option<(i32, Arc<Reaped>)>,
) -> Option<Watched> {
    let mut watched = Watched::open(pid).ok()?;
    watched.nest = nest;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: parse after it.
    let ppid: u32 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    (ppid == parent.pid() && parent.try_exit().is_none()).then_some(watched)
}

/// Reaps `pid` if it has ended, with its resource usage.
fn reap(pid: Pid) -> Option<Exit> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 writes only into the two local variables passed by pointer.
    let r = unsafe {
        libc::wait4(
            pid.as_raw_nonzero().get(),
            &mut status,
            libc::WNOHANG,
            &mut usage,
        )
    };
    if r == 0 {
        return None;
    }
    if r < 0 {
        // Only a bug elsewhere (another waiter) gets here; report a kill
        // rather than wait forever for a status that will never come.
        tracing::error!("process {pid:?} was reaped by someone else");
        status = libc::SIGKILL;
    }
    let time =
        |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Some(Exit {
        status: ExitStatus::from_raw(status),
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        max_rss_bytes: (usage.ru_maxrss as u64) * 1024,
    })
}

/// Reaps the process behind `pidfd`, if it has ended and is our child, with
/// its resource usage (which includes the children it waited for). `Ok(None)`
/// while it runs; `Err(ECHILD)` when it is not ours to reap.
fn reap_pidfd_with_usage(pidfd: &OwnedFd) -> Result<Option<(Duration, u64)>, rustix::io::Errno> {
    use std::os::fd::AsRawFd;
    const P_PIDFD: libc::c_int = 3;
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waitid (the system call, whose fifth argument is the rusage)
    // writes only into the two local variables passed by pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_waitid,
            P_PIDFD,
            pidfd.as_raw_fd(),
            &mut info as *mut libc::siginfo_t,
            libc::WEXITED | libc::WNOHANG,
            &mut usage as *mut libc::rusage,
        )
    };
    if r < 0 {
        return Err(
            rustix::io::Errno::from_io_error(&io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::CHILD),
        );
    }
    // SAFETY: si_pid is set by waitid when a child was waited for, and left
    // zero (as initialised) when none had ended.
    if unsafe { info.si_pid() } == 0 {
        return Ok(None);
    }
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok(Some((
        time(usage.ru_utime) + time(usage.ru_stime),
        (usage.ru_maxrss as u64) * 1024,
    )))
}

/// How a reaped process ended and what it used.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub status: ExitStatus,
    /// User plus system CPU time of the process and the children it waited for.
    pub cpu: Duration,
    /// Largest resident set of the process or of any child it waited for.
    pub max_rss_bytes: u64,
}

/// A child of the daemon. Dropped before it was reaped, it is killed with its
/// process group and reaped in the background.
#[derive(Debug)]
pub struct Process {
    pid: Pid,
    pidfd: AsyncFd<OwnedFd>,
    exit: Option<Exit>,
}

impl Process {
    /// Takes charge of `pid`, a child just spawned and not yet waited for.
    /// Needs a tokio runtime (the descriptor is registered with its reactor).
    pub fn adopt(pid: u32) -> io::Result<Process> {
        let pid = Pid::from_raw(pid as i32).ok_or_else(|| io::Error::other("pid 0"))?;
        let fd = rustix::process::pidfd_open(pid, PidfdFlags::NONBLOCK)?;
        // SAFETY: `fd` is an open pidfd that the AsyncFd owns, unchanged,
        // for its whole life.
        let pidfd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(Process {
            pid,
            pidfd,
            exit: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid.as_raw_nonzero().get() as u32
    }

    /// The exit, if the process has ended (reaping it then).
    pub fn try_exit(&mut self) -> Option<Exit> {
        if self.exit.is_none() {
            self.exit = reap(self.pid);
        }
        self.exit
    }

    /// Waits for the process to end. Cancel-safe.
    pub async fn exit(&mut self) -> Exit {
        loop {
            if let Some(e) = self.try_exit() {
                return e;
            }
            match self.pidfd.readable().await {
                Ok(mut ready) => {
                    if reap(self.pid).map(|e| self.exit = Some(e)).is_none() {
                        ready.clear_ready();
                    }
                }
                // The reactor is gone (runtime shutdown): nothing to wait with.
                Err(_) => std::future::pending::<()>().await,
            }
        }
    }

    /// Whether the process has ended (and been reaped).
    pub fn has_exited(&self) -> bool {
        self.exit.is_some()
    }

    /// Sends SIGKILL to the process and to its process group (it leads one).
    pub fn kill(&self) {
        if self.exit.is_some() {
            return;
        }
        let _ = rustix::process::pidfd_send_signal(self.pidfd.get_ref(), Signal::KILL);
        // The group id cannot have been reused: its leader is not reaped yet.
        let _ = rustix::process::kill_process_group(self.pid, Signal::KILL);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            self.kill();
            if let Ok(fd) = self.pidfd.get_ref().try_clone() {
                Orphans::keep(fd);
            }
        }
    }
}

/// A process that is not (yet) the daemon's child, such as a sandbox's init,
/// held by a pidfd so that it can be signalled safely and reaped once it is
/// handed to the daemon.
#[derive(Debug)]
pub struct Watched {
    pid: i32,
    pidfd: OwnedFd,
    /// In the nest: its pid there, and the nest's reports, since the nest's
    /// init, not the daemon, reaps it once bubblewrap is gone.
    nest: Option<(i32, Arc<Reaped>)>,
}

impl Watched {
    /// Opens `pid`, which the caller knows to be alive and unreaped (the
    /// child of a process it holds), so that the number cannot have been reused.
    pub fn open(pid: i32) -> io::Result<Watched> {
        let pid = Pid::from_raw(pid).ok_or_else(|| io::Error::other("pid 0"))?;
        Ok(Watched {
            pid: pid.as_raw_nonzero().get(),
            pidfd: rustix::process::pidfd_open(pid, PidfdFlags::NONBLOCK)?,
            nest: None,
        })
    }

    /// Waits (up to `within`) for the process to end and come to us, and
    /// reaps it with its resource usage: CPU time and peak resident memory
    /// of it and the children it waited for. `None` when it is not ours to
    /// reap (its parent reaped it, or the daemon is not its subreaper).
    pub async fn reap_with_usage(&self, within: Duration) -> Option<(Duration, u64)> {
        if let Some((nest_pid, reaped)) = &self.nest {
            let (nest_pid, reaped) = (*nest_pid, reaped.clone());
            return tokio::task::spawn_blocking(move || reaped.take(nest_pid, within))
                .await
                .ok()
                .flatten();
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match reap_pidfd_with_usage(&self.pidfd) {
                Ok(Some(usage)) => return Some(usage),
                Err(rustix::io::Errno::CHILD) if reaped_elsewhere(&self.pidfd) => return None,
                Err(e) if e != rustix::io::Errno::CHILD => return None,
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Its host pid: meaningful while the process is alive (the pidfd keeps
    /// the process, not the number).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn kill(&self) {
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, Signal::KILL);
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        // Nothing of a sandbox outlives what holds it: an init still alive
        // here belongs to a sandbox dropped unstarted, or left waiting by a
        // bubblewrap that ended early (see `kill_tree`).
        if !settled(&self.pidfd) {
            self.kill();
        }
        // Its parent (bubblewrap) normally reaps it; when bubblewrap ended
        // first, the process is ours (we are its subreaper) or PID 1's.
        if SUBREAPER.load(Ordering::Relaxed)
            && !settled(&self.pidfd)
            && let Ok(fd) = self.pidfd.try_clone()
        {
            Orphans::keep(fd);
        }
    }
}

/// Makes the daemon the reaper of its descendants' orphans (instead of the
/// host's PID 1, which in containers may never reap them).
pub fn become_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    SUBREAPER.store(true, Ordering::Relaxed);
    Ok(())
}

/// Set by [`become_subreaper`]: without it, a sandbox's init that bubblewrap
/// leaves behind goes to PID 1, and there is nothing for us to wait for.
static SUBREAPER: AtomicBool = AtomicBool::new(false);

/// Processes that were killed or handed over but not yet reaped.
struct Orphans;

static ORPHANS: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());

impl Orphans {
    fn keep(fd: OwnedFd) {
        let mut list = ORPHANS.lock().unwrap_or_else(|p| p.into_inner());
        list.retain(|fd| !settled(fd));
        list.push(fd);
    }
}

/// Reaps every kept process that has ended; forgets those that will never be
/// the daemon's to reap. Cheap; called after each run and periodically.
pub fn reap_orphans() {
    let mut list = ORPHANS.lock().unwrap_or_else(|p| p.into_inner());
    list.retain(|fd| !settled(fd));
}

/// How many processes still wait to be reaped (for tests and `doctor`).
pub fn orphans_pending() -> usize {
    ORPHANS.lock().map(|l| l.len()).unwrap_or(0)
}

/// True when the process behind `fd` needs nothing more from us: reaped
/// now, or already reaped by its parent. False while it runs, or while it
/// has ended as another's child (bubblewrap may still reap it; if
/// bubblewrap ended first, it comes to us).
fn settled(fd: &OwnedFd) -> bool {
    match rustix::process::waitid(
        WaitId::PidFd(fd.as_fd()),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    ) {
        Ok(Some(_)) => true,
        Ok(None) => false,
        Err(rustix::io::Errno::CHILD) => reaped_elsewhere(fd),
        Err(_) => true,
    }
}

/// Whether the process behind a pidfd has been reaped: the kernel then
/// shows its pid as -1 in the descriptor's fdinfo.
fn reaped_elsewhere(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("Pid:"))
                .is_none_or(|pid| pid.trim() == "-1")
        })
        .unwrap_or(true)
}
