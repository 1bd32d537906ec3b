//! The MCP surface: the `run` tool over rmcp, argument checks with errors a
//! model can act on, and the translation of runs into tool results. Knows the
//! registry and the executor only through their public interfaces.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, JsonObject,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::audit::{self, AuditLog};
use crate::exec::{ExecError, Executor, Request};
use crate::jail::ProjectMount;
use crate::registry::Registry;

pub mod result;
pub mod tool;

use result::{ErrorCode, ToolError};

/// The newest protocol revision this server implements.
pub const MAX_PROTOCOL: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// Shared state of the server, built once at start-up.
pub struct Shared {
    pub registry: Registry,
    pub executor: Executor,
    pub project: Option<ProjectMount>,
    /// Variables passed through from the daemon's environment at call time.
    pub inherit_env: Vec<String>,
    /// Cancelled when the server shuts down: every run in flight is killed.
    pub shutdown: CancellationToken,
    pub audit: Option<Arc<AuditLog>>,
}

#[derive(Clone)]
pub struct SandboxServer {
    shared: Arc<Shared>,
    tool: Arc<Tool>,
    instructions: Arc<String>,
}

impl SandboxServer {
    pub fn new(shared: Shared) -> SandboxServer {
        let envs: Vec<_> = shared.registry.iter().cloned().collect();
        let output_bytes = envs
            .iter()
            .map(|e| e.limits.output_bytes)
            .max()
            .unwrap_or(16 * 1024);
        let tool = tool::run_tool(&envs, shared.project.as_ref(), output_bytes);
        let inherited = crate::config::read_inherited(&shared.inherit_env);
        for env in &envs {
            if let Err(e) = shared
                .executor
                .keep_ready_for(env, shared.project.as_ref(), &inherited)
            {
                tracing::warn!("sandboxes for {} start on demand: {e}", env.name);
            }
        }
        let instructions = tool::instructions(&envs);
        SandboxServer {
            shared: Arc::new(shared),
            tool: Arc::new(tool),
            instructions: Arc::new(instructions),
        }
    }

    pub fn tools(&self) -> Vec<Tool> {
        vec![(*self.tool).clone()]
    }

    pub fn instructions(&self) -> &str {
        &self.instructions
    }

    fn env_list(&self) -> String {
        self.shared.registry.names().join(", ")
    }

    /// Handles a `run` call; every failure becomes an error result.
    pub async fn run(
        &self,
        args: Option<&JsonObject>,
        request_cancel: CancellationToken,
    ) -> CallToolResult {
        match self.try_run(args, request_cancel).await {
            Ok(r) => r,
            Err(e) => result::error_result(&e),
        }
    }

    async fn try_run(
        &self,
        args: Option<&JsonObject>,
        request_cancel: CancellationToken,
    ) -> Result<CallToolResult, ToolError> {
        let args = parse_run_args(args, &self.env_list())?;
        let env = self.shared.registry.get(&args.env).ok_or_else(|| {
            let what = if args.env.is_empty() {
                "`env` is empty".to_string()
            } else {
                format!("there is no environment {:?}", args.env)
            };
            ToolError::new(
                ErrorCode::UnknownEnv,
                what,
                format!("Set `env` to one of: {}.", self.env_list()),
            )
        })?;
        let inherited = crate::config::read_inherited(&self.shared.inherit_env);
        let cancel = either_cancelled(&request_cancel, &self.shared.shutdown);
        let outcome = self
            .shared
            .executor
            .run(Request {
                env,
                code: args.code.as_bytes(),
                project: self.shared.project.as_ref(),
                inherited,
                cancel: cancel.clone(),
                observer: None,
            })
            .await;
        cancel.cancel();
        let result = outcome.as_ref().map_err(exec_error);
        if let Some(log) = &self.shared.audit {
            let error = match &result {
                Ok(o) => result::run_error(o, &env.limits).map(|e| e.code.as_str()),
                Err(e) => Some(e.code.as_str()),
            };
            log.record(&audit::Entry {
                env,
                code: args.code.as_bytes(),
                kind: "run",
                outcome: outcome.as_ref().ok(),
                error,
            });
        }
        result.map(|o| result::run_result(&env.name, o, &env.limits))
    }
}

/// Arguments of `run`, checked.
#[derive(Debug)]
pub struct RunArgs {
    pub code: String,
    pub env: String,
}

pub fn parse_run_args(args: Option<&JsonObject>, envs: &str) -> Result<RunArgs, ToolError> {
    let empty = JsonObject::new();
    let args = args.unwrap_or(&empty);
    let invalid = |msg: String| {
        ToolError::new(
            ErrorCode::InvalidInput,
            msg,
            "Call run with {\"env\": <name>, \"code\": <program text>}.",
        )
    };
    if let Some(k) = args.keys().find(|k| !matches!(k.as_str(), "code" | "env")) {
        return Err(invalid(format!(
            "unknown argument `{k}`; run takes `code` and `env`"
        )));
    }
    let env = match args.get("env") {
        None => {
            return Err(ToolError::new(
                ErrorCode::InvalidInput,
                "missing argument `env`",
                format!("Set `env` to one of: {envs}."),
            ));
        }
        Some(Value::String(s)) => s.trim().to_string(),
        Some(other) => {
            return Err(ToolError::new(
                ErrorCode::InvalidInput,
                format!("`env` must be a string, not {}", json_type(other)),
                format!("Set `env` to one of: {envs}."),
            ));
        }
    };
    let code = match args.get("code") {
        None => {
            return Err(invalid(
                "missing argument `code` (the program text to run)".into(),
            ));
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(invalid(format!(
                "`code` must be a string, not {}",
                json_type(other)
            )));
        }
    };
    if code.trim().is_empty() {
        return Err(ToolError::new(
            ErrorCode::InvalidInput,
            "`code` is empty",
            "Pass the program text to run in `code`.",
        ));
    }
    Ok(RunArgs { code, env })
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub fn exec_error(e: &ExecError) -> ToolError {
    match e {
        ExecError::Busy { .. } => ToolError::new(
            ErrorCode::Busy,
            format!("the server is busy: {e}"),
            "Retry in a few seconds.",
        ),
        ExecError::CancelledWhileQueued => ToolError::new(
            ErrorCode::Cancelled,
            e.to_string(),
            "Run it again if you still need the result.",
        ),
        ExecError::CodeTooLarge { .. } => ToolError::new(
            ErrorCode::InvalidInput,
            e.to_string(),
            "Send less code: generate large data inside the sandbox instead of inlining it.",
        ),
        ExecError::Spawn(_) | ExecError::Setup(_) => ToolError::new(
            ErrorCode::SandboxUnavailable,
            e.to_string(),
            "This is a problem of the server's host or configuration, not of the code; tell the user to run `nix-sandbox-mcp doctor`.",
        ),
    }
}

/// A token cancelled when either input is (or when dropped by the caller via `cancel`).
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
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.protocol_version = MAX_PROTOCOL;
        info.server_info = Implementation::new("nix-sandbox-mcp", env!("CARGO_PKG_VERSION"))
            .with_title("Nix sandbox");
        info.instructions = Some((*self.instructions).clone());
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&MAX_PROTOCOL))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        match request.name.as_ref() {
            tool::RUN => Ok(self
                .run(request.arguments.as_ref(), context.ct.clone())
                .await
                .into()),
            other => Err(McpError::invalid_params(
                format!("unknown tool {other:?}; this server offers: {}", tool::RUN),
                None,
            )),
        }
    }
}
