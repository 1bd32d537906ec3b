//! Resource limits: what each one is (`values.rs`: [`Limits`], resolved from
//! its layers) and how this host enforces it. `detect.rs` decides, once,
//! which mechanism the host offers and why; each mechanism is a file behind
//! one interface: cgroup v2 (`cgroup_v2.rs`) and cgroup v1 leaf groups
//! (`cgroup_v1.rs`) through the pool of groups in `groups.rs`, and rlimits
//! (`rlimits.rs`). Knows nothing about bubblewrap or MCP.
//!
//! Every limit, where it is applied, and what a result says when it is hit
//! (the sentence is `exec/ending.rs`'s; "—" is "not by this mechanism"):
//!
//! | limit (config) | cgroup v2 | cgroup v1 | rlimit | elsewhere | when hit |
//! |---|---|---|---|---|---|
//! | `timeout_ms` | — | — | — | the supervisor's deadline (`exec/supervise.rs`) | `timeout`, "exceeded its T ms time limit" |
//! | `memory_mb` | `memory.max`, `memory.swap.max` = 0 | `memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` | `RLIMIT_DATA` on bubblewrap, when no cgroup limits memory | the server's memory budget admits runs by it (`exec/admission.rs`) | `memory_limit`, "used more than its M MiB memory limit" (counted: `memory.events` / `memory.oom_control`); under rlimits an allocation fails in the program |
//! | `pids` | `pids.max` | `pids.max` | `RLIMIT_NPROC` on the sandbox's init, when no cgroup limits processes | — | `process_limit`, "hit its limit of P processes and threads" (counted: `pids.events`); under rlimits a fork fails in the program |
//! | `cpu_seconds` | counted: `cpu.stat` | counted: `cpuacct.usage` | `RLIMIT_CPU` on bubblewrap (per process) | the supervisor kills at the group's total | `cpu_limit`, "used more than its S s of CPU time" |
//! | `cpus` | `cpu.max` | `cpu.cfs_quota_us` over `cpu.cfs_period_us` | — | — | nothing: the run is slowed, not ended |
//! | `file_size_mb` | — | — | `RLIMIT_FSIZE` on bubblewrap | — | `file_size_limit`, "a file grew beyond the F MiB file size limit" |
//! | `open_files` | — | — | `RLIMIT_NOFILE` on bubblewrap | — | nothing: `open` fails with EMFILE in the program |
//! | `workspace_mb` | — | — | — | the size of the nest's one staged tmpfs, else bubblewrap's `--size` on each tmpfs (`jail/plan.rs`) | nothing: writes fail with ENOSPC in the program |
//! | `workspace_files` | — | — | — | `nr_inodes` of the nest's staged tmpfs (`exec/nest/stage.rs`) | nothing: creating fails with ENOSPC in the program |
//! | `output_bytes` | — | — | — | the capture keeps this much of each stream (`exec/capture.rs`) | the middle cut: "[... N bytes omitted ...]" |
//! | `output_limit_mb` | — | — | — | the supervisor counts every stream | `output_limit`, "wrote more than O MiB of output" |
//! | (core dumps) | — | — | `RLIMIT_CORE` = 0 | — | — |

mod cgroup_v1;
mod cgroup_v2;
mod detect;
mod groups;
mod rlimits;
mod values;

pub mod systemd;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

pub use detect::WithoutV2;
use groups::{Group, GroupPool};
pub use rlimits::Rlimit;
pub use values::Limits;

/// What the memory limit is without a cgroup, said wherever the limits are
/// described: RLIMIT_DATA counts a process's private memory only.
pub const RLIMITS_MEMORY: &str = "memory as RLIMIT_DATA, per process, which does not count shared memory: MAP_SHARED mappings, memfd and System V segments are not limited";

/// The active enforcement mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    CgroupV2,
    CgroupV1,
    Rlimits,
}

impl Mechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::CgroupV2 => "cgroup v2",
            Mechanism::CgroupV1 => "cgroup v1",
            Mechanism::Rlimits => "rlimits",
        }
    }
}

/// Limits that fired during a run, as far as the mechanism can tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fired {
    pub memory: bool,
    pub pids: bool,
}

/// Kernel counters of a group, against which fired limits are judged.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    oom_kills: u64,
    pids_max_hits: u64,
    /// CPU time the group used, in microseconds, where it is counted.
    cpu_usec: Option<u64>,
    /// The group's highest memory use, where it is counted.
    peak_memory: Option<u64>,
}

/// What a sandbox used, as far as its cgroup counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu: Option<std::time::Duration>,
    pub peak_memory_bytes: Option<u64>,
}

/// The soft open-files limit the daemon raises its own to, where the hard
/// limit allows (see [`raise_open_files_limit`]).
const DAEMON_OPEN_FILES: u64 = 65_536;

/// Raises this process's soft open-files limit to [`DAEMON_OPEN_FILES`]
/// (or the hard limit, if lower). The daemon holds descriptors for every
/// sandbox alive (its pipes and pidfd, a pooled cgroup's open control
/// files), while the usual soft default, 1024, is kept low for programs
/// that still use select(). Sandboxes are unaffected: their open-files
/// limit is set on bubblewrap (see `rlimits.rs`).
pub fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let wanted = now
        .maximum
        .map_or(DAEMON_OPEN_FILES, |hard| hard.min(DAEMON_OPEN_FILES));
    // `None` is unlimited.
    if now.current.is_none_or(|soft| soft >= wanted) {
        return;
    }
    let raised = rustix::process::Rlimit {
        current: Some(wanted),
        maximum: now.maximum,
    };
    if let Err(e) = setrlimit(Resource::Nofile, raised) {
        tracing::debug!("cannot raise the open-files limit: {e}");
    }
}

/// Decides and applies limits for every run of this daemon.
#[derive(Debug)]
pub struct Enforcer {
    groups: Option<Arc<GroupPool>>,
    rlimits: rlimits::Policy,
    /// Why no cgroup is used, when none is.
    fallback_note: Option<String>,
    /// Why cgroup v2 is not used and what would give it, when it is not.
    without_v2: Option<WithoutV2>,
}

impl Enforcer {
    /// Probes the host. Never fails: the worst case is rlimits alone, with the
    /// reason kept for `doctor`.
    pub fn detect() -> Enforcer {
        let detected = detect::hierarchy();
        match detected.hierarchy {
            Ok(h) => Enforcer {
                groups: Some(GroupPool::start(h)),
                rlimits: rlimits::Policy::with_cgroups(),
                fallback_note: None,
                without_v2: detected.without_v2,
            },
            Err(why) => Enforcer::without_groups(why, detected.without_v2),
        }
    }

    /// An enforcer that uses rlimits only, because `why`, where `step` would
    /// give it cgroup v2 (`NIX_SANDBOX_LIMITS=rlimits`).
    pub fn rlimits_only(why: &str, step: &str) -> Enforcer {
        let without_v2 = WithoutV2 {
            why: why.to_string(),
            step: step.to_string(),
        };
        Enforcer::without_groups(why.to_string(), Some(without_v2))
    }

    fn without_groups(why: String, without_v2: Option<WithoutV2>) -> Enforcer {
        Enforcer {
            groups: None,
            rlimits: rlimits::Policy::without_cgroups(),
            fallback_note: Some(why),
            without_v2,
        }
    }

    /// Why cgroup v2 is not used and the step that would give it, when the
    /// mechanism is a fallback (cgroup v1 or rlimits).
    pub fn without_cgroup_v2(&self) -> Option<&WithoutV2> {
        self.without_v2.as_ref()
    }

    pub fn mechanism(&self) -> Mechanism {
        match &self.groups {
            Some(g) => g.mechanism(),
            None => Mechanism::Rlimits,
        }
    }

    /// A sentence for `doctor` and `envs`.
    pub fn describe(&self) -> String {
        match (&self.groups, &self.fallback_note) {
            (Some(g), _) => format!("{}; rlimits for cpu, file size, open files", g.describe()),
            (None, note) => format!(
                "rlimits only (processes as RLIMIT_NPROC; {RLIMITS_MEMORY}); no usable cgroup: {}",
                note.as_deref().unwrap_or("not probed")
            ),
        }
    }

    /// Whether a CPU quota (`cpus`) is enforced.
    pub fn limits_cpu(&self) -> bool {
        self.groups.as_ref().is_some_and(|g| g.limits_cpu())
    }

    /// Creates `count` groups ahead of time so runs never wait on mkdir.
    pub fn warm(&self, count: usize) {
        if let Some(g) = &self.groups {
            g.warm(count);
        }
    }

    /// Reserves a group for one sandbox (none in rlimit mode). The sandbox's
    /// bubblewrap joins it itself before exec ([`Lease::join_at_exec`]) or
    /// is moved into it with [`Lease::adopt`]; limits are set with
    /// [`Lease::apply`] when the run is known.
    pub fn reserve(&self) -> io::Result<Lease> {
        let Some(pool) = &self.groups else {
            return Ok(Lease { cgroup: None });
        };
        Ok(Lease {
            cgroup: Some(CgroupLease {
                group: Some(pool.take()?),
                pool: pool.clone(),
                before: Counters::default(),
                call_cpu_usec: None,
                carried: false,
                joined: false,
            }),
        })
    }

    /// The rlimits set on bubblewrap for a run: always CPU, file size, open
    /// files and core dumps; memory too when no cgroup enforces it.
    pub fn rlimits(&self, limits: &Limits) -> Vec<Rlimit> {
        self.rlimits.for_limits(limits)
    }

    /// The rlimits set on the sandbox's init once its user namespace
    /// exists: the process limit, when no cgroup enforces it.
    pub fn init_rlimits(&self, limits: &Limits) -> Vec<Rlimit> {
        self.rlimits.for_init(limits)
    }

    /// Removes every prepared group (at shutdown).
    pub fn cleanup(&self) {
        if let Some(g) = &self.groups {
            g.cleanup();
        }
    }
}

/// Removes every cgroup this process made, whichever enforcer made it and
/// whichever thread still holds it: the last step before the process exits.
pub fn remove_every_group() {
    groups::remove_every_group();
}

/// A reserved group for one sandbox. Keep it alive until the sandbox has
/// ended, then call [`Lease::release`]; dropped earlier, it kills the group.
#[derive(Debug)]
pub struct Lease {
    cgroup: Option<CgroupLease>,
}

#[derive(Debug)]
struct CgroupLease {
    pool: Arc<GroupPool>,
    group: Option<Group>,
    /// The counters at the last check.
    before: Counters,
    /// CPU time at the start of the current call.
    call_cpu_usec: Option<u64>,
    /// `call_cpu_usec` is where the previous call ended (a session's next
    /// call begins there: its sandbox is paused in between).
    carried: bool,
    /// The sandbox's first process joins the group itself (see
    /// [`Lease::join_at_exec`]).
    joined: bool,
}

impl Lease {
    /// Moves process `pid` (a bubblewrap that has not started anything yet)
    /// into the group, unless it joined it itself. Blocking: the kernel may
    /// wait for an RCU grace period, which is why this happens before a
    /// run, not during it.
    pub fn adopt(&self, pid: u32) -> io::Result<()> {
        match &self.cgroup {
            Some(c) if !c.joined => match &c.group {
                Some(g) => c.pool.adopt(g, pid),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }

    /// Where the hierarchy lets a process move itself cheaply (cgroup v1):
    /// writes `limits` into the group and returns the descriptors through
    /// which the sandbox's first process, single-threaded, joins the group
    /// before it execs bubblewrap, by writing "0" to each. [`Lease::adopt`]
    /// then moves nothing. `None` where the process is moved by pid.
    pub fn join_at_exec(&mut self, limits: &Limits) -> io::Result<Option<Arc<Vec<OwnedFd>>>> {
        let Some(c) = &mut self.cgroup else {
            return Ok(None);
        };
        let Some(g) = &mut c.group else {
            return Ok(None);
        };
        let Some(joins) = c.pool.joins(g) else {
            return Ok(None);
        };
        c.pool.apply(g, limits)?;
        c.joined = true;
        Ok(Some(joins))
    }

    /// Sets the group's limits for the coming run and notes the counters
    /// against which fired limits are judged.
    pub fn apply(&mut self, limits: &Limits) -> io::Result<()> {
        if let Some(c) = &mut self.cgroup
            && let Some(g) = &mut c.group
        {
            c.pool.apply(g, limits)?;
            c.before = c.pool.counters(g);
            c.call_cpu_usec = c.before.cpu_usec;
        }
        Ok(())
    }

    /// Starts counting a new call's CPU time (a session's group serves many).
    pub fn begin_call(&mut self) {
        if let Some(c) = &mut self.cgroup
            && let Some(g) = &c.group
            && !c.carried
        {
            c.call_cpu_usec = c.pool.counters(g).cpu_usec;
        }
    }

    /// CPU time the group used since the current call began, where counted.
    pub fn call_cpu(&self) -> Option<std::time::Duration> {
        let c = self.cgroup.as_ref()?;
        let now = c.pool.counters(c.group.as_ref()?).cpu_usec?;
        Some(std::time::Duration::from_micros(
            now.saturating_sub(c.call_cpu_usec?),
        ))
    }

    /// What the current call used (its CPU time, and the group's highest
    /// memory use so far) and the limits that fired since the last look,
    /// from one reading of the group's counters.
    pub fn settle(&mut self) -> (Usage, Fired) {
        let Some(c) = &mut self.cgroup else {
            return Default::default();
        };
        let Some(g) = &c.group else {
            return Default::default();
        };
        let now = c.pool.counters(g);
        let usage = Usage {
            cpu: now
                .cpu_usec
                .zip(c.call_cpu_usec)
                .map(|(now, start)| std::time::Duration::from_micros(now.saturating_sub(start))),
            peak_memory_bytes: now.peak_memory,
        };
        let fired = Fired {
            memory: now.oom_kills > c.before.oom_kills,
            pids: now.pids_max_hits > c.before.pids_max_hits,
        };
        c.before = Counters {
            cpu_usec: c.before.cpu_usec,
            ..now
        };
        // The next call of a session begins where this one ended: the
        // sandbox is paused in between, so the counter is read once a call.
        c.call_cpu_usec = now.cpu_usec;
        c.carried = true;
        (usage, fired)
    }

    /// Whether the group counts CPU time (without reading it).
    pub fn counts_cpu(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(|c| c.group.is_some() && c.call_cpu_usec.is_some())
    }

    /// Freezes (or thaws) every process in the group. False when the
    /// mechanism cannot, which leaves it to the caller.
    pub fn freeze(&self, frozen: bool) -> bool {
        match self.group() {
            Some((pool, g)) => match pool.freeze(g, frozen) {
                Some(Ok(())) => true,
                Some(Err(e)) => {
                    tracing::warn!(
                        "cannot {} a cgroup: {e}",
                        if frozen { "freeze" } else { "thaw" }
                    );
                    false
                }
                None => false,
            },
            None => false,
        }
    }

    /// Kills every process still in the group (a backstop: the pid
    /// namespace normally takes them all down with it).
    pub fn kill_all(&self) {
        if let Some((pool, g)) = self.group() {
            pool.kill(g);
        }
    }

    /// Returns the group to the pool once it is empty (in the background),
    /// after the call's last [`Lease::settle`]. The lease holds nothing
    /// afterwards.
    pub fn release(&mut self) {
        if let Some(c) = self.cgroup.take()
            && let Some(group) = c.group
        {
            c.pool.recycle(group);
        }
    }

    fn group(&self) -> Option<(&GroupPool, &Group)> {
        let c = self.cgroup.as_ref()?;
        Some((&c.pool, c.group.as_ref()?))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(c) = &mut self.cgroup
            && let Some(g) = c.group.take()
        {
            c.pool.kill(&g);
            c.pool.recycle(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rlimit_mode_leases_hold_no_group() {
        let e = Enforcer::rlimits_only("test", "unset it");
        assert_eq!(e.mechanism(), Mechanism::Rlimits);
        assert!(e.describe().contains("test"));
        let l = Limits::resolve(Default::default());
        let mut lease = e.reserve().unwrap();
        assert!(lease.join_at_exec(&l).unwrap().is_none());
        lease.adopt(std::process::id()).unwrap();
        lease.apply(&l).unwrap();
        assert_eq!(lease.settle().1, Fired::default());
        lease.release();
    }

    /// Runs the shell `script` in a process that joins the lease's groups
    /// itself before its exec (as the sandbox's bubblewrap does), after it
    /// prints its own /proc/self/cgroup with builtins (no fork, so even
    /// with a process limit of 1). Returns whether it succeeded, and what
    /// it printed.
    fn run_joined(lease: &mut Lease, limits: &Limits, script: &str) -> (bool, String) {
        let joins = lease
            .join_at_exec(limits)
            .unwrap()
            .expect("v1 groups have tasks files");
        lease.apply(limits).unwrap();
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "while read -r l; do echo \"$l\"; done < /proc/self/cgroup; {script}"
            ))
            .stdout(std::process::Stdio::piped());
        // SAFETY: between fork and exec the closure only writes to
        // descriptors opened before the fork; it does not allocate.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                for f in joins.iter() {
                    rustix::io::write(f, b"0")?;
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        lease.adopt(child.id()).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    /// The line of /proc/PID/cgroup text for `controller`'s hierarchy.
    fn line_for<'a>(memberships: &'a str, controller: &str) -> &'a str {
        memberships
            .lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == controller))
            })
            .unwrap_or_else(|| panic!("no {controller} line in {memberships}"))
    }

    /// cgroup v1's enforcer where the host gives one; `test` skips visibly otherwise.
    fn v1_enforcer(test: &str) -> Option<Enforcer> {
        let e = Enforcer::detect();
        if e.mechanism() != Mechanism::CgroupV1 {
            crate::skip::skip(
                test,
                &format!("needs cgroup v1; limits here are {}", e.describe()),
            );
            return None;
        }
        Some(e)
    }

    /// Where this host gives cgroup v1 (root here), a process that writes
    /// "0" through the lease's descriptors before its exec is in the
    /// sandbox's group in every hierarchy, and adopt moves nothing more.
    #[test]
    fn a_process_joins_its_v1_groups_itself() {
        let Some(e) = v1_enforcer("limits::a_process_joins_its_v1_groups_itself") else {
            return;
        };
        let l = Limits::resolve(Default::default());
        let mut lease = e.reserve().unwrap();
        let (ok, memberships) = run_joined(&mut lease, &l, "true");
        lease.release();
        assert!(ok);
        for controller in ["memory", "pids"] {
            let line = line_for(&memberships, controller);
            assert!(
                line.contains("/nix-sandbox-mcp-") && line.contains("/run-"),
                "{line}"
            );
        }
    }

    /// A pooled v1 group that served a run which hit its process limit
    /// serves the next one afresh: the earlier run's limit is not reported
    /// again, and what the run used is read through the files kept open.
    #[test]
    fn a_reused_v1_group_reports_only_its_own_run() {
        let Some(e) = v1_enforcer("limits::a_reused_v1_group_reports_only_its_own_run") else {
            return;
        };
        let l = Limits::resolve(Default::default());
        // The shell is the one process allowed: its fork fails at once and
        // nothing is orphaned.
        let one = Limits { pids: 1, ..l };
        let mut first = e.reserve().unwrap();
        let (ok, memberships) = run_joined(&mut first, &one, "true & wait");
        assert!(!ok);
        let (_, fired) = first.settle();
        assert!(fired.pids, "{fired:?}");
        first.release();
        let group = line_for(&memberships, "memory").to_string();
        // The recycler returns the group to the pool once it is empty; the
        // pool hands out the group returned last, so the others stay held.
        let mut others = Vec::new();
        for _ in 0..100 {
            let mut next = e.reserve().unwrap();
            let (ok, memberships) = run_joined(&mut next, &l, "true & wait");
            assert!(ok);
            if line_for(&memberships, "memory") != group {
                others.push(next);
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            let (usage, fired) = next.settle();
            next.release();
            assert_eq!(fired, Fired::default());
            assert!(usage.peak_memory_bytes.is_some(), "{usage:?}");
            if let Some(cpu) = usage.cpu {
                assert!(cpu < std::time::Duration::from_secs(1), "{usage:?}");
            }
            return;
        }
        panic!("the group {group} did not come back to the pool");
    }
}
