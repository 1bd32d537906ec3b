//! Building environments with Nix when the server starts, for the sources
//! that need it (`NIX_SANDBOX_ENVS` references, config `flake` entries no
//! package baked in, the project's devShell): the expressions, running
//! `nix build` with a time limit, and reading the artifact it made. Every
//! build runs in parallel; a failure becomes a warning about that
//! environment only.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::artifact;
use super::source::{Offer, Pending, Role};
use crate::config::Config;

/// One thing to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// How the build is named in messages: the reference, or `environments.X`.
    pub label: String,
    /// The environment name the result is served under; `None` keeps the
    /// artifact's own name.
    pub name: Option<String>,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A flake output reference, built as is (`nix build REF`).
    Reference(String),
    /// A Nix expression (`nix build --impure --expr E`).
    Expression(String),
}

/// A string as a Nix string literal.
pub fn nix_string(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace("${", "\\${");
    format!("\"{escaped}\"")
}

/// The expression that builds the artifact for a config `flake` entry with
/// this flake's `lib.flakeSandbox` (which also wraps plain packages).
pub fn flake_entry_expression(
    own_flake: &Path,
    name: &str,
    flake: &str,
    interpreter: Option<&[String]>,
) -> String {
    let interpreter = match interpreter {
        Some(argv) => format!(
            "[ {} ]",
            argv.iter()
                .map(|a| nix_string(a))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        None => "null".to_string(),
    };
    format!(
        "let s = builtins.getFlake {}; in s.lib.flakeSandbox {{ system = builtins.currentSystem; name = {}; flake = {}; interpreter = {interpreter}; }}",
        nix_string(&format!("path:{}", own_flake.display())),
        nix_string(name),
        nix_string(flake),
    )
}

/// The expression that builds the `project` environment from the project
/// flake's devShell with this flake's `lib.projectSandbox`.
pub fn project_expression(own_flake: &Path, project: &Path) -> String {
    format!(
        "let s = builtins.getFlake {}; in s.lib.projectSandbox {{ system = builtins.currentSystem; project = builtins.getFlake {}; }}",
        nix_string(&format!("path:{}", own_flake.display())),
        nix_string(&format!("path:{}", project.display())),
    )
}

/// Starts `build` (lazily: it runs when the registry awaits it); its result
/// is offered with `role`, the config's `[defaults]` applied.
pub fn pending(build: Build, role: Role, config: &Config) -> Pending {
    let limit = Duration::from_secs(config.server.nix_build_timeout_seconds.map_or(300, |s| s.0));
    let defaults = config.defaults;
    let label = build.label.clone();
    Pending {
        label,
        build: Box::pin(async move {
            let nix = which::which("nix")
                .map_err(|_| "nix is not installed or not on PATH".to_string())?;
            let path = build_one(&nix, &build.target, limit)
                .await
                .inspect_err(|e| {
                    tracing::warn!("building {} failed: {e}", build.label);
                })?;
            let mut env = artifact::load(&path, defaults).map_err(|e| {
                format!("it built {}, which is not a sandbox artifact ({e}); build it with lib.mkSandbox", path.display())
            })?;
            if let Some(name) = build.name {
                env.name = name;
            }
            Ok(Offer::new(env, role))
        }),
    }
}

async fn build_one(nix: &Path, target: &Target, limit: Duration) -> Result<PathBuf, String> {
    let mut cmd = tokio::process::Command::new(nix);
    // `--json` rather than `--print-out-paths`, which Nix before 2.6 lacks.
    cmd.args([
        "--extra-experimental-features",
        "nix-command flakes",
        "build",
        "--no-link",
        "--json",
    ]);
    match target {
        Target::Reference(r) => cmd.arg(r),
        Target::Expression(e) => cmd.args(["--impure", "--expr", e]),
    };
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = match tokio::time::timeout(limit, cmd.output()).await {
        Err(_) => {
            return Err(format!(
                "timed out after {} s (build it once with `nix build` first, or raise [server] nix_build_timeout_seconds)",
                limit.as_secs()
            ));
        }
        Ok(Err(e)) => return Err(format!("cannot run nix: {e}")),
        Ok(Ok(o)) => o,
    };
    if !out.status.success() {
        return Err(nix_error(&String::from_utf8_lossy(&out.stderr)));
    }
    out_path(&String::from_utf8_lossy(&out.stdout))
}

/// The `out` path from `nix build --json`.
fn out_path(json: &str) -> Result<PathBuf, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("unexpected output from nix build: {e}"))?;
    v.get(0)
        .and_then(|b| b.get("outputs"))
        .and_then(|o| o.get("out"))
        .and_then(|p| p.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| "nix build reported no output path".to_string())
}

/// The useful part of Nix's error output: its `error:` line and what follows,
/// without the trace.
fn nix_error(stderr: &str) -> String {
    let start = stderr.find("error:").unwrap_or(0);
    let text: Vec<&str> = stderr[start..]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(6)
        .collect();
    if text.is_empty() {
        "nix build failed".to_string()
    } else {
        text.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped_for_nix() {
        assert_eq!(nix_string(r#"a"b\c${d}"#), r#""a\"b\\c\${d}""#);
    }

    #[test]
    fn expressions_name_the_entry_and_the_interpreter() {
        let e = flake_entry_expression(
            Path::new("/nix/store/x-source"),
            "rb",
            "github:o/r#ruby",
            Some(&["ruby".to_string(), "{file}".to_string()]),
        );
        assert!(
            e.contains(r#"builtins.getFlake "path:/nix/store/x-source""#),
            "{e}"
        );
        assert!(
            e.contains(
                r#"name = "rb"; flake = "github:o/r#ruby"; interpreter = [ "ruby" "{file}" ];"#
            ),
            "{e}"
        );
        let e = project_expression(Path::new("/s"), Path::new("/home/me/proj"));
        assert!(
            e.contains(r#"project = builtins.getFlake "path:/home/me/proj""#),
            "{e}"
        );
    }

    #[test]
    fn reads_the_out_path_and_the_error() {
        assert_eq!(
            out_path(
                r#"[{"drvPath":"/nix/store/a.drv","outputs":{"out":"/nix/store/b-sandbox"}}]"#
            )
            .unwrap(),
            PathBuf::from("/nix/store/b-sandbox")
        );
        assert!(out_path("[]").is_err());
        let e = nix_error(
            "warning: dirty\nerror: flake 'github:o/r' does not provide attribute 'x'\n\n       Did you mean y?\n",
        );
        assert!(
            e.starts_with("error: flake") && e.contains("Did you mean y?"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_failed_build_is_an_error_of_that_build_only() {
        let build = |r: &str| Build {
            label: r.into(),
            name: None,
            target: Target::Reference(r.into()),
        };
        let config = Config::default();
        let builds = ["path:/nonexistent/a", "path:/nonexistent/b"]
            .map(|r| pending(build(r), Role::Extra, &config).build);
        for result in futures::future::join_all(builds).await {
            match result {
                Ok(_) => panic!("a build of a missing flake succeeded"),
                Err(e) => assert!(!e.is_empty()),
            }
        }
    }
}
