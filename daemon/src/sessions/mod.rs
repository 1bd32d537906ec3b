//! Sessions: interpreter state that persists across calls. A session is a
//! long-lived sandbox (the environment's policy and limits, applied to the
//! whole session) running a small agent in the environment's own language
//! (see `agent.rs` for the protocol). Each call is supervised by exec like
//! any run; this module owns the table of sessions (bounded in number, idle
//! time and lifetime; it dies with the server) and what a call's end means
//! for its session: continued, reset, or killed and restarted next time.

mod agent;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::environment::{Environment, InterpreterKind};
use crate::exec::Admission;
use crate::exec::ending::{Ending, Subject, signal_name};
use crate::exec::{
    AgentRequest, Counted, End, ExecError, Executor, Observer, Outcome, Sandbox, SetupFailure,
    Watch, supervise,
};
use crate::jail::ProjectMount;
use crate::sync::Recover;

/// How long a new agent may take to say it is ready.
const START_LIMIT: Duration = Duration::from_secs(20);
/// How long after a call's end its session is paused (see [`pause_after`]).
const PAUSE_AFTER: Duration = Duration::from_millis(3);
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
    #[error("session {name:?} works in {project}")]
    OtherProject { name: String, project: String },
    #[error("session {name:?} was closed: {why}; its state is gone")]
    Gone { name: String, why: String },
    #[error("all {max} sessions ({names}) are in a call right now")]
    Full { max: usize, names: String },
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// The session a call names.
#[derive(Clone, Copy)]
pub struct SessionCall<'a> {
    /// The table's key.
    pub key: &'a str,
    /// What the caller calls it, in messages.
    pub label: &'a str,
    /// The configured project it works in (`[projects.NAME]`), by name.
    pub project: Option<(&'a str, &'a ProjectMount)>,
    /// The caller's share of the table, when it has one: a new session of
    /// a caller at its bound closes the caller's own least recently used.
    pub share: Option<Share<'a>>,
}

/// A caller's share of the sessions: at most `max` of those whose keys it `owns`.
#[derive(Clone, Copy)]
pub struct Share<'a> {
    pub max: usize,
    pub owns: &'a (dyn Fn(&str) -> bool + Sync),
    /// The caller's share of the run slots.
    pub runs: &'a Admission,
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
    /// The project new sessions see.
    project: std::sync::RwLock<Option<ProjectMount>>,
    /// Values of the `inherit_env` variables.
    inherited: Vec<(String, String)>,
    limits: SessionLimits,
    table: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions closed by the reaper: name → (why, when).
    gone: Mutex<HashMap<String, (String, Instant)>>,
}

struct Session {
    /// What its caller names it (the table's key, or under the stateless
    /// revision the name behind the handle that keys it).
    label: String,
    /// The configured project it works in, when the call named one
    /// (`[projects.NAME]`); else the project of the server.
    project: Option<(String, ProjectMount)>,
    env: Arc<Environment>,
    created: Instant,
    last_used: Mutex<Instant>,
    /// Calls queued on it or running: a session with one is never closed
    /// to make room, nor as idle. (Its lock says less: the pause after a
    /// call holds it too.)
    calls: std::sync::atomic::AtomicUsize,
    /// One call at a time; `None` when the sandbox must be (re)started.
    /// Shared, so that pausing after a call can hold it past the call.
    live: Arc<tokio::sync::Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// The running agent's sandbox.
    agent: Option<Sandbox>,
    /// Why the sandbox is gone, for the next call's result.
    reset: Option<String>,
    started_once: bool,
    next_id: u64,
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
            project: std::sync::RwLock::new(project),
            inherited,
            limits,
            table: Mutex::new(HashMap::new()),
            gone: Mutex::new(HashMap::new()),
        }
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// Whether a session is open under `key`.
    pub fn is_open(&self, key: &str) -> bool {
        self.table.lock().recover().contains_key(key)
    }

    /// Runs `code` in the session `call` names, of `env`, creating the
    /// session on first use.
    pub async fn call(
        &self,
        call: SessionCall<'_>,
        env: &Arc<Environment>,
        code: &[u8],
        cancel: &CancellationToken,
        observer: Option<Arc<dyn Observer>>,
    ) -> Result<SessionOutcome, SessionError> {
        let kind = env
            .kind
            .ok_or_else(|| SessionError::Unsupported(env.name.clone()))?;
        let name = call.key;
        let share = call.share;
        let in_call = self.session(call, env)?;
        let session = &in_call.0;
        // Calls on one session queue here, before they take a run slot.
        let mut state = tokio::select! {
            state = session.live.clone().lock_owned() => state,
            _ = cancel.cancelled() => return Err(ExecError::CancelledWhileQueued.into()),
        };
        let _places = match self.executor.slot(cancel, share.map(|s| s.runs)).await {
            Ok(s) => s,
            Err(e) => {
                self.forget_unstarted(name, session, &state);
                return Err(e.into());
            }
        };
        *session.last_used.lock().recover() = Instant::now();
        let earlier_reset = state.reset.take();
        let start = match (state.agent.is_some(), state.started_once) {
            (true, _) => Start::Continued,
            (false, false) => Start::New,
            (false, true) => {
                Start::Restarted(earlier_reset.unwrap_or_else(|| "it had ended".to_string()))
            }
        };
        if state.agent.is_none() {
            let project = session.project.as_ref().map(|(_, m)| m);
            match self.start_agent(env, kind, project, cancel).await {
                Ok(agent) => state.agent = Some(agent),
                Err(e) => {
                    self.forget_unstarted(name, session, &state);
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
            if let Some(mut agent) = state.agent.take() {
                agent.kill().await;
            }
            state.reset = Some(r.cause.clone());
        }
        *session.last_used.lock().recover() = Instant::now();
        if state.agent.is_some() {
            drop(state);
            pause_after(session.live.clone(), id);
        }
        Ok(SessionOutcome {
            outcome,
            start,
            reset,
        })
    }

    /// A session that never ran takes no place in the table.
    fn forget_unstarted(&self, name: &str, session: &Arc<Session>, state: &State) {
        let mut table = self.table.lock().recover();
        if !state.started_once && table.get(name).is_some_and(|s| Arc::ptr_eq(s, session)) {
            table.remove(name);
        }
    }

    /// A call on session `name`, created for `env` when it does not exist
    /// yet. Counted in before the table is let go, so that no other call
    /// closes it to make room in between.
    fn session(
        &self,
        call: SessionCall<'_>,
        env: &Arc<Environment>,
    ) -> Result<InCall, SessionError> {
        let SessionCall {
            key: name,
            label,
            project,
            share,
        } = call;
        let mut table = self.table.lock().recover();
        if let Some(s) = table.get(name) {
            if s.env.name != env.name {
                return Err(SessionError::OtherEnv {
                    name: label.to_string(),
                    env: s.env.name.clone(),
                });
            }
            let theirs = s.project.as_ref().map(|(n, _)| n.as_str());
            if theirs != project.map(|(n, _)| n) {
                return Err(SessionError::OtherProject {
                    name: label.to_string(),
                    project: theirs.map_or("the server's project".to_string(), |n| {
                        format!("project {n}")
                    }),
                });
            }
            return Ok(InCall::enter(s));
        }
        // A name the reaper closed is reported once; the next call starts afresh.
        if let Some((why, _)) = self.gone.lock().recover().remove(name) {
            return Err(SessionError::Gone {
                name: label.to_string(),
                why,
            });
        }
        if let Some(share) = share {
            self.make_room(&mut table, share.owns, share.max, label, "of this caller's")?;
        }
        self.make_room(&mut table, &|_| true, self.limits.max_sessions, label, "")?;
        let s = Arc::new(Session {
            label: label.to_string(),
            project: project.map(|(n, m)| (n.to_string(), m.clone())),
            env: env.clone(),
            created: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            calls: Default::default(),
            live: Arc::new(tokio::sync::Mutex::new(State::default())),
        });
        table.insert(name.to_string(), s.clone());
        Ok(InCall::enter(&s))
    }

    /// With `max` sessions open whose keys are `among`, closes the least
    /// recently used of them not in a call, for a new session `label`
    /// (`whose` says whose, in the reason given).
    fn make_room(
        &self,
        table: &mut HashMap<String, Arc<Session>>,
        among: &(dyn Fn(&str) -> bool + Sync),
        max: usize,
        label: &str,
        whose: &str,
    ) -> Result<(), SessionError> {
        if table.keys().filter(|k| among(k)).count() < max {
            return Ok(());
        }
        let victim = table
            .iter()
            .filter(|(k, s)| among(k) && !s.in_call())
            .min_by_key(|(_, s)| *s.last_used.lock().recover())
            .map(|(n, _)| n.clone());
        let Some(victim) = victim else {
            let mut names: Vec<_> = table
                .iter()
                .filter(|(k, _)| among(k))
                .map(|(_, s)| s.label.clone())
                .collect();
            names.sort();
            return Err(SessionError::Full {
                max,
                names: names.join(", "),
            });
        };
        let closed = table.remove(&victim).expect("listed above");
        let whose = if whose.is_empty() {
            String::new()
        } else {
            format!(" {whose}")
        };
        self.remember_gone(victim, format!("it was the least recently used{whose} when session {label:?} needed its place (at most {max} are open at once)"));
        tokio::spawn(async move { closed.close().await });
        Ok(())
    }

    /// `project`: the session's own, else the server's.
    async fn start_agent(
        &self,
        env: &Environment,
        kind: InterpreterKind,
        project: Option<&ProjectMount>,
        cancel: &CancellationToken,
    ) -> Result<Sandbox, SessionError> {
        let servers = self.project.read().recover().clone();
        let mut sandbox = self
            .executor
            .start_agent(AgentRequest {
                env,
                cancel,
                project: project.or(servers.as_ref()),
                inherited: &self.inherited,
                program: agent::program_for(kind).as_bytes(),
            })
            .await?;
        let limits = crate::limits::Limits {
            timeout: START_LIMIT,
            ..env.limits
        };
        let started = supervise(
            &mut sandbox,
            &mut agent::AwaitReady,
            Watch {
                limits: &limits,
                cancel: &CancellationToken::new(),
                observer: None,
            },
        )
        .await;
        if let End::Replied(()) = started.end {
            return Ok(sandbox);
        }
        // Say what the interpreter printed, if anything.
        sandbox.kill().await;
        let detail = started.stderr.text.trim().to_string();
        Err(SessionError::Exec(ExecError::Setup {
            failure: SetupFailure::InterpreterNotReady,
            message: if detail.is_empty() {
                "the session's interpreter did not start".to_string()
            } else {
                detail
            },
        }))
    }

    /// Closes sessions idle or older than the limits; returns how many.
    pub async fn reap(&self) -> usize {
        let expired: Vec<(String, Arc<Session>, String)> = {
            let mut table = self.table.lock().recover();
            let now = Instant::now();
            let names: Vec<(String, String)> = table
                .iter()
                .filter(|(_, s)| !s.in_call())
                .filter_map(|(n, s)| {
                    let idle = now.duration_since(*s.last_used.lock().recover());
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
        let all: Vec<Arc<Session>> = self
            .table
            .lock()
            .recover()
            .drain()
            .map(|(_, s)| s)
            .collect();
        for session in all {
            session.close().await;
        }
    }

    /// Shows `project` to sessions from now on. Every open session saw the
    /// other one, so each is closed (after its call in progress), and its
    /// next call is told `why`.
    pub async fn change_project(&self, project: Option<ProjectMount>, why: &str) {
        *self.project.write().recover() = project;
        let open: Vec<(String, Arc<Session>)> = self.table.lock().recover().drain().collect();
        for (name, session) in open {
            self.remember_gone(name, why.to_string());
            session.close().await;
        }
    }

    /// Remembers, for a while, why the session `name` was closed.
    fn remember_gone(&self, name: String, why: String) {
        let mut gone = self.gone.lock().recover();
        gone.retain(|_, (_, at)| at.elapsed() < REMEMBER_GONE);
        gone.insert(name, (why, Instant::now()));
    }
}

impl Session {
    /// Kills the session's sandbox, after the call in progress, if any.
    async fn close(&self) {
        let mut state = self.live.lock().await;
        if let Some(mut agent) = state.agent.take() {
            agent.kill().await;
        }
    }
}

impl Session {
    fn in_call(&self) -> bool {
        self.calls.load(std::sync::atomic::Ordering::SeqCst) > 0
    }
}

/// A call on a session, from before it queues until it has returned.
struct InCall(Arc<Session>);

impl InCall {
    fn enter(session: &Arc<Session>) -> InCall {
        session
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InCall(session.clone())
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        self.0
            .calls
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Nothing the code left running may use the CPU until the next call, so
/// the sandbox is paused after call `id` — once its result is on its way
/// ([`PAUSE_AFTER`] later, so that reading the sandbox's processes never
/// competes with sending the result), unless the next call came first.
fn pause_after(live: Arc<tokio::sync::Mutex<State>>, id: u64) {
    tokio::spawn(async move {
        tokio::time::sleep(PAUSE_AFTER).await;
        let mut state = live.lock_owned().await;
        if state.next_id != id || state.agent.is_none() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(agent) = state.agent.as_mut() {
                agent.pause();
            }
        })
        .await;
    });
}

/// Runs one call in the agent's sandbox. Returns the outcome and, when the
/// session had to be reset, why.
async fn run_call(
    sandbox: &mut Sandbox,
    id: u64,
    code: &[u8],
    env: &Environment,
    cancel: &CancellationToken,
    observer: Option<Arc<dyn Observer>>,
) -> (Outcome, Option<Reset>) {
    let limits = env.limits;
    let start = Instant::now();
    sandbox.resume();
    sandbox.begin_call();
    let mut watched = supervise(
        sandbox,
        &mut agent::Call::new(id, code),
        Watch {
            limits: &limits,
            cancel,
            observer: observer.as_ref(),
        },
    )
    .await;
    let (usage, fired) = sandbox.settle_call();
    let network = sandbox.network_report();
    let upper = sandbox.upper_layer().map(Arc::new);
    let killed = (None, Some(libc::SIGKILL));
    let (status, exited) = match &watched.end {
        End::Replied(r) => ((Some(r.status.unwrap_or(1)), None), r.exited),
        End::Exited(e) => (crate::exec::interpret_exit(e.status), false),
        End::Broken => ((None, None), false),
        End::Timeout | End::Output | End::Cpu | End::Cancelled | End::ReplyOverflow => {
            (killed, false)
        }
    };
    let outcome = Outcome::of_call(
        &mut watched,
        status,
        Counted {
            duration: start.elapsed(),
            usage,
            network,
            upper,
            fired,
        },
    );
    let killed = |cause: String| {
        Some(Reset {
            cause,
            sandbox_lost: true,
        })
    };
    let reset = match watched.end {
        End::Replied(_) if exited => Some(Reset {
            cause: "the code ran `exit`, which ended the shell".to_string(),
            sandbox_lost: false,
        }),
        End::Replied(_) => None,
        // A limit, or the interpreter itself ending: the sandbox is gone.
        End::Exited(_) | End::Timeout | End::Cancelled | End::Output | End::Cpu => {
            killed(match Ending::of(&outcome) {
                Ending::Exited(c) => format!("the interpreter itself ended (exit status {c})"),
                Ending::Signalled(s) => {
                    format!("the interpreter itself was killed by {}", signal_name(s))
                }
                Ending::NoStatus => "the interpreter itself ended".to_string(),
                ending => ending.sentence(Subject::Session, &limits),
            })
        }
        End::ReplyOverflow => killed(format!(
            "the code wrote to the session's control channel (more than {} bytes in a line or {} KiB in a call)",
            crate::exec::supervise::REPLY_LINE_CAP,
            crate::exec::supervise::REPLY_CALL_CAP >> 10
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
