//! The life of one run: admission (a bounded number at once, a bounded queue),
//! a prepared sandbox, bounded capture of stdout and stderr, timeout and
//! cancellation, killing the whole sandbox, and a structured outcome saying
//! what ended it.
//!
//! Speed: sandboxes are set up ahead of time. bubblewrap is started, moved
//! into its cgroup, given its options on a pipe (`--args`), builds the
//! namespaces and mounts, and waits (`--block-fd`) before starting the
//! command. A call writes its code into the file already mounted as the code
//! file and one byte to start the command; the fork, the exec, the cgroup
//! migration (whose RCU synchronisation can take milliseconds) and the
//! mounts (one per store path of a Nix closure) are all off its critical path.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::capture::{Capture, Captured};
use crate::environment::Environment;
use crate::jail::{self, Call, ProjectMount};
use crate::limits::{Enforcer, Fired, Lease, Rlimit};
use crate::platform::Platform;
use crate::seccomp::{self, Programs};

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

/// A limit that ended (or was reached during) a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    Timeout,
    Memory,
    Processes,
    Cpu,
    Output,
    FileSize,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Timeout => "timeout",
            LimitKind::Memory => "memory",
            LimitKind::Processes => "processes",
            LimitKind::Cpu => "cpu",
            LimitKind::Output => "output",
            LimitKind::FileSize => "file_size",
        }
    }
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Exit status of the program (128 + N when it died of signal N).
    pub exit_code: Option<i32>,
    /// Signal that ended the program, when one did.
    pub signal: Option<i32>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub duration: Duration,
    pub timed_out: bool,
    pub cancelled: bool,
    /// The limit that ended the run.
    pub limit: Option<LimitKind>,
    /// Every limit reached during the run, including ones that did not end it.
    pub limits_reached: Vec<LimitKind>,
}

impl Outcome {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && self.limit.is_none() && !self.cancelled
    }
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

/// Admission control: at most `running` runs at once and `max_waiting` waiting.
#[derive(Debug)]
struct Admission {
    slots: Arc<Semaphore>,
    running: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// Runs calls in sandboxes. Cheap to share: clones refer to the same state.
#[derive(Clone, Debug)]
pub struct Executor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    platform: Arc<Platform>,
    enforcer: Enforcer,
    seccomp: Mutex<HashMap<Vec<String>, Arc<Programs>>>,
    admission: Admission,
    /// Sandboxes set up ahead of time, each waiting to start its command, by
    /// everything that was fixed when it was set up.
    ready: Mutex<HashMap<RecipeKey, Ready>>,
    /// How many prepared sandboxes to keep for each environment in use.
    ready_target: usize,
    /// Hands work to the thread that prepares sandboxes in the background.
    spawner: Mutex<Option<std::sync::mpsc::Sender<Arc<Recipe>>>>,
}

/// Everything a prepared sandbox is fixed to: bubblewrap's options (built
/// with placeholder descriptors and paths, so equal for equal calls), its
/// command, the seccomp allow-list, the rlimits and the cgroup limits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RecipeKey {
    options: Vec<u8>,
    command: Vec<String>,
    seccomp_allow: Vec<String>,
    rlimits: Vec<(u32, u64)>,
    memory_bytes: u64,
    pids: u64,
}

/// Everything needed to prepare a sandbox for one kind of call.
#[derive(Debug)]
struct Recipe {
    key: RecipeKey,
    env: Environment,
    project: Option<ProjectMount>,
    inherited: Vec<(String, String)>,
    rlimits: Vec<Rlimit>,
    programs: Arc<Programs>,
    /// Where the code file appears in the sandbox.
    code_path: String,
}

#[derive(Debug, Default)]
struct Ready {
    sandboxes: Vec<Prepared>,
    /// Being prepared right now.
    starting: usize,
    /// Registered with [`Executor::keep_ready_for`]: topped up after each
    /// use. Other calls (start-up probes, the CLI) are prepared on demand.
    kept: bool,
}

/// Stops reading after a stream stays open this long past the program's end
/// (nothing should hold it: the pid namespace is gone).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 64 * 1024;
/// Code larger than this is written to its file off the runtime's threads.
const LARGE_CODE: usize = 1 << 20;

impl Executor {
    /// `prestart` sandboxes are kept ready per environment (0 for one-shot
    /// use such as the CLI). Keeping them needs a tokio runtime.
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
                seccomp: Mutex::new(HashMap::new()),
                admission: Admission {
                    slots: Arc::new(Semaphore::new(max_running)),
                    running: max_running,
                    waiting: AtomicUsize::new(0),
                    max_waiting,
                },
                ready: Mutex::new(HashMap::new()),
                ready_target: prestart,
                spawner: Mutex::new(None),
            }),
        };
        if prestart > 0
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            executor.start_spawner(handle);
        }
        executor
    }

    /// Starts the thread that prepares sandboxes ahead of time. One long-lived
    /// thread: bubblewrap's parent-death signal follows the thread that forked
    /// it, and the cgroup migration it waits for must not block a runtime worker.
    fn start_spawner(&self, handle: tokio::runtime::Handle) {
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Recipe>>();
        let weak = Arc::downgrade(&self.inner);
        let started = std::thread::Builder::new()
            .name("sandbox-spawner".into())
            .spawn(move || {
                let _runtime = handle.enter();
                for recipe in rx {
                    let Some(inner) = weak.upgrade() else { break };
                    let prepared = inner
                        .spawn(&recipe, Vec::new())
                        .and_then(|s| s.set_up(&recipe));
                    let mut ready = inner.ready.lock().unwrap();
                    // Gone when the executor shut down meanwhile: the sandbox is dropped (killed).
                    let Some(r) = ready.get_mut(&recipe.key) else {
                        continue;
                    };
                    r.starting -= 1;
                    match prepared {
                        Ok(p) => r.sandboxes.push(p),
                        Err(e) => tracing::warn!("cannot prepare a sandbox ahead of time: {e}"),
                    }
                }
            });
        match started {
            Ok(_) => *self.inner.spawner.lock().unwrap() = Some(tx),
            Err(e) => {
                tracing::warn!("cannot start the sandbox spawner ({e}); sandboxes start on demand")
            }
        }
    }

    /// Keeps sandboxes ready for calls in `env` with this project and these
    /// inherited variables (the daemon's environment does not change).
    pub fn keep_ready_for(
        &self,
        env: &Environment,
        project: Option<&ProjectMount>,
        inherited: &[(String, String)],
    ) -> Result<(), ExecError> {
        let recipe = Arc::new(self.recipe(env, project, inherited)?);
        self.inner
            .ready
            .lock()
            .unwrap()
            .entry(recipe.key.clone())
            .or_default()
            .kept = true;
        self.refill(&recipe);
        Ok(())
    }

    pub fn platform(&self) -> &Platform {
        &self.inner.platform
    }

    pub fn enforcer(&self) -> &Enforcer {
        &self.inner.enforcer
    }

    /// Compiles (once per distinct allow-list) the seccomp programs for `env`.
    pub fn seccomp_for(&self, env: &Environment) -> Result<Arc<Programs>, seccomp::SeccompError> {
        let mut cache = self.inner.seccomp.lock().unwrap();
        if let Some(p) = cache.get(&env.seccomp_allow) {
            return Ok(p.clone());
        }
        let p = Arc::new(seccomp::compile(&env.seccomp_allow)?);
        cache.insert(env.seccomp_allow.clone(), p.clone());
        Ok(p)
    }

    fn recipe(
        &self,
        env: &Environment,
        project: Option<&ProjectMount>,
        inherited: &[(String, String)],
    ) -> Result<Recipe, ExecError> {
        self.recipe_at(env, project, inherited, env.code_path())
    }

    /// A recipe whose code file appears at `code_path` in the sandbox.
    fn recipe_at(
        &self,
        env: &Environment,
        project: Option<&ProjectMount>,
        inherited: &[(String, String)],
        code_path: String,
    ) -> Result<Recipe, ExecError> {
        let programs = self
            .seccomp_for(env)
            .map_err(|e| ExecError::Spawn(e.to_string()))?;
        let rlimits = self.inner.enforcer.rlimits(&env.limits);
        let template = Call {
            env,
            project,
            code_file: Some((Path::new("/code"), &code_path)),
            block_fd: Some(0),
            seccomp_fds: vec![0, 0],
            status_fd: Some(0),
            inherited,
        };
        Ok(Recipe {
            key: RecipeKey {
                options: nul_separated(jail::bwrap_options(&self.inner.platform.layout, &template)),
                command: env.command_for(&code_path),
                seccomp_allow: env.seccomp_allow.clone(),
                rlimits: rlimits
                    .iter()
                    .map(|r| (r.resource as u32, r.value))
                    .collect(),
                memory_bytes: env.limits.memory_bytes,
                pids: env.limits.pids,
            },
            env: env.clone(),
            project: project.cloned(),
            inherited: inherited.to_vec(),
            rlimits,
            programs,
            code_path,
        })
    }

    /// Runs one call to completion (or timeout, limit, cancellation).
    pub async fn run(&self, req: Request<'_>) -> Result<Outcome, ExecError> {
        let limits = req.env.limits;
        if req.code.len() as u64 > limits.file_size_bytes {
            return Err(ExecError::CodeTooLarge {
                size: req.code.len(),
                limit: limits.file_size_bytes,
            });
        }
        let recipe = Arc::new(self.recipe(req.env, req.project, req.inherited)?);
        let _slot = self.slot(&req.cancel).await?;
        let start = Instant::now();

        let Prepared {
            mut child,
            lease,
            code,
            block,
            status,
        } = self.take_prepared(&recipe).await?;
        self.refill(&recipe);
        let io = |e: std::io::Error| ExecError::Spawn(format!("code file: {e}"));
        let code = if req.code.len() > LARGE_CODE {
            let bytes = req.code.to_vec();
            tokio::task::spawn_blocking(move || write_code(code, &bytes))
                .await
                .map_err(|e| ExecError::Spawn(e.to_string()))?
                .map_err(io)?
        } else {
            write_code(code, req.code).map_err(io)?
        };
        // Start the command. A failure means bubblewrap is gone, which the
        // status below explains.
        let _ = rustix::io::write(&block, b"x");
        drop(block);
        if let Some(o) = &req.observer {
            o.started();
        }

        let total = Arc::new(AtomicU64::new(0));
        let over = Arc::new(Notify::new());
        let pump = |r: Box<dyn AsyncRead + Send + Unpin>, stream| {
            tokio::spawn(pump(
                r,
                limits.output_bytes,
                stream,
                req.observer.clone(),
                total.clone(),
                limits.output_limit_bytes,
                over.clone(),
            ))
        };
        let out_task = pump(
            Box::new(child.stdout.take().expect("piped")),
            Stream::Stdout,
        );
        let err_task = pump(
            Box::new(child.stderr.take().expect("piped")),
            Stream::Stderr,
        );

        enum End {
            Timeout,
            Cancelled,
            Output,
        }
        let (status_code, end) = tokio::select! {
            s = child.wait() => (s.ok(), None),
            _ = tokio::time::sleep(limits.timeout) => (None, Some(End::Timeout)),
            _ = req.cancel.cancelled() => (None, Some(End::Cancelled)),
            _ = over.notified() => (None, Some(End::Output)),
        };
        let mut status = Status::new(status);
        let status_code = match end {
            None => status_code,
            Some(_) => kill_sandbox(&mut child, &mut status, &lease).await,
        };
        let stdout = drain(out_task).await;
        let stderr = drain(err_task).await;
        let duration = start.elapsed();
        let fired = lease.finish();
        drop(code);

        if end.is_none() && self.inner.platform.layout.json_status_fd && !status.program_exited() {
            let message = stderr.text.trim();
            return Err(ExecError::Setup(if message.is_empty() {
                format!("bubblewrap exited with {status_code:?}")
            } else {
                message.to_string()
            }));
        }
        let (exit_code, signal) = interpret(status_code);
        let mut outcome = Outcome {
            exit_code,
            signal,
            stdout,
            stderr,
            duration,
            timed_out: matches!(end, Some(End::Timeout)),
            cancelled: matches!(end, Some(End::Cancelled)),
            limit: None,
            limits_reached: Vec::new(),
        };
        let ours = match end {
            Some(End::Timeout) => Some(LimitKind::Timeout),
            Some(End::Output) => Some(LimitKind::Output),
            _ => None,
        };
        attribute_limits(&mut outcome, ours, fired);
        Ok(outcome)
    }

    /// A prepared sandbox from the pool, or one prepared now when none is ready.
    async fn take_prepared(&self, recipe: &Arc<Recipe>) -> Result<Prepared, ExecError> {
        loop {
            let ready = self
                .inner
                .ready
                .lock()
                .unwrap()
                .get_mut(&recipe.key)
                .and_then(|r| r.sandboxes.pop());
            let Some(mut p) = ready else { break };
            // A sandbox that died while waiting (killed from outside, or its
            // set-up failed) is skipped.
            if matches!(p.child.try_wait(), Ok(None)) {
                return Ok(p);
            }
        }
        self.prepare_now(recipe, Vec::new()).await
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

    /// Starts a sandbox whose program keeps running (a session's agent):
    /// `program` is its code file, `args` follow the interpreter's command,
    /// and `fds` are passed to it at their current numbers. Returns the
    /// sandbox and the program's stdout and stderr; the caller owns its
    /// lifetime, which counts against no run slot.
    pub async fn start_live(
        &self,
        req: LiveRequest<'_>,
    ) -> Result<
        (
            LiveSandbox,
            tokio::process::ChildStdout,
            tokio::process::ChildStderr,
        ),
        ExecError,
    > {
        // The program stays out of /workspace, which belongs to the code it runs.
        let at = format!("/run/nsm/{}", req.env.file_name);
        let mut recipe = self.recipe_at(req.env, req.project, req.inherited, at)?;
        recipe.key.command.extend(req.args);
        let Prepared {
            mut child,
            lease,
            code,
            block,
            status,
        } = self.prepare_now(&Arc::new(recipe), req.fds).await?;
        let code = write_code(code, req.program)
            .map_err(|e| ExecError::Spawn(format!("program file: {e}")))?;
        let _ = rustix::io::write(&block, b"x");
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let sandbox = LiveSandbox {
            child,
            lease,
            status: Status::new(status),
            _program: code,
        };
        Ok((sandbox, stdout, stderr))
    }

    /// Tops up, in the background, the prepared sandboxes for `recipe` if it
    /// is kept ready.
    fn refill(&self, recipe: &Arc<Recipe>) {
        let target = self.inner.ready_target;
        let Some(spawner) = self.inner.spawner.lock().unwrap().clone() else {
            return;
        };
        let mut ready = self.inner.ready.lock().unwrap();
        let Some(r) = ready.get_mut(&recipe.key).filter(|r| r.kept) else {
            return;
        };
        while r.sandboxes.len() + r.starting < target {
            if spawner.send(recipe.clone()).is_err() {
                break;
            }
            r.starting += 1;
        }
    }

    /// Waits (up to a few seconds) until no run is in flight, then stops the
    /// prepared sandboxes and removes the cgroups; for shutdown.
    pub async fn shutdown(&self) {
        let all = self.inner.admission.running as u32;
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.inner.admission.slots.acquire_many(all),
        )
        .await;
        *self.inner.spawner.lock().unwrap() = None;
        let ready: Vec<Prepared> = std::mem::take(&mut *self.inner.ready.lock().unwrap())
            .into_values()
            .flat_map(|r| r.sandboxes)
            .collect();
        for mut p in ready {
            kill_sandbox(&mut p.child, &mut Status::new(p.status), &p.lease).await;
        }
        self.inner.enforcer.cleanup();
    }

    /// Waits for a run slot (see `max_concurrent_runs`), or fails at once
    /// with `Busy` when too many calls already wait.
    pub async fn slot(
        &self,
        cancel: &CancellationToken,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, ExecError> {
        let a = &self.inner.admission;
        if let Ok(p) = a.slots.clone().try_acquire_owned() {
            return Ok(p);
        }
        let waiting = a.waiting.fetch_add(1, Ordering::SeqCst);
        let _undo = scopeguard(|| {
            a.waiting.fetch_sub(1, Ordering::SeqCst);
        });
        if waiting >= a.max_waiting {
            return Err(ExecError::Busy {
                running: a.running,
                queued: waiting,
            });
        }
        tokio::select! {
            p = a.slots.clone().acquire_owned() => Ok(p.expect("semaphore never closed")),
            _ = cancel.cancelled() => Err(ExecError::CancelledWhileQueued),
        }
    }
}

/// What [`Executor::start_live`] needs.
pub struct LiveRequest<'a> {
    pub env: &'a Environment,
    pub project: Option<&'a ProjectMount>,
    pub inherited: &'a [(String, String)],
    pub program: &'a [u8],
    pub args: Vec<String>,
    pub fds: Vec<OwnedFd>,
}

/// A sandbox whose program keeps running. Dropping it kills it.
#[derive(Debug)]
pub struct LiveSandbox {
    child: Bwrap,
    lease: Lease,
    status: Status,
    _program: tempfile::NamedTempFile,
}

impl LiveSandbox {
    /// Waits for the sandbox to end by itself (cancel-safe).
    pub async fn exited(&mut self) -> (Option<i32>, Option<i32>) {
        interpret(self.child.wait().await.ok())
    }

    /// Limits that fired since the last call of this (memory, processes).
    pub fn fired(&mut self) -> Fired {
        self.lease.check()
    }

    /// Kills the whole sandbox and waits until nothing of it is left.
    pub async fn kill(mut self) {
        kill_sandbox(&mut self.child, &mut self.status, &self.lease).await;
    }
}

/// Writes a run's code into its (empty) file and hands the file back.
fn write_code(
    mut file: tempfile::NamedTempFile,
    code: &[u8],
) -> std::io::Result<tempfile::NamedTempFile> {
    file.as_file_mut().write_all(code)?;
    Ok(file)
}

/// A sandbox set up ahead of time: bubblewrap has built its namespaces and
/// mounts and waits on `block` before starting the command.
#[derive(Debug)]
struct Prepared {
    child: Bwrap,
    lease: Lease,
    /// The file mounted as the code file; the call writes the code into it.
    code: tempfile::NamedTempFile,
    /// Write end of bubblewrap's `--block-fd`: a byte starts the command.
    block: OwnedFd,
    /// Read end of bubblewrap's JSON status.
    status: OwnedFd,
}

/// A bubblewrap process. Dropped while it still runs, it is killed with its
/// whole process group: bubblewrap and, if it has started one, the sandbox's
/// init, which, caught before its user namespace is set up, would otherwise
/// wait forever for a parent that is gone.
#[derive(Debug)]
struct Bwrap(tokio::process::Child);

impl std::ops::Deref for Bwrap {
    type Target = tokio::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Bwrap {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Bwrap {
    fn drop(&mut self) {
        // Only while not yet reaped: a reaped pid may already name another process.
        if matches!(self.0.try_wait(), Ok(None))
            && let Some(pid) = self
                .0
                .id()
                .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A bubblewrap just started, blocked reading its options, not yet in its
/// cgroup.
struct Spawned {
    child: Bwrap,
    lease: Lease,
    code: tempfile::NamedTempFile,
    block: OwnedFd,
    status: OwnedFd,
    /// Write ends: the options, the two seccomp programs.
    options: OwnedFd,
    seccomp: [OwnedFd; 2],
    options_data: Vec<u8>,
}

impl Inner {
    /// Starts bubblewrap for `recipe` with its rlimits and its descriptors;
    /// it waits for its options on a pipe. Fast (one fork and exec); must run
    /// inside the tokio runtime, on a thread that outlives the sandbox.
    fn spawn(&self, recipe: &Recipe, extra: Vec<OwnedFd>) -> std::io::Result<Spawned> {
        let lease = self.enforcer.reserve()?;
        let pipe = || {
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(std::io::Error::from)
        };
        let (options_r, options_w) = pipe()?;
        let (sc0_r, sc0_w) = pipe()?;
        let (sc1_r, sc1_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let (block_r, block_w) = pipe()?;
        rustix::fs::fcntl_setfl(&status_r, rustix::fs::OFlags::NONBLOCK)?;
        let code = self.platform.code_file()?;
        let call = Call {
            env: &recipe.env,
            project: recipe.project.as_ref(),
            code_file: Some((code.path(), &recipe.code_path)),
            block_fd: Some(block_r.as_raw_fd()),
            seccomp_fds: vec![sc0_r.as_raw_fd(), sc1_r.as_raw_fd()],
            status_fd: Some(status_w.as_raw_fd()),
            inherited: &recipe.inherited,
        };
        let options_data = nul_separated(jail::bwrap_options(&self.platform.layout, &call));
        let options_fd = options_r.as_raw_fd();
        let plan = ChildPlan {
            hard: recipe
                .rlimits
                .iter()
                .map(|r| rustix::process::getrlimit(r.resource).maximum)
                .collect(),
            rlimits: recipe.rlimits.clone(),
            inherit: Arc::new(
                [options_r, sc0_r, sc1_r, status_w, block_r]
                    .into_iter()
                    .chain(extra)
                    .collect(),
            ),
            run_as: self.platform.run_as,
        };
        let mut cmd = tokio::process::Command::new(&self.platform.bwrap);
        cmd.arg("--args")
            .arg(options_fd.to_string())
            .arg("--")
            .args(&recipe.key.command)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // SAFETY: the closure runs between fork and exec in the child. `apply`
        // makes only async-signal-safe system calls on data prepared before the
        // fork, and does not allocate, lock, or touch the parent's threads.
        unsafe {
            cmd.pre_exec(move || plan.apply());
        }
        let child = Bwrap(cmd.spawn()?);
        Ok(Spawned {
            child,
            lease,
            code,
            block: block_w,
            status: status_r,
            options: options_w,
            seccomp: [sc0_w, sc1_w],
            options_data,
        })
    }
}

impl Spawned {
    /// Moves the waiting bubblewrap into its cgroup with the run's limits,
    /// then hands it its options and seccomp programs, so that it sets the
    /// sandbox up and waits to start the command. Blocking (the cgroup
    /// migration waits for the kernel; see [`Lease::adopt`]).
    fn set_up(mut self, recipe: &Recipe) -> std::io::Result<Prepared> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| std::io::Error::other("bubblewrap exited at once"))?;
        self.lease.apply(&recipe.env.limits)?;
        self.lease.adopt(pid)?;
        // A write fails only when bubblewrap has exited; the run reports why.
        let _ = std::fs::File::from(self.options).write_all(&self.options_data);
        for (fd, program) in self.seccomp.into_iter().zip(&recipe.programs.0) {
            let _ = std::fs::File::from(fd).write_all(program);
        }
        Ok(Prepared {
            child: self.child,
            lease: self.lease,
            code: self.code,
            block: self.block,
            status: self.status,
        })
    }
}

/// Everything the child does between fork and exec, prepared in the parent.
struct ChildPlan {
    rlimits: Vec<Rlimit>,
    /// The daemon's hard limits, read before the fork: the child must not allocate.
    hard: Vec<Option<u64>>,
    /// Descriptors bubblewrap must inherit (their close-on-exec flag is cleared).
    inherit: Arc<Vec<OwnedFd>>,
    run_as: Option<(u32, u32)>,
}

impl ChildPlan {
    /// Runs in the forked child: set the rlimits, give up root if we have it,
    /// and pass bubblewrap exactly the descriptors it needs (any the daemon
    /// itself inherited stay out of the sandbox). Only system calls.
    fn apply(&self) -> std::io::Result<()> {
        use rustix::process::{Resource, setrlimit};
        for (r, hard) in self.rlimits.iter().zip(&self.hard) {
            let cap = |v: u64| hard.map_or(v, |h| v.min(h));
            // CPU: the soft limit sends SIGXCPU (reported as "cpu"); the hard
            // limit, a little later, SIGKILL for programs that ignore it.
            let max = if r.resource == Resource::Cpu {
                r.value + 2
            } else {
                r.value
            };
            let limit = rustix::process::Rlimit {
                current: Some(cap(r.value)),
                maximum: Some(cap(max)),
            };
            setrlimit(r.resource, limit)?;
        }
        if let Some((uid, gid)) = self.run_as {
            let gid = rustix::process::Gid::from_raw(gid);
            rustix::thread::set_thread_groups(&[])?;
            rustix::thread::set_thread_res_gid(gid, gid, gid)?;
            let uid = rustix::process::Uid::from_raw(uid);
            rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        }
        close_inherited_descriptors();
        for fd in self.inherit.iter() {
            rustix::io::fcntl_setfd(fd.as_fd(), rustix::io::FdFlags::empty())?;
        }
        Ok(())
    }
}

/// Marks every descriptor above stderr close-on-exec.
fn close_inherited_descriptors() {
    // SAFETY: close_range only changes descriptor flags; it touches no memory.
    // Called in the forked child before exec, where it is async-signal-safe.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r != 0 {
        // Kernels before 5.11: walk the usual range instead.
        for fd in 3..4096 {
            // SAFETY: fcntl on a possibly-closed descriptor fails harmlessly.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}

fn nul_separated(args: Vec<OsString>) -> Vec<u8> {
    let mut out = Vec::new();
    for a in args {
        out.extend_from_slice(a.as_bytes());
        out.push(0);
    }
    out
}

/// Decides which limit ended the run from what we saw and what the kernel counted.
pub(crate) fn attribute_limits(o: &mut Outcome, ours: Option<LimitKind>, fired: Fired) {
    let mut reached = Vec::new();
    reached.extend(ours);
    if fired.memory {
        reached.push(LimitKind::Memory);
    }
    match o.signal {
        Some(libc::SIGXCPU) => reached.push(LimitKind::Cpu),
        Some(libc::SIGXFSZ) => reached.push(LimitKind::FileSize),
        _ => {}
    }
    if fired.pids {
        reached.push(LimitKind::Processes);
    }
    let failed = o.exit_code != Some(0);
    o.limit = ours.or_else(|| {
        if !failed {
            return None;
        }
        reached
            .iter()
            .copied()
            .find(|l| *l != LimitKind::Processes)
            .or_else(|| reached.first().copied())
    });
    o.limits_reached = reached;
}

/// Exit code and signal from bubblewrap's status. bubblewrap reports a
/// program killed by signal N as exit status 128 + N.
fn interpret(status: Option<ExitStatus>) -> (Option<i32>, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    let Some(status) = status else {
        return (None, None);
    };
    match (status.code(), status.signal()) {
        (Some(c), _) if c > 128 && c <= 128 + 64 => (Some(c), Some(c - 128)),
        (Some(c), _) => (Some(c), None),
        (None, Some(s)) => (None, Some(s)),
        (None, None) => (None, None),
    }
}

/// bubblewrap's JSON status (`--json-status-fd`), read as it arrives.
#[derive(Debug)]
struct Status {
    fd: OwnedFd,
    text: String,
}

impl Status {
    fn new(fd: OwnedFd) -> Status {
        Status {
            fd,
            text: String::new(),
        }
    }

    /// Reads what bubblewrap has written so far (the pipe is non-blocking).
    fn read_available(&mut self) -> &str {
        let mut buf = [0u8; 4096];
        let text = &mut self.text;
        read_ready(&self.fd, &mut buf, |d| {
            text.push_str(&String::from_utf8_lossy(d))
        });
        &self.text
    }

    /// Host pid of the sandbox's init (pid 1 of its pid namespace).
    fn sandbox_init(&mut self) -> Option<rustix::process::Pid> {
        let text = self.read_available();
        let rest = &text[text.find("\"child-pid\"")? + "\"child-pid\"".len()..];
        let digits: String = rest
            .trim_start_matches([':', ' '])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        rustix::process::Pid::from_raw(digits.parse().ok()?)
    }

    /// True when bubblewrap reported the program's exit, i.e. the sandbox was
    /// set up and the program ran. Read after bubblewrap has exited.
    fn program_exited(&mut self) -> bool {
        self.read_available().contains("\"exit-code\"")
    }
}

/// How long a killed sandbox's init may take to tear its namespace down
/// before bubblewrap itself is killed.
const TEARDOWN_GRACE: Duration = Duration::from_secs(2);

/// Kills the sandbox's init. The kernel then kills every process in its pid
/// namespace and waits for them before init can be reaped, so by the time
/// bubblewrap (which waits for init) exits, nothing of the sandbox is left.
/// Falls back to killing bubblewrap's process group.
async fn kill_sandbox(
    child: &mut tokio::process::Child,
    status: &mut Status,
    lease: &Lease,
) -> Option<ExitStatus> {
    use rustix::process::{Signal, kill_process, kill_process_group};
    if let Some(init) = status.sandbox_init() {
        let _ = kill_process(init, Signal::KILL);
        if let Ok(exit) = tokio::time::timeout(TEARDOWN_GRACE, child.wait()).await {
            return exit.ok();
        }
    }
    if let Some(pid) = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(p as i32))
    {
        let _ = kill_process_group(pid, Signal::KILL);
    }
    lease.kill_all();
    child.wait().await.ok()
}

async fn pump(
    mut r: Box<dyn AsyncRead + Send + Unpin>,
    cap: usize,
    stream: Stream,
    observer: Option<Arc<dyn Observer>>,
    total: Arc<AtomicU64>,
    limit: u64,
    over: Arc<Notify>,
) -> Capture {
    let mut capture = Capture::new(cap);
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                capture.push(&buf[..n]);
                if let Some(o) = &observer {
                    o.output(stream, &buf[..n]);
                }
                if total.fetch_add(n as u64, Ordering::Relaxed) + n as u64 > limit {
                    over.notify_one();
                }
            }
        }
    }
    capture
}

async fn drain(task: tokio::task::JoinHandle<Capture>) -> Captured {
    let abort = task.abort_handle();
    match tokio::time::timeout(DRAIN_GRACE, task).await {
        Ok(Ok(c)) => c.finish(),
        _ => {
            abort.abort();
            Captured::default()
        }
    }
}

/// Hands `sink` what a non-blocking descriptor holds right now, without
/// waiting for more.
pub(crate) fn read_ready(fd: impl AsFd, buf: &mut [u8], mut sink: impl FnMut(&[u8])) {
    while let Ok(n) = rustix::io::read(fd.as_fd(), &mut *buf) {
        if n == 0 {
            break;
        }
        sink(&buf[..n]);
    }
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(exit: Option<i32>, signal: Option<i32>) -> Outcome {
        Outcome {
            exit_code: exit,
            signal,
            stdout: Captured::default(),
            stderr: Captured::default(),
            duration: Duration::ZERO,
            timed_out: false,
            cancelled: false,
            limit: None,
            limits_reached: vec![],
        }
    }

    #[test]
    fn bwrap_signal_convention() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            interpret(Some(ExitStatus::from_raw(137 << 8))),
            (Some(137), Some(9))
        );
        assert_eq!(
            interpret(Some(ExitStatus::from_raw(3 << 8))),
            (Some(3), None)
        );
        assert_eq!(interpret(Some(ExitStatus::from_raw(9))), (None, Some(9)));
    }

    #[test]
    fn timeout_wins_and_process_limit_is_still_reported() {
        let mut o = outcome(None, Some(9));
        attribute_limits(
            &mut o,
            Some(LimitKind::Timeout),
            Fired {
                memory: false,
                pids: true,
            },
        );
        assert_eq!(o.limit, Some(LimitKind::Timeout));
        assert_eq!(
            o.limits_reached,
            vec![LimitKind::Timeout, LimitKind::Processes]
        );
    }

    #[test]
    fn memory_kill_is_attributed() {
        let mut o = outcome(Some(137), Some(9));
        attribute_limits(
            &mut o,
            None,
            Fired {
                memory: true,
                pids: false,
            },
        );
        assert_eq!(o.limit, Some(LimitKind::Memory));
    }

    #[test]
    fn cpu_and_file_size_signals_are_attributed() {
        let mut o = outcome(Some(128 + libc::SIGXCPU), Some(libc::SIGXCPU));
        attribute_limits(&mut o, None, Fired::default());
        assert_eq!(o.limit, Some(LimitKind::Cpu));
        let mut o = outcome(Some(128 + libc::SIGXFSZ), Some(libc::SIGXFSZ));
        attribute_limits(&mut o, None, Fired::default());
        assert_eq!(o.limit, Some(LimitKind::FileSize));
    }

    #[test]
    fn process_limit_ends_a_failed_run_but_not_a_successful_one() {
        let mut o = outcome(Some(1), None);
        attribute_limits(
            &mut o,
            None,
            Fired {
                memory: false,
                pids: true,
            },
        );
        assert_eq!(o.limit, Some(LimitKind::Processes));
        let mut o = outcome(Some(0), None);
        attribute_limits(
            &mut o,
            None,
            Fired {
                memory: false,
                pids: true,
            },
        );
        assert_eq!(o.limit, None);
        assert_eq!(o.limits_reached, vec![LimitKind::Processes]);
    }
}
