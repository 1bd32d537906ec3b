//! `run`: one call from a terminal, its output echoed as it arrives, its
//! exit status the program's own.

use super::*;
use crate::exec::ending::{Ending, Subject};

/// Echoes a run's output to the terminal as it arrives. When standard
/// output is closed (`run … | head`), the run is cancelled, as a pipeline's
/// SIGPIPE would end the program.
struct Echo {
    stdout_closed: std::sync::atomic::AtomicBool,
    cancel: CancellationToken,
}

impl Observer for Echo {
    fn output(&self, stream: Stream, data: &[u8]) {
        match stream {
            Stream::Stdout => {
                let mut stdout = std::io::stdout().lock();
                let written = stdout.write_all(data).and_then(|_| stdout.flush());
                if written.is_err_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) {
                    self.stdout_closed
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    self.cancel.cancel();
                }
            }
            Stream::Stderr => {
                let _ = std::io::stderr().lock().write_all(data);
            }
        }
    }
}

/// `run`'s own exit statuses (see its --help): nothing was run because the
/// server could not start, or because the environment does not exist.
const SERVER_FAILED: u8 = 123;
const NO_SUCH_ENVIRONMENT: u8 = 127;

/// Says why nothing was run, with `status`.
fn not_run(e: impl std::fmt::Display, status: u8) -> ExitCode {
    eprintln!("nix-sandbox-mcp: {e}");
    ExitCode::from(status)
}

/// How to pass code to `run`, for messages about missing code.
const HOW_TO_PASS_CODE: &str = "pass the program text as the CODE argument, in a file with -f FILE, or on standard input with `-`";

pub(super) async fn run_once(
    opts: &StartOptions,
    env_name: Option<String>,
    artifact_dir: Option<PathBuf>,
    file: Option<PathBuf>,
    code: Option<String>,
) -> ExitCode {
    let (code, source) = match (file, code.as_deref()) {
        (Some(f), _) => (
            std::fs::read(&f).map_err(|e| format!("cannot read {}: {e}", f.display())),
            format!("the file {}", f.display()),
        ),
        (None, Some("-")) => {
            let mut buf = Vec::new();
            let read = std::io::stdin()
                .read_to_end(&mut buf)
                .map(|_| buf)
                .map_err(|e| format!("cannot read standard input: {e}"));
            (read, "standard input".to_string())
        }
        (None, Some(c)) => (Ok(c.as_bytes().to_vec()), "the CODE argument".to_string()),
        (None, None) => (Ok(Vec::new()), "the command line".to_string()),
    };
    let code = match code {
        Ok(c) => c,
        Err(e) => return not_run(e, 2),
    };
    // The same rule as the MCP tool's.
    if let Some(problem) = crate::exec::code_problem(&code) {
        eprintln!("nix-sandbox-mcp: nothing was run: {source} {problem}; {HOW_TO_PASS_CODE}");
        return ExitCode::from(2);
    }
    let app = match app::start(&StartOptions {
        load_environments: artifact_dir.is_none(),
        quick: true,
        ..opts.clone()
    })
    .await
    {
        Ok(a) => a,
        Err(e) => return not_run(e, SERVER_FAILED),
    };
    let env = match (&artifact_dir, &env_name) {
        (Some(dir), _) => match artifact::load(dir, app.config.defaults) {
            Ok(e) => Arc::new(e),
            Err(e) => {
                return not_run(
                    format!("sandbox artifact {}: {e}", dir.display()),
                    NO_SUCH_ENVIRONMENT,
                );
            }
        },
        (None, Some(name)) => match app.registry.get(name) {
            Some(e) => e.clone(),
            None => {
                return not_run(
                    format!(
                        "there is no environment {name:?}; available: {}",
                        app.registry.names().join(", ")
                    ),
                    NO_SUCH_ENVIRONMENT,
                );
            }
        },
        (None, None) => return not_run("give --env NAME or --artifact DIR", 2),
    };
    if let Some(name) = &env_name {
        let about = format!("environment {} ", env.name);
        let alias = format!("environment {name} ");
        for w in app.registry.warnings.iter() {
            if w.starts_with(&about) || w.starts_with(&alias) {
                eprintln!("nix-sandbox-mcp: warning: {w}");
            }
        }
    }
    let inherited = crate::config::read_inherited(&app.config.project.inherit_names());
    let cancel = CancellationToken::new();
    let echo = Arc::new(Echo {
        stdout_closed: Default::default(),
        cancel: cancel.clone(),
    });
    let interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.cancel();
        }
    });
    let outcome = app
        .executor
        .run(Request {
            env: &env,
            code: &code,
            project: app.project.as_ref(),
            inherited: &inherited,
            cancel,
            observer: Some(echo.clone()),
            share: None,
        })
        .await;
    app.executor.shutdown().await;
    let o = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nix-sandbox-mcp: {e}");
            if let ExecError::Setup { message, .. } = &e {
                eprintln!("  fix: {}", app::diagnose_sandbox_failure(message));
            }
            return ExitCode::from(126);
        }
    };
    let ending = Ending::of(&o);
    // A closed standard output ended the run, whatever it looked like then.
    if !matches!(ending, Ending::Limit(_))
        && echo
            .stdout_closed
            .load(std::sync::atomic::Ordering::Relaxed)
    {
        return ExitCode::from(141);
    }
    match ending {
        Ending::Exited(_) | Ending::Signalled(_) => {}
        Ending::Cancelled => eprintln!("nix-sandbox-mcp: interrupted; the sandbox was killed"),
        _ => eprintln!(
            "nix-sandbox-mcp: {}",
            ending.sentence(Subject::Run, &env.limits)
        ),
    }
    ExitCode::from(ending.exit_status())
}
