//! The life of one run: admission (a bounded number at once, a bounded queue),
//! limits, spawning bubblewrap with the jail's argv and the code in a memfd,
//! bounded capture of stdout and stderr, timeout and cancellation, killing the
//! whole sandbox, and a structured outcome saying what ended the run.

use std::collections::HashMap;
use std::io::{Seek, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
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
use crate::limits::{ChildSetup, Enforcer, Fired};
use crate::platform::Platform;
use crate::seccomp::{self, Programs};

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Sees a run's output as it happens (terminal echo, progress, job logs).
pub trait Observer: Send + Sync {
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
}

/// One call to run.
pub struct Request<'a> {
    pub env: &'a Environment,
    pub code: &'a [u8],
    pub project: Option<&'a ProjectMount>,
    /// Variables passed through from the daemon's environment, read at call time.
    pub inherited: Vec<(String, String)>,
    pub cancel: CancellationToken,
    pub observer: Option<Arc<dyn Observer>>,
}

/// Admission control: at most `running` runs at once and `queued` waiting.
#[derive(Debug)]
struct Admission {
    slots: Arc<Semaphore>,
    running: usize,
    waiting: AtomicUsize,
    max_waiting: usize,
}

#[derive(Debug)]
pub struct Executor {
    platform: Arc<Platform>,
    enforcer: Enforcer,
    seccomp: Mutex<HashMap<Vec<String>, Arc<Programs>>>,
    admission: Admission,
}

/// Stops reading after a stream stays open this long past the program's end
/// (nothing should hold it: the pid namespace is gone).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 64 * 1024;

impl Executor {
    pub fn new(
        platform: Arc<Platform>,
        enforcer: Enforcer,
        max_running: usize,
        max_waiting: usize,
    ) -> Executor {
        Executor {
            platform,
            enforcer,
            seccomp: Mutex::new(HashMap::new()),
            admission: Admission {
                slots: Arc::new(Semaphore::new(max_running)),
                running: max_running,
                waiting: AtomicUsize::new(0),
                max_waiting,
            },
        }
    }

    pub fn platform(&self) -> &Platform {
        &self.platform
    }

    pub fn enforcer(&self) -> &Enforcer {
        &self.enforcer
    }

    /// Compiles (once per distinct allow-list) the seccomp programs for `env`.
    pub fn seccomp_for(&self, env: &Environment) -> Result<Arc<Programs>, seccomp::SeccompError> {
        let mut cache = self.seccomp.lock().unwrap();
        if let Some(p) = cache.get(&env.seccomp_allow) {
            return Ok(p.clone());
        }
        let p = Arc::new(seccomp::compile(&env.seccomp_allow)?);
        cache.insert(env.seccomp_allow.clone(), p.clone());
        Ok(p)
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
        let _slot = self.admit(&req.cancel).await?;
        let start = Instant::now();

        let code_fd = memfd_with("code", req.code)
            .map_err(|e| ExecError::Spawn(format!("code memfd: {e}")))?;
        let programs = self
            .seccomp_for(req.env)
            .map_err(|e| ExecError::Spawn(e.to_string()))?;
        let seccomp_fds = programs
            .0
            .iter()
            .map(|p| memfd_with("seccomp", p))
            .collect::<std::io::Result<Vec<OwnedFd>>>()
            .map_err(|e| ExecError::Spawn(format!("seccomp memfd: {e}")))?;
        let lease = self
            .enforcer
            .acquire(&limits)
            .map_err(|e| ExecError::Spawn(format!("cgroup: {e}")))?;

        let call = Call {
            env: req.env,
            project: req.project,
            code_fd: Some(code_fd.as_raw_fd()),
            seccomp_fds: seccomp_fds.iter().map(|f| f.as_raw_fd()).collect(),
            inherited: &req.inherited,
            command: req.env.command_for(&req.env.code_path()),
        };
        let args = jail::bwrap_args(&self.platform.layout, &call);
        let mut inherit = vec![code_fd];
        inherit.extend(seccomp_fds);
        let mut child = spawn_bwrap(
            &self.platform,
            args,
            ChildPlan::new(lease.setup.clone(), inherit, self.platform.run_as),
        )
        .map_err(|e| ExecError::Spawn(e.to_string()))?;

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
            Exited(std::io::Result<ExitStatus>),
            Timeout,
            Cancelled,
            Output,
        }
        let end = tokio::select! {
            s = child.wait() => End::Exited(s),
            _ = tokio::time::sleep(limits.timeout) => End::Timeout,
            _ = req.cancel.cancelled() => End::Cancelled,
            _ = over.notified() => End::Output,
        };
        let (status, end) = match end {
            End::Exited(s) => (s.ok(), None),
            other => {
                kill_sandbox(&child);
                lease.kill_all();
                (child.wait().await.ok(), Some(other))
            }
        };
        let stdout = drain(out_task).await;
        let stderr = drain(err_task).await;
        let duration = start.elapsed();
        let fired = tokio::task::spawn_blocking(move || lease.finish())
            .await
            .unwrap_or_default();

        let (exit_code, signal) = interpret(status);
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

    /// Waits (up to a few seconds) until no run is in flight, for shutdown.
    pub async fn drain(&self) {
        let all = self.admission.running as u32;
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.admission.slots.acquire_many(all),
        )
        .await;
    }

    async fn admit(
        &self,
        cancel: &CancellationToken,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, ExecError> {
        let a = &self.admission;
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

/// Decides which limit ended the run from what we saw and what the kernel counted.
fn attribute_limits(o: &mut Outcome, ours: Option<LimitKind>, fired: Fired) {
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

fn memfd_with(name: &str, data: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(data)?;
    f.rewind()?;
    Ok(OwnedFd::from(f))
}

/// Everything the child does between fork and exec, prepared in the parent.
#[derive(Clone)]
struct ChildPlan {
    setup: ChildSetup,
    /// Descriptors bubblewrap must inherit (their close-on-exec flag is cleared).
    inherit: Arc<Vec<OwnedFd>>,
    run_as: Option<(u32, u32)>,
    /// Hard limits of the daemon, read here because the child must not allocate.
    hard: Vec<Option<u64>>,
}

impl ChildPlan {
    fn new(setup: ChildSetup, inherit: Vec<OwnedFd>, run_as: Option<(u32, u32)>) -> ChildPlan {
        let hard = setup
            .rlimits
            .iter()
            .map(|r| rustix::process::getrlimit(r.resource).maximum)
            .collect();
        ChildPlan {
            setup,
            inherit: Arc::new(inherit),
            run_as,
            hard,
        }
    }

    /// Runs in the forked child: join the run's cgroups, set rlimits, give up
    /// root if we have it, and let bubblewrap inherit its descriptors. Only
    /// system calls, no allocation.
    fn apply(&self) -> std::io::Result<()> {
        use rustix::process::{Resource, Rlimit, setrlimit};
        for fd in self.setup.join.iter() {
            rustix::io::write(fd, b"0")?;
        }
        for (r, hard) in self.setup.rlimits.iter().zip(&self.hard) {
            let cap = |v: u64| hard.map_or(v, |h| v.min(h));
            // CPU: the soft limit sends SIGXCPU (reported as "cpu"); the hard
            // limit, a little later, SIGKILL for programs that ignore it.
            let max = if r.resource == Resource::Cpu {
                r.value + 2
            } else {
                r.value
            };
            setrlimit(
                r.resource,
                Rlimit {
                    current: Some(cap(r.value)),
                    maximum: Some(cap(max)),
                },
            )?;
        }
        if let Some((uid, gid)) = self.run_as {
            let gid = rustix::process::Gid::from_raw(gid);
            rustix::thread::set_thread_groups(&[])?;
            rustix::thread::set_thread_res_gid(gid, gid, gid)?;
            let uid = rustix::process::Uid::from_raw(uid);
            rustix::thread::set_thread_res_uid(uid, uid, uid)?;
        }
        for fd in self.inherit.iter() {
            rustix::io::fcntl_setfd(fd.as_fd(), rustix::io::FdFlags::empty())?;
        }
        Ok(())
    }
}

fn spawn_bwrap(
    platform: &Platform,
    args: Vec<std::ffi::OsString>,
    plan: ChildPlan,
) -> std::io::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(&platform.bwrap);
    cmd.args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure runs between fork and exec in the child. `apply` makes
    // only async-signal-safe system calls on data prepared before the fork and
    // does not allocate, lock or touch the parent's threads.
    unsafe {
        cmd.pre_exec(move || plan.apply());
    }
    cmd.spawn()
}

/// Kills bubblewrap and its pid-1 init, which takes the sandbox's pid
/// namespace, and every process in it, down with them.
fn kill_sandbox(child: &tokio::process::Child) {
    if let Some(pid) = child
        .id()
        .and_then(|p| rustix::process::Pid::from_raw(p as i32))
    {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
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
