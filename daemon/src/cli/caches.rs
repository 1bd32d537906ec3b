//! `caches`: what environments keep for this project, and clearing it.

use std::path::Path;

use super::*;

pub(super) fn caches(
    config: Option<&Path>,
    clear: bool,
    env: Option<&str>,
    json: bool,
) -> ExitCode {
    let config = match crate::config::load(config) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let project = match app::resolve_project(&config) {
        Ok((p, _)) => p.map(|p| p.host_path),
        Err(e) => return fail(e),
    };
    let dir = crate::caches::project_dir(&crate::caches::root(), project.as_deref());
    let mut found: Vec<(String, String, u64)> = Vec::new();
    for env_dir in sorted_dirs(&dir) {
        let env_name = name_of(&env_dir);
        if env.is_some_and(|e| e != env_name) {
            continue;
        }
        for cache in sorted_dirs(&env_dir) {
            found.push((
                env_name.clone(),
                crate::caches::decode(&name_of(&cache)),
                crate::caches::size(&cache),
            ));
        }
        if clear && let Err(e) = std::fs::remove_dir_all(&env_dir) {
            return fail(format!("cannot remove {}: {e}", env_dir.display()));
        }
    }
    if clear && env.is_none() {
        let _ = std::fs::remove_dir(&dir);
    }
    let mut out = Out::default();
    if json {
        let list: Vec<_> = found
            .iter()
            .map(|(e, c, b)| serde_json::json!({"environment": e, "cache": c, "bytes": b}))
            .collect();
        let doc = serde_json::json!({
            "project": project, "directory": dir, "cleared": clear, "caches": list,
        });
        out.print(&(serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"));
    } else {
        let whose = match &project {
            Some(p) => format!("project {}", p.display()),
            None => "runs without a project".to_string(),
        };
        if found.is_empty() {
            out.print(&format!("no caches for {whose} (in {})\n", dir.display()));
        } else {
            let verb = if clear { "cleared" } else { "kept" };
            out.print(&format!(
                "caches {verb} for {whose}, in {}:\n",
                dir.display()
            ));
            for (e, c, b) in &found {
                out.print(&format!(
                    "  {e:<12} {c:<32} {:>8.1} MiB\n",
                    *b as f64 / (1 << 20) as f64
                ));
            }
        }
    }
    out.finish(ExitCode::SUCCESS)
}

fn sorted_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    dirs
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
