//! `envs`: the environments, their sources and limits, and the declared
//! commands offered as tools, as text or JSON.

use super::*;
use crate::commands::Offered;

pub(super) async fn list_envs(opts: &StartOptions, json: bool) -> ExitCode {
    let app = match app::start(opts).await {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let mechanism = app.executor.enforcer().describe();
    let commands = match app::declared_commands(&app.config, &app.registry, app.project.as_ref()) {
        Ok(c) => c.catalog(),
        Err(e) => {
            app.executor.shutdown().await;
            return fail(e);
        }
    };
    let mut text = String::new();
    if json {
        let envs: Vec<serde_json::Value> = app
            .registry
            .iter()
            .map(|e| {
                let l = &e.limits;
                serde_json::json!({
                    "name": e.name, "description": e.description, "source": e.origin.to_string(),
                    "interpreter": e.interpreter, "network": e.network.policy().map(|p| p.described()), "tools": e.tools,
                    "caches": e.caches.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), "cache_mb": e.cache_bytes >> 20,
                    "limits": {
                        "timeout_ms": l.timeout.as_millis() as u64, "memory_mb": l.memory_bytes >> 20, "pids": l.pids,
                        "cpu_seconds": l.cpu_seconds, "file_size_mb": l.file_size_bytes >> 20, "open_files": l.open_files,
                        "workspace_mb": l.workspace_bytes >> 20, "workspace_files": l.workspace_files, "output_bytes": l.output_bytes, "output_limit_mb": l.output_limit_bytes >> 20,
                    },
                })
            })
            .collect();
        let out = serde_json::json!({
            "environments": envs,
            "aliases": app.registry.aliases(),
            "limits_mechanism": app.executor.enforcer().mechanism().as_str(),
            "cpu_quota": app.executor.enforcer().limits_cpu(),
            "limits_detail": mechanism,
            "cgroup_v2_missing": app.executor.enforcer().without_cgroup_v2().map(|w| serde_json::json!({"why": w.why, "step": w.step})),
            "project": app.project.as_ref().map(|p| serde_json::json!({"path": p.host_path, "mount_point": p.mount_point, "mode": p.access.name()})),
            "warnings": app.registry.warnings,
            "sources": app.registry.sources.iter().map(|(name, about)| serde_json::json!({"name": name, "about": about})).collect::<Vec<_>>(),
            "commands": commands.offered.iter().map(command_json).collect::<Vec<_>>(),
        });
        text = serde_json::to_string_pretty(&out).unwrap_or_default() + "\n";
    } else {
        for e in app.registry.iter() {
            let l = &e.limits;
            let _ = writeln!(text, "{}\n    {}", e.name, e.description);
            let _ = writeln!(text, "    source:      {}", e.origin);
            let _ = writeln!(text, "    interpreter: {}", e.interpreter.join(" "));
            let _ = writeln!(
                text,
                "    limits:      timeout {} ms, memory {} MiB, {} processes, cpu {} s, files {} MiB, {} open files, workspace {} MiB, output {} B kept per stream, killed past {} MiB",
                l.timeout.as_millis(),
                l.memory_bytes >> 20,
                l.pids,
                l.cpu_seconds,
                l.file_size_bytes >> 20,
                l.open_files,
                l.workspace_bytes >> 20,
                l.output_bytes,
                l.output_limit_bytes >> 20
            );
            let _ = writeln!(
                text,
                "    network:     {}",
                e.network.policy().map_or("off".to_string(), |p| format!(
                    "through the proxy to {}",
                    p.described()
                ))
            );
            if !e.caches.is_empty() {
                let list: Vec<&str> = e.caches.iter().map(|c| c.0.as_str()).collect();
                let _ = writeln!(
                    text,
                    "    caches:      {} (at most {} MiB; see `caches`)",
                    list.join(", "),
                    e.cache_bytes >> 20
                );
            }
        }
        for (alias, target) in app.registry.aliases() {
            let _ = writeln!(text, "({alias} is another name for {target})");
        }
        for offered in &commands.offered {
            text += &command_text(offered);
        }
        let _ = writeln!(text, "limits enforced with: {mechanism}");
        if let Some(w) = app.executor.enforcer().without_cgroup_v2() {
            let _ = writeln!(text, "{w}");
        }
        match (&app.project, &app.project_note) {
            (Some(p), _) => {
                let mode = p.access.name();
                let _ = writeln!(
                    text,
                    "project: {} at {} ({mode})",
                    p.host_path.display(),
                    p.mount_point
                );
            }
            (None, Some(note)) => {
                let _ = writeln!(text, "project: {note}");
            }
            (None, None) => {}
        }
        for w in &app.registry.warnings {
            let _ = writeln!(text, "warning: {w}");
        }
    }
    app.executor.shutdown().await;
    let mut out = Out::default();
    out.print(&text);
    out.finish(ExitCode::SUCCESS)
}

/// A declared command as `envs --json` lists it.
fn command_json(offered: &Offered) -> serde_json::Value {
    let c = &offered.command;
    serde_json::json!({
        "name": c.name, "tool": offered.tool, "description": c.description, "env": c.env,
        "argv": c.template.declared(), "workdir": c.workdir, "danger": c.danger.as_str(), "confirm": c.confirm,
        "network": c.network.policy().map(|p| p.described()), "file": c.file,
        "params": c.params.iter().map(|p| serde_json::json!({"name": p.name, "type": p.kind.name(), "required": p.required, "schema": p.schema()})).collect::<Vec<_>>(),
    })
}

/// A declared command as `envs` lists it, after the environments.
fn command_text(offered: &Offered) -> String {
    let c = &offered.command;
    let mut text = format!(
        "command {} (tool {})\n    {}\n",
        c.name, offered.tool, c.description
    );
    let mut how = vec![
        format!("in {}", c.env),
        format!("danger {}", c.danger.as_str()),
    ];
    if c.confirm {
        how.push("asks the user first".into());
    }
    if let Some(p) = c.network.policy() {
        how.push(format!("network to {}", p.described()));
    }
    let _ = writeln!(
        text,
        "    runs:        {} ({})",
        c.template.declared().join(" "),
        how.join(", ")
    );
    for p in &c.params {
        let need = if p.required { "required" } else { "optional" };
        let _ = writeln!(
            text,
            "    parameter:   {} ({}, {need})",
            p.name,
            p.kind.name()
        );
    }
    let _ = writeln!(text, "    declared in: {}", c.file.display());
    text
}
