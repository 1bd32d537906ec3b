//! The half of `doctor` that runs inside a test sandbox, from this binary by
//! a hidden subcommand (`__probe WHAT`): it tries what the sandbox must
//! refuse and prints what happened, one `key value` line per try, for
//! `protections` to judge outside. Not for users, so not in `--help`.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::process::{Child, Command, ExitCode, Stdio};

/// The subcommand's name, as the first argument.
pub const PROBE: &str = "__probe";

/// Calls the kernel lets an unprivileged process make, each tried in a way
/// whose answer without the filter is not EPERM (success, EINVAL or
/// EAFNOSUPPORT), so an EPERM can only be the filter's.
pub const REFUSED_CALLS: &[&str] = &["pidfd_getfd", "setns", "socket_vsock"];

/// Runs one probe: `syscalls`, `processes MAX`, `memory MAX_MIB`, or
/// `wait` (a child of `processes`: it lives until its standard input ends).
pub fn probe_main(mut args: impl Iterator<Item = std::ffi::OsString>) -> ExitCode {
    let what = args.next();
    let max = args
        .next()
        .and_then(|a| a.to_str().and_then(|s| s.parse::<u64>().ok()));
    let done = match (what.as_ref().and_then(|w| w.to_str()), max) {
        (Some("syscalls"), _) => syscalls(),
        (Some("processes"), Some(max)) => processes(max),
        (Some("memory"), Some(max)) => memory(max),
        (Some("wait"), _) => std::io::stdin().read_to_end(&mut Vec::new()).map(|_| ()),
        _ => Err(std::io::Error::other(
            "usage: __probe syscalls | processes MAX | memory MAX_MIB",
        )),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "nix-sandbox-mcp probe: {e}");
            ExitCode::from(1)
        }
    }
}

/// `NAME ok` or `NAME ERRNO` for each of [`REFUSED_CALLS`].
fn syscalls() -> std::io::Result<()> {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
    let answer = |r: rustix::io::Result<()>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => e.raw_os_error().to_string(),
    };
    // Our own standard input, through a pidfd of our own: allowed to any
    // process without the filter.
    let getfd = pidfd_open(getpid(), PidfdFlags::empty()).and_then(|pidfd| {
        pidfd_getfd(
            &pidfd,
            std::io::stdin().as_raw_fd(),
            PidfdGetfdFlags::empty(),
        )
        .map(drop)
    });
    // Re-entering one's own user namespace: EINVAL without the filter.
    let setns = rustix::fs::open(
        "/proc/self/ns/user",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .and_then(|ns| {
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::User),
        )
    });
    // A vsock socket: created, or EAFNOSUPPORT where the host has no vsock.
    let vsock = rustix::net::socket(
        rustix::net::AddressFamily::VSOCK,
        rustix::net::SocketType::STREAM,
        None,
    )
    .map(drop);
    let mut out = std::io::stdout().lock();
    for (name, result) in REFUSED_CALLS.iter().zip([getfd, setns, vsock]) {
        writeln!(out, "{name} {}", answer(result))?;
    }
    Ok(())
}

/// Starts waiting children until a start fails or `max` run; prints
/// `started N` and `refused ERRNO` (or `refused none`), then ends them.
fn processes(max: u64) -> std::io::Result<()> {
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = Vec::new();
    let mut refused = None;
    while (children.len() as u64) < max {
        match Command::new(&exe)
            .args([PROBE, "wait"])
            .stdin(Stdio::piped())
            .spawn()
        {
            Ok(child) => children.push(child),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "started {}", children.len())?;
    match &refused {
        Some(e) => writeln!(out, "refused {}", e.raw_os_error().unwrap_or(0))?,
        None => writeln!(out, "refused none")?,
    }
    for child in &mut children {
        drop(child.stdin.take());
    }
    for mut child in children {
        child.wait()?;
    }
    Ok(())
}

/// Allocates and touches memory 4 MiB at a time up to `max_mib`, printing
/// `allocated MIB` after each step; `refused MIB` when an allocation fails
/// (an rlimit), `reached MIB` at the end. A cgroup kills it instead.
fn memory(max_mib: u64) -> std::io::Result<()> {
    const STEP: usize = 4 << 20;
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let mut out = std::io::stdout();
    while (kept.len() * STEP) as u64 >> 20 < max_mib {
        let mut block = Vec::new();
        if block.try_reserve_exact(STEP).is_err() {
            writeln!(out, "refused {}", (kept.len() * STEP) >> 20)?;
            return Ok(());
        }
        // Written, not only reserved, so that every page is charged.
        block.resize(STEP, 1);
        kept.push(block);
        writeln!(out, "allocated {}", (kept.len() * STEP) >> 20)?;
    }
    writeln!(out, "reached {}", (kept.len() * STEP) >> 20)
}
