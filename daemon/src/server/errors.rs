//! The tool errors a model reads when exec or a session cannot take a
//! call: each kind of failure with its code and what to do about it.

use std::sync::Arc;
use std::time::SystemTime;

use rmcp::ErrorData as McpError;

use super::result::{ErrorCode, ToolError};
use super::session_handles::{Reached, Unreachable};
use super::{SandboxServer, tasks};
use crate::environment::Environment;
use crate::exec::ExecError;
use crate::jail::ProjectMount;
use crate::jobs::Job;
use crate::sessions::SessionError;

impl SandboxServer {
    /// The job behind a task id of this server's caller, or the error the
    /// extension gives an unknown task (-32602), saying which.
    pub(super) fn task_job(&self, task_id: &str) -> Result<(Arc<Job>, SystemTime), McpError> {
        self.tasks
            .job(&self.principal, task_id, &self.shared.jobs)
            .map_err(|e| {
                let why = match e {
                    tasks::Unknown::NotIssued => {
                        "this server never issued it to this client (or it restarted since)".to_string()
                    }
                    tasks::Unknown::Forgotten => {
                        "its job finished and was forgotten (finished jobs are kept for a while)".to_string()
                    }
                    tasks::Unknown::OtherReplica(r) => format!(
                        "it is held by replica {r}, and this is {}: the load balancer must route it there (by the Mcp-Name header)",
                        self.replica_name()
                    ),
                };
                McpError::invalid_params(format!("unknown task {task_id:?}: {why}"), None)
            })
    }

    /// The configured project `name` (`[projects.NAME]`), or the error
    /// that lists those there are.
    pub(super) fn named_project<'a>(
        &'a self,
        name: &str,
    ) -> Result<(&'a str, &'a ProjectMount), ToolError> {
        if let Some((n, m)) = self.shared.projects.get_key_value(name) {
            return Ok((n.as_str(), m));
        }
        let known: Vec<&str> = self.shared.projects.keys().map(String::as_str).collect();
        Err(if known.is_empty() {
            ToolError::new(
                ErrorCode::InvalidInput,
                format!(
                    "no project is named {name:?}: `project` names a project the configuration declares ([projects.NAME]), and it declares none"
                ),
                "Run without `project`: the project is mounted at /project.",
            )
        } else {
            ToolError::new(
                ErrorCode::InvalidInput,
                format!(
                    "no project is named {name:?}: `project` names a configured project, never a path"
                ),
                format!("Use one of: {}.", known.join(", ")),
            )
        })
    }

    /// The session `given` reaches for this server's caller (a handle, or a
    /// name that gets one), or the error a model can act on.
    pub(super) fn reach_session(&self, given: &str) -> Result<Reached, ToolError> {
        self.handles
            .reach(&self.principal, given, &|h| self.shared.sessions.is_open(h))
            .map_err(|e| match e {
                Unreachable::UnknownHandle => ToolError::new(
                    ErrorCode::SessionExpired,
                    format!("no session has the handle {given:?}: it was never issued by this server as it runs now, its session closed long ago, or the server restarted"),
                    "Call with a session name to start a session, and use the handle its result gives.",
                ),
                Unreachable::OtherReplica(r) => ToolError::new(
                    ErrorCode::SessionExpired,
                    format!(
                        "the session {given:?} is held by replica {r}, and this is {}: it cannot run here",
                        self.replica_name()
                    ),
                    "The load balancer must route a session's calls to its replica (by the Mcp-Param-Session header); if that replica is gone, start a new session.",
                ),
                Unreachable::OtherPrincipal => ToolError::new(
                    ErrorCode::InvalidInput,
                    format!("the session handle {given:?} belongs to another client"),
                    "Use a session of your own: name one, and use the handle its result gives.",
                ),
                Unreachable::TooManyNames => ToolError::new(
                    ErrorCode::Busy,
                    "too many session names are in use on this server",
                    "Reuse a session you have (by its name or handle).",
                ),
            })
    }

    /// The error a model can act on for a session that cannot take the call.
    pub(super) fn session_error(
        &self,
        name: &str,
        env: &Environment,
        e: SessionError,
    ) -> ToolError {
        let message = e.to_string();
        match e {
            SessionError::Unsupported(_) => {
                let registry = self.shared.registry();
                let capable: Vec<&str> = registry
                    .iter()
                    .filter(|e| e.kind.is_some())
                    .map(|e| e.name.as_str())
                    .collect();
                ToolError::new(
                    ErrorCode::InvalidInput,
                    message,
                    if capable.is_empty() {
                        "Run without `session`.".to_string()
                    } else {
                        format!(
                            "Run without `session`, or use a session with env {}.",
                            capable.join(", ")
                        )
                    },
                )
            }
            SessionError::OtherEnv { env: owner, .. } => ToolError::new(
                ErrorCode::SessionMismatch,
                message,
                format!(
                    "Use env {owner} with session {name:?}, or give the {} session another name.",
                    env.name
                ),
            ),
            SessionError::OtherProject { project, .. } => ToolError::new(
                ErrorCode::SessionMismatch,
                message,
                format!(
                    "Call session {name:?} as it was started (in {project}), or give this one another name."
                ),
            ),
            SessionError::Gone { .. } => ToolError::new(
                ErrorCode::SessionExpired,
                message,
                format!(
                    "Call again with session {name:?} to start a fresh one (redo the setup it needs), or use a new name."
                ),
            ),
            SessionError::Full { .. } => ToolError::new(
                ErrorCode::Busy,
                message,
                "Retry when a call in one of them has finished, or run without `session`.",
            ),
            SessionError::Exec(e) => exec_error(&e),
        }
    }
}

pub fn exec_error(e: &ExecError) -> ToolError {
    match e {
        ExecError::Busy { .. } => ToolError::new(
            ErrorCode::Busy,
            format!("the server is busy: {e}"),
            "Retry in a few seconds.",
        ),
        ExecError::ShareBusy { .. } => ToolError::new(
            ErrorCode::Busy,
            e.to_string(),
            "Wait for one of your calls to end, then call again.",
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
        ExecError::OverBudget { .. } => ToolError::new(
            ErrorCode::SandboxUnavailable,
            e.to_string(),
            "This is the server's configuration, not the code: tell the user to raise [server] memory_budget_mb or lower the environment's memory_mb.",
        ),
        ExecError::Spawn { .. } | ExecError::Setup { .. } => ToolError::new(
            ErrorCode::SandboxUnavailable,
            e.to_string(),
            "This is a problem of the server's host or configuration, not of the code; tell the user to run `nix-sandbox-mcp doctor`.",
        ),
    }
}
