//! Admission: at most `running` sandboxes run calls at once and at most
//! `max_waiting` calls wait for one; beyond that a call is refused at once
//! (`busy`) instead of piling up. Sessions and jobs take slots here too. And
//! the memory budget: every sandbox alive (prepared ahead, running a call or
//! a job, holding a session) reserves its memory limit from it for its whole
//! life, so that together they never promise more memory than the server
//! may use.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::ExecError;

#[derive(Debug)]
pub struct Admission {
    /// Whose places these are: the server's, or one caller's share of them.
    caller: bool,
    slots: Arc<Semaphore>,
    running: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// Whether a wait for a slot counts against the queue's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// A client's call: refused as busy when the queue is full.
    Bounded,
    /// The daemon's own work, which a client cannot multiply.
    Internal,
}

/// Permission to run one call; dropping it frees the slot.
pub type Slot = OwnedSemaphorePermit;

/// A call's places: in its caller's share, when it has one, and the
/// server's run slot. Dropping it frees both.
#[derive(Debug)]
pub struct Places {
    pub(super) _caller: Option<Slot>,
    pub(super) _server: Slot,
}

impl Admission {
    pub fn new(running: usize, max_waiting: usize) -> Admission {
        Admission {
            caller: false,
            slots: Arc::new(Semaphore::new(running)),
            running,
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// One caller's share: at most `running` of its calls in flight (run
    /// slots taken or waited for), and `max_waiting` more waiting to be.
    pub fn for_caller(running: usize, max_waiting: usize) -> Admission {
        Admission {
            caller: true,
            ..Admission::new(running, max_waiting)
        }
    }

    /// How many sandboxes may run calls at once.
    pub(super) fn max_running(&self) -> usize {
        self.running
    }

    /// How many calls may wait for a slot.
    pub(super) fn max_queued(&self) -> usize {
        self.max_waiting
    }

    /// Waits for a slot, or fails at once with `Busy` when too many calls
    /// already wait, or with `CancelledWhileQueued`. The daemon's own work
    /// (start-up checks of environments) waits whatever the queue holds.
    pub async fn slot(&self, cancel: &CancellationToken, queue: Queue) -> Result<Slot, ExecError> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _undo = Undo(&self.waiting);
        if queue == Queue::Bounded && waiting >= self.max_waiting {
            let (running, queued) = (self.running, waiting);
            return Err(match self.caller {
                true => ExecError::ShareBusy { running, queued },
                false => ExecError::Busy { running, queued },
            });
        }
        tokio::select! {
            p = self.slots.clone().acquire_owned() => Ok(p.expect("semaphore never closed")),
            _ = cancel.cancelled() => Err(ExecError::CancelledWhileQueued),
        }
    }

    /// Waits (up to `limit`) until no call holds a slot; for shutdown.
    pub(super) async fn quiesce(&self, limit: std::time::Duration) {
        let all = self.running as u32;
        let _ = tokio::time::timeout(limit, self.slots.acquire_many(all)).await;
    }
}

/// Takes a waiter off the count when its wait ends, however it ends.
struct Undo<'a>(&'a AtomicUsize);

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The server's memory budget, in MiB.
#[derive(Debug)]
pub(super) struct Budget {
    mib: Arc<Semaphore>,
    total_mib: u64,
}

/// Part of the budget, held by one sandbox; dropping it gives it back.
#[derive(Debug)]
pub(super) struct Reservation(#[allow(dead_code)] OwnedSemaphorePermit);

impl Budget {
    pub(super) fn new(total_mib: u64) -> Budget {
        let total_mib = total_mib.min(Semaphore::MAX_PERMITS as u64);
        Budget {
            mib: Arc::new(Semaphore::new(total_mib as usize)),
            total_mib,
        }
    }

    pub(super) fn total_mib(&self) -> u64 {
        self.total_mib
    }

    /// MiB of the budget held by sandboxes alive now.
    pub(super) fn used_mib(&self) -> u64 {
        self.total_mib - self.mib.available_permits() as u64
    }

    /// How many sandboxes with a memory limit of `bytes` the whole budget
    /// holds at once.
    pub(super) fn holds(&self, bytes: u64) -> u64 {
        self.total_mib / mib_of(bytes).max(1)
    }

    /// `bytes` of the budget, if that much is free now.
    pub(super) fn try_reserve(&self, bytes: u64) -> Option<Reservation> {
        let mib = u32::try_from(mib_of(bytes))
            .ok()
            .filter(|m| u64::from(*m) <= self.total_mib)?;
        self.mib
            .clone()
            .try_acquire_many_owned(mib)
            .ok()
            .map(Reservation)
    }

    /// Waits for `bytes` of the budget to be free (cancellable). Fails at
    /// once when the budget could never hold that much.
    pub(super) async fn reserve(
        &self,
        bytes: u64,
        cancel: &CancellationToken,
    ) -> Result<Reservation, ExecError> {
        let mib = mib_of(bytes);
        if mib > self.total_mib {
            return Err(ExecError::OverBudget {
                needed_mib: mib,
                budget_mib: self.total_mib,
            });
        }
        tokio::select! {
            r = self.mib.clone().acquire_many_owned(mib as u32) => {
                Ok(Reservation(r.expect("semaphore never closed")))
            }
            _ = cancel.cancelled() => Err(ExecError::CancelledWhileQueued),
        }
    }
}

fn mib_of(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// The default budget: half of the memory this process may use (the host's,
/// or its cgroup's limit when lower), in MiB.
pub fn default_budget_mib() -> u64 {
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map(|kib| kib >> 10)
        .unwrap_or(4096);
    let own = own_cgroup_limit_mib().unwrap_or(u64::MAX);
    (host.min(own) / 2).max(256)
}

/// The memory limit of this process's own cgroup, where one is set.
fn own_cgroup_limit_mib() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |path: String| -> Option<u64> {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let limit = if controllers.is_empty() {
            read(format!("/sys/fs/cgroup{path}/memory.max"))
        } else if controllers.split(',').any(|c| c == "memory") {
            read(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
        } else {
            None
        }?;
        // "max", or v1's "no limit" (a page-rounded i64::MAX), parse as none.
        (limit < 1 << 60).then_some(limit >> 20)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_budget_holds_what_sandboxes_reserve_and_refuses_what_cannot_fit() {
        let budget = Budget::new(1024);
        let a = budget.try_reserve(600 << 20).unwrap();
        assert!(budget.try_reserve(600 << 20).is_none());
        assert!(
            budget.try_reserve(2048 << 20).is_none(),
            "never more than the budget"
        );
        let cancel = CancellationToken::new();
        assert!(matches!(
            budget.reserve(2048 << 20, &cancel).await,
            Err(ExecError::OverBudget {
                needed_mib: 2048,
                budget_mib: 1024
            })
        ));
        drop(a);
        assert!(budget.try_reserve(600 << 20).is_some());
        assert_eq!(budget.holds(600 << 20), 1);
        assert_eq!(
            budget.holds((500 << 20) + 1),
            2,
            "counted in whole MiB, as reserved"
        );
        assert_eq!(Budget::new(12_000).holds(1024 << 20), 11);
        assert!(default_budget_mib() >= 256);
    }
}
