//! bubblewrap's status protocol (`--json-status-fd`): one JSON document per
//! line. The first names the sandbox's init (`child-pid`, in bubblewrap's pid namespace); a
//! later one carries the program's `exit-code`, and is written only when the
//! sandbox was set up and the program ran. That difference tells bubblewrap's
//! own failures from the program's.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// bubblewrap writes a few hundred bytes; anything beyond this is not read.
const STATUS_CAP: usize = 64 * 1024;

#[derive(Debug)]
pub(super) struct Status {
    /// Read end, non-blocking.
    fd: OwnedFd,
    text: String,
}

impl Status {
    pub(super) fn new(fd: OwnedFd) -> Status {
        Status {
            fd,
            text: String::new(),
        }
    }

    /// Reads what bubblewrap has written so far, without waiting.
    fn read_available(&mut self) -> &str {
        let mut buf = [0u8; 4096];
        while self.text.len() < STATUS_CAP {
            match rustix::io::read(self.fd.as_fd(), &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.text.push_str(&String::from_utf8_lossy(&buf[..n])),
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
            if let Some(pid) = self.field("child-pid") {
                return Some(pid as i32);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut fds = [rustix::event::PollFd::new(
                &self.fd,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec::try_from(left).ok();
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(0) => return None,
                Ok(_) => {
                    let before = self.text.len();
                    self.read_available();
                    // Readable but nothing read: bubblewrap closed the pipe.
                    if self.text.len() == before && self.field("child-pid").is_none() {
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

    #[test]
    fn a_failed_set_up_has_no_init_and_no_exit() {
        let mut s = status_with("");
        assert_eq!(s.wait_for_init(Duration::from_secs(5)), None);
        assert!(!s.program_exited());
    }
}
