//! `doctor`: checks, one by one, what the sandbox needs on this machine and
//! prints a concrete fix for each failure. The same checks gate `--stdio`.

use std::process::ExitCode;

use crate::app::{self, StartError, StartOptions};
use crate::config;
use crate::limits::Mechanism;
use crate::platform::Platform;
use crate::registry;

struct Report {
    failures: usize,
}

impl Report {
    fn ok(&self, what: &str, detail: impl AsRef<str>) {
        println!("ok    {what}: {}", detail.as_ref());
    }
    fn warn(&self, what: &str, detail: impl AsRef<str>, fix: impl AsRef<str>) {
        println!(
            "warn  {what}: {}\n      fix: {}",
            detail.as_ref(),
            fix.as_ref()
        );
    }
    fn fail(&mut self, what: &str, detail: impl AsRef<str>, fix: impl AsRef<str>) {
        self.failures += 1;
        println!(
            "FAIL  {what}: {}\n      fix: {}",
            detail.as_ref(),
            fix.as_ref()
        );
    }
}

pub async fn run(opts: &StartOptions) -> ExitCode {
    let mut r = Report { failures: 0 };

    let config = match config::load(opts.config.as_deref()) {
        Ok(c) => {
            match &c.file {
                Some(f) => r.ok("config", format!("loaded {}", f.display())),
                None => r.ok("config", "no config file; built-in defaults (host mode)"),
            }
            c
        }
        Err(e) => {
            r.fail(
                "config",
                e.to_string(),
                "correct the file, or start without --config to use the defaults",
            );
            return ExitCode::from(1);
        }
    };

    match Platform::probe() {
        Ok(p) => {
            r.ok(
                "bubblewrap",
                format!("{} {}", p.bwrap.display(), p.bwrap_version),
            );
            if !p.layout.disable_userns {
                r.warn("bubblewrap", "this version cannot forbid nested user namespaces (--disable-userns needs 0.8)", "upgrade bubblewrap to 0.8 or later");
            }
            if !p.layout.add_seccomp_fd {
                r.warn(
                    "bubblewrap",
                    "this version loads one seccomp program; clone3 is not filtered",
                    "upgrade bubblewrap to 0.5 or later",
                );
            }
            if p.run_as.is_some() {
                r.ok(
                    "identity",
                    format!(
                        "running as root: sandboxes start as host uid {} (nobody), never as root",
                        crate::platform::UNPRIVILEGED_ID
                    ),
                );
            }
        }
        Err(e) => {
            r.fail("bubblewrap", e.to_string(), e.fix());
            return ExitCode::from(1);
        }
    }

    let executor = match app::executor_for(&config, false) {
        Ok(x) => x,
        Err(e) => {
            r.fail("sandbox", e.to_string(), "see above");
            return ExitCode::from(1);
        }
    };
    match app::self_test(&executor).await {
        Ok(()) => r.ok("namespaces", "a test sandbox started with new user, pid, ipc, uts, cgroup and network namespaces, seccomp and limits"),
        Err(StartError::Sandbox { detail, fix }) => r.fail("namespaces", detail, fix),
        Err(e) => r.fail("namespaces", e.to_string(), "see above"),
    }

    let enforcer = executor.enforcer();
    match enforcer.mechanism() {
        Mechanism::Rlimits => r.warn(
            "limits",
            enforcer.describe(),
            "memory and process limits are approximate without a cgroup. With systemd and cgroup v2, start the server in its own delegated scope: `systemd-run --user --scope -p Delegate=yes nix-sandbox-mcp --stdio`",
        ),
        _ => r.ok("limits", enforcer.describe()),
    }
    match crate::seccomp::compile(&[]) {
        Ok(p) => r.ok(
            "seccomp",
            format!(
                "{} filter program(s), {} syscalls blocked",
                p.0.len(),
                crate::seccomp::BLOCKED.len() + crate::seccomp::CONDITIONAL.len()
            ),
        ),
        Err(e) => r.fail(
            "seccomp",
            e.to_string(),
            "report this as a bug with your architecture",
        ),
    }

    let resolved = app::resolve_project(&config);
    let project = resolved.as_ref().ok().and_then(|(p, _)| p.clone());
    match resolved {
        Ok((Some(p), _)) => {
            r.ok(
                "project",
                format!(
                    "{} mounted at {} ({})",
                    p.host_path.display(),
                    p.mount_point,
                    if p.writable {
                        "read-write"
                    } else {
                        "read-only"
                    }
                ),
            );
        }
        Ok((None, note)) => r.warn(
            "project",
            note.unwrap_or_default(),
            "set PROJECT_DIR or [project] path",
        ),
        Err(e) => r.fail(
            "project",
            e.to_string(),
            "set PROJECT_DIR or [project] path to an existing directory",
        ),
    }

    let project_dir = project.as_ref().map(|p| p.host_path.as_path());
    let gathered = registry::gather(&config, project_dir, &registry::sources()).await;
    let reg = registry::load(&config, gathered, Some(&app::ExecProber(executor.clone()))).await;
    for (name, about) in &reg.sources {
        r.ok(&format!("source {name}"), about);
    }
    for e in reg.iter() {
        r.ok(
            "environment",
            format!("{}: {} [{}]", e.name, e.description, e.origin),
        );
    }
    for w in &reg.warnings {
        r.warn(
            "environment",
            w,
            "install the interpreter, or fix the environment's definition",
        );
    }
    if reg.is_empty() {
        r.fail(
            "environments",
            "none is available",
            "install bash, python3 or node, or configure environments",
        );
    }
    executor.shutdown().await;

    if r.failures == 0 {
        println!("\nall checks passed");
        ExitCode::SUCCESS
    } else {
        println!("\n{} check(s) failed", r.failures);
        ExitCode::from(1)
    }
}
