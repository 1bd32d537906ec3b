//! What a call asks of exec: the request types (a run, a command run as
//! is, a session's agent), the executor's bounds, and what makes code
//! unfit to run.

use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use super::{Admission, Observer};
use crate::environment::Environment;
use crate::jail::ProjectMount;

/// What is wrong with `code` as a program, if anything, as a predicate for
/// the caller's name of it ("holds a NUL byte…"). Code is text: it must be
/// UTF-8, hold no NUL byte (interpreters refuse or silently drop them, and a
/// session's framing cannot carry them), and not be blank.
pub fn code_problem(code: &[u8]) -> Option<String> {
    if let Some(at) = code.iter().position(|b| *b == 0) {
        return Some(format!(
            "holds a NUL byte (at byte {at}); code must be text"
        ));
    }
    if let Err(e) = std::str::from_utf8(code) {
        return Some(format!(
            "is not valid UTF-8 (at byte {}); code must be text",
            e.valid_up_to()
        ));
    }
    if code.iter().all(u8::is_ascii_whitespace) {
        return Some(
            if code.is_empty() {
                "is empty"
            } else {
                "holds only whitespace"
            }
            .to_string(),
        );
    }
    None
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
    /// The caller's share of the run slots, when it has one (over HTTP).
    pub share: Option<&'a Admission>,
}

impl<'a> Request<'a> {
    /// A run of the server's own (a self-test, a probe): no project, no
    /// inherited variables, nobody watching, cancelled by no one.
    pub fn internal(env: &'a Environment, code: &'a [u8]) -> Request<'a> {
        Request {
            env,
            code,
            project: None,
            inherited: &[],
            cancel: CancellationToken::new(),
            observer: None,
            share: None,
        }
    }
}

/// How much the executor runs at once.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Calls running at once (`max_concurrent_runs`).
    pub max_running: usize,
    /// Calls waiting for a slot (`max_queued_runs`).
    pub max_waiting: usize,
    /// Sandboxes kept prepared per environment (0 for one-shot use).
    pub prestart: usize,
    /// What the memory limits of all live sandboxes may add up to, in MiB.
    pub memory_budget_mib: u64,
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
    /// Cancels the wait for a share of the memory budget.
    pub cancel: &'a CancellationToken,
    pub project: Option<&'a ProjectMount>,
    pub inherited: &'a [(String, String)],
    /// The agent's source, run by the environment's interpreter.
    pub program: &'a [u8],
}

/// Where a session's agent file appears in its sandbox: outside /workspace,
/// which belongs to the code the agent runs.
pub const AGENT_DIR: &str = "/run/nsm";
