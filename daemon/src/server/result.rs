//! Tool results: the structured content (matching the published output schema)
//! and the readable text block, for runs and for errors. Every error carries a
//! stable code and a one-line suggestion of what to do next.

use std::collections::BTreeSet;

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Map, Value, json};

use crate::changes::Note;
use crate::exec::ending::{Ending, Subject, signal_name};
use crate::exec::{LimitKind, Outcome};
use crate::limits::Limits;

/// Stable, machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    ExitNonzero,
    KilledBySignal,
    Timeout,
    MemoryLimit,
    ProcessLimit,
    CpuLimit,
    OutputLimit,
    /// The program succeeded but some of its output could not be read.
    OutputIncomplete,
    FileSizeLimit,
    Cancelled,
    UnknownEnv,
    UnknownJob,
    SessionExpired,
    SessionMismatch,
    InvalidInput,
    Busy,
    SandboxUnavailable,
    Internal,
    /// A declared command waits for the user's confirmation (a token was issued).
    ConfirmationRequired,
    /// The user declined or dismissed the question: nothing ran.
    ConfirmationDeclined,
    /// No answer in time, or the token expired: nothing ran.
    ConfirmationExpired,
    /// A token that is unknown, used, or bound to another invocation: nothing ran.
    ConfirmationInvalid,
    /// The caller's credentials do not allow it (an environment, a project,
    /// confirming): nothing ran.
    Forbidden,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ExitNonzero => "exit_nonzero",
            ErrorCode::KilledBySignal => "killed_by_signal",
            ErrorCode::Timeout => "timeout",
            ErrorCode::MemoryLimit => "memory_limit",
            ErrorCode::ProcessLimit => "process_limit",
            ErrorCode::CpuLimit => "cpu_limit",
            ErrorCode::OutputLimit => "output_limit",
            ErrorCode::OutputIncomplete => "output_incomplete",
            ErrorCode::FileSizeLimit => "file_size_limit",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::UnknownEnv => "unknown_env",
            ErrorCode::UnknownJob => "unknown_job",
            ErrorCode::SessionExpired => "session_expired",
            ErrorCode::SessionMismatch => "session_mismatch",
            ErrorCode::InvalidInput => "invalid_input",
            ErrorCode::Busy => "busy",
            ErrorCode::SandboxUnavailable => "sandbox_unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::ConfirmationRequired => "confirmation_required",
            ErrorCode::ConfirmationDeclined => "confirmation_declined",
            ErrorCode::ConfirmationExpired => "confirmation_expired",
            ErrorCode::ConfirmationInvalid => "confirmation_invalid",
            ErrorCode::Forbidden => "forbidden",
        }
    }
}

/// An error as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
    pub suggestion: String,
}

impl ToolError {
    pub fn new(
        code: ErrorCode,
        message: impl Into<String>,
        suggestion: impl Into<String>,
    ) -> ToolError {
        ToolError {
            code,
            message: message.into(),
            suggestion: suggestion.into(),
        }
    }

    pub(super) fn to_json(&self) -> Value {
        json!({"code": self.code.as_str(), "message": self.message, "suggestion": self.suggestion})
    }

    pub(super) fn to_text(&self) -> String {
        format!(
            "error[{}]: {}\nnext: {}",
            self.code.as_str(),
            self.message,
            self.suggestion
        )
    }
}

/// The output schema of `run`: one shape for every result, success or error.
/// Fields that do not apply (an exit code after a kill, a signal after a normal
/// exit) are left out rather than null, which keeps the schema small; the
/// rare `stdout_incomplete` and `stderr_incomplete` (a stream that could not
/// be read to its end) are not listed, which the schema allows; nor is
/// `ran` (what produced the result, on every result: docs/protocol.md), to
/// keep the schema within its budget of the agent's context.
/// `network`, `sessions` and `changes` say whether the tool can report a
/// network allowance, a session and changes to the project; the properties
/// it cannot return are left out, each costing the agent's context a few
/// tokens.
pub fn output_schema(network: bool, sessions: bool, changes: bool) -> Map<String, Value> {
    let t = |ty: &str| json!({"type": ty});
    let mut schema = json!({
        "type": "object",
        "properties": {
            "ok": t("boolean"),
            "env": t("string"),
            "exit_code": t("integer"),
            "signal": t("string"),
            "stdout": t("string"),
            "stderr": t("string"),
            "duration_ms": t("integer"),
            "cpu_ms": t("integer"),
            "network_denied": {"type": "array", "items": t("string")},
            "peak_memory_bytes": t("integer"),
            "timed_out": t("boolean"),
            "limit": t("string"),
            "limits_reached": {"type": "array", "items": t("string")},
            "stdout_dropped_bytes": t("integer"),
            "stderr_dropped_bytes": t("integer"),
            "job": t("string"),
            "error": t("object")
        },
        "required": ["ok"]
    });
    if network {
        schema["properties"]["network"] = t("object");
    }
    if sessions {
        schema["properties"]["session"] = t("object");
    }
    if changes {
        schema["properties"]["changes"] = t("object");
    }
    match schema {
        Value::Object(m) => m,
        _ => unreachable!("schema literal is an object"),
    }
}

/// The output schema of a declared command's tool and of `confirm`: the
/// run's, and the confirmation a call may wait for.
pub fn command_output_schema(network: bool, changes: bool) -> Map<String, Value> {
    let mut schema = output_schema(network, false, changes);
    schema["properties"]["confirmation"] = json!({"type": "object"});
    schema
}

/// A declared command's call that waits for the user: nothing ran;
/// `confirmation` says how to confirm it.
pub fn confirmation_required(err: &ToolError, confirmation: Value) -> CallToolResult {
    tool_result(
        json!({"ok": false, "error": err.to_json(), "confirmation": confirmation}),
        err.to_text(),
        true,
    )
}

/// A tool result: `structured` as the structured content, `text` as the one
/// readable block, flagged as an error when `is_error`.
pub(super) fn tool_result(structured: Value, text: String, is_error: bool) -> CallToolResult {
    let mut r = if is_error {
        CallToolResult::structured_error(structured)
    } else {
        CallToolResult::structured(structured)
    };
    r.content = vec![ContentBlock::text(text)];
    r
}

/// A result for an error that happened before any code ran.
pub fn error_result(err: &ToolError) -> CallToolResult {
    tool_result(
        json!({"ok": false, "error": err.to_json()}),
        err.to_text(),
        true,
    )
}

/// The error a finished run amounts to, if any: its ending (see
/// `exec::ending`) as an error code, the ending's sentence, what it cost
/// the sandbox, and what to do next.
pub fn run_error(o: &Outcome, limits: &Limits) -> Option<ToolError> {
    let ending = Ending::of(o);
    let said = ending.sentence(Subject::Run, limits);
    let e =
        |code, message: String, suggestion: &str| Some(ToolError::new(code, message, suggestion));
    match ending {
        Ending::Exited(0) => incomplete_output(o).map(|(stream, why)| {
            ToolError::new(
                ErrorCode::OutputIncomplete,
                format!("the program succeeded, but its {stream} could not be read to the end: {why}"),
                "Run it again; if it keeps happening, have the program write its output to a file under /workspace and print a summary.",
            )
        }),
        Ending::Cancelled => e(
            ErrorCode::Cancelled,
            format!("{said} and its sandbox killed"),
            "Run it again if you still need the result.",
        ),
        Ending::Limit(LimitKind::Timeout) => e(
            ErrorCode::Timeout,
            format!("{said}; the whole sandbox was killed"),
            "Make the code faster or do less per call (for example split the work, or run a subset of the tests).",
        ),
        Ending::Limit(LimitKind::Memory) => e(
            ErrorCode::MemoryLimit,
            format!("{said} and was killed"),
            "Use less memory: process data in chunks or stream it instead of loading it whole.",
        ),
        Ending::Limit(LimitKind::Processes) => e(
            ErrorCode::ProcessLimit,
            said,
            "Start fewer processes or threads (lower the worker count of test runners or builds).",
        ),
        Ending::Limit(LimitKind::Cpu) => e(
            ErrorCode::CpuLimit,
            format!("{said} and was stopped"),
            "Do less computation per call.",
        ),
        Ending::Limit(LimitKind::Output) => e(
            ErrorCode::OutputLimit,
            format!("{said} and was killed"),
            "Print less: filter the output (grep, head, tail) or write it to a file under /workspace and print a summary.",
        ),
        Ending::Limit(LimitKind::FileSize) => e(
            ErrorCode::FileSizeLimit,
            said,
            "Write smaller files.",
        ),
        Ending::Signalled(_) => e(
            ErrorCode::KilledBySignal,
            said,
            "Read stderr above; the program crashed or killed itself.",
        ),
        Ending::Exited(_) => e(
            ErrorCode::ExitNonzero,
            said,
            "Read stderr above, fix the code, and run it again.",
        ),
        Ending::NoStatus => e(
            ErrorCode::Internal,
            said,
            "Run it again; if it keeps happening, check the server's log.",
        ),
    }
}

/// The first stream that could not be read to its end, and why.
fn incomplete_output(o: &Outcome) -> Option<(&'static str, &str)> {
    [("stdout", &o.stdout), ("stderr", &o.stderr)]
        .into_iter()
        .find_map(|(name, c)| c.incomplete.as_deref().map(|why| (name, why)))
}

/// What a run in a session did to the session, for its result.
pub struct SessionNote<'a> {
    pub name: &'a str,
    /// Its handle, under the stateless revision.
    pub handle: Option<&'a str>,
    /// "new", "continued" or "restarted".
    pub state: &'static str,
    /// Why it was restarted (what ended the previous one).
    pub restarted_because: Option<&'a str>,
    /// What this run did to it, when it lost state.
    pub reset: Option<&'a str>,
}

impl SessionNote<'_> {
    fn to_json(&self) -> Value {
        let mut v = json!({"name": self.name, "state": self.state});
        if let Some(handle) = self.handle {
            v["handle"] = json!(handle);
        }
        if let Some(why) = self.restarted_because {
            v["restarted_because"] = json!(why);
        }
        if let Some(why) = self.reset {
            v["reset"] = json!(why);
        }
        v
    }
}

/// The result of a finished run (in a session when `session` is given).
/// `project` is what it did to the project, when anything.
pub fn run_result(
    env: &str,
    o: &Outcome,
    limits: &Limits,
    session: Option<&SessionNote>,
    project: Option<&Note>,
) -> CallToolResult {
    let err = run_error(o, limits);
    let mut v = json!({
        "ok": err.is_none(),
        "env": env,
        "stdout": o.stdout.text,
        "stderr": o.stderr.text,
        "duration_ms": o.duration.as_millis() as u64,
        "timed_out": o.timed_out,
        "limits_reached": o.limits_reached.iter().map(|l| l.as_str()).collect::<Vec<_>>(),
        "stdout_dropped_bytes": o.stdout.dropped_bytes,
        "stderr_dropped_bytes": o.stderr.dropped_bytes,
    });
    if let Some(code) = o.exit_code {
        v["exit_code"] = json!(code);
    }
    if let Some(sig) = o.signal {
        v["signal"] = json!(signal_name(sig));
    }
    if let Some(limit) = o.limit {
        v["limit"] = json!(limit.as_str());
    }
    for (key, c) in [
        ("stdout_incomplete", &o.stdout),
        ("stderr_incomplete", &o.stderr),
    ] {
        if let Some(why) = &c.incomplete {
            v[key] = json!(format!("{} bytes were not read: {why}", c.dropped_bytes));
        }
    }
    add_usage(&mut v, o);
    add_network(&mut v, o);
    if let Some(e) = &err {
        v["error"] = e.to_json();
    }
    if let Some(s) = session {
        v["session"] = s.to_json();
    }
    let mut text = run_text(env, o, err.as_ref(), session);
    let mut link = None;
    if let Some(note) = project {
        v["changes"] = super::project::to_json(note);
        text = format!("{text}\n{}", super::project::to_text(note).trim_end());
        link = super::project::link(note);
    }
    let mut r = tool_result(v, text, err.is_some());
    r.content.extend(link);
    r
}

/// What went through the proxy: the hosts refused (for the agent to ask the
/// user about), and the whole record when there was any traffic.
pub(super) fn add_network(v: &mut Value, o: &Outcome) {
    let Some(report) = &o.network else {
        return;
    };
    let denied = report.denied_subjects();
    if !denied.is_empty() {
        v["network_denied"] = json!(denied);
    }
    if !report.is_empty() {
        v["network"] = json!(report);
    }
}

/// "network: refused pypi.org (not on the allowlist), …", with what to allow.
fn network_text(o: &Outcome) -> String {
    let Some(report) = &o.network else {
        return String::new();
    };
    if report.denied.is_empty() {
        return String::new();
    }
    let refused: Vec<String> = report
        .denied
        .iter()
        .map(|d| format!("{}:{} ({})", d.subject(), d.port, d.reason))
        .collect();
    let mut text = format!("network: refused {}\n", refused.join("; "));
    let hosts: BTreeSet<&str> = report
        .denied
        .iter()
        .filter(|d| d.method.is_none())
        .map(|d| d.host.as_str())
        .collect();
    if !hosts.is_empty() {
        let hosts: Vec<&str> = hosts.into_iter().collect();
        text += &format!(
            "to allow them, the user adds {} to the environment's network allowlist\n",
            hosts.join(", ")
        );
    }
    if report.denied.iter().any(|d| d.method.is_some()) {
        text += "refused requests are the environment's request rules at work; only the user can change them\n";
    }
    text
}

/// CPU time and peak memory, where they were counted.
pub(super) fn add_usage(v: &mut Value, o: &Outcome) {
    if let Some(cpu) = o.usage.cpu {
        v["cpu_ms"] = json!(cpu.as_millis() as u64);
    }
    if let Some(peak) = o.usage.peak_memory_bytes {
        v["peak_memory_bytes"] = json!(peak);
    }
}

/// "cpu 120 ms, peak memory 45.2 MiB", or what of it was counted.
fn usage_text(o: &Outcome) -> String {
    let mut parts = Vec::new();
    if let Some(cpu) = o.usage.cpu {
        parts.push(format!("cpu {} ms", cpu.as_millis()));
    }
    if let Some(peak) = o.usage.peak_memory_bytes {
        parts.push(format!(
            "peak memory {:.1} MiB",
            peak as f64 / (1 << 20) as f64
        ));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

fn run_text(
    env: &str,
    o: &Outcome,
    err: Option<&ToolError>,
    session: Option<&SessionNote>,
) -> String {
    let status = match (o.exit_code, o.signal) {
        _ if o.timed_out => "timed out".to_string(),
        _ if o.cancelled => "cancelled".to_string(),
        (_, Some(s)) => format!("killed by {}", signal_name(s)),
        (Some(c), None) => format!("exit {c}"),
        (None, None) => "no exit status".to_string(),
    };
    let usage = usage_text(o);
    let mut t = match session {
        Some(s) => format!(
            "[{env}, session {} {}] {status} in {} ms{usage}\n",
            s.name,
            s.state,
            o.duration.as_millis()
        ),
        None => format!("[{env}] {status} in {} ms{usage}\n", o.duration.as_millis()),
    };
    if let Some(why) = session.and_then(|s| s.restarted_because) {
        t.push_str(&format!(
            "(a fresh session: the previous one ended because {why})\n"
        ));
    }
    for (name, c) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
        if c.total_bytes > 0 {
            t.push_str(&format!("--- {name} ---\n{}", c.text));
            if !c.text.ends_with('\n') {
                t.push('\n');
            }
        }
    }
    if o.stdout.total_bytes == 0 && o.stderr.total_bytes == 0 {
        t.push_str("(no output)\n");
    }
    t.push_str(&network_text(o));
    if let Some(why) = session.and_then(|s| s.reset) {
        t.push_str(&format!("session: {why}\n"));
    }
    if let Some(e) = err {
        t.push_str(&e.to_text());
    }
    t.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::capture::Captured;
    use std::time::Duration;

    fn outcome(exit: Option<i32>, signal: Option<i32>, limit: Option<LimitKind>) -> Outcome {
        Outcome {
            stdout: Captured {
                text: "out\n".into(),
                total_bytes: 4,
                dropped_bytes: 0,
                incomplete: None,
            },
            duration: Duration::from_millis(12),
            timed_out: limit == Some(LimitKind::Timeout),
            limit,
            limits_reached: limit.into_iter().collect(),
            ..Outcome::ended(exit, signal)
        }
    }

    fn structured(r: &CallToolResult) -> &Value {
        r.structured_content.as_ref().unwrap()
    }

    #[test]
    fn output_that_could_not_be_read_is_never_a_success() {
        let l = Limits::resolve(Default::default());
        let mut o = outcome(Some(0), None, None);
        o.stderr = Captured {
            text: "partial".into(),
            total_bytes: 70_007,
            dropped_bytes: 70_000,
            incomplete: Some("the stream was still open".into()),
        };
        let r = run_result("bash", &o, &l, None, None);
        let s = structured(&r);
        assert_eq!((s["ok"].clone(), r.is_error), (json!(false), Some(true)));
        assert_eq!(s["error"]["code"], "output_incomplete");
        assert!(
            s["error"]["message"]
                .as_str()
                .unwrap()
                .contains("its stderr")
        );
        assert_eq!(
            s["stderr_incomplete"],
            "70000 bytes were not read: the stream was still open"
        );
        // A failure stays the failure it is; the loss is still stated.
        o.exit_code = Some(2);
        let s = structured(&run_result("bash", &o, &l, None, None)).clone();
        assert_eq!(s["error"]["code"], "exit_nonzero");
        assert!(s["stderr_incomplete"].is_string());
    }

    #[test]
    fn success_is_not_an_error_and_matches_schema_shape() {
        let l = Limits::resolve(Default::default());
        let r = run_result("python", &outcome(Some(0), None, None), &l, None, None);
        assert_eq!(r.is_error, Some(false));
        let s = structured(&r);
        assert_eq!(s["ok"], true);
        assert_eq!(s["exit_code"], 0);
        assert!(s.get("error").is_none());
        let schema = output_schema(true, true, true);
        for key in s.as_object().unwrap().keys() {
            assert!(
                schema["properties"].get(key).is_some(),
                "{key} missing from schema"
            );
        }
    }

    #[test]
    fn nonzero_exit_is_an_error_with_code() {
        let l = Limits::resolve(Default::default());
        let r = run_result("bash", &outcome(Some(3), None, None), &l, None, None);
        assert_eq!(r.is_error, Some(true));
        assert_eq!(structured(&r)["error"]["code"], "exit_nonzero");
        let text = match &r.content[0] {
            ContentBlock::Text(t) => t.text.clone(),
            _ => panic!(),
        };
        assert!(text.starts_with("[bash] exit 3 in 12 ms"), "{text}");
        assert!(text.contains("error[exit_nonzero]"), "{text}");
        assert!(text.contains("next: "), "{text}");
    }

    #[test]
    fn limits_map_to_codes() {
        let l = Limits::resolve(Default::default());
        for (limit, code) in [
            (LimitKind::Timeout, "timeout"),
            (LimitKind::Memory, "memory_limit"),
            (LimitKind::Processes, "process_limit"),
            (LimitKind::Cpu, "cpu_limit"),
            (LimitKind::Output, "output_limit"),
            (LimitKind::FileSize, "file_size_limit"),
        ] {
            let r = run_result("x", &outcome(None, Some(9), Some(limit)), &l, None, None);
            assert_eq!(structured(&r)["error"]["code"], code);
            assert_eq!(structured(&r)["limit"], limit.as_str());
        }
    }

    #[test]
    fn error_result_has_code_and_suggestion_in_both_forms() {
        let e = ToolError::new(
            ErrorCode::UnknownEnv,
            "no env \"ruby\"",
            "Use one of: bash, python.",
        );
        let r = error_result(&e);
        assert_eq!(r.is_error, Some(true));
        assert_eq!(structured(&r)["error"]["code"], "unknown_env");
        assert_eq!(structured(&r)["ok"], false);
        match &r.content[0] {
            ContentBlock::Text(t) => {
                assert!(t.text.contains("unknown_env") && t.text.contains("bash, python"));
            }
            _ => panic!(),
        }
    }
}
