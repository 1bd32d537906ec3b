//! Holding every process the daemon starts or inherits by pidfd: exits are
//! awaited on the runtime, signals reach the process a descriptor names
//! (never a recycled pid), and everything is reaped. A process dropped
//! while it still runs is killed and reaped later; with
//! [`become_subreaper`], the sandboxes' own init processes, which
//! bubblewrap may leave behind, come back to the daemon instead of the
//! host's PID 1 and are reaped here too.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};
use tokio::io::unix::AsyncFd;

use super::nest::Reaped;

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
        usage: Some((
            time(usage.ru_utime) + time(usage.ru_stime),
            (usage.ru_maxrss as u64) * 1024,
        )),
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

/// Puts `fd` on the runtime's reactor, to be awaited until readable (a
/// pidfd: until its process ends); gives it back if the reactor refuses it.
/// Must be called on the tokio runtime.
pub(super) fn on_reactor(fd: OwnedFd) -> Result<AsyncFd<OwnedFd>, (OwnedFd, io::Error)> {
    // SAFETY: the AsyncFd owns `fd`, unchanged, for its whole life.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts())
}

/// How a process ended and, once reaped, what it used.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub status: ExitStatus,
    /// User plus system CPU time of the process and the children it waited
    /// for, and the largest resident set of any of them; `None` for an exit
    /// learnt before the process was reaped ([`Exit::reported`]).
    pub usage: Option<(Duration, u64)>,
}

impl Exit {
    /// An exit as a process reported it before ending: `code` as a shell
    /// shows it (128 + N for a signal N).
    pub fn reported(code: i32) -> Exit {
        Exit {
            status: ExitStatus::from_raw((code & 0xff) << 8),
            usage: None,
        }
    }
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
        let pidfd = on_reactor(fd).map_err(|(_, e)| e)?;
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

    /// Waits up to `within` for the process to end (reaped or not); true
    /// when it has. For a sandbox's init, the end of every process in its
    /// pid namespace: the kernel kills them and waits for them first.
    pub async fn ended_within(&self, within: Duration) -> bool {
        let Ok(fd) = self.pidfd.try_clone() else {
            return false;
        };
        match on_reactor(fd) {
            Ok(fd) => tokio::time::timeout(within, fd.readable())
                .await
                .is_ok_and(|r| r.is_ok()),
            Err(_) => false,
        }
    }

    /// Whether the process has ended (reaped or not), now: as
    /// [`Watched::ended_within`], without waiting.
    pub fn has_ended(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(1))
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

/// A pidfd on `pid`, provided it is the sandbox init that `parent`
/// (bubblewrap, alive) started: a pid read from a pipe could otherwise name
/// a process that has since been reaped and replaced.
pub(super) fn watch_child_of(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reported_exit_reads_as_bubblewrap_wrote_it() {
        let (code, signal) = super::super::interpret_exit(Exit::reported(3).status);
        assert_eq!((code, signal), (Some(3), None));
        // bubblewrap's 128 + N for a program killed by signal N.
        let (code, signal) = super::super::interpret_exit(Exit::reported(137).status);
        assert_eq!((code, signal), (Some(137), Some(9)));
        assert!(Exit::reported(0).status.success());
        assert!(Exit::reported(0).usage.is_none());
    }
}
