//! The pool of sandboxes set up ahead of time, by recipe. A dedicated thread
//! prepares them (fork, exec, cgroup migration and bubblewrap's set-up all
//! happen there, off any call's critical path); a call takes one and the
//! pool is topped up behind it. Only recipes registered with [`Pool::keep`]
//! are kept ready; anything else is prepared on demand.
//!
//! How many wait follows demand: as many as calls of the recipe came in
//! the busiest second of the last minute, at least [`FLOOR`] and at most
//! the pool's bound (the number of runs at once). A quiet environment keeps
//! two, a busy one as many as can run; sandboxes beyond what is wanted are
//! handed back to be stopped (their memory back in the budget). A burst
//! larger than what waits is set up call by call, as without a pool.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::recipe::{Recipe, RecipeKey};
use super::sandbox::Prepared;
use crate::sync::Recover;

/// Prepares a sandbox for a recipe; `None` once the executor is gone.
pub(super) type Prepare = Box<dyn Fn(&Recipe) -> Option<std::io::Result<Prepared>> + Send>;

/// Sandboxes kept ready per kept recipe however quiet it is (when the
/// bound allows): a call, and the next one before the first's replacement
/// is ready.
pub(super) const FLOOR: usize = 2;
/// How far back demand is remembered.
const MEMORY: Duration = Duration::from_secs(60);
/// The window in which calls count as one burst.
const BURST: Duration = Duration::from_secs(1);
/// Calls remembered per recipe (enough to see any burst the bound allows).
const REMEMBERED: usize = 512;

#[derive(Debug)]
pub(super) struct Pool {
    ready: Mutex<HashMap<RecipeKey, Ready>>,
    /// The most sandboxes kept ready per kept recipe.
    target: usize,
    /// Hands work to the preparing thread.
    spawner: Mutex<Option<std::sync::mpsc::Sender<Arc<Recipe>>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set at shutdown: queued work is dropped, not prepared.
    closing: AtomicBool,
    /// Told each time a prepared sandbox joins the pool: a call waiting
    /// for the memory budget may take its share (see [`Pool::evict_one`]).
    added: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Ready {
    sandboxes: Vec<Prepared>,
    /// Being prepared right now.
    starting: usize,
    /// Registered with [`Pool::keep`]: topped up after each use, and when
    /// the pool is tended.
    kept: Option<Arc<Recipe>>,
    /// When calls asked for one, over the last [`MEMORY`].
    calls: VecDeque<Instant>,
}

impl Ready {
    fn called(&mut self, now: Instant) {
        if self.calls.len() == REMEMBERED {
            self.calls.pop_front();
        }
        self.calls.push_back(now);
    }

    /// How many to keep ready at `now`, within `bound` (see the header).
    fn wanted(&mut self, now: Instant, bound: usize) -> usize {
        while self
            .calls
            .front()
            .is_some_and(|t| now.duration_since(*t) > MEMORY)
        {
            self.calls.pop_front();
        }
        busiest(&self.calls).clamp(FLOOR.min(bound), bound)
    }
}

/// The most of `calls` (in order) within any one [`BURST`].
fn busiest(calls: &VecDeque<Instant>) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (i, t) in calls.iter().enumerate() {
        while t.duration_since(calls[first]) > BURST {
            first += 1;
        }
        most = most.max(i + 1 - first);
    }
    most
}

impl Pool {
    /// Sandboxes prepared and waiting for a call.
    pub(super) fn ready_count(&self) -> usize {
        self.ready
            .lock()
            .recover()
            .values()
            .map(|r| r.sandboxes.len())
            .sum()
    }

    pub(super) fn new(target: usize) -> Pool {
        Pool {
            ready: Mutex::new(HashMap::new()),
            target,
            spawner: Mutex::new(None),
            thread: Mutex::new(None),
            closing: AtomicBool::new(false),
            added: tokio::sync::Notify::new(),
        }
    }

    /// Starts the thread that prepares sandboxes, when sandboxes are to be
    /// kept at all. One long-lived thread: bubblewrap's parent-death signal
    /// follows the thread that forked it, and the cgroup migration it waits
    /// for must not block a runtime worker.
    pub(super) fn start_spawner(
        self: &Arc<Self>,
        runtime: tokio::runtime::Handle,
        prepare: Prepare,
    ) {
        if self.target == 0 {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Recipe>>();
        let pool = Arc::downgrade(self);
        let started = std::thread::Builder::new()
            .name("sandbox-spawner".into())
            .spawn(move || {
                let _runtime = runtime.enter();
                for recipe in rx {
                    let Some(pool) = pool.upgrade() else { break };
                    if pool.closing.load(Ordering::SeqCst) {
                        break;
                    }
                    let Some(prepared) = prepare(&recipe) else {
                        break;
                    };
                    let mut ready = pool.ready.lock().recover();
                    // Gone when the pool was drained meanwhile: the sandbox is dropped (killed).
                    let Some(r) = ready.get_mut(&recipe.key) else {
                        continue;
                    };
                    // Forgotten and kept again meanwhile: counted afresh.
                    r.starting = r.starting.saturating_sub(1);
                    match prepared {
                        Ok(p) => {
                            r.sandboxes.push(p);
                            pool.added.notify_waiters();
                        }
                        // The memory budget is in use; calls prepare their own.
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => tracing::warn!("cannot prepare a sandbox ahead of time: {e}"),
                    }
                }
            });
        match started {
            Ok(thread) => {
                *self.spawner.lock().recover() = Some(tx);
                *self.thread.lock().recover() = Some(thread);
            }
            Err(e) => {
                tracing::warn!("cannot start the sandbox spawner ({e}); sandboxes start on demand")
            }
        }
    }

    /// Keeps sandboxes ready for `recipe` from now on.
    pub(super) fn keep(&self, recipe: &Arc<Recipe>) {
        self.ready
            .lock()
            .unwrap()
            .entry(recipe.key.clone())
            .or_default()
            .kept = Some(recipe.clone());
        self.refill(recipe);
    }

    /// A prepared sandbox for `key`, if one is ready and still alive. The
    /// call counts as demand either way.
    pub(super) fn take(&self, key: &RecipeKey) -> Option<Prepared> {
        let mut ready = self.ready.lock().recover();
        let r = ready.get_mut(key)?;
        r.called(Instant::now());
        // One that died while it waited is dropped (its remains stopped).
        // Dead after starting ahead of its call, its interpreter ran the
        // empty code file instead of waiting in its hook: no more of those.
        let kept = r.kept.clone();
        std::iter::from_fn(|| r.sandboxes.pop()).find_map(|mut p| {
            if p.is_alive() {
                return Some(p);
            }
            if p.released()
                && let Some(recipe) = &kept
                && !recipe.warm_failed.swap(true, Ordering::SeqCst)
            {
                tracing::warn!(
                    "{}: the interpreter does not wait in its start-up hook; it is no longer started ahead of calls",
                    recipe.env.name
                );
            }
            None
        })
    }

    /// Tops up, in the background, the sandboxes for `recipe` if it is kept,
    /// to what its demand wants (what it no longer wants is stopped when
    /// the pool is tended).
    pub(super) fn refill(&self, recipe: &Arc<Recipe>) {
        if let Some(r) = self.ready.lock().recover().get_mut(&recipe.key) {
            self.top_up(r, Instant::now());
        }
    }

    /// Tops up every kept recipe to what its demand wants (sandboxes the
    /// memory budget refused earlier are tried again), and hands back those
    /// that wait beyond it (for the caller to stop).
    pub(super) fn tend(&self) -> Vec<Prepared> {
        let now = Instant::now();
        let mut surplus = Vec::new();
        for r in self.ready.lock().recover().values_mut() {
            let wanted = r.wanted(now, self.target);
            while r.sandboxes.len() > wanted {
                surplus.extend(r.sandboxes.pop());
            }
            self.top_up(r, now);
        }
        surplus
    }

    /// Asks the spawner for what `r` lacks, when it is kept.
    fn top_up(&self, r: &mut Ready, now: Instant) {
        let Some(spawner) = self.spawner.lock().recover().clone() else {
            return;
        };
        let Some(recipe) = r.kept.clone() else {
            return;
        };
        let wanted = r.wanted(now, self.target);
        while r.sandboxes.len() + r.starting < wanted {
            if spawner.send(recipe.clone()).is_err() {
                break;
            }
            r.starting += 1;
        }
    }

    /// Takes a waiting sandbox out of the pool (to free its share of the
    /// memory budget for a call that needs it): one of the recipe with the
    /// most waiting.
    pub(super) fn evict_one(&self) -> Option<Prepared> {
        // (A call that found none waits for `added` too: a sandbox being
        // prepared holds its share already, and would hold it until the
        // pool lets it go, a minute later.)
        let mut ready = self.ready.lock().recover();
        ready
            .values_mut()
            .max_by_key(|r| r.sandboxes.len())
            .and_then(|r| r.sandboxes.pop())
    }

    /// Resolves when a prepared sandbox next joins the pool.
    pub(super) fn added(&self) -> tokio::sync::futures::Notified<'_> {
        self.added.notified()
    }

    /// Stops keeping `key` ready and hands back the sandboxes that wait for it.
    pub(super) fn forget(&self, key: &RecipeKey) -> Vec<Prepared> {
        self.ready
            .lock()
            .unwrap()
            .remove(key)
            .map(|r| r.sandboxes)
            .unwrap_or_default()
    }

    /// Stops keeping every recipe ready and hands back the sandboxes that
    /// wait; those being prepared are dropped (killed) when they are done.
    pub(super) fn forget_all(&self) -> Vec<Prepared> {
        std::mem::take(&mut *self.ready.lock().recover())
            .into_values()
            .flat_map(|r| r.sandboxes)
            .collect()
    }

    /// Stops preparing (waiting for the sandbox being prepared, if any) and
    /// hands back every waiting sandbox; for shutdown. Blocking.
    pub(super) fn drain(&self) -> Vec<Prepared> {
        self.closing.store(true, Ordering::SeqCst);
        *self.spawner.lock().recover() = None;
        let thread = self.thread.lock().recover().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
        self.forget_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: &[u64]) -> VecDeque<Instant> {
        ms.iter()
            .map(|m| start + Duration::from_millis(*m))
            .collect()
    }

    #[test]
    fn the_busiest_second_counts() {
        let t = Instant::now();
        assert_eq!(busiest(&at(t, &[])), 0);
        assert_eq!(busiest(&at(t, &[0, 5000, 10000])), 1);
        // Four calls at once, then one now and then.
        assert_eq!(busiest(&at(t, &[0, 1, 2, 3, 4000, 9000])), 4);
        assert_eq!(busiest(&at(t, &[0, 600, 1200, 1800, 2400])), 2);
    }

    #[test]
    fn what_waits_follows_demand_within_the_bound() {
        let t = Instant::now();
        let mut r = Ready::default();
        // Quiet: the floor (or the bound, when smaller).
        assert_eq!(r.wanted(t, 8), FLOOR);
        assert_eq!(r.wanted(t, 1), 1);
        // A burst of six: six wait, as many as the bound allows.
        for i in 0..6 {
            r.called(t + Duration::from_millis(i * 10));
        }
        let later = t + Duration::from_secs(2);
        assert_eq!(r.wanted(later, 8), 6);
        assert_eq!(r.wanted(later, 4), 4);
        // A minute later the burst is forgotten.
        assert_eq!(r.wanted(t + MEMORY + Duration::from_secs(2), 8), FLOOR);
        assert!(r.calls.is_empty());
    }
}
