//! Network namespaces for sandboxes without network, made in the nest and
//! used again. Such a sandbox needs a network namespace holding nothing
//! but a loopback; bubblewrap making one per sandbox, and the kernel
//! tearing it down after, is the largest single cost of a sandbox's
//! set-up (1 to 2 ms of CPU of a 7 ms bare bubblewrap here, mostly the
//! kernel's cleanup work after the sandbox). So the child that becomes
//! bubblewrap joins one from a pool, or makes one (loopback up) when the
//! pool is empty, and bubblewrap makes none (`jail::Call::network_given`).
//!
//! Policy:
//! - One sandbox at a time: sandboxes alive together never share a
//!   loopback, nor the abstract unix sockets bound in its namespace.
//! - A namespace goes back to the pool only once every process that was in
//!   it has ended: bubblewrap, and the sandbox's init, which the kernel
//!   lets end only after every other process of its pid namespace (see
//!   `Sandbox::wind_down`). Sockets close with their processes. One whose
//!   sandbox was not seen to end (killed, a session's, discarded) is
//!   dropped, not used again.
//! - Owned by the nest's user namespace, not by the sandbox's: no process
//!   of a sandbox holds a capability over it (bubblewrap drops them all,
//!   and the nest's are never given), so its loopback, addresses, routes
//!   and rules stay as made.
//! - What one sandbox can see of an earlier one: the loopback's packet
//!   counters, and for a minute its closed TCP connections in TIME_WAIT
//!   (/proc/net/tcp). Sandboxes of one server serve one client.
//! - Environments with network keep a namespace bubblewrap makes for each
//!   sandbox: the proxy listens there.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketType};
use rustix::thread::{LinkNameSpaceType, UnshareFlags};

/// How many idle namespaces the pool keeps (about 20 KiB of kernel memory
/// each); more are closed.
const IDLE_MOST: usize = 32;

/// Idle network namespaces, each with its loopback up.
#[derive(Debug, Default)]
pub(in crate::exec) struct Pool {
    idle: Mutex<Vec<OwnedFd>>,
}

impl Pool {
    fn take(&self) -> Option<OwnedFd> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn put(&self, namespace: OwnedFd) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_MOST {
            idle.push(namespace);
        }
    }

    /// What the child does for a sandbox: join an idle namespace, or make one.
    pub(in crate::exec) fn plan(&self) -> Plan {
        match self.take() {
            Some(namespace) => Plan::Join(namespace),
            None => Plan::Make,
        }
    }
}

/// A sandbox's network namespace, from the pool or new, held as long as
/// the sandbox. Dropped, it goes back to the pool if [`Held::vacated`]
/// was called, and is closed otherwise.
#[derive(Debug)]
pub struct Held {
    namespace: Option<OwnedFd>,
    pool: Arc<Pool>,
    vacated: bool,
}

impl Held {
    pub(in crate::exec) fn new(namespace: OwnedFd, pool: Arc<Pool>) -> Held {
        Held {
            namespace: Some(namespace),
            pool,
            vacated: false,
        }
    }

    /// Says that no process is left in the namespace: it may serve another
    /// sandbox.
    pub(in crate::exec) fn vacated(&mut self) {
        self.vacated = true;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let (true, Some(namespace)) = (self.vacated, self.namespace.take()) {
            self.pool.put(namespace);
        }
    }
}

/// What the child that becomes bubblewrap does about its network namespace.
#[derive(Debug)]
pub(in crate::exec) enum Plan {
    /// Joins this idle one.
    Join(OwnedFd),
    /// Makes a new one, its loopback up.
    Make,
}

impl Plan {
    /// In the child, inside the nest's user namespace: the namespace it is
    /// in afterwards, to report to the daemon. Only system calls.
    /// An idle namespace that cannot be joined is replaced by a new one.
    pub(super) fn apply(&self) -> Result<NamespaceFd<'_>, Errno> {
        if let Plan::Join(namespace) = self
            && rustix::thread::move_into_link_name_space(
                namespace.as_fd(),
                Some(LinkNameSpaceType::Network),
            )
            .is_ok()
        {
            return Ok(NamespaceFd::Joined(namespace.as_fd()));
        }
        // SAFETY: only CLONE_NEWNET, which changes nothing this
        // (single-threaded) process relies on.
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNET) }?;
        loopback_up()?;
        // The daemon's /proc, mounted for the host's pid namespace, where
        // this process has a pid too.
        let own = rustix::fs::open(
            c"/proc/self/ns/net",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(NamespaceFd::Made(own))
    }
}

/// The namespace a child is in, as it reports it.
pub(super) enum NamespaceFd<'a> {
    Joined(BorrowedFd<'a>),
    Made(OwnedFd),
}

impl NamespaceFd<'_> {
    pub(super) fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            NamespaceFd::Joined(fd) => *fd,
            NamespaceFd::Made(fd) => fd.as_fd(),
        }
    }
}

/// Sets the new namespace's loopback up, as bubblewrap does for the one it
/// makes (the kernel gives it 127.0.0.1 and ::1 then).
fn loopback_up() -> Result<(), Errno> {
    let socket = rustix::net::socket(AddressFamily::INET, SocketType::DGRAM, None)?;
    let fd = rustix::fd::AsRawFd::as_raw_fd(&socket);
    // SAFETY: `request` is a zeroed ifreq (valid for every field of its
    // union) naming "lo"; both ioctls read and write only that struct,
    // which outlives them, and `fd` is the socket held above.
    let result = unsafe {
        let mut request: libc::ifreq = std::mem::zeroed();
        for (to, from) in request.ifr_name.iter_mut().zip(b"lo") {
            *to = *from as libc::c_char;
        }
        let mut result = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut request);
        if result == 0 {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            result = libc::ioctl(fd, libc::SIOCSIFFLAGS, &request);
        }
        result
    };
    match result {
        0 => Ok(()),
        _ => Err(Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        )),
    }
}
