//! exec: the life of every sandboxed process, from admission to reaping.
//! One-shot runs, background jobs and sessions all go through here, and only
//! here are a sandbox's pipes read.
//!
//! The stages a sandbox passes through, in order:
//!
//! 1. **Recipe** (`recipe.rs`): the jail's plan (`jail::Plan`) with the
//!    seccomp filter and cgroup limits, fixed before a call arrives. Equal
//!    plans make interchangeable sandboxes; the plan is the pool's key.
//! 2. **Spawned** (`spawn/`): the pipes the plan names opened (`wiring.rs`),
//!    bubblewrap started (`launch.rs`) blocked reading its options from a
//!    pipe, the mounts staged from outside attached, the nest's report
//!    adopted, the sandbox put in its cgroup.
//! 3. **Prepared** (`sandbox.rs`): namespaces and mounts built, the sandbox's
//!    init known by pidfd, waiting on `--block-fd` to start the command. The
//!    pool (`prestart.rs`) keeps these ready per recipe; for bash, python and
//!    node it lets the command start at once, and the interpreter waits in a
//!    hook of its own start-up for the call's code (`warm.rs`).
//! 4. **Sandbox** (`sandbox.rs`): the call's code is in its file (or, for a
//!    session, the agent runs) and the command has started.
//! 5. **Supervised** (`supervise.rs`): the one loop that watches a sandbox
//!    through a call: deadline, cancellation, capped capture of every
//!    channel, killing the whole tree.
//! 6. **Outcome** (`outcome.rs`): exit status, output, duration, and which
//!    limit ended the run; `ending.rs` names how it ended, in the one set of
//!    sentences and exit statuses every caller uses.
//!
//! Before stage 3 a call passes **admission** (`admission.rs`): a bounded
//! number run at once and a bounded number wait. Every process is held by
//! pidfd and reaped in `process.rs`. Underneath bubblewrap, the **nest**
//! (`nest/`) is the process that owns a sandbox's namespaces: it stages the
//! project's overlay and the store views, keeps pooled network namespaces,
//! and takes every sandbox process with it when the server dies; what the
//! executor holds there is set up once, in `nest_parts.rs`.

mod admission;
pub mod capture;
mod child;
pub mod ending;
mod launch;
pub mod nest;
mod nest_parts;
mod outcome;
mod pidns;
mod prestart;
mod probes;
pub mod process;

mod recipe;
mod request;
mod sandbox;
mod spawn;
mod status;
pub mod supervise;
mod warm;
mod wiring;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

pub use admission::{Admission, Places, Queue, Slot, default_budget_mib};
pub(crate) use outcome::Counted;
pub use outcome::{LimitKind, Outcome};
pub use request::{AGENT_DIR, AgentRequest, Argv, Bounds, Request, code_problem};
pub use sandbox::Sandbox;
pub use supervise::{End, Protocol, RunOnce, Supervised, Watch, supervise};

use crate::config::Switches;
use crate::environment::Environment;
use crate::jail::ProjectMount;
use crate::limits::{Enforcer, Usage};
use crate::network::Proxy;
use crate::platform::Platform;
use crate::sync::Recover;
use admission::{Budget, Reservation};
use nest_parts::NestParts;
use prestart::Pool;
use recipe::{FromViews, Ingredients, Recipe, SeccompCache};
use sandbox::{Control, Prepared};

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Sees a run as it happens (terminal echo, progress, job logs).
pub trait Observer: Send + Sync {
    /// The run got a sandbox and its program is starting.
    fn started(&self) {}
    fn output(&self, stream: Stream, data: &[u8]);
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("all {running} run slots are busy and {queued} calls are already waiting")]
    Busy { running: usize, queued: usize },
    #[error(
        "this caller already has {running} runs in flight and {queued} waiting, its share of the server"
    )]
    ShareBusy { running: usize, queued: usize },
    #[error("cancelled while waiting for a run slot")]
    CancelledWhileQueued,
    #[error(
        "the code is {size} bytes, larger than this environment's file size limit ({limit} bytes)"
    )]
    CodeTooLarge { size: usize, limit: u64 },
    #[error(
        "this environment's memory limit ({needed_mib} MiB) is larger than the server's memory budget ({budget_mib} MiB)"
    )]
    OverBudget { needed_mib: u64, budget_mib: u64 },
    /// A step of starting the sandbox failed on the host.
    #[error("cannot start the sandbox: {step}: {source}")]
    Spawn {
        step: SpawnStep,
        #[source]
        source: std::io::Error,
    },
    /// bubblewrap ran but could not set the sandbox up; the program never
    /// started. `message` is what bubblewrap (or the interpreter) said.
    #[error("the sandbox could not be set up: {message}")]
    Setup {
        failure: SetupFailure,
        message: String,
    },
}

/// The step of starting a sandbox that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnStep {
    Seccomp,
    SessionPipes,
    StartBubblewrap,
    SetUp,
    CodeFile,
    StartProgram,
}

impl std::fmt::Display for SpawnStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpawnStep::Seccomp => "the seccomp filter",
            SpawnStep::SessionPipes => "the session's pipes",
            SpawnStep::StartBubblewrap => "starting bubblewrap",
            SpawnStep::SetUp => "setting the sandbox up",
            SpawnStep::CodeFile => "the code file",
            SpawnStep::StartProgram => "starting the program",
        })
    }
}

impl SpawnStep {
    /// The error of this step failing with `source`.
    pub(crate) fn failed(self, source: impl Into<std::io::Error>) -> ExecError {
        ExecError::Spawn {
            step: self,
            source: source.into(),
        }
    }
}

/// Why bubblewrap could not set a sandbox up, as far as a caller acts on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupFailure {
    /// The command could not be executed (not in the environment, or not
    /// a program): bubblewrap's `execvp` failed.
    CommandNotStarted,
    /// A session's interpreter did not come up.
    InterpreterNotReady,
    /// Anything else: a mount, a namespace, the host's configuration.
    Host,
}

impl SetupFailure {
    /// The failure bubblewrap's own words (its standard error) describe.
    fn of_bubblewrap(message: &str) -> SetupFailure {
        if message.contains("execvp") {
            SetupFailure::CommandNotStarted
        } else {
            SetupFailure::Host
        }
    }
}

/// Exit code and signal as the program saw them, from bubblewrap's exit
/// status (bubblewrap reports a program killed by signal N as 128 + N).
pub(crate) fn interpret_exit(status: std::process::ExitStatus) -> (Option<i32>, Option<i32>) {
    outcome::interpret(Some(status))
}

/// How long a call that took a waiting sandbox may run before the pool
/// prepares its replacement (it does at the call's end if sooner).
const REFILL_DELAY: Duration = Duration::from_millis(50);
/// How long after a call's end the pool prepares its replacement: time for
/// the result to reach the client first: setting a sandbox up takes a core
/// for a few milliseconds.
const REPLY_GRACE: Duration = Duration::from_millis(2);

/// Code larger than this is written to its file off the runtime's threads.
const LARGE_CODE: usize = 1 << 20;

/// Runs calls in sandboxes. Cheap to share: clones refer to the same state.
#[derive(Clone, Debug)]
pub struct Executor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    platform: Arc<Platform>,
    enforcer: Enforcer,
    seccomp: SeccompCache,
    admission: Admission,
    budget: Budget,
    pool: Arc<Pool>,
    /// Serves every sandbox that has network.
    proxy: Proxy,
    /// Every sandbox starts in the nest, when the host allows one; else why not.
    nest: Result<nest::Nest, String>,
    /// What staged sandboxes' bubblewrap needs of the host's root, when it
    /// runs in a root of its own (see `nest::root`); else why not.
    host_root: Result<nest::root::HostRoot, String>,
    /// Where environments' caches are kept, once the project is known.
    caches: std::sync::RwLock<Option<crate::caches::Caches>>,
    /// Store views by closure (`None`: the view could not be made, and
    /// the closure is bound path by path).
    views: Mutex<HashMap<Vec<PathBuf>, Option<Arc<nest::view::View>>>>,
    /// The view the /proc masks are mounted from (an empty file and an
    /// empty directory), when there is a nest; without it, or once it
    /// failed, bubblewrap mounts each mask.
    masks: Option<Arc<nest::view::View>>,
    /// What is turned off (see `config::knobs`).
    switches: Switches,
}

impl Executor {
    /// `prestart` sandboxes are kept ready per environment registered with
    /// [`Executor::keep_ready_for`] (0 for one-shot use such as the CLI).
    /// Keeping them needs a tokio runtime.
    pub fn new(
        platform: Arc<Platform>,
        enforcer: Enforcer,
        bounds: Bounds,
        proxy: Proxy,
        switches: Switches,
    ) -> Executor {
        let NestParts {
            nest,
            host_root,
            masks,
        } = NestParts::start(&platform, switches);
        let executor = Executor {
            inner: Arc::new(Inner {
                platform,
                enforcer,
                seccomp: SeccompCache::default(),
                admission: Admission::new(bounds.max_running, bounds.max_waiting),
                budget: Budget::new(bounds.memory_budget_mib),
                pool: Arc::new(Pool::new(bounds.prestart)),
                proxy,
                nest,
                host_root,
                caches: std::sync::RwLock::new(None),
                views: Mutex::default(),
                masks,
                switches,
            }),
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let owner = Arc::downgrade(&executor.inner);
            executor.inner.pool.start_spawner(
                runtime,
                Box::new(move |recipe| {
                    let inner = owner.upgrade()?;
                    // Its calls bind the closure path by path now, on demand.
                    let failed = |v: &Arc<nest::view::View>| {
                        v.failed.load(std::sync::atomic::Ordering::SeqCst)
                    };
                    if recipe.view.as_ref().is_some_and(failed)
                        || recipe.masks.as_ref().is_some_and(failed)
                    {
                        return Some(Err(std::io::ErrorKind::WouldBlock.into()));
                    }
                    let Some(reservation) =
                        inner.budget.try_reserve(recipe.env.limits.memory_bytes)
                    else {
                        return Some(Err(std::io::ErrorKind::WouldBlock.into()));
                    };
                    let warm = !recipe.warm_failed.load(std::sync::atomic::Ordering::SeqCst);
                    Some(
                        inner
                            .spawn(recipe, Vec::new())
                            .and_then(|s| s.set_up(recipe, inner.platform.run_as))
                            .map(|mut p| {
                                if warm {
                                    p.release();
                                }
                                Prepared {
                                    reservation: Some(reservation),
                                    ..p
                                }
                            }),
                    )
                }),
            );
        }
        executor
    }

    pub fn platform(&self) -> &Platform {
        &self.inner.platform
    }

    pub fn enforcer(&self) -> &Enforcer {
        &self.inner.enforcer
    }

    /// Keeps sandboxes ready for calls in `env` with this project and these
    /// inherited variables (the daemon's environment does not change).
    pub fn keep_ready_for(
        &self,
        env: &Environment,
        project: Option<&ProjectMount>,
        inherited: &[(String, String)],
    ) -> Result<(), ExecError> {
        let recipe = Arc::new(self.recipe(Ingredients::run(env, project, inherited))?);
        self.inner.pool.keep(&recipe);
        Ok(())
    }

    /// Stops keeping sandboxes ready for calls in `env` (see
    /// [`Executor::keep_ready_for`]); those waiting are stopped as they go.
    pub fn stop_keeping_ready_for(
        &self,
        env: &Environment,
        project: Option<&ProjectMount>,
        inherited: &[(String, String)],
    ) {
        if let Ok(recipe) = self.recipe(Ingredients::run(env, project, inherited)) {
            drop(self.inner.pool.forget(&recipe.key));
        }
    }

    fn recipe(&self, mut ingredients: Ingredients) -> Result<Recipe, ExecError> {
        ingredients.prestart &= self.inner.switches.warm_start;
        let stage_root = self
            .inner
            .nest
            .as_ref()
            .ok()
            .map(|_| self.inner.platform.stage_dir.as_path());
        let caches = match &*self.inner.caches.read().recover() {
            Some(c) => c.mounts(ingredients.env),
            None => Vec::new(),
        };
        let view = self.view_for(ingredients.env);
        let masks = self
            .inner
            .masks
            .clone()
            .filter(|m| !m.failed.load(std::sync::atomic::Ordering::SeqCst));
        Recipe::new(
            &self.inner.platform.layout,
            &self.inner.enforcer,
            &self.inner.seccomp,
            stage_root.map(|root| (root, self.inner.host_root.as_ref().ok())),
            FromViews { store: view, masks },
            caches,
            ingredients,
        )
    }

    /// Keeps environments' caches for `project` (see [`crate::caches`]),
    /// from the next sandbox prepared on.
    pub fn keep_caches(&self, project: Option<&ProjectMount>) {
        let view = project.map(|p| crate::caches::ProjectView {
            host_path: p.host_path.clone(),
            mount_point: p.mount_point.clone(),
            writable: p.access == crate::jail::ProjectAccess::ReadWrite
                || (p.access == crate::jail::ProjectAccess::Overlay && p.overlay),
        });
        *self.inner.caches.write().recover() =
            Some(crate::caches::Caches::new(view, self.inner.platform.run_as));
    }

    /// Keeps as many sandboxes ready as demand wants (see `prestart`):
    /// stops the others, prepares those missing; for a long-running server,
    /// every second or so.
    pub async fn tend_pool(&self) {
        for surplus in self.inner.pool.tend() {
            surplus.discard().await;
        }
    }

    /// Stops keeping sandboxes ready for the recipes registered so far (the
    /// project changed, so none of them applies) and stops those waiting.
    /// The store views go too (sandboxes that hold one keep it): the
    /// environments may be rebuilt for the new project.
    pub async fn forget_ready(&self) {
        self.inner.views.lock().recover().clear();
        for prepared in self.inner.pool.forget_all() {
            prepared.discard().await;
        }
    }

    /// Runs one call to completion (or timeout, limit, cancellation).
    pub async fn run(&self, req: Request<'_>) -> Result<Outcome, ExecError> {
        self.run_call(req, None, Queue::Bounded).await
    }

    /// Like [`Executor::run`], waiting for a slot as `queue` says.
    pub async fn run_queued(&self, req: Request<'_>, queue: Queue) -> Result<Outcome, ExecError> {
        self.run_call(req, None, queue).await
    }

    /// Runs `argv` (with `req.code` empty) instead of the environment's
    /// interpreter, in the same jail, limits and capture as [`Executor::run`].
    /// Never from a prepared sandbox: the command is part of the recipe.
    pub async fn run_argv(&self, req: Request<'_>, argv: Argv<'_>) -> Result<Outcome, ExecError> {
        self.run_call(req, Some(argv), Queue::Bounded).await
    }

    async fn run_call(
        &self,
        req: Request<'_>,
        argv: Option<Argv<'_>>,
        queue: Queue,
    ) -> Result<Outcome, ExecError> {
        let limits = req.env.limits;
        if req.code.len() as u64 > limits.file_size_bytes {
            return Err(ExecError::CodeTooLarge {
                size: req.code.len(),
                limit: limits.file_size_bytes,
            });
        }
        let recipe = Arc::new(self.recipe(Ingredients {
            command: argv.as_ref().map(|a| a.argv.to_vec()),
            workdir: argv.as_ref().map(|a| a.workdir.to_string()),
            ..Ingredients::run(req.env, req.project, req.inherited)
        })?);
        let _places = self.places(&req.cancel, req.share, queue).await?;
        let start = Instant::now();

        let pooled = match argv {
            None => self.inner.pool.take(&recipe.key),
            Some(_) => None,
        };
        // With the pool used up (a burst), its refill starts now, for the
        // calls behind this one. Otherwise another sandbox still waits, and
        // the refill starts when this call's result is out (REPLY_GRACE
        // after its end), or after REFILL_DELAY if it runs longer: setting
        // a sandbox (and its interpreter) up would take a core from a short
        // call while it runs.
        let kept = argv.is_none();
        let prepared = match pooled {
            Some(p) => {
                self.refill_after(&recipe, REFILL_DELAY);
                p
            }
            None => {
                // This call's memory first: a replacement asked for before
                // it could take the budget it waits for, and the next call
                // would run before this one.
                let reservation = self.reserve_memory(&limits, &req.cancel).await?;
                if kept {
                    self.inner.pool.refill(&recipe);
                }
                self.prepare_now(&recipe, Vec::new(), reservation).await?
            }
        };
        let prepared = with_code(prepared, req.code).await?;
        let network = recipe.network.as_ref().map(|p| (&self.inner.proxy, p));
        let mut sandbox = prepared
            .start(None, network)
            .map_err(|e| SpawnStep::StartProgram.failed(e))?;
        if let Some(o) = &req.observer {
            o.started();
        }
        let mut watched = supervise(
            &mut sandbox,
            &mut RunOnce,
            Watch {
                limits: &limits,
                cancel: &req.cancel,
                observer: req.observer.as_ref(),
            },
        )
        .await;
        let duration = start.elapsed();
        let (counted, fired) = sandbox.settle_call();
        let network = sandbox.network_report();
        let upper = sandbox.upper_layer().map(Arc::new);
        // Without a cgroup that counts, the kernel's own account: that of
        // the sandbox's init (bubblewrap does not wait for it), else
        // bubblewrap's, both known once bubblewrap has exited.
        let fallback_usage = match counted.cpu {
            None => {
                let exit = sandbox.ended().await;
                sandbox.reap_init_usage().await.or(exit.usage)
            }
            Some(_) => None,
        };
        if kept {
            self.refill_after(&recipe, REPLY_GRACE);
        }
        let set_up_failed = matches!(watched.end, End::Exited(_))
            && self.inner.platform.layout.features.json_status_fd
            && !sandbox.program_ran();
        // bubblewrap may still be tearing the sandbox's namespaces down
        // after reporting the exit: not the call's to wait for.
        tokio::spawn(sandbox.wind_down());
        if set_up_failed {
            let message = watched.stderr.text.trim();
            return Err(ExecError::Setup {
                failure: SetupFailure::of_bubblewrap(message),
                message: if message.is_empty() {
                    format!(
                        "bubblewrap exited with {:?}",
                        watched.exit.map(|e| e.status)
                    )
                } else {
                    message.to_string()
                },
            });
        }
        let usage = Usage {
            cpu: counted.cpu.or(fallback_usage.map(|(cpu, _)| cpu)),
            peak_memory_bytes: counted
                .peak_memory_bytes
                .or(fallback_usage.map(|(_, rss)| rss)),
        };
        let status = outcome::interpret(watched.exit.map(|e| e.status));
        Ok(Outcome::of_call(
            &mut watched,
            status,
            Counted {
                duration,
                usage,
                network,
                upper,
                fired,
            },
        ))
    }

    /// Tops `recipe`'s waiting sandboxes up once `delay` has passed.
    fn refill_after(&self, recipe: &Arc<Recipe>, delay: Duration) {
        let pool = self.inner.pool.clone();
        let recipe = recipe.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            pool.refill(&recipe);
        });
    }

    /// Starts a sandbox running a session's agent, with a control channel:
    /// the agent gets the descriptor numbers of its request and reply pipes
    /// as its two arguments. The sandbox counts against no run slot; the
    /// caller owns it (dropping it kills it).
    pub async fn start_agent(&self, req: AgentRequest<'_>) -> Result<Sandbox, ExecError> {
        let io = |e: std::io::Error| SpawnStep::SessionPipes.failed(e);
        let pipe =
            || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e.into()));
        let (requests_r, requests_w) = pipe()?;
        let (replies_r, replies_w) = pipe()?;
        // The node agent reopens its pipes through /proc to make them
        // close-on-exec; when the sandbox runs as another uid it needs the
        // permission. Only processes holding a pipe can reach it there.
        for (end, mode) in [(&requests_r, 0o644), (&replies_w, 0o622)] {
            rustix::fs::fchmod(end, rustix::fs::Mode::from_raw_mode(mode))
                .map_err(|e| io(e.into()))?;
        }
        let recipe = Arc::new(self.recipe(Ingredients {
            env: req.env,
            project: req.project,
            inherited: req.inherited,
            code_path: format!("{AGENT_DIR}/{}", req.env.file_name),
            extra_args: vec![
                requests_r.as_raw_fd().to_string(),
                replies_w.as_raw_fd().to_string(),
            ],
            command: None,
            workdir: None,
            prestart: false,
        })?);
        let reservation = self.reserve_memory(&req.env.limits, req.cancel).await?;
        let prepared = self
            .prepare_now(&recipe, vec![requests_r, replies_w], reservation)
            .await?;
        let prepared = with_code(prepared, req.program).await?;
        let control = Control {
            requests: pipe::Sender::from_owned_fd(requests_w).map_err(io)?,
            replies: pipe::Receiver::from_owned_fd(replies_r).map_err(io)?,
            partial: Vec::new(),
        };
        let network = recipe.network.as_ref().map(|p| (&self.inner.proxy, p));
        prepared
            .start(Some(control), network)
            .map_err(|e| SpawnStep::StartProgram.failed(e))
    }

    /// Reserves a sandbox's share of the memory budget, taking prepared
    /// sandboxes out of the pool to free it if need be, else waiting for
    /// running ones to end or for one being prepared to be ready (it holds
    /// its share from the start).
    async fn reserve_memory(
        &self,
        limits: &crate::limits::Limits,
        cancel: &CancellationToken,
    ) -> Result<Reservation, ExecError> {
        let budget = &self.inner.budget;
        loop {
            if let Some(r) = budget.try_reserve(limits.memory_bytes) {
                return Ok(r);
            }
            // Listening before looking: one that joins in between is seen.
            let added = self.inner.pool.added();
            tokio::pin!(added);
            added.as_mut().enable();
            match self.inner.pool.evict_one() {
                Some(waiting) => waiting.discard().await,
                None => tokio::select! {
                    reserved = budget.reserve(limits.memory_bytes, cancel) => return reserved,
                    () = &mut added => {}
                },
            }
        }
    }

    /// The memory budget, in MiB.
    pub fn memory_budget_mib(&self) -> u64 {
        self.inner.budget.total_mib()
    }

    /// MiB of the memory budget held by sandboxes alive now.
    pub fn memory_budget_used_mib(&self) -> u64 {
        self.inner.budget.used_mib()
    }

    /// Sandboxes prepared ahead and waiting for a call.
    pub fn sandboxes_ready(&self) -> usize {
        self.inner.pool.ready_count()
    }

    /// How many sandboxes with a memory limit of `bytes` the memory budget
    /// holds at once.
    pub fn budget_holds(&self, bytes: u64) -> u64 {
        self.inner.budget.holds(bytes)
    }

    /// How many calls may run at once (`max_concurrent_runs`).
    pub fn max_concurrent_runs(&self) -> usize {
        self.inner.admission.max_running()
    }

    /// How many calls may wait for a slot (`max_queued_runs`).
    pub fn max_queued_runs(&self) -> usize {
        self.inner.admission.max_queued()
    }

    /// Sets a sandbox up for `recipe` now, giving bubblewrap `extra`
    /// descriptors to pass on to the command.
    async fn prepare_now(
        &self,
        recipe: &Arc<Recipe>,
        extra: Vec<OwnedFd>,
        reservation: Reservation,
    ) -> Result<Prepared, ExecError> {
        let spawned = self
            .inner
            .spawn(recipe, extra)
            .map_err(|e| SpawnStep::StartBubblewrap.failed(e))?;
        let recipe = recipe.clone();
        let run_as = self.inner.platform.run_as;
        let prepared = tokio::task::spawn_blocking(move || spawned.set_up(&recipe, run_as))
            .await
            .map_err(|e| SpawnStep::SetUp.failed(e))?
            .map_err(|e| SpawnStep::SetUp.failed(e))?;
        Ok(Prepared {
            reservation: Some(reservation),
            ..prepared
        })
    }

    /// Waits for a place in the caller's `share` when it has one, then for
    /// a run slot (see `max_concurrent_runs`); fails at once with
    /// `ShareBusy` or `Busy` when too many calls already wait.
    pub async fn slot(
        &self,
        cancel: &CancellationToken,
        share: Option<&Admission>,
    ) -> Result<Places, ExecError> {
        self.places(cancel, share, Queue::Bounded).await
    }

    async fn places(
        &self,
        cancel: &CancellationToken,
        share: Option<&Admission>,
        queue: Queue,
    ) -> Result<Places, ExecError> {
        let caller = match share {
            Some(s) => Some(s.slot(cancel, Queue::Bounded).await?),
            None => None,
        };
        let server = self.inner.admission.slot(cancel, queue).await?;
        Ok(Places {
            _caller: caller,
            _server: server,
        })
    }

    /// Waits (up to a few seconds) until no run is in flight, then stops the
    /// prepared sandboxes and removes the cgroups; for shutdown.
    pub async fn shutdown(&self) {
        self.inner.admission.quiesce(Duration::from_secs(5)).await;
        let pool = self.inner.pool.clone();
        let waiting = tokio::task::spawn_blocking(move || pool.drain())
            .await
            .unwrap_or_default();
        for prepared in waiting {
            prepared.discard().await;
        }
        self.inner.enforcer.cleanup();
        // Give what the sandboxes left behind a moment to come back to us
        // and be reaped, rather than leave it to PID 1.
        for _ in 0..100 {
            process::reap_orphans();
            if process::orphans_pending() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Inner {
    fn spawn(&self, recipe: &Recipe, extra: Vec<OwnedFd>) -> std::io::Result<spawn::Spawned> {
        spawn::spawn(
            &self.platform,
            &self.enforcer,
            self.nest.as_ref().ok(),
            recipe,
            extra,
        )
    }
}

/// Writes `code` into a prepared sandbox's code file (large code off the
/// runtime's threads).
async fn with_code(mut prepared: Prepared, code: &[u8]) -> Result<Prepared, ExecError> {
    let io = |e: std::io::Error| SpawnStep::CodeFile.failed(e);
    if code.len() <= LARGE_CODE {
        prepared.write_code(code).map_err(io)?;
        return Ok(prepared);
    }
    let code = code.to_vec();
    tokio::task::spawn_blocking(move || prepared.write_code(&code).map(|()| prepared))
        .await
        .map_err(|e| io(e.into()))?
        .map_err(io)
}
