//! What the agent reads: the `run` tool's description and schemas and the
//! server instructions, built once at start-up from the loaded environments,
//! and the tools of declared commands, built from their declarations.
//! Kept small on purpose: every token here is paid on every conversation.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{Value, json};

use crate::commands::declaration::Danger;
use crate::commands::{Catalog, Offered, params};
use crate::environment::Environment;
use crate::jail::{ProjectAccess, ProjectMount};
use crate::registry::{Building, Registry};

pub const RUN: &str = "run";
pub const JOB: &str = "job";
pub const CONFIRM: &str = "confirm";

/// The `run` tool definition.
/// `unmounted`: why there is no project, when there is none;
/// `other_roots`: the client's roots besides the project, not mounted.
pub fn run_tool(
    envs: &[Arc<Environment>],
    builds: &Registry,
    project: Option<&ProjectMount>,
    unmounted: Option<&str>,
    other_roots: &[String],
    output_bytes: usize,
    missing: &[&str],
) -> Tool {
    let names: Vec<&str> = envs.iter().map(|e| e.name.as_str()).collect();
    let mut input = json!({
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "env": {"type": "string", "enum": names},
            "background": {"type": "boolean", "description": "Start as a job"}
        },
        "required": ["code", "env"]
    });
    let sessions = has_sessions(envs);
    if sessions {
        // Mirrored in the Mcp-Param-Session header (2026-07-28), by which a
        // load balancer routes a session's calls to the replica holding it.
        input["properties"]["session"] = json!({
            "type": "string",
            "description": "Keep state across calls",
            "x-mcp-header": "Session"
        });
    }
    let any_network = envs.iter().any(|e| e.network.policy().is_some());
    Tool::new(
        RUN,
        description(
            envs,
            builds,
            project,
            unmounted,
            other_roots,
            output_bytes,
            missing,
        ),
        Arc::new(object(input)),
    )
    .with_raw_output_schema(Arc::new(super::result::output_schema(
        any_network,
        sessions,
        changes_reported(project),
    )))
    // Only the hints whose defaults would be wrong (destructive, open world).
    .with_annotations(
        ToolAnnotations::new()
            .destructive(false)
            .open_world(any_network),
    )
}

/// `missing`: protections this host cannot give, said plainly.
/// `builds`: the Nix builds still running and those that failed.
fn description(
    envs: &[Arc<Environment>],
    builds: &Registry,
    project: Option<&ProjectMount>,
    unmounted: Option<&str>,
    other_roots: &[String],
    output_bytes: usize,
    missing: &[&str],
) -> String {
    let timeout = |e: &Environment| {
        format!(
            "{}s",
            trim_float(e.limits.timeout.as_millis() as f64 / 1000.0)
        )
    };
    let common_timeout = envs
        .first()
        .map(|e| timeout(e))
        .filter(|t| envs.iter().all(|e| timeout(e) == *t));
    let mut d = String::from("Run code in a fresh, isolated sandbox. Envs:\n");
    let sessions = has_sessions(envs);
    for e in envs {
        let mut notes = Vec::new();
        if common_timeout.is_none() {
            notes.push(format!("limit {}", timeout(e)));
        }
        if let Some(p) = e.network.policy() {
            notes.push(format!("network: {}", p.described()));
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        d.push_str(&format!("- {}: {}{notes}\n", e.name, e.description));
    }
    let named = |b: &Building| b.name.clone().unwrap_or_else(|| b.label.clone());
    if !builds.building.is_empty() {
        let what: Vec<String> = builds.building.iter().map(named).collect();
        d.push_str(&format!(
            "Being built by Nix, offered when ready (the tool list changes): {}.\n",
            what.join(", ")
        ));
    }
    if !builds.failed.is_empty() {
        let what: Vec<String> = builds.failed.iter().map(|(b, _)| named(b)).collect();
        d.push_str(&format!(
            "Could not be built (the server's log says why): {}.\n",
            what.join(", ")
        ));
    }
    if let Some(t) = &common_timeout {
        d.push_str(&format!("Time limit {t}. "));
    }
    if !envs.iter().any(|e| e.network.policy().is_some()) {
        d.push_str("No network. ");
    } else if !envs.iter().all(|e| e.network.policy().is_some()) {
        d.push_str("No network unless marked. ");
    }
    if let Some(p) = project {
        let how = match p.access {
            ProjectAccess::Overlay => "a writable copy; changes come back as a patch",
            ProjectAccess::ReadWrite => "writable, changes are real",
            ProjectAccess::ReadOnly if p.downgraded => "read-only: no copy-on-write on this host",
            ProjectAccess::ReadOnly => "read-only",
        };
        d.push_str(&format!("Project: {} ({how}). ", p.mount_point));
    } else if let Some(why) = unmounted {
        let why = why.trim_start_matches("no project mounted: ");
        d.push_str(&format!("No project is mounted ({why}). "));
    }
    if !other_roots.is_empty() {
        d.push_str(&format!(
            "Not mounted (the client's other roots): {}. ",
            other_roots.join(", ")
        ));
    }
    let fresh = if sessions {
        "empty each call unless session"
    } else {
        "empty each call"
    };
    d.push_str(&format!("Writable: /workspace (cwd, HOME; {fresh}). Output over {} KiB per stream is cut in the middle.", output_bytes / 1024));
    if !missing.is_empty() {
        d.push_str(&format!(" Weaker on this host: {}.", missing.join("; ")));
    }
    d
}

/// Whether results can report changes to the project (an overlay's, or
/// protected files a read-write run created).
pub fn changes_reported(project: Option<&ProjectMount>) -> bool {
    project.is_some_and(|p| p.access != ProjectAccess::ReadOnly)
}

/// Whether any environment can hold a session (has a known interpreter).
fn has_sessions(envs: &[Arc<Environment>]) -> bool {
    envs.iter().any(|e| e.kind.is_some())
}

/// The `job` tool: reads and stops background runs.
pub fn job_tool(limits: crate::jobs::JobLimits) -> Tool {
    let input = json!({
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "wait_seconds": {"type": "number", "maximum": 60},
            "kill": {"type": "boolean"},
            "stdout_offset": {"type": "integer"},
            "stderr_offset": {"type": "integer"}
        }
    });
    let description = format!(
        "Background runs (limit {} s). No id: lists them. With id: state and new output; wait_seconds waits for the end; kill stops it.",
        limits.timeout.as_secs()
    );
    Tool::new(JOB, description, Arc::new(object(input)))
        .with_annotations(ToolAnnotations::new().destructive(false).open_world(false))
}

/// The `run` tool with a `project` argument naming one of the configured
/// projects (`[projects.NAME]`), when there are any: only those names,
/// never a path.
pub fn with_projects(mut run: Tool, projects: &BTreeMap<String, ProjectMount>) -> Tool {
    if projects.is_empty() {
        return run;
    }
    let names: Vec<&str> = projects.keys().map(String::as_str).collect();
    let mut input = (*run.input_schema).clone();
    if let Some(Value::Object(properties)) = input.get_mut("properties") {
        properties.insert(
            "project".into(),
            json!({"type": "string", "enum": names, "description": "Run in this project instead"}),
        );
    }
    run.input_schema = Arc::new(input);
    let listed: Vec<String> = projects
        .iter()
        .map(|(name, m)| format!("{name} ({})", m.host_path.display()))
        .collect();
    let d = run.description.take().unwrap_or_default();
    run.description = Some(
        format!(
            "{d}\nOther projects (`project`, mounted at the same place): {}.",
            listed.join(", ")
        )
        .into(),
    );
    run
}

/// The `run` tool, mentioning the declared commands when there are any.
pub fn with_commands(mut run: Tool, catalog: &Catalog) -> Tool {
    if !catalog.is_empty() {
        let names: Vec<&str> = catalog.offered.iter().map(|o| o.tool.as_str()).collect();
        let d = run.description.take().unwrap_or_default();
        run.description = Some(
            format!(
                "{d}\nDeclared commands have their own tools: {}.",
                names.join(", ")
            )
            .into(),
        );
    }
    run
}

/// A declared command's tool: the author's description, an input schema
/// from its parameters, the run's output schema, and hints from its danger.
pub fn command_tool(offered: &Offered, project: Option<&ProjectMount>) -> Tool {
    let c = &offered.command;
    let hints = match c.danger {
        Danger::Safe => ToolAnnotations::new().read_only(true).destructive(false),
        Danger::Moderate => ToolAnnotations::new().read_only(false).destructive(false),
        Danger::High => ToolAnnotations::new().read_only(false).destructive(true),
    };
    let network = c.network.policy().is_some();
    Tool::new(
        offered.tool.clone(),
        c.description.clone(),
        Arc::new(params::input_schema(&c.params)),
    )
    .with_raw_output_schema(Arc::new(super::result::command_output_schema(
        network,
        changes_reported(project),
    )))
    .with_annotations(hints.open_world(network))
}

/// The `confirm` tool, for clients that cannot ask their user themselves.
pub fn confirm_tool(catalog: &Catalog, project: Option<&ProjectMount>) -> Tool {
    let input = json!({
        "type": "object",
        "properties": {
            "token": {"type": "string"},
            "command": {"type": "string"},
            "arguments": {"type": "object"}
        },
        "required": ["token", "command"]
    });
    let open_world = catalog
        .offered
        .iter()
        .any(|o| o.command.confirm && o.command.network.policy().is_some());
    Tool::new(
        CONFIRM,
        "Run a command that returned confirmation_required, once the user agreed: pass back its confirmation's token, command and arguments.",
        Arc::new(object(input)),
    )
    .with_raw_output_schema(Arc::new(super::result::command_output_schema(
        open_world,
        changes_reported(project),
    )))
    .with_annotations(
        ToolAnnotations::new()
            .read_only(false)
            .destructive(true)
            .open_world(open_world),
    )
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.1}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Server instructions: how to choose an environment.
pub fn instructions(envs: &[Arc<Environment>]) -> String {
    let mut s =
        String::from("Run code instead of guessing its result. Pick `env` by the code's language");
    if envs.iter().any(|e| e.name == "bash") {
        s.push_str("; bash for shell commands and the project's tools (tests, builds, git)");
    }
    s.push_str(". Longer work: run with background=true, then job.");
    s
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("schema literals are objects"),
    }
}
