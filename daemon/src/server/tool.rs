//! What the agent reads: the `run` tool's description and schemas and the
//! server instructions, built once at start-up from the loaded environments.
//! Kept small on purpose: every token here is paid on every conversation.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use crate::environment::Environment;
use crate::jail::ProjectMount;

pub const RUN: &str = "run";

/// The `run` tool definition.
pub fn run_tool(
    envs: &[Arc<Environment>],
    project: Option<&ProjectMount>,
    output_bytes: usize,
) -> Tool {
    let names: Vec<&str> = envs.iter().map(|e| e.name.as_str()).collect();
    let input = json!({
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Program text; run as a file by the env's interpreter (bash: a script)."},
            "env": {"type": "string", "enum": names, "description": "Environment to run in."}
        },
        "required": ["code", "env"],
        "additionalProperties": false
    });
    let any_network = envs.iter().any(|e| e.network);
    Tool::new(
        RUN,
        description(envs, project, output_bytes),
        Arc::new(object(input)),
    )
    .with_raw_output_schema(Arc::new(super::result::output_schema()))
    .with_annotations(
        ToolAnnotations::with_title("Run code in a sandbox")
            .read_only(false)
            .destructive(false)
            .idempotent(false)
            .open_world(any_network),
    )
}

fn description(
    envs: &[Arc<Environment>],
    project: Option<&ProjectMount>,
    output_bytes: usize,
) -> String {
    let mut d = String::from("Run code in a fresh, isolated sandbox. Environments:\n");
    for e in envs {
        let secs = e.limits.timeout.as_millis() as f64 / 1000.0;
        let net = if e.network { ", network" } else { "" };
        d.push_str(&format!(
            "- {}: {} ({}s{net})\n",
            e.name,
            e.description,
            trim_float(secs)
        ));
    }
    if !envs.iter().all(|e| e.network) {
        d.push_str("No network unless marked. ");
    }
    match project {
        Some(p) if p.writable => d.push_str(&format!(
            "The user's project is at {} (writable: changes are real). ",
            p.mount_point
        )),
        Some(p) => d.push_str(&format!(
            "The user's project is at {} (read-only). ",
            p.mount_point
        )),
        None => {}
    }
    d.push_str(&format!(
        "/workspace is the writable working directory and HOME, empty at the start of each call. Output over {} KiB per stream keeps its head and tail.",
        output_bytes / 1024
    ));
    d
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.1}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Server instructions: how to choose an environment.
pub fn instructions(envs: &[Arc<Environment>], project: Option<&ProjectMount>) -> String {
    let has = |n: &str| envs.iter().any(|e| e.name == n);
    let mut s = String::from("Use `run` to execute code instead of guessing its result. ");
    if has("bash") {
        s.push_str("Use env bash for shell commands and the project's own tools (tests, builds, grep, git); ");
    }
    s.push_str("use the language's env for snippets in that language. ");
    if let Some(p) = project {
        s.push_str(&format!("Read project files under {}. ", p.mount_point));
    }
    s.push_str("Each call starts from a clean sandbox: create and use files within one call. A failed run (non-zero exit, timeout, limit) is an error result with stdout, stderr and a suggestion.");
    s
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("schema literals are objects"),
    }
}
