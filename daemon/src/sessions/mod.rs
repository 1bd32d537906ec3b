//! Sessions: interpreter state that persists across calls. A session is a
//! long-lived sandbox (the environment's policy and limits, applied to the
//! whole session) running a small agent in the environment's own language
//! (agent.py, agent.js, agent.sh beside this file). Calls go to the agent on a
//! request pipe and come back on a reply pipe, never on the program's
//! stdout; the program's output is read from its pipes while the call runs
//! and drained when the reply arrives. The table is bounded in number, idle
//! time and lifetime, and dies with the server.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio_util::sync::CancellationToken;

use crate::capture::Capture;
use crate::environment::{Environment, InterpreterKind};
use crate::exec::{
    ExecError, Executor, LimitKind, LiveRequest, LiveSandbox, Observer, Outcome, Stream, read_ready,
};
use crate::jail::ProjectMount;

const PYTHON_AGENT: &str = include_str!("agent.py");
const NODE_AGENT: &str = include_str!("agent.js");
const BASH_AGENT: &str = include_str!("agent.sh");

/// How long a new agent may take to say it is ready.
const START_LIMIT: Duration = Duration::from_secs(20);
/// Sessions closed for idleness or age are remembered (to say so) this long.
const REMEMBER_GONE: Duration = Duration::from_secs(24 * 3600);

/// Bounds on sessions.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub max_sessions: usize,
    pub idle: Duration,
    pub lifetime: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("environment {0} has no interpreter sessions support (bash, python and node do)")]
    Unsupported(String),
    #[error("session {name:?} belongs to environment {env}")]
    OtherEnv { name: String, env: String },
    #[error("session {name:?} was closed: {why}; its state is gone")]
    Gone { name: String, why: String },
    #[error("all {max} sessions ({names}) are in a call right now")]
    Full { max: usize, names: String },
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// How this call found its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// A new session was started for this call.
    New,
    /// The session went on from the previous call.
    Continued,
    /// The session had been reset (see the reason) and started afresh.
    Restarted(String),
}

/// A session call's result: the run, and what happened to the session.
#[derive(Debug)]
pub struct SessionOutcome {
    pub outcome: Outcome,
    pub start: Start,
    /// Set when this call reset the session.
    pub reset: Option<Reset>,
}

pub struct Sessions {
    executor: Executor,
    project: Option<ProjectMount>,
    /// Values of the `inherit_env` variables.
    inherited: Vec<(String, String)>,
    limits: SessionLimits,
    table: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions closed by the reaper: name → (why, when).
    gone: Mutex<HashMap<String, (String, Instant)>>,
}

struct Session {
    env: Arc<Environment>,
    created: Instant,
    last_used: Mutex<Instant>,
    /// One call at a time; `None` when the sandbox must be (re)started.
    live: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    agent: Option<Agent>,
    /// Why the sandbox is gone, for the next call's result.
    reset: Option<String>,
    started_once: bool,
    next_id: u64,
}

/// A running agent and its channels.
struct Agent {
    sandbox: LiveSandbox,
    requests: pipe::Sender,
    replies: tokio::io::Lines<tokio::io::BufReader<pipe::Receiver>>,
    stdout: tokio::process::ChildStdout,
    stderr: tokio::process::ChildStderr,
    stdout_open: bool,
    stderr_open: bool,
}

#[derive(serde::Deserialize)]
struct Reply {
    id: Option<u64>,
    status: Option<i32>,
    #[serde(default)]
    exited: bool,
    #[serde(default)]
    ready: bool,
}

/// Which agent runs an interpreter of this kind, and its file name.
fn agent_for(kind: InterpreterKind) -> &'static str {
    match kind {
        InterpreterKind::Python => PYTHON_AGENT,
        InterpreterKind::Node => NODE_AGENT,
        InterpreterKind::Bash => BASH_AGENT,
    }
}

impl Sessions {
    pub fn new(
        executor: Executor,
        project: Option<ProjectMount>,
        inherited: Vec<(String, String)>,
        limits: SessionLimits,
    ) -> Sessions {
        Sessions {
            executor,
            project,
            inherited,
            limits,
            table: Mutex::new(HashMap::new()),
            gone: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `code` in session `name` of `env`, creating the session on first use.
    pub async fn call(
        &self,
        name: &str,
        env: &Arc<Environment>,
        code: &[u8],
        cancel: &CancellationToken,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<SessionOutcome, SessionError> {
        let kind = env
            .kind
            .ok_or_else(|| SessionError::Unsupported(env.name.clone()))?;
        let session = self.session(name, env)?;
        // Calls on one session queue here, before they take a run slot.
        let mut state = tokio::select! {
            state = session.live.lock() => state,
            _ = cancel.cancelled() => return Err(ExecError::CancelledWhileQueued.into()),
        };
        let _run_slot = match self.executor.slot(cancel).await {
            Ok(s) => s,
            Err(e) => {
                self.forget_unstarted(name, &session, &state);
                return Err(e.into());
            }
        };
        *session.last_used.lock().unwrap() = Instant::now();
        let earlier_reset = state.reset.take();
        let start = match (state.agent.is_some(), state.started_once) {
            (true, _) => Start::Continued,
            (false, false) => Start::New,
            (false, true) => {
                Start::Restarted(earlier_reset.unwrap_or_else(|| "it had ended".to_string()))
            }
        };
        if state.agent.is_none() {
            match self.start_agent(env, kind).await {
                Ok(agent) => state.agent = Some(agent),
                Err(e) => {
                    self.forget_unstarted(name, &session, &state);
                    return Err(e);
                }
            }
            state.started_once = true;
        }
        state.next_id += 1;
        let id = state.next_id;
        let agent = state.agent.as_mut().expect("started above");
        if let Some(o) = &observer {
            o.started();
        }
        let (outcome, reset) = run_call(agent, id, code, env, cancel, observer).await;
        if let Some(r) = &reset
            && r.sandbox_lost
        {
            if let Some(agent) = state.agent.take() {
                agent.sandbox.kill().await;
            }
            state.reset = Some(r.cause.clone());
        }
        *session.last_used.lock().unwrap() = Instant::now();
        Ok(SessionOutcome {
            outcome,
            start,
            reset,
        })
    }

    /// A session that never ran takes no place in the table.
    fn forget_unstarted(&self, name: &str, session: &Arc<Session>, state: &State) {
        let mut table = self.table.lock().unwrap();
        if !state.started_once && table.get(name).is_some_and(|s| Arc::ptr_eq(s, session)) {
            table.remove(name);
        }
    }

    /// The session `name`, created for `env` when it does not exist yet.
    fn session(&self, name: &str, env: &Arc<Environment>) -> Result<Arc<Session>, SessionError> {
        let mut table = self.table.lock().unwrap();
        if let Some(s) = table.get(name) {
            if s.env.name != env.name {
                return Err(SessionError::OtherEnv {
                    name: name.to_string(),
                    env: s.env.name.clone(),
                });
            }
            return Ok(s.clone());
        }
        // A name the reaper closed is reported once; the next call starts afresh.
        if let Some((why, _)) = self.gone.lock().unwrap().remove(name) {
            return Err(SessionError::Gone {
                name: name.to_string(),
                why,
            });
        }
        if table.len() >= self.limits.max_sessions {
            // Make room by closing the least recently used session not in a call.
            let max = self.limits.max_sessions;
            let victim = table
                .iter()
                .filter(|(_, s)| s.live.try_lock().is_ok())
                .min_by_key(|(_, s)| *s.last_used.lock().unwrap())
                .map(|(n, _)| n.clone());
            let Some(victim) = victim else {
                let mut names: Vec<_> = table.keys().cloned().collect();
                names.sort();
                return Err(SessionError::Full {
                    max,
                    names: names.join(", "),
                });
            };
            let closed = table.remove(&victim).expect("listed above");
            self.remember_gone(victim, format!("it was the least recently used when session {name:?} needed its place (at most {max} are open at once)"));
            tokio::spawn(async move { closed.close().await });
        }
        let s = Arc::new(Session {
            env: env.clone(),
            created: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            live: tokio::sync::Mutex::new(State::default()),
        });
        table.insert(name.to_string(), s.clone());
        Ok(s)
    }

    async fn start_agent(
        &self,
        env: &Environment,
        kind: InterpreterKind,
    ) -> Result<Agent, SessionError> {
        let io =
            |e: std::io::Error| SessionError::Exec(ExecError::Spawn(format!("session pipes: {e}")));
        let (requests_r, requests_w) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e.into()))?;
        let (replies_r, replies_w) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| io(e.into()))?;
        // The node agent reopens its reply pipe through /proc to make it
        // close-on-exec; when the sandbox runs as another uid it needs the
        // permission. Only processes holding the pipe can reach it there.
        rustix::fs::fchmod(&replies_w, rustix::fs::Mode::from_raw_mode(0o622))
            .map_err(|e| io(e.into()))?;
        let args = vec![
            requests_r.as_raw_fd().to_string(),
            replies_w.as_raw_fd().to_string(),
        ];
        let fds: Vec<OwnedFd> = vec![requests_r, replies_w];
        let (sandbox, stdout, stderr) = self
            .executor
            .start_live(LiveRequest {
                env,
                project: self.project.as_ref(),
                inherited: &self.inherited,
                program: agent_for(kind).as_bytes(),
                args,
                fds,
            })
            .await?;

        let requests = pipe::Sender::from_owned_fd(requests_w).map_err(io)?;
        let replies =
            tokio::io::BufReader::new(pipe::Receiver::from_owned_fd(replies_r).map_err(io)?)
                .lines();
        let mut agent = Agent {
            sandbox,
            requests,
            replies,
            stdout,
            stderr,
            stdout_open: true,
            stderr_open: true,
        };
        let ready = tokio::time::timeout(START_LIMIT, async {
            loop {
                match agent.replies.next_line().await {
                    Ok(Some(line))
                        if serde_json::from_str::<Reply>(&line).is_ok_and(|r| r.ready) =>
                    {
                        return Ok(());
                    }
                    Ok(Some(_)) => continue,
                    _ => return Err(()),
                }
            }
        })
        .await;
        if !matches!(ready, Ok(Ok(()))) {
            // Say what the interpreter printed, if anything.
            let mut err = Vec::new();
            let _ = tokio::time::timeout(
                Duration::from_millis(200),
                agent.stderr.read_to_end(&mut err),
            )
            .await;
            agent.sandbox.kill().await;
            let detail = String::from_utf8_lossy(&err).trim().to_string();
            return Err(SessionError::Exec(ExecError::Setup(if detail.is_empty() {
                "the session's interpreter did not start".to_string()
            } else {
                detail
            })));
        }
        Ok(agent)
    }

    /// Closes sessions idle or older than the limits; returns how many.
    pub async fn reap(&self) -> usize {
        let expired: Vec<(String, Arc<Session>, String)> = {
            let mut table = self.table.lock().unwrap();
            let now = Instant::now();
            let names: Vec<(String, String)> = table
                .iter()
                .filter_map(|(n, s)| {
                    let idle = now.duration_since(*s.last_used.lock().unwrap());
                    let age = now.duration_since(s.created);
                    if idle >= self.limits.idle {
                        Some((
                            n.clone(),
                            format!("it was idle for {} s", self.limits.idle.as_secs()),
                        ))
                    } else if age >= self.limits.lifetime {
                        Some((
                            n.clone(),
                            format!(
                                "it reached the {} s session lifetime",
                                self.limits.lifetime.as_secs()
                            ),
                        ))
                    } else {
                        None
                    }
                })
                .collect();
            names
                .into_iter()
                .filter_map(|(n, why)| table.remove(&n).map(|s| (n, s, why)))
                .collect()
        };
        let count = expired.len();
        for (name, session, why) in expired {
            self.remember_gone(name, why);
            session.close().await;
        }
        count
    }

    /// Closes expired sessions every few seconds, forever.
    pub async fn reap_forever(self: Arc<Self>) {
        let period = Duration::from_secs(5).min(self.limits.idle.min(self.limits.lifetime) / 2);
        let mut ticks = tokio::time::interval(period);
        loop {
            ticks.tick().await;
            let closed = self.reap().await;
            if closed > 0 {
                tracing::info!("closed {closed} idle or expired session(s)");
            }
        }
    }

    /// Kills every session (at shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Session>> = self.table.lock().unwrap().drain().map(|(_, s)| s).collect();
        for session in all {
            session.close().await;
        }
    }

    /// Remembers, for a while, why the session `name` was closed.
    fn remember_gone(&self, name: String, why: String) {
        let mut gone = self.gone.lock().unwrap();
        gone.retain(|_, (_, at)| at.elapsed() < REMEMBER_GONE);
        gone.insert(name, (why, Instant::now()));
    }
}

impl Session {
    /// Kills the session's sandbox, after the call in progress, if any.
    async fn close(&self) {
        let mut state = self.live.lock().await;
        if let Some(agent) = state.agent.take() {
            agent.sandbox.kill().await;
        }
    }
}

/// Sends one call to the agent and collects its output until the reply, the
/// time limit, a cancellation, the output limit or the agent's end. Returns
/// the outcome and, when the session had to be reset, why.
async fn run_call(
    agent: &mut Agent,
    id: u64,
    code: &[u8],
    env: &Environment,
    cancel: &CancellationToken,
    observer: Option<Arc<dyn Observer>>,
) -> (Outcome, Option<Reset>) {
    let limits = env.limits;
    let start = Instant::now();
    let mut out = Capture::new(limits.output_bytes);
    let mut err = Capture::new(limits.output_bytes);
    let mut header = format!("{id} {}\n", code.len()).into_bytes();
    header.extend_from_slice(code);

    enum End {
        Replied(Reply),
        AgentEnded((Option<i32>, Option<i32>)),
        Timeout,
        Cancelled,
        Output,
        Broken,
    }
    let mut total = 0u64;
    let mut buf_out = vec![0u8; 64 * 1024];
    let mut buf_err = vec![0u8; 64 * 1024];
    let deadline = tokio::time::sleep(limits.timeout);
    tokio::pin!(deadline);
    let mut send = std::pin::pin!(agent.requests.write_all(&header));
    let mut sent = false;
    let record = |stream: Stream, data: &[u8], capture: &mut Capture, total: &mut u64| {
        capture.push(data);
        *total += data.len() as u64;
        if let Some(o) = &observer {
            o.output(stream, data);
        }
    };
    let end = loop {
        tokio::select! {
            r = &mut send, if !sent => {
                if r.is_err() { break End::Broken; }
                sent = true;
            }
            line = agent.replies.next_line() => match line {
                Ok(Some(l)) => match serde_json::from_str::<Reply>(&l) {
                    Ok(r) if r.id == Some(id) => break End::Replied(r),
                    _ => continue,
                },
                _ => break End::Broken,
            },
            // The code may close its own stdout or stderr; the call goes on.
            n = agent.stdout.read(&mut buf_out), if agent.stdout_open => match n {
                Ok(n) if n > 0 => record(Stream::Stdout, &buf_out[..n], &mut out, &mut total),
                _ => agent.stdout_open = false,
            },
            n = agent.stderr.read(&mut buf_err), if agent.stderr_open => match n {
                Ok(n) if n > 0 => record(Stream::Stderr, &buf_err[..n], &mut err, &mut total),
                _ => agent.stderr_open = false,
            },
            status = agent.sandbox.exited() => break End::AgentEnded(status),
            _ = &mut deadline => break End::Timeout,
            _ = cancel.cancelled() => break End::Cancelled,
        }
        if total > limits.output_limit_bytes {
            break End::Output;
        }
    };
    // A reply channel that closed means the interpreter is ending: say how it ended.
    let end = match end {
        End::Broken => {
            match tokio::time::timeout(Duration::from_secs(1), agent.sandbox.exited()).await {
                Ok(status) => End::AgentEnded(status),
                Err(_) => End::Broken,
            }
        }
        other => other,
    };
    // Everything the code wrote before the agent replied is in the pipes now.
    if matches!(end, End::Replied(_)) {
        read_ready(&agent.stdout, &mut buf_out, |d| {
            record(Stream::Stdout, d, &mut out, &mut total)
        });
        read_ready(&agent.stderr, &mut buf_err, |d| {
            record(Stream::Stderr, d, &mut err, &mut total)
        });
    }
    let fired = agent.sandbox.fired();

    let cancelled = matches!(end, End::Cancelled);
    let (exit_code, signal, ours, exited) = match &end {
        End::Replied(r) => (Some(r.status.unwrap_or(1)), None, None, r.exited),
        End::AgentEnded((code, sig)) => (*code, *sig, None, false),
        End::Timeout | End::Cancelled => (
            None,
            Some(libc::SIGKILL),
            (!cancelled).then_some(LimitKind::Timeout),
            false,
        ),
        End::Output => (None, Some(libc::SIGKILL), Some(LimitKind::Output), false),
        End::Broken => (None, None, None, false),
    };
    let mut outcome = Outcome {
        exit_code,
        signal,
        stdout: out.finish(),
        stderr: err.finish(),
        duration: start.elapsed(),
        timed_out: ours == Some(LimitKind::Timeout),
        cancelled,
        limit: None,
        limits_reached: Vec::new(),
    };
    crate::exec::attribute_limits(&mut outcome, ours, fired);
    let killed = |cause: String| {
        Some(Reset {
            cause,
            sandbox_lost: true,
        })
    };
    let reset = match end {
        End::Replied(_) if exited => Some(Reset {
            cause: "the code ran `exit`, which ended the shell".to_string(),
            sandbox_lost: false,
        }),
        End::Replied(_) => None,
        End::AgentEnded(_) => killed(match outcome.limit {
            Some(LimitKind::Memory) => format!(
                "the session used more than its {} MiB memory limit",
                limits.memory_bytes >> 20
            ),
            Some(LimitKind::Processes) => {
                format!("the session hit its limit of {} processes", limits.pids)
            }
            _ => match (exit_code, signal) {
                (Some(c), _) => format!("the interpreter itself ended (exit status {c})"),
                (_, Some(s)) => format!("the interpreter itself was killed by signal {s}"),
                _ => "the interpreter itself ended".to_string(),
            },
        }),
        End::Timeout => killed(format!(
            "a call exceeded its {} ms time limit",
            limits.timeout.as_millis()
        )),
        End::Cancelled => killed("a call was cancelled".to_string()),
        End::Output => killed(format!(
            "a call wrote more than {} MiB of output",
            limits.output_limit_bytes >> 20
        )),
        End::Broken => killed("the session's interpreter stopped answering".to_string()),
    };
    (outcome, reset)
}

/// What a call did to its session.
#[derive(Debug, Clone)]
pub struct Reset {
    /// What happened, e.g. "a call exceeded its 30000 ms time limit".
    pub cause: String,
    /// The whole sandbox is gone (killed or ended), not just the interpreter's state.
    pub sandbox_lost: bool,
}

impl Reset {
    /// What the agent should know: the cause and what was lost.
    pub fn describe(&self) -> String {
        if self.sandbox_lost {
            format!(
                "{}, so the session was killed: its variables, imports, functions and /workspace files are gone; the next call starts a fresh session",
                self.cause
            )
        } else {
            format!(
                "{}: variables and functions are gone; files in /workspace and the working directory are kept",
                self.cause
            )
        }
    }
}
