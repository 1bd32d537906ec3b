//! The pool of sandboxes set up ahead of time, by recipe. A dedicated thread
//! prepares them (fork, exec, cgroup migration and bubblewrap's set-up all
//! happen there, off any call's critical path); a call takes one and the
//! pool is topped up behind it. Only recipes registered with [`Pool::keep`]
//! are kept ready; anything else is prepared on demand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::recipe::{Recipe, RecipeKey};
use super::sandbox::Prepared;

/// Prepares a sandbox for a recipe; `None` once the executor is gone.
pub(super) type Prepare = Box<dyn Fn(&Recipe) -> Option<std::io::Result<Prepared>> + Send>;

#[derive(Debug)]
pub(super) struct Pool {
    ready: Mutex<HashMap<RecipeKey, Ready>>,
    /// Sandboxes to keep ready per kept recipe.
    target: usize,
    /// Hands work to the preparing thread.
    spawner: Mutex<Option<std::sync::mpsc::Sender<Arc<Recipe>>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set at shutdown: queued work is dropped, not prepared.
    closing: AtomicBool,
}

#[derive(Debug, Default)]
struct Ready {
    sandboxes: Vec<Prepared>,
    /// Being prepared right now.
    starting: usize,
    /// Registered with [`Pool::keep`]: topped up after each use.
    kept: bool,
}

impl Pool {
    pub(super) fn new(target: usize) -> Pool {
        Pool {
            ready: Mutex::new(HashMap::new()),
            target,
            spawner: Mutex::new(None),
            thread: Mutex::new(None),
            closing: AtomicBool::new(false),
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
                    let mut ready = pool.ready.lock().unwrap();
                    // Gone when the pool was drained meanwhile: the sandbox is dropped (killed).
                    let Some(r) = ready.get_mut(&recipe.key) else {
                        continue;
                    };
                    // Forgotten and kept again meanwhile: counted afresh.
                    r.starting = r.starting.saturating_sub(1);
                    match prepared {
                        Ok(p) => r.sandboxes.push(p),
                        // The memory budget is in use; calls prepare their own.
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => tracing::warn!("cannot prepare a sandbox ahead of time: {e}"),
                    }
                }
            });
        match started {
            Ok(thread) => {
                *self.spawner.lock().unwrap() = Some(tx);
                *self.thread.lock().unwrap() = Some(thread);
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
            .kept = true;
        self.refill(recipe);
    }

    /// A prepared sandbox for `key`, if one is ready and still alive.
    pub(super) fn take(&self, key: &RecipeKey) -> Option<Prepared> {
        loop {
            let mut p = self
                .ready
                .lock()
                .unwrap()
                .get_mut(key)
                .and_then(|r| r.sandboxes.pop())?;
            if p.is_alive() {
                return Some(p);
            }
        }
    }

    /// Tops up, in the background, the sandboxes for `recipe` if it is kept.
    pub(super) fn refill(&self, recipe: &Arc<Recipe>) {
        let Some(spawner) = self.spawner.lock().unwrap().clone() else {
            return;
        };
        let mut ready = self.ready.lock().unwrap();
        let Some(r) = ready.get_mut(&recipe.key).filter(|r| r.kept) else {
            return;
        };
        while r.sandboxes.len() + r.starting < self.target {
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
        let mut ready = self.ready.lock().unwrap();
        ready
            .values_mut()
            .max_by_key(|r| r.sandboxes.len())
            .and_then(|r| r.sandboxes.pop())
    }

    /// Stops keeping every recipe ready and hands back the sandboxes that
    /// wait; those being prepared are dropped (killed) when they are done.
    pub(super) fn forget_all(&self) -> Vec<Prepared> {
        std::mem::take(&mut *self.ready.lock().unwrap())
            .into_values()
            .flat_map(|r| r.sandboxes)
            .collect()
    }

    /// Stops preparing (waiting for the sandbox being prepared, if any) and
    /// hands back every waiting sandbox; for shutdown. Blocking.
    pub(super) fn drain(&self) -> Vec<Prepared> {
        self.closing.store(true, Ordering::SeqCst);
        *self.spawner.lock().unwrap() = None;
        let thread = self.thread.lock().unwrap().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
        self.forget_all()
    }
}
