//! The command line: `--stdio` (the MCP server), `run`, `envs` and `doctor`.
//! Parses arguments with clap, sets up logging on stderr, and drives the
//! other modules; holds no sandbox logic of its own.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{ArgAction, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::app::{self, App, StartOptions};
use crate::exec::{ExecError, LimitKind, Observer, Request, Stream};
use crate::jobs::Jobs;
use crate::registry::artifact;
use crate::server::{SandboxServer, Shared};
use crate::sessions::Sessions;

const ABOUT: &str = "Run code from AI agents in bubblewrap sandboxes built from Nix or the host";

const LONG_ABOUT: &str = "\
nix-sandbox-mcp is a Model Context Protocol (MCP) server whose tool is \
run(code, env). Each environment (bash, python, node, or one built by Nix) \
runs in a bubblewrap sandbox: new user, pid, ipc, uts, cgroup and network \
namespaces, no capabilities, a read-only root, the project mounted read-only \
at /project, a fresh writable /workspace, a seccomp filter, and limits on \
time, memory, processes, CPU, file size, open files and output.

Calls may name a session to keep interpreter state (variables, the working \
directory, /workspace) across calls, or run in the background as jobs read \
with the job tool.

Without a configuration file it serves the host's bash, python3 and node \
(host mode); with Nix it serves sandbox artifacts built by the flake.";

const AFTER_HELP: &str = "\
CONFIGURATION
    The configuration is read from --config PATH, else from
    $XDG_CONFIG_HOME/nix-sandbox-mcp/config.toml (~/.config/... when
    XDG_CONFIG_HOME is unset) when that file exists, else built-in defaults
    apply. config.example.toml in the source documents every key.

ENVIRONMENT
    PROJECT_DIR        Host directory mounted as the project (overrides [project] path;
                       default: the current directory, unless it is / or $HOME).
    PROJECT_MOUNT      Where the project appears in the sandbox (default /project).
    NIX_SANDBOX_DIR    Directories (colon-separated) of pre-built sandbox artifacts
                       (default: ~/.config/nix-sandbox-mcp/sandboxes).
    NIX_SANDBOX_ENVS   Comma-separated flake references built into artifacts at start-up.
    NIX_SANDBOX_LIMITS auto (default: cgroup v2, else v1, else rlimits) or rlimits
                       (never use cgroups).
    RUST_LOG           Log filter, e.g. debug or nix_sandbox_mcp=trace (logs go to stderr).

EXIT STATUS
    run exits with the program's own status; 124 when it timed out, 125 when a
    limit other than time ended it, 126 when the sandbox could not start.
    doctor exits 0 when sandboxing works, 1 otherwise.

EXAMPLES
    nix-sandbox-mcp --stdio
    claude mcp add sandbox -- nix-sandbox-mcp --stdio
    nix-sandbox-mcp run --env python 'print(6 * 7)'
    echo 'ls /project' | nix-sandbox-mcp run --env bash -
    nix-sandbox-mcp envs
    nix-sandbox-mcp doctor";

#[derive(Parser, Debug)]
#[command(name = "nix-sandbox-mcp", version, about = ABOUT, long_about = LONG_ABOUT, after_long_help = AFTER_HELP)]
// A later --config replaces an earlier one: the Nix package's wrapper passes
// its own, and the user's must win.
#[command(args_override_self = true)]
struct Cli {
    /// Serve MCP over standard input and output (what MCP clients launch)
    #[arg(long)]
    stdio: bool,

    /// Read the configuration from this TOML file
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,

    /// Log more to stderr: -v for debug, -vv for trace (RUST_LOG overrides)
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run code once in an environment's sandbox and stream its output
    ///
    /// The code comes from the CODE argument, from a file (-f), or from
    /// standard input (CODE is `-`). Output streams to the terminal as it is
    /// produced; the exit status is the program's own.
    Run {
        /// Environment to run in (see `envs`)
        #[arg(short, long, value_name = "NAME", required_unless_present = "artifact")]
        env: Option<String>,
        /// Run in the sandbox artifact in DIR instead of a configured environment
        #[arg(long, value_name = "DIR", conflicts_with = "env")]
        artifact: Option<PathBuf>,
        /// Read the code from FILE
        #[arg(
            short = 'f',
            long = "file",
            value_name = "FILE",
            conflicts_with = "code"
        )]
        file: Option<PathBuf>,
        /// The code to run, or `-` to read it from standard input
        #[arg(value_name = "CODE", required_unless_present = "file")]
        code: Option<String>,
    },
    /// List the environments: name, description, source, interpreter, limits
    Envs {
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Check that sandboxing works here and say how to fix what does not
    Doctor,
    /// Print the JSON schema of the configuration file
    ///
    /// Editors and TOML tools can check a config.toml against it as it is
    /// written (for example taplo, with `#:schema ./config-schema.json` on
    /// the file's first line).
    Schema,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose, cli.stdio);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nix-sandbox-mcp: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(dispatch(cli));
    // Runs killed at shutdown may still be settling; don't wait for blocked readers.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    result
}

fn init_logging(verbose: u8, serving: bool) {
    // rmcp logs every message at info; keep it for -v.
    let default = match verbose {
        0 if serving => "info,rmcp=warn",
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

async fn dispatch(cli: Cli) -> ExitCode {
    let opts = StartOptions {
        config: cli.config.clone(),
        load_environments: true,
        quick: false,
        prestart: false,
    };
    match cli.command {
        None if cli.stdio => {
            serve_stdio(&StartOptions {
                prestart: true,
                ..opts
            })
            .await
        }
        Some(_) if cli.stdio => {
            eprintln!("nix-sandbox-mcp: --stdio serves MCP and takes no command");
            ExitCode::from(2)
        }
        None => {
            eprintln!(
                "nix-sandbox-mcp: nothing to do. Use --stdio to serve MCP, or one of the commands run, envs, doctor (see --help)."
            );
            ExitCode::from(2)
        }
        Some(Command::Run {
            env,
            artifact,
            file,
            code,
        }) => run_once(&opts, env, artifact, file, code).await,
        Some(Command::Envs { json }) => list_envs(&opts, json).await,
        Some(Command::Doctor) => crate::doctor::run(&opts).await,
        Some(Command::Schema) => {
            let schema = crate::config::json_schema();
            println!(
                "{}",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("nix-sandbox-mcp: {e}");
    ExitCode::from(1)
}

async fn serve_stdio(opts: &StartOptions) -> ExitCode {
    use rmcp::ServiceExt;
    let app = match app::start(opts).await {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let App {
        registry,
        executor,
        project,
        config,
        audit,
        ..
    } = app;
    tracing::info!(
        "serving {} environment(s) over stdio: {}; limits: {}",
        registry.len(),
        registry.names().join(", "),
        executor.enforcer().describe()
    );

    let commands = match app::declared_commands(&config, &registry, project.as_ref()) {
        Ok(c) => Arc::new(c),
        Err(e) => return fail(e),
    };
    let shutdown = CancellationToken::new();
    let inherited = crate::config::read_inherited(&config.project.inherit_names());
    let sessions = Arc::new(Sessions::new(
        executor.clone(),
        project.clone(),
        inherited.clone(),
        app::session_limits(&config),
    ));
    let server = SandboxServer::new(Shared {
        registry,
        executor: executor.clone(),
        project,
        inherited,
        shutdown: shutdown.clone(),
        audit,
        jobs: Jobs::new(app::job_limits(&config)),
        sessions: sessions.clone(),
        commands,
    });
    let reaper = tokio::spawn(sessions.clone().reap_forever());
    let service = match server.serve(rmcp::transport::stdio_pipes()).await {
        Ok(s) => s,
        Err(e) => return fail(format!("MCP initialization failed: {e}")),
    };
    let cancel = service.cancellation_token();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let quit = tokio::select! {
        r = service.waiting() => format!("{r:?}"),
        _ = tokio::signal::ctrl_c() => { cancel.cancel(); "interrupted".to_string() }
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => "terminated".to_string(),
    };
    tracing::info!("shutting down ({quit}); killing runs in flight");
    shutdown.cancel();
    reaper.abort();
    sessions.close_all().await;
    executor.shutdown().await;
    ExitCode::SUCCESS
}

/// Echoes a run's output to the terminal as it arrives.
struct Echo;

impl Observer for Echo {
    fn output(&self, stream: Stream, data: &[u8]) {
        let _ = match stream {
            Stream::Stdout => std::io::stdout()
                .lock()
                .write_all(data)
                .and_then(|_| std::io::stdout().flush()),
            Stream::Stderr => std::io::stderr().lock().write_all(data),
        };
    }
}

async fn run_once(
    opts: &StartOptions,
    env_name: Option<String>,
    artifact_dir: Option<PathBuf>,
    file: Option<PathBuf>,
    code: Option<String>,
) -> ExitCode {
    let code = match (file, code.as_deref()) {
        (Some(f), _) => std::fs::read(&f).map_err(|e| format!("cannot read {}: {e}", f.display())),
        (None, Some("-")) => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map(|_| buf)
                .map_err(|e| format!("cannot read standard input: {e}"))
        }
        (None, Some(c)) => Ok(c.as_bytes().to_vec()),
        (None, None) => Err("no code given".to_string()),
    };
    let code = match code {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let app = match app::start(&StartOptions {
        load_environments: artifact_dir.is_none(),
        quick: true,
        ..opts.clone()
    })
    .await
    {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let env = match (&artifact_dir, &env_name) {
        (Some(dir), _) => match artifact::load(dir, app.config.defaults) {
            Ok(e) => Arc::new(e),
            Err(e) => return fail(format!("sandbox artifact {}: {e}", dir.display())),
        },
        (None, Some(name)) => match app.registry.get(name) {
            Some(e) => e.clone(),
            None => {
                return fail(format!(
                    "there is no environment {name:?}; available: {}",
                    app.registry.names().join(", ")
                ));
            }
        },
        (None, None) => return fail("give --env NAME or --artifact DIR"),
    };
    let inherited = crate::config::read_inherited(&app.config.project.inherit_names());
    let cancel = CancellationToken::new();
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
            observer: Some(Arc::new(Echo)),
        })
        .await;
    app.executor.shutdown().await;
    let o = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("nix-sandbox-mcp: {e}");
            if let ExecError::Setup(message) = &e {
                eprintln!("  fix: {}", app::diagnose_sandbox_failure(message));
            }
            return ExitCode::from(126);
        }
    };
    if let Some(limit) = o.limit {
        let what = match limit {
            LimitKind::Timeout => format!("timed out after {} ms", env.limits.timeout.as_millis()),
            other => format!("stopped by the {} limit", other.as_str()),
        };
        eprintln!("nix-sandbox-mcp: {what}");
        return ExitCode::from(if limit == LimitKind::Timeout {
            124
        } else {
            125
        });
    }
    if o.cancelled {
        return ExitCode::from(130);
    }
    ExitCode::from(o.exit_code.map(|c| c.clamp(0, 255) as u8).unwrap_or(1))
}

async fn list_envs(opts: &StartOptions, json: bool) -> ExitCode {
    let app = match app::start(opts).await {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let mechanism = app.executor.enforcer().describe();
    if json {
        let envs: Vec<serde_json::Value> = app
            .registry
            .iter()
            .map(|e| {
                let l = &e.limits;
                serde_json::json!({
                    "name": e.name, "description": e.description, "source": e.origin.to_string(),
                    "interpreter": e.interpreter, "network": e.network, "tools": e.tools,
                    "limits": {
                        "timeout_ms": l.timeout.as_millis() as u64, "memory_mb": l.memory_bytes >> 20, "pids": l.pids,
                        "cpu_seconds": l.cpu_seconds, "file_size_mb": l.file_size_bytes >> 20, "open_files": l.open_files,
                        "workspace_mb": l.workspace_bytes >> 20, "output_bytes": l.output_bytes, "output_limit_mb": l.output_limit_bytes >> 20,
                    },
                })
            })
            .collect();
        let out = serde_json::json!({
            "environments": envs,
            "aliases": app.registry.aliases(),
            "limits_mechanism": app.executor.enforcer().mechanism().as_str(),
            "limits_detail": mechanism,
            "project": app.project.as_ref().map(|p| serde_json::json!({"path": p.host_path, "mount_point": p.mount_point, "writable": p.writable})),
            "warnings": app.registry.warnings,
            "sources": app.registry.sources.iter().map(|(name, about)| serde_json::json!({"name": name, "about": about})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        for e in app.registry.iter() {
            let l = &e.limits;
            println!("{}\n    {}", e.name, e.description);
            println!("    source:      {}", e.origin);
            println!("    interpreter: {}", e.interpreter.join(" "));
            println!(
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
            println!("    network:     {}", if e.network { "on" } else { "off" });
        }
        for (alias, target) in app.registry.aliases() {
            println!("({alias} is another name for {target})");
        }
        println!("limits enforced with: {mechanism}");
        match (&app.project, &app.project_note) {
            (Some(p), _) => println!(
                "project: {} at {} ({})",
                p.host_path.display(),
                p.mount_point,
                if p.writable {
                    "read-write"
                } else {
                    "read-only"
                }
            ),
            (None, Some(note)) => println!("project: {note}"),
            (None, None) => {}
        }
        for w in &app.registry.warnings {
            println!("warning: {w}");
        }
    }
    app.executor.shutdown().await;
    ExitCode::SUCCESS
}
