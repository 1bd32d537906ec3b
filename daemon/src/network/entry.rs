//! The way into a sandbox: a TCP listener on `127.0.0.1:PORT` that lives in
//! the sandbox's own network namespace but belongs to the daemon, which
//! accepts on it and proxies (`proxy.rs`).
//!
//! A socket stays in the network namespace it was created in, whoever holds
//! it later. So the daemon forks a short-lived child that joins the
//! sandbox's network namespace (and first the user namespace owning it,
//! which joining requires), creates, binds and listens, hands the listening
//! descriptor back over a socket pair (`SCM_RIGHTS`) and exits. A fork
//! rather than a thread because a multithreaded process cannot join a user
//! namespace; a fork rather than a re-exec because the child needs nothing
//! but a handful of system calls on data prepared before the fork, and
//! skipping the exec keeps it to about a millisecond. The child never
//! runs anything from the sandbox and never sees its pid namespace; when
//! the daemon runs as root it first takes the identity bubblewrap runs as,
//! so it holds no more in the sandbox's namespaces than bubblewrap's own
//! user does. Afterwards the daemon checks that the listener really is in
//! the sandbox's namespace.
//!
//! Why this is as safe as a Unix socket bound into the jail with a
//! forwarder process inside: in both designs the sandbox's namespace has
//! loopback only and no route out, and the one way out is a socket whose
//! far end the daemon holds. Here there is less of it: no forwarder
//! process in the jail that its code could kill, replace or talk past, no
//! socket file on the host to protect, and nothing the daemon runs inside
//! the jail at all. The sandbox's code can connect to the listener, as it
//! should; it cannot take the port over (the daemon binds it before the
//! command starts, without `SO_REUSEPORT`), and closing the daemon's
//! descriptor is beyond it. A tool that ignores the proxy variables finds
//! no route and, without a resolver configuration, no DNS: it fails.
//!
//! Call [`listen_in`] while the sandbox is prepared (bubblewrap waiting on
//! its block descriptor), before any of its code runs, and drop the
//! listener when the sandbox ends: it keeps the namespace alive.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};
use rustix::thread::LinkNameSpaceType;

/// How long the child may take (it needs about a millisecond).
const CHILD_LIMIT: Duration = Duration::from_secs(5);
/// How long the child waits for the sandbox's loopback to come up, in ms.
const LOOPBACK_WAIT_MS: u32 = 2000;
/// Pending connections the kernel queues before the proxy accepts them.
const BACKLOG: i32 = 128;
/// `ioctl(NS_GET_USERNS)`: the user namespace that owns a namespace.
const NS_GET_USERNS: libc::c_ulong = 0xb701;
/// `ioctl(SIOCGSKNS)`: the network namespace of a socket.
const SIOCGSKNS: libc::c_ulong = 0x894c;

/// A listener on `127.0.0.1:port` in the network namespace of the sandbox
/// whose init is `sandbox_init_pid` (alive, and held by the caller so the
/// pid cannot have been reused). `run_as` is the identity bubblewrap runs
/// as, when the daemon is root. Blocking, for about a millisecond.
pub fn listen_in(
    sandbox_init_pid: i32,
    run_as: Option<(u32, u32)>,
    port: u16,
) -> io::Result<TcpListener> {
    let pid = Pid::from_raw(sandbox_init_pid).ok_or_else(|| io::Error::other("pid 0"))?;
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty())?;
    let net = rustix::fs::open(
        format!("/proc/{sandbox_init_pid}/ns/net"),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Still alive after the open: the file is that process's namespace.
    if has_exited(&pidfd)? {
        return Err(io::Error::other(
            "the sandbox ended before its proxy listener was set up",
        ));
    }
    let own = rustix::fs::open(
        "/proc/self/ns/net",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if same_namespace(&net, &own)? {
        return Err(io::Error::other(
            "the sandbox shares the daemon's network namespace; a proxied sandbox needs its own (--unshare-net)",
        ));
    }
    let user = namespace_ioctl(&net, NS_GET_USERNS)?;
    let (ours, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    let child = Child {
        user,
        net,
        reply: theirs,
        run_as,
        addr: SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
    };
    // SAFETY: fork in a multithreaded process; the child (one thread) only
    // makes raw system calls on the data in `child`, prepared before the
    // fork, allocates nothing, takes no lock and leaves with `_exit`.
    let forked = unsafe { libc::fork() };
    if forked == 0 {
        let code = child.run();
        // SAFETY: ends the child at once, without running the parent's
        // destructors or exit handlers.
        unsafe { libc::_exit(code) };
    }
    if forked < 0 {
        return Err(io::Error::last_os_error());
    }
    let child_pid = Pid::from_raw(forked).expect("fork returned a pid");
    let Child { net, reply, .. } = child;
    drop(reply);
    let received = receive(&ours);
    if received.is_err() {
        let _ = rustix::process::kill_process(child_pid, Signal::KILL);
    }
    let _ = retrying(|| rustix::process::waitpid(Some(child_pid), WaitOptions::empty()));
    let listener = received?;
    let actual = namespace_ioctl(&listener, SIOCGSKNS)?;
    if !same_namespace(&actual, &net)? {
        return Err(io::Error::other(
            "the proxy listener is not in the sandbox's network namespace",
        ));
    }
    Ok(TcpListener::from(listener))
}

/// What the forked child needs, prepared before the fork.
struct Child {
    user: OwnedFd,
    net: OwnedFd,
    reply: OwnedFd,
    run_as: Option<(u32, u32)>,
    addr: SocketAddrV4,
}

/// The steps of the child, reported with the error when one fails.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Step {
    Identity = 1,
    JoinUser,
    JoinNet,
    Socket,
    Bind,
    Listen,
}

impl Step {
    fn describe(b: u8) -> &'static str {
        match b {
            1 => "taking the sandbox's identity",
            2 => "joining the sandbox's user namespace",
            3 => "joining the sandbox's network namespace",
            4 => "creating the socket",
            5 => "binding 127.0.0.1 in the sandbox",
            6 => "listening",
            _ => "an unknown step",
        }
    }
}

impl Child {
    /// Runs in the forked child. Only system calls; no allocation.
    fn run(&self) -> libc::c_int {
        match self.listen() {
            Ok(listener) => match send(self.reply.as_fd(), &[0; 5], Some(listener.as_fd())) {
                Ok(()) => 0,
                Err(_) => 1,
            },
            Err((step, errno)) => {
                let e = errno.raw_os_error().to_le_bytes();
                let _ = send(
                    self.reply.as_fd(),
                    &[step as u8, e[0], e[1], e[2], e[3]],
                    None,
                );
                1
            }
        }
    }

    fn listen(&self) -> Result<OwnedFd, (Step, Errno)> {
        if let Some((uid, gid)) = self.run_as {
            let at = |e| (Step::Identity, e);
            rustix::thread::set_thread_groups(&[]).map_err(at)?;
            let gid = rustix::process::Gid::from_raw(gid);
            rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(at)?;
            let uid = rustix::process::Uid::from_raw(uid);
            rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(at)?;
        }
        rustix::thread::move_into_link_name_space(self.user.as_fd(), Some(LinkNameSpaceType::User))
            .map_err(|e| (Step::JoinUser, e))?;
        rustix::thread::move_into_link_name_space(
            self.net.as_fd(),
            Some(LinkNameSpaceType::Network),
        )
        .map_err(|e| (Step::JoinNet, e))?;
        let socket = rustix::net::socket_with(
            AddressFamily::INET,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| (Step::Socket, e))?;
        // bubblewrap reports the sandbox's init before the init has brought
        // loopback up; until it has, some kernels refuse to bind 127.0.0.1.
        let mut waited = 0;
        loop {
            match rustix::net::bind(&socket, &self.addr) {
                Err(Errno::ADDRNOTAVAIL) if waited < LOOPBACK_WAIT_MS => {
                    let ms = rustix::thread::Timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    };
                    let _ = rustix::thread::nanosleep(&ms);
                    waited += 1;
                }
                r => break r.map_err(|e| (Step::Bind, e))?,
            }
        }
        rustix::net::listen(&socket, BACKLOG).map_err(|e| (Step::Listen, e))?;
        Ok(socket)
    }
}

/// Sends `data`, and `fd` if given, in one message.
fn send(to: BorrowedFd, data: &[u8], fd: Option<BorrowedFd>) -> rustix::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    rustix::net::sendmsg(to, &[IoSlice::new(data)], &mut control, SendFlags::empty())?;
    Ok(())
}

/// The child's answer: the listener, or the step that failed and why.
fn receive(from: &OwnedFd) -> io::Result<OwnedFd> {
    let mut poll = [rustix::event::PollFd::new(
        from,
        rustix::event::PollFlags::IN,
    )];
    let limit = rustix::event::Timespec::try_from(CHILD_LIMIT).map_err(io::Error::other)?;
    // The daemon's own signals (SIGCHLD, this child's among them) interrupt the wait.
    if retrying(|| rustix::event::poll(&mut poll, Some(&limit)))? == 0 {
        return Err(io::Error::other(
            "the listener set-up did not finish in time",
        ));
    }
    let mut data = [0u8; 5];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = retrying(|| {
        rustix::net::recvmsg(
            from,
            &mut [IoSliceMut::new(&mut data)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
    })?;
    let mut listener = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message
            && listener.is_none()
        {
            listener = fds.next();
        }
    }
    match (listener, msg.bytes) {
        (Some(fd), 5) if data[0] == 0 => Ok(fd),
        (_, 5) => {
            let cause = io::Error::from_raw_os_error(i32::from_le_bytes([
                data[1], data[2], data[3], data[4],
            ]));
            Err(io::Error::new(
                cause.kind(),
                format!("{}: {cause}", Step::describe(data[0])),
            ))
        }
        _ => Err(io::Error::other(
            "the listener set-up ended without an answer",
        )),
    }
}

/// Runs `call` again while a signal interrupts it.
fn retrying<T>(mut call: impl FnMut() -> rustix::io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(Errno::INTR) => {}
            r => return r.map_err(io::Error::from),
        }
    }
}

/// True when the process behind `pidfd` has ended.
fn has_exited(pidfd: &OwnedFd) -> io::Result<bool> {
    let mut poll = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    Ok(retrying(|| rustix::event::poll(&mut poll, Some(&zero)))? > 0)
}

fn same_namespace(a: &OwnedFd, b: &OwnedFd) -> io::Result<bool> {
    let (a, b) = (rustix::fs::fstat(a)?, rustix::fs::fstat(b)?);
    Ok((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino))
}

/// A namespace ioctl that returns a new descriptor.
fn namespace_ioctl(fd: &OwnedFd, request: libc::c_ulong) -> io::Result<OwnedFd> {
    // SAFETY: NS_GET_USERNS and SIOCGSKNS take no argument and return a new
    // descriptor, which nothing else owns.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a descriptor the kernel just opened for us (close-on-exec).
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}
