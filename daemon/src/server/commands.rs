//! Declared commands over MCP: a call's arguments checked into an
//! invocation, the user's confirmation (asked through the client, or by a
//! token and the `confirm` tool), the run in the command's environment with
//! the same jail, limits, capture, progress and cancellation as `run`, and
//! an audit entry for every step.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{CallToolResponse, CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::confirm_rounds::Retry;
use super::result::{self, ErrorCode, ToolError};
use super::{Progress, SandboxServer, either_cancelled, exec_error, progress, tool};
use crate::audit::CommandEntry;
use crate::commands::confirm::{self, Answer, Redeemed};
use crate::commands::invocation::{self, InvalidArguments};
use crate::commands::{Commands, Offered, ResolvedInvocation};
use crate::environment::Environment;
use crate::exec::{Argv, ExecError, Outcome, Request, SetupFailure};
use crate::jail::ProjectAccess;

impl SandboxServer {
    /// Handles a call of a declared command's tool.
    /// `commands`: the set the call was found in (with its project).
    /// `retry`: what a retried call of the stateless revision brings back.
    pub(super) async fn call_command(
        &self,
        commands: &Commands,
        offered: &Offered,
        args: Option<&JsonObject>,
        retry: Retry<'_>,
        context: &RequestContext<RoleServer>,
        progress: Option<Progress>,
    ) -> CallToolResponse {
        let resolved = invocation::split_background(args).and_then(|(rest, background)| {
            invocation::resolve(&offered.command, rest.as_ref(), commands.project())
                .map(|inv| (inv, background))
        });
        let (inv, background) = match resolved {
            Ok(r) => r,
            Err(e) => return result::error_result(&invalid_arguments(offered, e)).into(),
        };
        let how = How {
            background,
            tasks: super::declares_tasks(context),
        };
        if !offered.command.confirm {
            return self
                .run_invocation(commands, &inv, how, context.ct.clone(), progress)
                .await;
        }
        if super::stateless(context) {
            return self
                .confirm_in_rounds(commands, offered, args, &inv, how, retry, context, progress)
                .await;
        }
        self.confirm_by_asking(commands, offered, args, &inv, how, context, progress)
            .await
    }

    /// Confirmation under 2025-11-25: the server asks the client's user
    /// (elicitation) and waits; without elicitation, a token.
    #[allow(clippy::too_many_arguments)]
    async fn confirm_by_asking(
        &self,
        commands: &Commands,
        offered: &Offered,
        args: Option<&JsonObject>,
        inv: &ResolvedInvocation,
        how: How,
        context: &RequestContext<RoleServer>,
        progress: Option<Progress>,
    ) -> CallToolResponse {
        let digest = inv.digest();
        if confirm::client_can_ask(context.client_capabilities().as_ref()) {
            self.audit_command("asked", inv, Some("elicitation"), None, None);
            // Progress while the user thinks keeps clients with short
            // request timeouts waiting, and tells the agent why.
            let asked = std::time::Instant::now();
            let waiting = progress
                .as_ref()
                .map(|p| p.waiting(&offered.tool, commands.ask_timeout));
            let answer = confirm::ask(
                &context.peer,
                question(commands, offered, inv),
                commands.ask_timeout,
                &context.ct,
            )
            .await;
            if let Some(w) = waiting {
                w.abort();
            }
            let (event, error) = match answer {
                Answer::Approved => {
                    self.audit_command("confirmed", inv, Some("elicitation"), None, None);
                    let progress = progress.map(|p| p.after(asked.elapsed()));
                    return self
                        .run_invocation(commands, inv, how, context.ct.clone(), progress)
                        .await;
                }
                Answer::Declined | Answer::Cancelled => ("declined", declined(offered, &answer)),
                Answer::TimedOut => (
                    "expired",
                    ToolError::new(
                        ErrorCode::ConfirmationExpired,
                        format!(
                            "the user did not answer in {} s; nothing ran",
                            commands.ask_timeout.as_secs()
                        ),
                        format!(
                            "Call {} again when the user is there to confirm it.",
                            offered.tool
                        ),
                    ),
                ),
                Answer::CallCancelled => (
                    "declined",
                    ToolError::new(
                        ErrorCode::Cancelled,
                        "the call was cancelled while the user was asked; nothing ran",
                        "Call it again if you still need it.",
                    ),
                ),
                Answer::Failed(why) => {
                    tracing::warn!(
                        "cannot ask the user to confirm {}: {why}; handing out a token instead",
                        offered.tool
                    );
                    return self
                        .issue_token(commands, offered, args, inv, digest)
                        .into();
                }
            };
            self.audit_command(
                event,
                inv,
                Some("elicitation"),
                None,
                Some(error.code.as_str()),
            );
            return result::error_result(&error).into();
        }
        self.issue_token(commands, offered, args, inv, digest)
            .into()
    }

    /// The result that hands out a token for `inv`.
    pub(super) fn issue_token(
        &self,
        commands: &Commands,
        offered: &Offered,
        args: Option<&JsonObject>,
        inv: &ResolvedInvocation,
        digest: [u8; 32],
    ) -> CallToolResult {
        let tokens = &commands.tokens;
        let token = match tokens.issue(&self.principal, digest) {
            Ok(t) => t,
            Err(e) => {
                return result::error_result(&ToolError::new(
                    ErrorCode::Internal,
                    format!("no randomness for a confirmation token: {e}"),
                    "Tell the user; the command cannot be confirmed on this machine now.",
                ));
            }
        };
        self.audit_command("asked", inv, Some("token"), None, None);
        let arguments = Value::Object(args.cloned().unwrap_or_default());
        let ttl = tokens.ttl().as_secs().max(1);
        let call =
            json!({"token": token.reveal(), "command": offered.tool, "arguments": arguments});
        let err = ToolError::new(
            ErrorCode::ConfirmationRequired,
            format!(
                "{} runs only after the user confirms it; nothing ran yet. It would run: {}",
                offered.tool,
                inv.display_argv()
            ),
            format!(
                "Show the user that command. If they agree, call {} with {call} within {ttl} s; if not, do not run it.",
                tool::CONFIRM
            ),
        );
        result::confirmation_required(
            &err,
            json!({
                "token": token.reveal(),
                "command": offered.tool,
                "arguments": arguments,
                "argv": inv.argv,
                "expires_in_s": ttl,
            }),
        )
    }

    /// Handles a `confirm` call: runs the invocation its token was issued for
    /// (as a job when its arguments say `background`; a task when `tasks`).
    pub(super) async fn confirm(
        &self,
        commands: &Commands,
        args: Option<&JsonObject>,
        tasks: bool,
        cancel: CancellationToken,
        progress: Option<Progress>,
    ) -> CallToolResponse {
        let result = async {
            let args = super::Arguments::new(args, tool::CONFIRM, &["token", "command", "arguments"], CONFIRM_SHAPE)?;
            let token = args.string("token")?.ok_or_else(|| args.invalid("missing argument `token`"))?;
            let name = args.string("command")?.ok_or_else(|| args.invalid("missing argument `command`"))?;
            let arguments = match args.get("arguments") {
                None => None,
                Some(Value::Object(m)) => Some(m.clone()),
                Some(v) => return Err(args.wrong("arguments", "an object", v)),
            };
            let catalog = commands.catalog();
            let offered = catalog
                .by_tool(&name)
                .filter(|o| o.command.confirm)
                .ok_or_else(|| {
                    let confirmable: Vec<&str> = catalog
                        .offered
                        .iter()
                        .filter(|o| o.command.confirm)
                        .map(|o| o.tool.as_str())
                        .collect();
                    args.invalid(&format!(
                        "{name:?} is not a command that needs confirmation (those are: {})",
                        confirmable.join(", ")
                    ))
                })?;
            let (arguments, background) = invocation::split_background(arguments.as_ref())
                .map_err(|e| invalid_arguments(offered, e))?;
            let inv = invocation::resolve(&offered.command, arguments.as_ref(), commands.project())
                .map_err(|e| invalid_arguments(offered, e))?;
            let how = How { background, tasks };
            let again = format!("Call {} again for a new token.", offered.tool);
            match commands.tokens.redeem(&token, &self.principal, &inv.digest()) {
                Redeemed::Valid => {
                    self.audit_command("confirmed", &inv, Some("token"), None, None);
                    Ok(self.run_invocation(commands, &inv, how, cancel, progress).await)
                }
                Redeemed::Expired => {
                    let e = ToolError::new(
                        ErrorCode::ConfirmationExpired,
                        format!(
                            "the token expired (tokens last {} s); nothing ran",
                            commands.tokens.ttl().as_secs().max(1)
                        ),
                        again,
                    );
                    self.audit_command("expired", &inv, Some("token"), None, Some(e.code.as_str()));
                    Err(e)
                }
                Redeemed::Unknown => Err(ToolError::new(
                    ErrorCode::ConfirmationInvalid,
                    "the token is unknown or already used (each token works once); nothing ran",
                    again,
                )),
                Redeemed::OtherInvocation => {
                    let e = ToolError::new(
                        ErrorCode::ConfirmationInvalid,
                        "the token was issued for a different invocation (other command or arguments); it is now used up and nothing ran",
                        format!("{again} Pass back the command and arguments exactly as in its confirmation."),
                    );
                    self.audit_command("refused", &inv, Some("token"), None, Some(e.code.as_str()));
                    Err(e)
                }
            }
        }
        .await;
        result.unwrap_or_else(|e| result::error_result(&e).into())
    }

    /// Runs an invocation in its environment's jail with the command's
    /// limits, and records it.
    /// `how`: in the foreground, or as a job (a task for a client that
    /// declared the extension).
    pub(super) async fn run_invocation(
        &self,
        commands: &Commands,
        inv: &ResolvedInvocation,
        how: How,
        request_cancel: CancellationToken,
        progress: Option<Progress>,
    ) -> CallToolResponse {
        let env = match self.command_env(inv) {
            Ok(env) => env,
            Err(e) => return result::error_result(&e).into(),
        };
        if how.background {
            let job = match self.start_command_job(commands, inv, env) {
                Ok(job) => job,
                Err(e) => return result::error_result(&e).into(),
            };
            return match how
                .tasks
                .then(|| self.tasks.issue(&self.principal, &job, &self.shared.jobs))
                .flatten()
            {
                Some(task) => CallToolResponse::Task(task),
                None => super::job_result::job_started(&job).into(),
            };
        }
        self.run_in_foreground(commands, inv, env, request_cancel, progress)
            .await
            .into()
    }

    /// The environment a command runs in: its environment's, with the
    /// command's time limit, output, network and variables.
    pub(super) fn command_env(&self, inv: &ResolvedInvocation) -> Result<Environment, ToolError> {
        let base = match self.environment(&inv.env) {
            Ok(env) => env,
            Err(e) if e.code == ErrorCode::SandboxUnavailable => return Err(e),
            Err(_) => {
                return Err(ToolError::new(
                    ErrorCode::SandboxUnavailable,
                    format!("the command's environment {} is not available", inv.env),
                    "Tell the user to fix the command's declaration.",
                ));
            }
        };
        let mut env = (*base).clone();
        if let Some(t) = inv.timeout {
            env.limits.timeout = t;
        }
        if let Some(b) = inv.output_bytes {
            env.limits.output_bytes = b;
        }
        env.network = inv.network.clone();
        env.vars.extend(inv.vars.iter().cloned());
        Ok(env)
    }

    async fn run_in_foreground(
        &self,
        commands: &Commands,
        inv: &ResolvedInvocation,
        env: Environment,
        request_cancel: CancellationToken,
        progress: Option<Progress>,
    ) -> CallToolResult {
        let cancel = either_cancelled(&request_cancel, &self.shared.shutdown);
        let live = Arc::new(progress::Live::default());
        let reporter = progress.map(|p| p.report(&live, env.limits.timeout));
        let project = commands.project();
        let absent = super::project::absent_protected(project);
        let outcome = self
            .shared
            .executor
            .run_argv(
                Request {
                    env: &env,
                    code: b"",
                    project,
                    inherited: &self.shared.inherited,
                    cancel: cancel.clone(),
                    observer: Some(live),
                    share: self.run_share(),
                },
                Argv {
                    argv: &inv.argv,
                    workdir: &inv.workdir,
                },
            )
            .await;
        if let Some(r) = reporter {
            r.abort();
        }
        cancel.cancel();
        match outcome {
            Ok(o) => {
                let title = format!("command {}", inv.command);
                let note = self
                    .project_note(project, o.upper.clone(), absent, title, None)
                    .await;
                let r = result::run_result(&env.name, &o, &env.limits, None, note.as_ref());
                let error = result::run_error(&o, &env.limits);
                self.audit_command(
                    "run",
                    inv,
                    None,
                    Some(&o),
                    error.as_ref().map(|e| e.code.as_str()),
                );
                r
            }
            Err(e) => {
                let err = start_error(inv, &e);
                self.audit_command("run", inv, None, None, Some(err.code.as_str()));
                result::error_result(&err)
            }
        }
    }

    pub(super) fn audit_command(
        &self,
        event: &str,
        inv: &ResolvedInvocation,
        via: Option<&str>,
        outcome: Option<&Outcome>,
        error: Option<&str>,
    ) {
        if event == "run" {
            let seconds = outcome.map(|o| o.duration.as_secs_f64());
            self.shared
                .metrics
                .run(&inv.env, "command", error.unwrap_or("ok"), seconds);
        }
        if let Some(log) = &self.shared.audit {
            log.record_command(&CommandEntry {
                principal: &self.principal,
                event,
                command: &inv.command,
                env: &inv.env,
                argv: &inv.argv,
                invocation: &inv.digest(),
                via,
                outcome,
                error,
            });
        }
    }
}

const CONFIRM_SHAPE: &str = "Call confirm with the `confirmation` a command returned: {\"token\": …, \"command\": …, \"arguments\": {…}}.";

/// What the user is asked.
pub(super) fn question(commands: &Commands, offered: &Offered, inv: &ResolvedInvocation) -> String {
    let c = &offered.command;
    let writes = match commands.project().map(|p| p.access) {
        Some(ProjectAccess::ReadWrite) => "the project's files themselves",
        Some(ProjectAccess::Overlay) => {
            "a copy of the project (your files are not written; its changes come back as a patch)"
        }
        Some(ProjectAccess::ReadOnly) | None => "only its own scratch directory",
    };
    format!(
        "Allow {} to run?\n\n    {}\n\nin {} (environment {}), danger {}, network {}; it may write {writes}.",
        offered.tool,
        inv.display_argv(),
        inv.workdir,
        inv.env,
        c.danger.as_str(),
        c.network
            .policy()
            .map_or("off".to_string(), |p| p.described())
    )
}

/// How a declared command's call runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct How {
    /// As a job: the call returns at once (`background`).
    pub(super) background: bool,
    /// The call declared the tasks extension: a job is a task.
    pub(super) tasks: bool,
}

/// The error for a question the user declined (or dismissed): nothing ran.
pub(super) fn declined(offered: &Offered, answer: &Answer) -> ToolError {
    ToolError::new(
        ErrorCode::ConfirmationDeclined,
        format!(
            "the user {} running {}; nothing ran",
            if *answer == Answer::Declined {
                "declined"
            } else {
                "dismissed the question about"
            },
            offered.tool
        ),
        "Do not retry on your own; ask the user what they want instead.",
    )
}

/// The error for arguments that cannot be used: what is wrong, and how the
/// tool is called.
fn invalid_arguments(offered: &Offered, e: InvalidArguments) -> ToolError {
    let params: Vec<String> = offered
        .command
        .params
        .iter()
        .map(|p| {
            let mark = if p.required { "" } else { "?" };
            format!("{}{mark}", p.name)
        })
        .collect();
    let suggestion = if params.is_empty() {
        format!("Call {} with no arguments.", offered.tool)
    } else {
        format!(
            "Call {} with {{{}}} ('?': optional), each as its input schema says.",
            offered.tool,
            params.join(", ")
        )
    };
    ToolError::new(ErrorCode::InvalidInput, e.message, suggestion)
}

/// A command that could not start: most often its program is not in the
/// environment.
fn start_error(inv: &ResolvedInvocation, e: &ExecError) -> ToolError {
    match e {
        ExecError::Setup {
            failure: SetupFailure::CommandNotStarted,
            message,
        } => ToolError::new(
            ErrorCode::SandboxUnavailable,
            format!("{} could not start {}: {message}", inv.command, inv.argv[0]),
            format!(
                "The program is not in environment {}; tell the user to fix the command's declaration.",
                inv.env
            ),
        ),
        other => exec_error(other),
    }
}
