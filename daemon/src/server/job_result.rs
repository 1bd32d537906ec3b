//! Results of the `job` tool: a job started, the list of jobs, and one
//! job's state with the output since the last read.

use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use super::result::{add_network, add_usage, run_error, tool_result};
use crate::exec::ending::signal_name;
use crate::jobs::{Chunk, Ending, Job, State};

/// The result of `run` with `background`: the job's id, at once.
pub fn job_started(job: &Job) -> CallToolResult {
    let v = json!({"ok": true, "env": job.env, "job": job.id, "state": job.state().as_str()});
    let text = format!(
        "[{}] started {} (time limit {} s). Read it with job(id=\"{}\", wait_seconds=30); stop it with job(id=\"{}\", kill=true).",
        job.env,
        job.id,
        job.limits.timeout.as_secs(),
        job.id,
        job.id
    );
    tool_result(v, text, false)
}

/// The result of `job` without an id: every job and its state.
pub fn job_list(jobs: &[std::sync::Arc<Job>]) -> CallToolResult {
    let entries: Vec<Value> = jobs
        .iter()
        .map(|j| {
            let mut e = json!({"job": j.id, "env": j.env, "state": j.state().as_str(), "age_s": j.created.elapsed().as_secs()});
            if let Some(Ending::Ran(o, _)) = j.ending() {
                e["exit_code"] = json!(o.exit_code);
            }
            e
        })
        .collect();
    let text = if jobs.is_empty() {
        "no jobs; start one with run(background=true)".to_string()
    } else {
        jobs.iter()
            .map(|j| {
                let exit = match j.ending() {
                    Some(Ending::Ran(o, _)) => o
                        .exit_code
                        .map(|c| format!(", exit {c}"))
                        .unwrap_or_default(),
                    Some(Ending::Failed(_)) => ", failed to start".to_string(),
                    None => String::new(),
                };
                format!(
                    "{} [{}] {}{exit}, {} s ago",
                    j.id,
                    j.env,
                    j.state().as_str(),
                    j.created.elapsed().as_secs()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    tool_result(json!({"ok": true, "jobs": entries}), text, false)
}

/// The result of `job` with an id: its state, its new output, and once it
/// has finished, how it ended (an error result when it failed, as for `run`).
pub fn job_status(job: &Job, stdout: &Chunk, stderr: &Chunk) -> CallToolResult {
    let state = job.state();
    let mut v = json!({
        "ok": true,
        "job": job.id,
        "env": job.env,
        "state": state.as_str(),
        "stdout": stdout.output.text,
        "stderr": stderr.output.text,
        "stdout_offset": stdout.next_offset,
        "stderr_offset": stderr.next_offset,
        "stdout_dropped_bytes": stdout.output.dropped_bytes + stdout.lost_bytes,
        "stderr_dropped_bytes": stderr.output.dropped_bytes + stderr.lost_bytes,
    });
    let mut err = None;
    let mut project = None;
    if state == State::Finished {
        match job.ending() {
            Some(Ending::Ran(o, note)) => {
                project = note;
                v["duration_ms"] = json!(o.duration.as_millis() as u64);
                v["timed_out"] = json!(o.timed_out);
                v["limits_reached"] = json!(
                    o.limits_reached
                        .iter()
                        .map(|l| l.as_str())
                        .collect::<Vec<_>>()
                );
                if let Some(c) = o.exit_code {
                    v["exit_code"] = json!(c);
                }
                if let Some(s) = o.signal {
                    v["signal"] = json!(signal_name(s));
                }
                if let Some(l) = o.limit {
                    v["limit"] = json!(l.as_str());
                }
                add_usage(&mut v, &o);
                add_network(&mut v, &o);
                err = run_error(&o, &job.limits);
            }
            Some(Ending::Failed(e)) => {
                err = Some(super::exec_error(&e));
            }
            None => {}
        }
    }
    let mut text = format!("[{}] {} {}", job.env, job.id, state.as_str());
    if let Some(c) = v.get("exit_code") {
        text.push_str(&format!(", exit {c}"));
    }
    if let Some(ms) = v.get("duration_ms") {
        text.push_str(&format!(" in {ms} ms"));
    }
    text.push('\n');
    for (name, chunk) in [("stdout", stdout), ("stderr", stderr)] {
        if chunk.lost_bytes > 0 {
            text.push_str(&format!(
                "({} earlier bytes of {name} are no longer kept)\n",
                chunk.lost_bytes
            ));
        }
        if !chunk.output.text.is_empty() {
            text.push_str(&format!("--- new {name} ---\n{}", chunk.output.text));
            if !chunk.output.text.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    if stdout.output.text.is_empty() && stderr.output.text.is_empty() {
        text.push_str("(no new output)\n");
    }
    if state != State::Finished {
        text.push_str(&format!(
            "next: job(id=\"{}\", wait_seconds=30) to wait and read more",
            job.id
        ));
    }
    let mut link = None;
    if let Some(note) = &project {
        v["changes"] = super::project::to_json(note);
        text.push_str(&super::project::to_text(note));
        link = super::project::link(note);
    }
    if let Some(e) = &err {
        v["ok"] = json!(false);
        v["error"] = e.to_json();
        text.push_str(&e.to_text());
    }
    let mut r = tool_result(v, text.trim_end().to_string(), err.is_some());
    r.content.extend(link);
    r
}
