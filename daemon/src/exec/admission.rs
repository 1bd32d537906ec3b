//! Admission: at most `running` sandboxes run calls at once and at most
//! `max_waiting` calls wait for one; beyond that a call is refused at once
//! (`busy`) instead of piling up. Sessions and jobs take slots here too.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::ExecError;

#[derive(Debug)]
pub(super) struct Admission {
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

impl Admission {
    pub(super) fn new(running: usize, max_waiting: usize) -> Admission {
        Admission {
            slots: Arc::new(Semaphore::new(running)),
            running,
            waiting: AtomicUsize::new(0),
            max_waiting,
        }
    }

    /// Waits for a slot, or fails at once with `Busy` when too many calls
    /// already wait, or with `CancelledWhileQueued`. The daemon's own work
    /// (start-up checks of environments) waits whatever the queue holds.
    pub(super) async fn slot(
        &self,
        cancel: &CancellationToken,
        queue: Queue,
    ) -> Result<Slot, ExecError> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _undo = Undo(&self.waiting);
        if queue == Queue::Bounded && waiting >= self.max_waiting {
            return Err(ExecError::Busy {
                running: self.running,
                queued: waiting,
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
