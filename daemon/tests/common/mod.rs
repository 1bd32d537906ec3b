//! Shared set-up for the integration tests: one real executor and registry per
//! test binary (host mode, real bubblewrap), plus helpers to run code and to
//! look for processes left behind.

#![allow(dead_code)]

pub mod cli;
pub mod skip;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use nix_sandbox_mcp::app::{self, App, StartOptions};
use nix_sandbox_mcp::environment::Environment;
use nix_sandbox_mcp::exec::{Outcome, Request};
use tokio_util::sync::CancellationToken;

pub struct Fixture {
    pub app: App,
    /// A project directory with a file and symlinks that point outside it.
    pub project: PathBuf,
    _dir: tempfile::TempDir,
}

/// The fixture, started once per test binary.
pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // Build on a separate thread: tests call this from inside their own runtimes.
        std::thread::spawn(|| {
            let dir = tempfile::tempdir().unwrap();
            let project = dir.path().join("project");
            std::fs::create_dir(&project).unwrap();
            std::fs::write(project.join("README.md"), "hello from the project\n").unwrap();
            std::os::unix::fs::symlink("/etc", project.join("etc-link")).unwrap();
            std::os::unix::fs::symlink(dir.path().join("outside.txt"), project.join("outside-link")).unwrap();
            std::fs::write(dir.path().join("outside.txt"), "outside\n").unwrap();
            let config = dir.path().join("config.toml");
            std::fs::write(
                &config,
                format!(
                    "[project]\npath = {:?}\n[project.inherit_env]\nvars = [\"NSM_TEST_INHERITED\"]\n[server]\nmax_concurrent_runs = 8\nmax_queued_runs = 200\n",
                    project.display().to_string()
                ),
            )
            .unwrap();
            let rt = tokio::runtime::Runtime::new().unwrap();
            let app = rt
                .block_on(app::start(&StartOptions {
                    config: Some(config),
                    load_environments: true,
                    quick: false,
                    // Each test has its own runtime; sandboxes started in the
                    // set-up runtime would outlive it.
                    prestart: false,
                    in_background: false,
                }))
                .unwrap_or_else(|e| panic!("start failed: {e}"));
            Fixture { app, project, _dir: dir }
        })
        .join()
        .unwrap()
    })
}

pub fn env(name: &str) -> Arc<Environment> {
    fixture()
        .app
        .registry
        .get(name)
        .unwrap_or_else(|| {
            panic!(
                "environment {name} not available: {:?}",
                fixture().app.registry.warnings
            )
        })
        .clone()
}

/// Runs `code` in `env` with the fixture's project mounted.
pub async fn run(env: &Environment, code: &str) -> Outcome {
    run_with(env, code, CancellationToken::new()).await
}

pub async fn run_with(env: &Environment, code: &str, cancel: CancellationToken) -> Outcome {
    let f = fixture();
    f.app
        .executor
        .run(Request {
            env,
            code: code.as_bytes(),
            project: f.app.project.as_ref(),
            inherited: &nix_sandbox_mcp::config::read_inherited(
                &f.app.config.project.inherit_names(),
            ),
            cancel,
            observer: None,
            share: None,
        })
        .await
        .expect("run starts")
}

/// A copy of `name` with other limits (resolved from the given settings on top).
pub fn env_with(name: &str, tweak: impl FnOnce(&mut Environment)) -> Environment {
    let mut e = (*env(name)).clone();
    tweak(&mut e);
    e
}

/// Host processes whose command line contains `marker`.
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == me {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) {
                found.push(format!("{name}: {cmd}"));
            }
        }
    }
    found
}

/// A marker unique to this test process and call.
pub fn marker() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}{}",
        std::process::id() % 10000,
        1000 + N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Prints `message` on the terminal even though the test harness captures
/// test output (it captures only the print macros): for a test that skips
/// part or all of what it checks, so the skip is seen.
pub fn note(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "note: {message}");
}

/// Waits until no host process carries `marker`, for at most `seconds`; the
/// processes still there then.
pub async fn left_after(marker: &str, seconds: u64) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while !processes_with(marker).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    processes_with(marker)
}
