//! bubblewrap's status protocol (`--json-status-fd`): one JSON document per
//! line. The first names the sandbox's init (`child-pid`, in bubblewrap's pid namespace); a
//! later one carries the program's `exit-code`, and is written only when the
//! sandbox was set up and the program ran. That difference tells bubblewrap's
//! own failures from the program's. The exit code arrives as the program
//! ends, before bubblewrap itself has exited and torn its namespaces down,
//! so a call can end on it ([`Status::exit_reported`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

/// bubblewrap writes a few hundred bytes; anything beyond this is not read.
const STATUS_CAP: usize = 64 * 1024;

#[derive(Debug)]
pub(super) struct Status {
    /// Read end, non-blocking; on the runtime's reactor once [`Status::watch`]ed.
    fd: Channel,
    text: String,
    /// bubblewrap closed its end.
    closed: bool,
}

#[derive(Debug)]
enum Channel {
    Plain(OwnedFd),
    Watched(AsyncFd<OwnedFd>),
}

impl Channel {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Channel::Plain(fd) => fd.as_fd(),
            Channel::Watched(fd) => fd.get_ref().as_fd(),
        }
    }
}

impl Status {
    pub(super) fn new(fd: OwnedFd) -> Status {
        Status {
            fd: Channel::Plain(fd),
            text: String::new(),
            closed: false,
        }
    }

    /// Puts the channel on the runtime's reactor, for [`Status::exit_reported`].
    /// Must be called on the tokio runtime; the channel stays as it was if
    /// the reactor refuses it.
    pub(super) fn watch(self) -> Status {
        let Status { fd, text, closed } = self;
        let fd = match fd {
            Channel::Plain(fd) => match super::process::on_reactor(fd) {
                Ok(watched) => Channel::Watched(watched),
                Err((fd, _)) => Channel::Plain(fd),
            },
            watched => watched,
        };
        Status { fd, text, closed }
    }

    /// Reads what bubblewrap has written so far, without waiting.
    fn read_available(&mut self) -> &str {
        let mut buf = [0u8; 4096];
        while !self.closed && self.text.len() < STATUS_CAP {
            match rustix::io::read(self.fd.fd(), &mut buf) {
                Ok(0) => self.closed = true,
                Ok(n) => self.text.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
        }
        &self.text
    }

    /// The pid of the sandbox's init as bubblewrap's pid namespace knows it
    /// (the host's, or the nest's), waiting up to `limit` for
    /// bubblewrap to report it. `None` when bubblewrap ended (or failed)
    /// before creating the sandbox. Blocking.
    pub(super) fn wait_for_init(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(pid) = self.init_pid() {
                return Some(pid as i32);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let fd = self.fd.fd();
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec::try_from(left).ok();
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(0) => return None,
                Ok(_) => {
                    self.read_available();
                    if self.closed && self.init_pid().is_none() {
                        return None;
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return None,
            }
        }
    }

    /// True when bubblewrap reported the program's exit: the sandbox was set
    /// up and the program ran. Meaningful once bubblewrap has exited.
    pub(super) fn program_exited(&mut self) -> bool {
        self.read_available();
        self.field("exit-code").is_some()
    }

    /// The program's exit code as bubblewrap reports it (128 + N for a
    /// program killed by signal N), once it has. Never resolves when
    /// bubblewrap ends without reporting one (a failed set-up, bubblewrap
    /// killed) or the channel is not [`Status::watch`]ed: the caller then
    /// learns the end from bubblewrap's own exit.
    pub(super) async fn exit_reported(&mut self) -> i32 {
        loop {
            self.read_available();
            if let Some(code) = self.field("exit-code") {
                return code as i32;
            }
            let Channel::Watched(fd) = &self.fd else {
                return std::future::pending().await;
            };
            if self.closed {
                return std::future::pending().await;
            }
            match fd.readable().await {
                Ok(mut ready) => ready.clear_ready(),
                Err(_) => return std::future::pending().await,
            }
        }
    }

    /// The init's pid from the first document, before its line ends:
    /// bubblewrap writes the opening `{ "child-pid": N` in one write (the
    /// namespaces' ids follow in writes of their own) and a pipe delivers a
    /// write that small whole, so the spawner wakes once for the pid, not
    /// once a write. Any other shape is read as whole lines.
    fn init_pid(&self) -> Option<i64> {
        let opening = self.text.trim_start().strip_prefix('{')?.trim_start();
        let Some(rest) = opening.strip_prefix("\"child-pid\":") else {
            return self.field("child-pid");
        };
        let rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..digits].parse().ok()
    }

    /// The first numeric `key` in the documents read so far.
    fn field(&self, key: &str) -> Option<i64> {
        self.text.lines().find_map(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()?
                .get(key)?
                .as_i64()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_with(text: &str) -> Status {
        let (r, w) = rustix::pipe::pipe().unwrap();
        rustix::io::write(&w, text.as_bytes()).unwrap();
        drop(w);
        rustix::fs::fcntl_setfl(&r, rustix::fs::OFlags::NONBLOCK).unwrap();
        Status::new(r)
    }

    #[test]
    fn reads_the_init_and_the_exit() {
        let mut s = status_with(
            "{ \"child-pid\": 4242, \"pid-namespace\": 4026532181 }\n{ \"exit-code\": 3 }\n",
        );
        assert_eq!(s.wait_for_init(Duration::from_secs(1)), Some(4242));
        assert!(s.program_exited());
    }

    #[tokio::test]
    async fn the_exit_code_arrives_while_bubblewrap_still_runs() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        rustix::fs::fcntl_setfl(&r, rustix::fs::OFlags::NONBLOCK).unwrap();
        let mut s = Status::new(r);
        rustix::io::write(&w, b"{ \"child-pid\": 7 }\n").unwrap();
        assert_eq!(s.wait_for_init(Duration::from_secs(1)), Some(7));
        let mut s = s.watch();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // Split as a pipe may deliver it; the write end stays open.
            rustix::io::write(&w, b"{ \"exit-").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            rustix::io::write(&w, b"code\": 130 }\n").unwrap();
            w
        });
        let code = tokio::time::timeout(Duration::from_secs(5), s.exit_reported()).await;
        assert_eq!(code.ok(), Some(130));
        drop(writer.join());
    }

    #[tokio::test]
    async fn no_exit_code_is_made_up_when_bubblewrap_ends_without_one() {
        let mut s = status_with("{ \"child-pid\": 7 }\n").watch();
        let waited = tokio::time::timeout(Duration::from_millis(200), s.exit_reported()).await;
        assert!(waited.is_err(), "reported {waited:?}");
        assert!(!s.program_exited());
    }

    #[test]
    fn the_init_is_read_from_the_first_write_before_its_line_ends() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        rustix::fs::fcntl_setfl(&r, rustix::fs::OFlags::NONBLOCK).unwrap();
        let mut s = Status::new(r);
        rustix::io::write(&w, b"{ \"child-pid\": 4242").unwrap();
        assert_eq!(s.wait_for_init(Duration::from_secs(5)), Some(4242));
        rustix::io::write(
            &w,
            b", \"pid-namespace\": 4026532181 }\n{ \"exit-code\": 0 }\n",
        )
        .unwrap();
        drop(w);
        assert!(s.program_exited());
    }

    #[test]
    fn an_opening_without_a_pid_is_no_init() {
        for text in [
            "{ \"child-pid\": ",
            "{ \"child-pid\": x }\n",
            "{ \"exit-code\": 1 }\n",
        ] {
            let mut s = status_with(text);
            assert_eq!(s.wait_for_init(Duration::from_secs(5)), None, "{text}");
        }
    }

    #[test]
    fn a_failed_set_up_has_no_init_and_no_exit() {
        let mut s = status_with("");
        assert_eq!(s.wait_for_init(Duration::from_secs(5)), None);
        assert!(!s.program_exited());
    }
}
