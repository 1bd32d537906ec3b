//! The nest's own processes, run from this binary by a hidden subcommand:
//! the holder (`__nest`), which creates the nest's user and pid
//! namespaces and stays as long as the daemon, and the nest's init, forked
//! by the holder, pid 1 of the nest's pid namespace. Each dies with its
//! parent (the daemon, the holder); when the init dies the kernel kills
//! every process in the namespace, which is every sandbox.
//!
//! A sandbox's init that its bubblewrap leaves behind comes to the nest's
//! init, not to the daemon; the init reaps it and reports its resource
//! usage on its standard output (shared with the holder's, read by the
//! daemon), one line per process: `reaped PID CPU_MICROSECONDS MAXRSS_KIB`,
//! the pid as the nest sees it.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::ExitCode;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, Signal};
use rustix::thread::UnshareFlags;

/// The holder's argument: the daemon's pid, to tell a parent that died
/// before the parent-death signal was set from one that is alive.
pub const HOLDER: &str = "__nest";
/// What the holder writes on its standard output once the nest exists.
pub const READY: &[u8] = b"ready\n";
/// What a root holder writes once it has its user namespace, and waits for
/// the daemon to map every id in it (one byte on its standard input).
pub const MAP_ME: &[u8] = b"map-me\n";

/// The holder: creates the namespaces, starts the init, reports ready, then
/// waits until the daemon closes its standard input (shutdown) or the init
/// dies; either way it ends, and the nest with it.
pub fn holder_main(daemon: Option<&str>) -> ExitCode {
    match hold(daemon) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "nix-sandbox-mcp nest: {e}");
            ExitCode::from(1)
        }
    }
}

fn hold(daemon: Option<&str>) -> std::io::Result<()> {
    let daemon = daemon
        .and_then(|d| d.parse::<i32>().ok())
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::other("usage: __nest DAEMON_PID"))?;
    let die_with_daemon = || -> std::io::Result<()> {
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
        if rustix::process::getppid() != Some(daemon) {
            return Err(std::io::Error::other("the daemon is gone"));
        }
        Ok(())
    };
    die_with_daemon()?;
    let (uid, gid) = (rustix::process::geteuid(), rustix::process::getegid());
    // SAFETY: no CLONE_FILES or CLONE_FS: nothing shared with another
    // thread changes (the holder has one thread).
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER) }?;
    if uid.is_root() {
        // Every id, as on the host: overlayfs copies a changed file up with
        // its owner, who must exist in the namespace. Only a process outside
        // the namespace may map more than itself: the daemon does.
        std::io::stdout().write_all(MAP_ME)?;
        std::io::stdout().flush()?;
        let mut go = [0u8; 1];
        std::io::stdin().read_exact(&mut go)?;
    } else {
        // The one mapping an unprivileged process may write: itself.
        std::fs::write("/proc/self/setgroups", "deny")?;
        std::fs::write("/proc/self/uid_map", format!("{0} {0} 1", uid.as_raw()))?;
        std::fs::write("/proc/self/gid_map", format!("{0} {0} 1", gid.as_raw()))?;
    }
    // Gaining capabilities in the new namespace cleared the parent-death signal.
    die_with_daemon()?;
    // SAFETY: as above.
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWPID) }?;
    // The first child in the new pid namespace is its init. It holds the
    // read end of a pipe whose write end only the holder keeps: end of file
    // there means the holder is gone (should that happen before the init's
    // parent-death signal is set).
    let (holder_alive, keep_alive) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // SAFETY: the holder has one thread, so the child may go on running
    // ordinary code (no lock can be held by a thread that is not copied).
    let init = unsafe { libc::fork() };
    if init < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if init == 0 {
        drop(keep_alive);
        init_main(holder_alive);
    }
    drop(holder_alive);
    std::io::stdout().write_all(READY)?;
    std::io::stdout().flush()?;
    let init_pid = Pid::from_raw(init).ok_or_else(|| std::io::Error::other("pid 0"))?;
    let init_fd = rustix::process::pidfd_open(init_pid, rustix::process::PidfdFlags::empty())?;
    let stdin = std::io::stdin();
    let mut fds = [
        PollFd::new(&stdin, PollFlags::IN),
        PollFd::new(&init_fd, PollFlags::IN),
    ];
    loop {
        match poll(&mut fds, None) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    // Shutdown (or the init died): the init's end takes every sandbox with it.
    let _ = rustix::process::kill_process(init_pid, Signal::KILL);
    let _ = rustix::process::waitpid(Some(init_pid), rustix::process::WaitOptions::empty());
    drop(keep_alive);
    Ok(())
}

/// The nest's init: dies with the holder, reaps whatever is orphaned in the
/// namespace as soon as it ends, and reports what each used. Never returns.
fn init_main(holder_alive: OwnedFd) -> ! {
    let gone = |code: i32| -> ! {
        // SAFETY: _exit ends the process at once; nothing of the holder's
        // (buffers, destructors) must run twice.
        unsafe { libc::_exit(code) }
    };
    if rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).is_err() {
        gone(1);
    }
    let mut fds = [PollFd::new(&holder_alive, PollFlags::IN)];
    if !matches!(poll(&mut fds, Some(&Timespec::default())), Ok(0)) {
        gone(0);
    }
    // SIGCHLD stays pending while blocked, so a child that ends between a
    // reap and the wait below still wakes the wait: nothing is missed, and
    // nothing is polled.
    // SAFETY: sigset_t is a plain C value; sigemptyset/sigaddset initialise
    // it, and sigprocmask only reads it.
    let chld = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let mut out = std::io::stdout().lock();
    loop {
        while let Some((pid, cpu_us, maxrss_kib)) = reap_one() {
            // The daemon stopped reading: it is gone.
            if writeln!(out, "reaped {pid} {cpu_us} {maxrss_kib}")
                .and_then(|()| out.flush())
                .is_err()
            {
                gone(0);
            }
        }
        // SAFETY: waits for a signal in `chld`; the info pointer may be null.
        unsafe { libc::sigwaitinfo(&chld, std::ptr::null_mut()) };
    }
}

/// Reaps one child that has ended: its pid, CPU time (with that of the
/// children it waited for) and peak resident set. `None` when none has.
fn reap_one() -> Option<(i32, u64, u64)> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 writes only into the two local variables passed by pointer.
        let pid = unsafe { libc::wait4(-1, &mut status, libc::__WALL | libc::WNOHANG, &mut usage) };
        if pid > 0 {
            let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            return Some((
                pid,
                us(usage.ru_utime) + us(usage.ru_stime),
                usage.ru_maxrss as u64,
            ));
        }
        if pid == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}
