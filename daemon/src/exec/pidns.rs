//! A sandbox's processes seen from the host, for when no cgroup holds them
//! (the rlimit fallback): found by their pid namespace, which every process
//! of a sandbox shares and none can leave. Stops and continues them as a
//! whole (a session between calls) and adds up the CPU time and the memory
//! they used. One scan of /proc per use: fine for a session's calls, never
//! on a one-shot run's path.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use rustix::process::{Pid, Signal};

/// The processes whose pid namespace is `init`'s.
fn members(init: i32) -> Vec<i32> {
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

/// Sends `signal` to every process of the sandbox. For SIGSTOP, repeats
/// until no new process appears (one forking during the scan is caught on
/// the next pass).
pub(super) fn signal_all(init: i32, signal: Signal) {
    let mut done: Vec<i32> = Vec::new();
    for _ in 0..8 {
        let fresh: Vec<i32> = members(init)
            .into_iter()
            .filter(|p| !done.contains(p))
            .collect();
        if fresh.is_empty() {
            return;
        }
        for pid in &fresh {
            if let Some(p) = Pid::from_raw(*pid) {
                let _ = rustix::process::kill_process(p, signal);
            }
        }
        if signal != Signal::STOP {
            return;
        }
        done.extend(fresh);
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
