//! exec: the life of every sandboxed process, from admission to reaping.
//! One-shot runs, background jobs and sessions all go through here, and only
//! here are a sandbox's pipes read.
//!
//! The stages a sandbox passes through, in order:
//!
//! 1. **Recipe** (`recipe.rs`): everything a sandbox is fixed to before a call
//!    arrives: bubblewrap's options, the command, seccomp, rlimits, cgroup
//!    limits. Equal recipes make interchangeable sandboxes.
//! 2. **Spawned** (`spawn.rs`): bubblewrap forked and exec'd, blocked reading
//!    its options from a pipe, not yet in its cgroup.
//! 3. **Prepared** (`sandbox.rs`): in its cgroup, namespaces and mounts built,
//!    the sandbox's init known by pidfd, waiting on `--block-fd` to start the
//!    command. The pool (`prestart.rs`) keeps these ready per recipe.
//! 4. **Sandbox** (`sandbox.rs`): the call's code is in its file (or, for a
//!    session, the agent runs) and the command has started.
//! 5. **Supervised** (`supervise.rs`): the one loop that watches a sandbox
//!    through a call: deadline, cancellation, capped capture of every
//!    channel, killing the whole tree.
//! 6. **Outcome** (`outcome.rs`): exit status, output, duration, and which
//!    limit ended the run.
//!
//! Before stage 3 a call passes **admission** (`admission.rs`): a bounded
//! number run at once and a bounded number wait. Every process is held by
//! pidfd and reaped in `spawn.rs`.

mod admission;
pub mod capture;
mod outcome;
mod prestart;

mod recipe;
mod sandbox;
pub mod spawn;
mod status;
pub mod supervise;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

pub use admission::Slot;
pub(crate) use outcome::attribute_limits;
pub use outcome::{LimitKind, Outcome};
pub use sandbox::Sandbox;
pub use supervise::{End, Protocol, RunOnce, Supervised, Watch, supervise};

use crate::environment::Environment;
use crate::jail::ProjectMount;
use crate::limits::Enforcer;
use crate::platform::Platform;
use admission::Admission;
use prestart::Pool;
use recipe::{Ingredients, Recipe, SeccompCache};
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
    #[error("cancelled while waiting for a run slot")]
    CancelledWhileQueued,
    #[error(
        "the code is {size} bytes, larger than this environment's file size limit ({limit} bytes)"
    )]
    CodeTooLarge { size: usize, limit: u64 },
    #[error("cannot start the sandbox: {0}")]
    Spawn(String),
    /// bubblewrap ran but could not set the sandbox up; the program never started.
    #[error("the sandbox could not be set up: {0}")]
    Setup(String),
}

/// One call to run.
pub struct Request<'a> {
    pub env: &'a Environment,
    pub code: &'a [u8],
    pub project: Option<&'a ProjectMount>,
    /// Values of the `inherit_env` variables from the daemon's environment.
    pub inherited: &'a [(String, String)],
    pub cancel: CancellationToken,
    pub observer: Option<Arc<dyn Observer>>,
}

/// A command run as is instead of an interpreter on a code file: bubblewrap
/// execs `argv[0]` (looked up in the environment's `PATH`) with no shell.
#[derive(Debug, Clone, Copy)]
pub struct Argv<'a> {
    pub argv: &'a [String],
    /// Where it starts, inside the sandbox.
    pub workdir: &'a str,
}

/// A sandbox whose program keeps running and takes calls on a control
/// channel (a session's agent).
pub struct AgentRequest<'a> {
    pub env: &'a Environment,
    pub project: Option<&'a ProjectMount>,
    pub inherited: &'a [(String, String)],
    /// The agent's source, run by the environment's interpreter.
    pub program: &'a [u8],
}

/// Where a session's agent file appears in its sandbox: outside /workspace,
/// which belongs to the code the agent runs.
pub const AGENT_DIR: &str = "/run/nsm";

/// Exit code and signal as the program saw them, from bubblewrap's exit
/// status (bubblewrap reports a program killed by signal N as 128 + N).
pub(crate) fn interpret_exit(status: std::process::ExitStatus) -> (Option<i32>, Option<i32>) {
    outcome::interpret(Some(status))
}

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
    pool: Arc<Pool>,
}

impl Executor {
    /// `prestart` sandboxes are kept ready per environment registered with
    /// [`Executor::keep_ready_for`] (0 for one-shot use such as the CLI).
    /// Keeping them needs a tokio runtime.
    pub fn new(
        platform: Arc<Platform>,
        enforcer: Enforcer,
        max_running: usize,
        max_waiting: usize,
        prestart: usize,
    ) -> Executor {
        let executor = Executor {
            inner: Arc::new(Inner {
                platform,
                enforcer,
                seccomp: SeccompCache::default(),
                admission: Admission::new(max_running, max_waiting),
                pool: Arc::new(Pool::new(prestart)),
            }),
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let owner = Arc::downgrade(&executor.inner);
            executor.inner.pool.start_spawner(
                runtime,
                Box::new(move |recipe| {
                    let inner = owner.upgrade()?;
                    Some(
                        inner
                            .spawn(recipe, Vec::new())
                            .and_then(|s| s.set_up(recipe)),
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
        let recipe = Arc::new(self.recipe(Ingredients {
            env,
            project,
            inherited,
            code_path: crate::jail::code_path(env),
            extra_args: Vec::new(),
            command: None,
            workdir: None,
        })?);
        self.inner.pool.keep(&recipe);
        Ok(())
    }

    fn recipe(&self, ingredients: Ingredients) -> Result<Recipe, ExecError> {
        Recipe::new(
            &self.inner.platform.layout,
            &self.inner.enforcer,
            &self.inner.seccomp,
            ingredients,
        )
    }

    /// Runs one call to completion (or timeout, limit, cancellation).
    pub async fn run(&self, req: Request<'_>) -> Result<Outcome, ExecError> {
        self.run_call(req, None).await
    }

    /// Runs `argv` (with `req.code` empty) instead of the environment's
    /// interpreter, in the same jail, limits and capture as [`Executor::run`].
    /// Never from a prepared sandbox: the command is part of the recipe.
    pub async fn run_argv(&self, req: Request<'_>, argv: Argv<'_>) -> Result<Outcome, ExecError> {
        self.run_call(req, Some(argv)).await
    }

    async fn run_call(
        &self,
        req: Request<'_>,
        argv: Option<Argv<'_>>,
    ) -> Result<Outcome, ExecError> {
        let limits = req.env.limits;
        if req.code.len() as u64 > limits.file_size_bytes {
            return Err(ExecError::CodeTooLarge {
                size: req.code.len(),
                limit: limits.file_size_bytes,
            });
        }
        let recipe = Arc::new(self.recipe(Ingredients {
            env: req.env,
            project: req.project,
            inherited: req.inherited,
            code_path: crate::jail::code_path(req.env),
            extra_args: Vec::new(),
            command: argv.as_ref().map(|a| a.argv.to_vec()),
            workdir: argv.as_ref().map(|a| a.workdir.to_string()),
        })?);
        let _slot = self.slot(&req.cancel).await?;
        let start = Instant::now();

        let pooled = match argv {
            None => self.inner.pool.take(&recipe.key),
            Some(_) => None,
        };
        let prepared = match pooled {
            Some(p) => p,
            None => self.prepare_now(&recipe, Vec::new()).await?,
        };
        if argv.is_none() {
            self.inner.pool.refill(&recipe);
        }
        let prepared = with_code(prepared, req.code).await?;
        let mut sandbox = prepared
            .start(None)
            .map_err(|e| ExecError::Spawn(e.to_string()))?;
        if let Some(o) = &req.observer {
            o.started();
        }
        let watched = supervise(
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
        let fired = sandbox.finish();
        let set_up_failed = matches!(watched.end, End::Exited(_))
            && self.inner.platform.layout.json_status_fd
            && !sandbox.program_ran();
        drop(sandbox);
        spawn::reap_orphans();
        if set_up_failed {
            let message = watched.stderr.text.trim();
            return Err(ExecError::Setup(if message.is_empty() {
                format!(
                    "bubblewrap exited with {:?}",
                    watched.exit.map(|e| e.status)
                )
            } else {
                message.to_string()
            }));
        }
        let ours = match watched.end {
            End::Timeout => Some(LimitKind::Timeout),
            End::Output => Some(LimitKind::Output),
            _ => None,
        };
        let (exit_code, signal) = outcome::interpret(watched.exit.map(|e| e.status));
        let mut outcome = Outcome {
            exit_code,
            signal,
            stdout: watched.stdout,
            stderr: watched.stderr,
            duration,
            timed_out: matches!(watched.end, End::Timeout),
            cancelled: matches!(watched.end, End::Cancelled),
            limit: None,
            limits_reached: Vec::new(),
        };
        attribute_limits(&mut outcome, ours, fired);
        Ok(outcome)
    }

    /// Starts a sandbox running a session's agent, with a control channel:
    /// the agent gets the descriptor numbers of its request and reply pipes
    /// as its two arguments. The sandbox counts against no run slot; the
    /// caller owns it (dropping it kills it).
    pub async fn start_agent(&self, req: AgentRequest<'_>) -> Result<Sandbox, ExecError> {
        let io = |what: &str, e: std::io::Error| ExecError::Spawn(format!("{what}: {e}"));
        let pipe = || {
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| io("session pipes", e.into()))
        };
        let (requests_r, requests_w) = pipe()?;
        let (replies_r, replies_w) = pipe()?;
        // The node agent reopens its pipes through /proc to make them
        // close-on-exec; when the sandbox runs as another uid it needs the
        // permission. Only processes holding a pipe can reach it there.
        for (end, mode) in [(&requests_r, 0o644), (&replies_w, 0o622)] {
            rustix::fs::fchmod(end, rustix::fs::Mode::from_raw_mode(mode))
                .map_err(|e| io("session pipes", e.into()))?;
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
        })?);
        let prepared = self
            .prepare_now(&recipe, vec![requests_r, replies_w])
            .await?;
        let prepared = with_code(prepared, req.program).await?;
        let control = Control {
            requests: pipe::Sender::from_owned_fd(requests_w)
                .map_err(|e| io("session pipes", e))?,
            replies: pipe::Receiver::from_owned_fd(replies_r)
                .map_err(|e| io("session pipes", e))?,
            partial: Vec::new(),
        };
        prepared
            .start(Some(control))
            .map_err(|e| io("session start", e))
    }

    /// Sets a sandbox up for `recipe` now, giving bubblewrap `extra`
    /// descriptors to pass on to the command.
    async fn prepare_now(
        &self,
        recipe: &Arc<Recipe>,
        extra: Vec<OwnedFd>,
    ) -> Result<Prepared, ExecError> {
        let spawned = self
            .inner
            .spawn(recipe, extra)
            .map_err(|e| ExecError::Spawn(e.to_string()))?;
        let recipe = recipe.clone();
        tokio::task::spawn_blocking(move || spawned.set_up(&recipe))
            .await
            .map_err(|e| ExecError::Spawn(e.to_string()))?
            .map_err(|e| ExecError::Spawn(e.to_string()))
    }

    /// Waits for a run slot (see `max_concurrent_runs`), or fails at once
    /// with `Busy` when too many calls already wait.
    pub async fn slot(&self, cancel: &CancellationToken) -> Result<Slot, ExecError> {
        self.inner.admission.slot(cancel).await
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
        spawn::reap_orphans();
    }
}

impl Inner {
    fn spawn(&self, recipe: &Recipe, extra: Vec<OwnedFd>) -> std::io::Result<spawn::Spawned> {
        spawn::spawn(&self.platform, &self.enforcer, recipe, extra)
    }
}

/// Writes `code` into a prepared sandbox's code file (large code off the
/// runtime's threads).
async fn with_code(mut prepared: Prepared, code: &[u8]) -> Result<Prepared, ExecError> {
    let io = |e: std::io::Error| ExecError::Spawn(format!("code file: {e}"));
    if code.len() <= LARGE_CODE {
        prepared.write_code(code).map_err(io)?;
        return Ok(prepared);
    }
    let code = code.to_vec();
    tokio::task::spawn_blocking(move || prepared.write_code(&code).map(|()| prepared))
        .await
        .map_err(|e| ExecError::Spawn(e.to_string()))?
        .map_err(io)
}
