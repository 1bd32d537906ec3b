//! The MCP surface: the `run` and `job` tools and the tools of declared
//! commands (`commands.rs`) over rmcp, argument checks with errors a model
//! can act on (`errors.rs` for the executor's and sessions' failures),
//! progress (`progress.rs`) and cancellation of calls, and the translation
//! of runs and jobs into tool results (`result.rs`); the project the
//! client's roots name (`roots.rs`). Knows the registry, the executor, the job table and the
//! declared commands only through their public interfaces.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, CustomRequest,
    CustomResult, GetTaskParams, GetTaskResult, Implementation, InitializeRequestParams,
    InitializeResult, JsonObject, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
    ServerConfig, SubscriptionFilter, TASKS_EXTENSION_ID, Tool, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use crate::audit::{self, AuditLog};
use crate::config::Config;
use crate::environment::Environment;
use crate::exec::{Executor, Observer, Outcome, Request};
use crate::jail::ProjectMount;
use crate::jobs::Jobs;
use crate::registry::{Builds, Gathered, Registry};
use crate::sessions::{SessionCall, SessionOutcome, Sessions, Share, Start};

mod arguments;
pub mod caller;
mod commands;
mod confirm_rounds;
mod environments;
mod errors;
pub mod framing;
pub mod http;
mod ids;
mod job_result;
mod job_tool;
mod progress;
mod project;
mod provenance;
pub mod result;
mod roots;
mod session_handles;
mod tasks;
pub mod tool;
mod uri;

pub use errors::exec_error;
pub use ids::check_replica;
use progress::Progress;
pub use roots::ProjectState;

use crate::commands::sealed::SealedStates;
use crate::sync::Recover;
use arguments::Arguments;
use caller::{DEFAULT_PROJECT, Grants, missing_scope};
use confirm_rounds::Retry;
use result::{ErrorCode, ToolError};

/// The newest protocol revision this server implements: a client that
/// sends requests with its `_meta` (or asks `server/discover`) gets it.
pub const MAX_PROTOCOL: ProtocolVersion = ProtocolVersion::V_2026_07_28;
/// The newest revision with an `initialize` handshake: a client that sends
/// `initialize` gets it (or the older one it asks for).
pub const MAX_HANDSHAKE_PROTOCOL: ProtocolVersion = ProtocolVersion::LATEST_WITH_INITIALIZE;
/// Longest a `job` call waits for a job to finish.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Longest tools/list and calls wait for the start checks (each check is
/// bounded by its own time limit; this is a backstop).
const CHECKS_WAIT: Duration = Duration::from_secs(60);

/// Shared state of the server, built once at start-up (the registry is
/// replaced as Nix builds end, see [`SandboxServer::publish`]; the project
/// when the client's roots name another, see `roots.rs`).
pub struct Shared {
    pub config: Arc<Config>,
    pub registry: RwLock<Arc<Registry>>,
    pub executor: Executor,
    /// The project and the declared commands, read from it.
    pub project: RwLock<Arc<ProjectState>>,
    /// Values of the `inherit_env` variables, read when the server starts
    /// (the daemon's environment does not change while it runs).
    pub inherited: Vec<(String, String)>,
    /// Cancelled when the server shuts down: every run in flight is killed.
    pub shutdown: CancellationToken,
    pub audit: Option<Arc<AuditLog>>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub jobs: Jobs,
    pub sessions: Arc<Sessions>,
    /// `[projects.NAME]`: the projects a call may name in `project`.
    pub projects: std::collections::BTreeMap<String, ProjectMount>,
    /// This server's name among replicas (over HTTP), put in the handles
    /// of what lives on it: sessions and tasks.
    pub replica: Option<String>,
}

impl Shared {
    /// The environments offered now.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.read().recover().clone()
    }

    /// The project now; a call keeps the one it started with.
    pub fn project_state(&self) -> Arc<ProjectState> {
        self.project.read().recover().clone()
    }
}

#[derive(Clone)]
pub struct SandboxServer {
    shared: Arc<Shared>,
    /// `run` and `job`, as the registry last published makes them.
    tools: Arc<RwLock<Vec<Tool>>>,
    instructions: Arc<String>,
    /// The largest per-stream output cap of any environment: what `job` returns at most.
    output_bytes: Arc<AtomicUsize>,
    /// The clients initialized under 2025-11-25 (over HTTP, one per MCP
    /// session; closed ones are let go): told when the tools change.
    peers: Arc<std::sync::Mutex<Vec<Peer<RoleServer>>>>,
    /// The open `subscriptions/listen` streams (2026-07-28) that asked to be
    /// told when the tools change.
    listeners: Arc<std::sync::Mutex<Vec<SubscriptionSink>>>,
    /// Set once the client is initialized and the project file is watched.
    watching: Arc<std::sync::OnceLock<()>>,
    /// The patches of the project's changes, and what sessions last reported.
    ledger: Arc<project::Ledger>,
    /// Set once the client's roots were read (see `roots.rs`).
    roots_read: Arc<tokio::sync::watch::Sender<bool>>,
    /// False while the environments' start checks run (see [`Self::follow_builds`]).
    checked: Arc<tokio::sync::watch::Sender<bool>>,
    /// Held while the project is switched.
    switching: Arc<tokio::sync::Mutex<()>>,
    /// The task offering environments as their Nix builds end.
    building: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
    /// Who calls: on stdio, the one connection this server serves (a
    /// random name made at start); over HTTP, the principal its
    /// credentials name (see [`Self::for_principal`]). What a caller is
    /// handed (sessions, jobs, tasks, confirmations) is bound to it.
    principal: Arc<str>,
    /// Served over HTTP: the client's roots are not followed (they are
    /// paths on another machine), sessions have handles under both
    /// revisions, and a request may do what its grants allow.
    remote: bool,
    /// The principal's share of the server (HTTP only).
    quota: Option<Arc<caller::Quota>>,
    /// Background runs as tasks, for callers that declare the extension.
    tasks: Arc<tasks::Tasks>,
    /// Sessions' handles under the stateless revision.
    handles: Arc<session_handles::Handles>,
    /// The key confirmation states are sealed with, made at start (`None`:
    /// the system gave no randomness; confirmation falls back to tokens).
    sealed: Option<Arc<SealedStates>>,
}

impl SandboxServer {
    pub fn new(shared: Shared) -> SandboxServer {
        let registry = shared.registry();
        let replica = shared.replica.clone();
        let envs: Vec<_> = registry.iter().cloned().collect();
        let instructions = tool::instructions(&envs);
        let server = SandboxServer {
            shared: Arc::new(shared),
            tools: Arc::default(),
            instructions: Arc::new(instructions),
            output_bytes: Arc::default(),
            peers: Arc::default(),
            listeners: Arc::default(),
            watching: Arc::default(),
            ledger: Arc::default(),
            roots_read: Arc::new(tokio::sync::watch::Sender::new(false)),
            checked: Arc::new(tokio::sync::watch::Sender::new(true)),
            switching: Arc::default(),
            building: Arc::default(),
            principal: stdio_principal().into(),
            remote: false,
            quota: None,
            handles: Arc::new(session_handles::Handles::new(replica.clone())),
            tasks: Arc::new(tasks::Tasks::new(replica.clone())),
            sealed: SealedStates::new(replica)
                .inspect_err(|e| {
                    tracing::warn!("no key for confirmation states ({e}); confirmation under 2026-07-28 uses tokens")
                })
                .ok()
                .map(Arc::new),
        };
        server.offer(&registry, None);
        server.watch_project_file();
        server
    }

    /// This server as `principal` reaches it over HTTP: the same
    /// environments, executor, tables and listeners, with its own name,
    /// quota and ledger of project changes.
    pub fn for_principal(&self, principal: &str, quota: caller::Quota) -> SandboxServer {
        SandboxServer {
            principal: principal.into(),
            remote: true,
            quota: Some(Arc::new(quota)),
            ledger: Arc::default(),
            ..self.clone()
        }
    }

    /// The tools offered now: `run`, `job`, and the declared commands'
    /// (with `confirm` when one of them needs confirmation).
    pub fn tools(&self) -> Vec<Tool> {
        let state = self.shared.project_state();
        let catalog = state.commands.catalog();
        let mut tools = self.tools.read().recover().clone();
        if catalog.is_empty() {
            return tools;
        }
        tools[0] = tool::with_commands(tools[0].clone(), &catalog);
        let project = state.mount.as_ref();
        tools.extend(
            catalog
                .offered
                .iter()
                .map(|o| tool::command_tool(o, project)),
        );
        if catalog.any_confirm() {
            tools.push(tool::confirm_tool(&catalog, project));
        }
        tools
    }

    pub fn instructions(&self) -> &str {
        &self.instructions
    }

    fn env_list(&self) -> String {
        self.shared.registry().names().join(", ")
    }

    fn environment(&self, name: &str) -> Result<Arc<Environment>, ToolError> {
        let registry = self.shared.registry();
        if let Some(env) = registry.get(name) {
            return Ok(env.clone());
        }
        if registry.is_building(name) {
            return Err(ToolError::new(
                ErrorCode::SandboxUnavailable,
                format!("the environment {name:?} is still being built by Nix"),
                "Call again once the tool list changes (the server says so when the build ends), or use another environment meanwhile.",
            ));
        }
        if let Some(why) = registry.build_failure(name) {
            return Err(ToolError::new(
                ErrorCode::SandboxUnavailable,
                format!("the environment {name:?} could not be built: {why}"),
                format!(
                    "Tell the user the build failed; meanwhile use one of: {}.",
                    self.env_list()
                ),
            ));
        }
        let what = if name.is_empty() {
            "`env` is empty".to_string()
        } else {
            format!("there is no environment {name:?}")
        };
        Err(ToolError::new(
            ErrorCode::UnknownEnv,
            what,
            format!("Set `env` to one of: {}.", self.env_list()),
        ))
    }

    /// Handles a `run` call; every failure becomes an error result.
    /// `stateless`: the call speaks 2026-07-28, where sessions have handles;
    /// `tasks`: it declared the tasks extension, so a background run is a task;
    /// `grants`: the environments and projects it may use.
    async fn run(
        &self,
        args: Option<&JsonObject>,
        cancel: CancellationToken,
        progress: Option<Progress>,
        (stateless, tasks): (bool, bool),
        grants: &Grants,
    ) -> CallToolResponse {
        let result = async {
            let args = Arguments::new(args, tool::RUN, &["code", "env", "session", "background", "project"], RUN_SHAPE)?;
            let env_name = args.string("env")?.ok_or_else(|| {
                ToolError::new(
                    ErrorCode::InvalidInput,
                    "missing argument `env`",
                    format!("Set `env` to one of: {}.", self.env_list()),
                )
            })?;
            let code = args
                .string("code")?
                .ok_or_else(|| args.invalid("missing argument `code` (the program text to run)"))?;
            if let Some(problem) = crate::exec::code_problem(code.as_bytes()) {
                return Err(ToolError::new(
                    ErrorCode::InvalidInput,
                    format!("`code` {problem}"),
                    "Pass the program text to run in `code`; send binary data as a file in the project, or encode it (base64) and decode it in the code.",
                ));
            }
            let env = self.environment(env_name.trim())?;
            grants.may_use_env(&env.name)?;
            let project = args.string("project")?;
            grants.may_use_project(project.as_deref().unwrap_or(DEFAULT_PROJECT))?;
            let named = match project {
                Some(name) => Some(self.named_project(&name)?),
                None => None,
            };
            let session = args.string("session")?;
            if let Some(name) = &session {
                check_session_name(name).map_err(|m| args.invalid(&m))?;
            }
            match (args.bool("background")?.unwrap_or(false), session) {
                (true, Some(_)) => Err(args.invalid("`session` and `background` cannot be combined: a session runs one call at a time, in the foreground")),
                (true, None) => {
                    let job = self.start_job(env, code, named)?;
                    match tasks.then(|| self.tasks.issue(&self.principal, &job, &self.shared.jobs)).flatten() {
                        Some(task) => Ok(CallToolResponse::Task(task)),
                        None => Ok(job_result::job_started(&job).into()),
                    }
                }
                (false, None) => Ok(self.run_now(&env, &code, None, named, cancel, progress).await.into()),
                (false, Some(name)) => {
                    // Over HTTP a name is the caller's own under both revisions.
                    let handle = match stateless || self.remote {
                        true => Some(self.reach_session(&name)?.handle),
                        false => None,
                    };
                    let session = SessionRef { name: &name, handle: handle.as_deref() };
                    Ok(self.run_now(&env, &code, Some(session), named, cancel, progress).await.into())
                }
            }
        }
        .await;
        result.unwrap_or_else(|e| result::error_result(&e).into())
    }

    /// Runs `code` and waits for it, in a fresh sandbox or in a session.
    async fn run_now(
        &self,
        env: &Arc<Environment>,
        code: &str,
        session: Option<SessionRef<'_>>,
        named: Option<NamedProject<'_>>,
        request_cancel: CancellationToken,
        progress: Option<Progress>,
    ) -> CallToolResult {
        let cancel = either_cancelled(&request_cancel, &self.shared.shutdown);
        let live = Arc::new(progress::Live::default());
        let reporter = progress.map(|p| p.report(&live, env.limits.timeout));
        let state = self.shared.project_state();
        let mount = named.map(|(_, m)| m).or(state.mount.as_ref());
        let absent = project::absent_protected(mount);
        let owns = |key: &str| self.handles.owns(&self.principal, key);
        let outcome = match session {
            None => self
                .shared
                .executor
                .run(Request {
                    env,
                    code: code.as_bytes(),
                    project: mount,
                    inherited: &self.shared.inherited,
                    cancel: cancel.clone(),
                    observer: Some(live),
                    share: self.run_share(),
                })
                .await
                .map(|o| (o, None))
                .map_err(|e| exec_error(&e)),
            Some(session) => self
                .shared
                .sessions
                .call(
                    SessionCall {
                        key: session.key(),
                        label: session.name,
                        project: named,
                        share: self.quota.as_ref().map(|q| Share {
                            max: q.max_sessions,
                            owns: &owns,
                            runs: &q.runs,
                        }),
                    },
                    env,
                    code.as_bytes(),
                    &cancel,
                    Some(live),
                )
                .await
                .map(|s| {
                    let SessionOutcome {
                        outcome,
                        start,
                        reset,
                    } = s;
                    (outcome, Some((start, reset)))
                })
                .map_err(|e| self.session_error(session.name, env, e)),
        };
        if let Some(r) = reporter {
            r.abort();
        }
        cancel.cancel();
        let kind = if session.is_some() { "session" } else { "run" };
        self.audit(env, code, kind, outcome.as_ref().map(|(o, _)| o));
        let note = match &outcome {
            Ok((o, started)) => {
                let title = match session {
                    Some(s) => format!("{} session {:?}", env.name, s.name),
                    None => format!("{} run", env.name),
                };
                let title = match named {
                    Some((name, _)) => format!("{title} in project {name}"),
                    None => title,
                };
                let fresh = matches!(started, Some((Start::New | Start::Restarted(_), _)));
                let session = session.map(|s| (s.key(), fresh));
                self.project_note(mount, o.upper.clone(), absent, title, session)
                    .await
            }
            Err(_) => None,
        };
        match &outcome {
            Ok((o, None)) => result::run_result(&env.name, o, &env.limits, None, note.as_ref()),
            Ok((o, Some((start, reset)))) => {
                let (state, restarted_because) = match start {
                    Start::New => ("new", None),
                    Start::Continued => ("continued", None),
                    Start::Restarted(why) => ("restarted", Some(why.as_str())),
                };
                let reset = reset.as_ref().map(|r| r.describe());
                let project = note.clone();
                let note = result::SessionNote {
                    name: session.map_or("", |s| s.name),
                    handle: session.and_then(|s| s.handle),
                    state,
                    restarted_because,
                    reset: reset.as_deref(),
                };
                result::run_result(&env.name, o, &env.limits, Some(&note), project.as_ref())
            }
            Err(e) => result::error_result(e),
        }
    }

    /// This server's name among replicas, in messages.
    fn replica_name(&self) -> &str {
        self.shared
            .replica
            .as_deref()
            .unwrap_or("a server that is no replica")
    }

    /// The caller's share of the run slots (HTTP; none on stdio).
    fn run_share(&self) -> Option<&crate::exec::Admission> {
        self.quota.as_ref().map(|q| &q.runs)
    }

    fn audit(
        &self,
        env: &Environment,
        code: &str,
        kind: &str,
        outcome: Result<&Outcome, &ToolError>,
    ) {
        let error = match &outcome {
            Ok(o) => result::run_error(o, &env.limits).map(|e| e.code.as_str()),
            Err(e) => Some(e.code.as_str()),
        };
        let seconds = outcome.ok().map(|o| o.duration.as_secs_f64());
        self.shared
            .metrics
            .run(&env.name, kind, error.unwrap_or("ok"), seconds);
        let Some(log) = &self.shared.audit else {
            return;
        };
        log.record(&audit::Entry {
            principal: &self.principal,
            env,
            code: code.as_bytes(),
            kind,
            outcome: outcome.ok(),
            error,
        });
    }
}

const RUN_SHAPE: &str = "Call run with {\"env\": <name>, \"code\": <program text>}; add \"session\": <name> to keep state between calls, or \"background\": true to start a job.";

/// Session names: short, and safe to show and log.
fn check_session_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(ok_char) {
        return Err(format!(
            "`session` must be 1 to 64 letters, digits, '.', '_' or '-', not {name:?}"
        ));
    }
    Ok(())
}
const JOB_SHAPE: &str = "Call job with no arguments to list jobs, or {\"id\": \"job-1\", \"wait_seconds\": 30} to wait for one and read its new output.";

/// A token cancelled when either input is (or when the caller cancels it).
pub fn either_cancelled(a: &CancellationToken, b: &CancellationToken) -> CancellationToken {
    let out = CancellationToken::new();
    let (a, b, o) = (a.clone(), b.clone(), out.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = a.cancelled() => o.cancel(),
            _ = b.cancelled() => o.cancel(),
            _ = o.cancelled() => {}
        }
    });
    out
}

impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        // Prompts: none, but declared, as the list rmcp answers with (empty)
        // says: a server that answers prompts/list declares prompts.
        let mut capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_prompts()
            .enable_tasks()
            .build();
        // The project file's commands, environments Nix is still building,
        // and a project that follows the client's roots change while the
        // server runs.
        if (self
            .shared
            .project_state()
            .commands
            .project_file()
            .is_some()
            || !self.shared.registry().building.is_empty()
            || !self.shared.config.project.path_is_explicit)
            && let Some(tools) = capabilities.tools.as_mut()
        {
            tools.list_changed = Some(true);
        }
        let mut info = ServerConfig::new(capabilities);
        info.protocol_version = MAX_HANDSHAKE_PROTOCOL;
        info.server_info = Implementation::new("nix-sandbox-mcp", env!("CARGO_PKG_VERSION"))
            .with_title("Nix sandbox");
        info.instructions = Some((*self.instructions).clone());
        info
    }

    /// As rmcp's: the client's revision when it is one with a handshake that
    /// is supported, else [`MAX_HANDSHAKE_PROTOCOL`]; and the tasks
    /// extension, which 2026-07-28 has and the handshake revisions have not,
    /// is left out.
    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, McpError> {
        let mut info = self.get_info();
        if let Some(extensions) = info.capabilities.extensions.as_mut() {
            extensions.remove(TASKS_EXTENSION_ID);
            if extensions.is_empty() {
                info.capabilities.extensions = None;
            }
        }
        if request.protocol_version.has_initialize()
            && self
                .supported_protocol_versions()
                .contains(&request.protocol_version)
        {
            info.protocol_version = request.protocol_version.clone();
        }
        Ok(info)
    }

    /// A tool by name: rmcp checks a call's `Mcp-Param-*` headers against
    /// its schema (`x-mcp-header`).
    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|t| t.name == name)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&MAX_PROTOCOL))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // Only checked environments are listed; the descriptions and the
        // project file's commands follow the project.
        self.ready(&context.peer).await;
        // A caller sees the tools its grants let it call.
        let grants = Grants::of(&context, self.remote);
        let tools = self
            .tools()
            .into_iter()
            .filter(|t| missing_scope(&t.name, &grants).is_none())
            .collect();
        let mut list = ListToolsResult::with_all_items(tools);
        list.meta = provenance::with_server_info(list.meta, stateless(&context));
        Ok(list)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let tool = request.name.to_string();
        let stateless = stateless(&context);
        let mut response = guarded(&tool, self.call_tool_unguarded(request, context)).await;
        match &mut response {
            Ok(CallToolResponse::Complete(result)) => {
                provenance::stamp(result, &self.shared.registry(), stateless);
            }
            Ok(CallToolResponse::InputRequired(asked)) => {
                asked.meta = provenance::with_server_info(asked.meta.take(), stateless);
            }
            _ => {}
        }
        response
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let mut list = project::list(&self.ledger);
        list.meta = provenance::with_server_info(list.meta, stateless(&context));
        Ok(list)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let mut read = project::read(&self.ledger, &request.uri)?;
        read.meta = provenance::with_server_info(read.meta, stateless(&context));
        Ok(read.into())
    }

    /// rmcp hands a standard request whose params do not fit its type here,
    /// as if the method were unknown; say what is wrong instead. Under
    /// 2026-07-28 the methods it removed are unknown.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let removed = ["initialize", "ping", "logging/setLevel"];
        if stateless(&context) && removed.contains(&request.method.as_str()) {
            return Err(McpError::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("{} is not a method of MCP 2026-07-28", request.method),
                None,
            ));
        }
        let standard = [
            "initialize",
            "ping",
            "tools/list",
            "tools/call",
            "resources/list",
            "resources/read",
            "resources/templates/list",
            "prompts/list",
            "prompts/get",
            "completion/complete",
            "logging/setLevel",
        ];
        if standard.contains(&request.method.as_str()) {
            return Err(McpError::invalid_params(
                format!(
                    "the params of {} do not have the shape the MCP specification gives them",
                    request.method
                ),
                None,
            ));
        }
        Err(McpError::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("unknown method {:?}", request.method),
            None,
        ))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        {
            let mut peers = self.peers.lock().recover();
            peers.retain(|p| !p.is_transport_closed());
            peers.push(context.peer.clone());
        }
        if self.remote || self.watching.set(()).is_err() {
            return;
        }
        self.follow_roots(&context.peer).await;
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let (job, created) = self.task_job(&request.task_id)?;
        let (stdout, stderr) = job.read(None, None, self.output_bytes.load(Ordering::Relaxed));
        let mut status = job_result::job_status(&job, &stdout, &stderr);
        provenance::stamp(&mut status, &self.shared.registry(), true);
        let ttl = self.shared.jobs.limits().retention;
        Ok(tasks::detailed(
            &request.task_id,
            &job,
            created,
            status,
            ttl,
        ))
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let (job, _) = self.task_job(&request.task_id)?;
        job.kill();
        Ok(())
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        // A job asks for no input: answers are ignored, as the extension
        // says of answers to nothing outstanding.
        self.task_job(&request.task_id).map(|_| ())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        // Only the tool list changes (rmcp also drops what get_info does
        // not advertise).
        let mut accepted = SubscriptionFilter::new();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let sink = context.sink().clone();
        self.listeners.lock().recover().push(sink.clone());
        context.cancelled().await;
        self.listeners
            .lock()
            .recover()
            .retain(|s| s.id() != sink.id());
        Ok(())
    }

    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        if !self.remote && self.watching.get().is_some() {
            self.follow_roots(&context.peer).await;
        }
    }
}

/// The session a call names: the name given, and under the stateless
/// revision the handle it reaches (which keys the session table then).
#[derive(Clone, Copy)]
struct SessionRef<'a> {
    name: &'a str,
    handle: Option<&'a str>,
}

impl<'a> SessionRef<'a> {
    /// The session table's key.
    fn key(&self) -> &'a str {
        self.handle.unwrap_or(self.name)
    }
}

/// A configured project a call names (`[projects.NAME]`): its name and mount.
type NamedProject<'a> = (&'a str, &'a ProjectMount);

/// The principal of the stdio connection: random, so that nothing sealed
/// for one server's client is taken for another's.
fn stdio_principal() -> String {
    let mut bytes = [0u8; 16];
    let _ = getrandom::fill(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("stdio:{}:{hex}", std::process::id())
}

/// Whether the request speaks the stateless revision (2026-07-28 and
/// later): no handshake, no requests from the server to the client.
fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| !v.has_initialize())
}

/// Whether the request speaks the stateless revision and declared the
/// tasks extension: a background run is then a task.
fn declares_tasks(context: &RequestContext<RoleServer>) -> bool {
    stateless(context)
        && context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
}

/// Sends `notifications/tools/list_changed` without waiting for it: to the
/// initialized client (2025-11-25), and on each listen stream that asked
/// for it (2026-07-28).
fn tell_tools_changed(peers: Vec<Peer<RoleServer>>, listeners: Vec<SubscriptionSink>) {
    for peer in peers {
        tokio::spawn(async move {
            if let Err(e) = peer.notify_tool_list_changed().await {
                tracing::debug!("cannot tell the client the tools changed: {e}");
            }
        });
    }
    for sink in listeners {
        tokio::spawn(async move {
            if let Err(e) = sink.notify_tool_list_changed().await {
                tracing::debug!("cannot tell a listener the tools changed: {e}");
            }
        });
    }
}

impl SandboxServer {
    /// A tool call, which [`guarded`] runs so that a panic fails it alone.
    async fn call_tool_unguarded(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let progress = context.meta.get_progress_token().map(|token| Progress {
            peer: context.peer.clone(),
            token,
            before: Duration::ZERO,
        });
        self.ready(&context.peer).await;
        let args = request.arguments.as_ref();
        let commands = self.shared.project_state().commands.clone();
        let grants = Grants::of(&context, self.remote);
        let name = request.name.as_ref();
        if let Some(scope) = missing_scope(name, &grants) {
            let err = caller::forbidden(
                format!(
                    "this caller's credentials do not allow {name} (it needs the scope {scope})"
                ),
                format!(
                    "Ask the server's operator for {scope}, or use a tool this caller may use."
                ),
            );
            return Ok(result::error_result(&err).into());
        }
        match name {
            tool::RUN => {
                let era = (stateless(&context), declares_tasks(&context));
                Ok(self
                    .run(args, context.ct.clone(), progress, era, &grants)
                    .await)
            }
            tool::JOB => Ok(self.job(args, progress).await.into()),
            tool::CONFIRM if commands.catalog().any_confirm() => {
                let tasks = declares_tasks(&context);
                Ok(self
                    .confirm(&commands, args, tasks, context.ct.clone(), progress)
                    .await)
            }
            other => {
                let catalog = commands.catalog();
                match catalog.by_tool(other) {
                    Some(offered) => {
                        if let Err(e) = grants.may_use_project(DEFAULT_PROJECT) {
                            return Ok(result::error_result(&e).into());
                        }
                        if offered.command.confirm && !grants.confirm {
                            let err = caller::forbidden(
                                format!(
                                    "{other} needs the user's confirmation, and this caller's credentials do not allow confirming (the scope sandbox:confirm)"
                                ),
                                "Ask the server's operator for sandbox:confirm.",
                            );
                            return Ok(result::error_result(&err).into());
                        }
                        let retry = Retry {
                            input_responses: request.input_responses.as_ref(),
                            request_state: request.request_state.as_deref(),
                        };
                        Ok(self
                            .call_command(&commands, offered, args, retry, &context, progress)
                            .await)
                    }
                    None => Err(McpError::invalid_params(
                        format!(
                            "unknown tool {other:?}; this server offers: {}",
                            self.tools()
                                .iter()
                                .map(|t| t.name.as_ref())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        None,
                    )),
                }
            }
        }
    }
}

/// Runs `call` (the tool call `tool`); a panic in it (a bug) becomes an
/// `internal` error of that call, and the server goes on serving.
async fn guarded(
    tool: &str,
    call: impl std::future::Future<Output = Result<CallToolResponse, McpError>>,
) -> Result<CallToolResponse, McpError> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!("a call to {tool} failed on an internal error (a bug): {what}");
            let err = ToolError::new(
                ErrorCode::Internal,
                format!(
                    "the server failed on an internal error (a bug) in this call to {tool}; other calls are unaffected"
                ),
                "Run it again; if it keeps happening, report it with the server's log.",
            );
            Ok(result::error_result(&err).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_in_a_call_fails_that_call_alone() {
        let panicking = async {
            if true {
                panic!("a bug");
            }
            Ok(CallToolResult::success(Vec::new()).into())
        };
        let answer = guarded("run", panicking).await.unwrap();
        let CallToolResponse::Complete(r) = answer else {
            panic!("not a tool result");
        };
        assert_eq!(r.is_error, Some(true));
        let text = serde_json::to_string(&r).unwrap();
        assert!(
            text.contains("\"internal\"") && text.contains("other calls are unaffected"),
            "{text}"
        );
        // The runtime that ran it goes on.
        let fine = guarded("run", async {
            Ok(CallToolResult::success(Vec::new()).into())
        })
        .await;
        assert!(fine.is_ok());
    }
}
