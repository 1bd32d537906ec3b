//! `serve --http systemd`: the listening socket systemd passes to a
//! socket-activated service (`LISTEN_PID`, `LISTEN_FDS`, the socket at
//! file descriptor 3), taken once at start and made close-on-exec so that
//! no sandbox or helper the server starts inherits it.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::str::FromStr;

use super::Address;

/// Where `--http` says to listen: an address to bind, or systemd's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    At(Address),
    Systemd,
}

impl FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Listen, String> {
        if s == "systemd" {
            return Ok(Listen::Systemd);
        }
        s.parse()
            .map(Listen::At)
            .map_err(|e| format!("{e}, or systemd"))
    }
}

/// Why systemd's socket could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error(
        "--http systemd: no socket was passed (LISTEN_PID and LISTEN_FDS are not this process's); start it from a systemd socket unit, or give an address"
    )]
    NotActivated,
    #[error(
        "--http systemd: systemd passed {0} sockets; give the service one socket unit with one ListenStream="
    )]
    Several(usize),
    #[error("--http systemd: the socket passed is not usable: {0}")]
    Unusable(String),
}

/// The socket systemd passed and the address it listens at.
#[derive(Debug)]
pub struct Inherited {
    pub address: Address,
    pub socket: OwnedFd,
}

/// The first socket systemd passed to this process (`SD_LISTEN_FDS_START`).
const FIRST_FD: i32 = 3;

/// Takes the listening socket systemd passed to this process. Called once,
/// before the server starts any process.
pub fn take() -> Result<Inherited, ActivationError> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok());
    let count = match (ours, count) {
        (true, Some(n)) if n > 0 => n,
        _ => return Err(ActivationError::NotActivated),
    };
    if count > 1 {
        return Err(ActivationError::Several(count));
    }
    // SAFETY: F_GETFD reads one descriptor's flags; it touches no memory.
    if unsafe { libc::fcntl(FIRST_FD, libc::F_GETFD) } < 0 {
        return Err(ActivationError::Unusable(format!(
            "descriptor {FIRST_FD} is not open"
        )));
    }
    // SAFETY: descriptor 3 is open (above) and nothing closes it while
    // it is borrowed here: no other part of the server owns it until it is
    // taken below.
    let passed = unsafe { BorrowedFd::borrow_raw(FIRST_FD) };
    // Checked before it is taken, so that a descriptor that is not the
    // socket is never closed by us.
    if rustix::net::sockopt::socket_type(passed).map_err(unusable)?
        != rustix::net::SocketType::STREAM
        || !rustix::net::sockopt::socket_acceptconn(passed).map_err(unusable)?
    {
        return Err(ActivationError::Unusable(
            "it is not a listening stream socket (ListenStream=)".into(),
        ));
    }
    let address = address_of(passed)?;
    rustix::io::fcntl_setfd(passed, rustix::io::FdFlags::CLOEXEC).map_err(unusable)?;
    // SAFETY: LISTEN_PID names this process, so systemd passed it the
    // listening socket at 3 (sd_listen_fds(3)), checked above; nothing else
    // in the process owns it, and this function is called once.
    let socket = unsafe { OwnedFd::from_raw_fd(FIRST_FD) };
    Ok(Inherited { address, socket })
}

/// A system call on the passed descriptor failed.
fn unusable(e: rustix::io::Errno) -> ActivationError {
    ActivationError::Unusable(e.to_string())
}

fn address_of(socket: impl AsFd) -> Result<Address, ActivationError> {
    let local = rustix::net::getsockname(socket).map_err(unusable)?;
    if let Ok(tcp) = std::net::SocketAddr::try_from(local.clone()) {
        return Ok(Address::Tcp(tcp));
    }
    rustix::net::SocketAddrUnix::try_from(local)
        .ok()
        .and_then(|unix| unix.path().map(|p| p.to_string_lossy().into_owned()))
        .filter(|p| p.starts_with('/'))
        .map(|p| Address::Unix(p.into()))
        .ok_or_else(|| {
            ActivationError::Unusable(
                "it is neither a TCP socket nor a Unix socket with a path".into(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_or_an_address() {
        assert_eq!("systemd".parse::<Listen>(), Ok(Listen::Systemd));
        assert_eq!(
            "127.0.0.1:1".parse::<Listen>(),
            Ok(Listen::At("127.0.0.1:1".parse().unwrap()))
        );
        let e = "systemd:3".parse::<Listen>().unwrap_err();
        assert!(e.ends_with("or systemd"), "{e}");
    }

    #[test]
    fn an_inherited_socket_says_where_it_listens() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = tcp.local_addr().unwrap();
        assert_eq!(address_of(&tcp).unwrap(), Address::Tcp(at));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert_eq!(address_of(&unix).unwrap(), Address::Unix(path));
    }
}
