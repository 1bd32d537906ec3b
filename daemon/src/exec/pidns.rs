//! A sandbox's processes seen from the host, for when no cgroup holds them
//! (the rlimit fallback) or none can freeze them (cgroup v1): every process
//! of a sandbox descends from its init, since orphans are reparented inside
//! its pid namespace, so the kernel's lists of children from the init down
//! name them all, at a cost that follows the sandbox's size, not the
//! host's (a scan of /proc by pid namespace where the kernel keeps no such
//! lists). Stops and continues them as a whole (a session between calls)
//! and adds up the CPU time and the memory they used.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal};

/// The most processes a sandbox is looked at for (its own limit is lower).
const MAX_MEMBERS: usize = 1 << 16;

/// The processes of `init`'s sandbox, `init` first.
fn members(init: i32) -> Vec<i32> {
    descendants(init).unwrap_or_else(|| same_namespace(init))
}

/// `init` and every process below it, from the kernel's lists of each
/// thread's children; `None` where the kernel keeps none.
fn descendants(init: i32) -> Option<Vec<i32>> {
    fs::metadata(format!("/proc/{init}/task/{init}/children")).ok()?;
    let mut out = vec![init];
    let mut next = 0;
    while next < out.len() && out.len() < MAX_MEMBERS {
        let pid = out[next];
        next += 1;
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            if let Ok(children) = fs::read_to_string(path) {
                out.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
    }
    Some(out)
}

/// The processes whose pid namespace is `init`'s: one look at every
/// process of the host.
fn same_namespace(init: i32) -> Vec<i32> {
    let ns = |pid: &str| fs::metadata(format!("/proc/{pid}/ns/pid")).map(|m| m.ino());
    let Ok(target) = ns(&init.to_string()) else {
        return Vec::new();
    };
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| ns(&pid.to_string()).is_ok_and(|i| i == target))
        .collect()
}

/// A sandbox's processes, stopped; held by pidfd where the kernel gives
/// one, so that continuing them names exactly these, never a process that
/// took a pid of theirs since.
#[derive(Debug, Default)]
pub(super) struct Stopped {
    held: Vec<OwnedFd>,
    /// Those stopped by pid (no pidfd).
    by_pid: Vec<i32>,
}

/// Stops every process of the sandbox, repeating until no new process
/// appears (one forking while the last was listed is caught on the next
/// pass; a stopped process forks no more).
pub(super) fn stop_all(init: i32) -> Stopped {
    let mut stopped = Stopped::default();
    let mut done: Vec<i32> = Vec::new();
    for _ in 0..8 {
        let fresh: Vec<i32> = members(init)
            .into_iter()
            .filter(|p| !done.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in &fresh {
            let Some(p) = Pid::from_raw(*pid) else {
                continue;
            };
            match rustix::process::pidfd_open(p, PidfdFlags::empty()) {
                Ok(fd) => {
                    let _ = rustix::process::pidfd_send_signal(&fd, Signal::STOP);
                    stopped.held.push(fd);
                }
                Err(_) => {
                    let _ = rustix::process::kill_process(p, Signal::STOP);
                    stopped.by_pid.push(*pid);
                }
            }
        }
        done.extend(fresh);
    }
    stopped
}

impl Stopped {
    /// Continues what [`stop_all`] stopped.
    pub(super) fn resume(self) {
        for fd in &self.held {
            let _ = rustix::process::pidfd_send_signal(fd, Signal::CONT);
        }
        for pid in self.by_pid.iter().filter_map(|p| Pid::from_raw(*p)) {
            let _ = rustix::process::kill_process(pid, Signal::CONT);
        }
    }
}

/// CPU time the sandbox's processes have used, with that of the children
/// they waited for, and the largest resident set among them.
pub(super) fn usage(init: i32) -> (Duration, u64) {
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    let mut cpu_ticks = 0u64;
    let mut peak_kib = 0u64;
    for pid in members(init) {
        if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) {
            // Fields after the command name: utime, stime, cutime, cstime
            // are the 14th to 17th fields of the line.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.split_whitespace().collect())
                .unwrap_or_default();
            cpu_ticks += fields
                .get(11..15)
                .unwrap_or_default()
                .iter()
                .filter_map(|f| f.parse::<u64>().ok())
                .sum::<u64>();
        }
        if let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) {
            let hwm = status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            peak_kib = peak_kib.max(hwm);
        }
    }
    (
        Duration::from_secs_f64(cpu_ticks as f64 / ticks as f64),
        peak_kib * 1024,
    )
}

/// The host pid of the child of `parent` (a host pid) that the pid
/// namespace one level below the host's knows as `inner`: bubblewrap
/// started in the nest names its sandbox's init that way.
pub(super) fn child_known_as(parent: i32, inner: i32) -> Option<i32> {
    let matches = |pid: i32| {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
        };
        let ppid = field("PPid:")?.first()?.parse::<i32>().ok()?;
        let nspid = field("NSpid:")?;
        (ppid == parent && nspid.get(1)?.parse::<i32>().ok()? == inner).then_some(pid)
    };
    // The kernel's list of children, where it keeps one; else the pids just
    // after the parent's (where a new child usually is), else all of them.
    if let Ok(children) = fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")) {
        return children
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .find_map(matches);
    }
    (parent + 1..parent + 64).find_map(matches).or_else(|| {
        fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find_map(matches)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pid: i32) -> char {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .unwrap_or('?')
    }

    /// Waits (signals are delivered asynchronously) until `pid`'s state is
    /// or is not `T`.
    fn becomes(pid: i32, stopped: bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (state(pid) == 'T') != stopped {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Kills the tree whatever the test's outcome.
    struct Tree(Vec<i32>);
    impl Drop for Tree {
        fn drop(&mut self) {
            for p in self.0.iter().rev().filter_map(|p| Pid::from_raw(*p)) {
                let _ = rustix::process::kill_process(p, Signal::KILL);
            }
        }
    }

    #[test]
    fn a_tree_is_found_stopped_and_continued_whole() {
        // A parent whose child starts two more.
        let mut top = std::process::Command::new("sh")
            .args(["-c", "sh -c 'sleep 30 & sleep 30' & wait"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = top.id() as i32;
        let mut tree = Tree(vec![pid]);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while tree.0.len() < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            tree.0 = members(pid);
        }
        assert_eq!(tree.0.len(), 4, "{:?}", tree.0);
        assert_eq!(tree.0[0], pid);
        let stopped = stop_all(pid);
        for p in &tree.0 {
            assert!(becomes(*p, true), "{p} of {:?} was not stopped", tree.0);
        }
        stopped.resume();
        for p in &tree.0 {
            assert!(becomes(*p, false), "{p} of {:?} was not continued", tree.0);
        }
        drop(tree);
        let _ = top.wait();
    }
}
