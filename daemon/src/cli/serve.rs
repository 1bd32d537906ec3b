//! `--stdio`: the MCP server over standard input and output, from start-up
//! to shutdown (every run in flight killed, every session closed).

use super::*;

/// SIGINT and SIGTERM, listened for from the start: one that comes while
/// the server starts or waits for the client's handshake ends it as
/// cleanly as one that comes later (its cgroups and runtime directory
/// removed), where the signal's default action would kill it outright.
struct Signals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Which signal came.
    async fn received(&mut self) -> &'static str {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = next(&mut self.interrupt) => "interrupted",
            _ = next(&mut self.terminate) => "terminated",
        }
    }
}

pub(super) async fn serve_stdio(opts: &StartOptions) -> ExitCode {
    use rmcp::ServiceExt;
    let mut signals = Signals::listen();
    let app = tokio::select! {
        started = app::start(opts) => match started {
            Ok(a) => a,
            Err(e) => return fail(e),
        },
        quit = signals.received() => {
            tracing::info!("{quit} while starting; nothing to shut down");
            return ExitCode::SUCCESS;
        }
    };
    let App {
        registry,
        executor,
        project,
        project_note,
        config,
        audit,
        gathered,
        builds,
        checks_pending,
        projects,
        ..
    } = app;
    tracing::info!(
        "serving {} environment(s) over stdio{}: {}; limits: {}",
        registry.len(),
        if checks_pending {
            ", once each starts in the sandbox"
        } else {
            ""
        },
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
    let jobs = Jobs::new(app::job_limits(&config));
    let server = SandboxServer::new(Shared {
        config: Arc::new(config),
        registry: std::sync::RwLock::new(Arc::new(registry)),
        executor: executor.clone(),
        project: std::sync::RwLock::new(Arc::new(ProjectState::new(
            project,
            project_note,
            commands,
        ))),
        inherited,
        shutdown: shutdown.clone(),
        audit,
        jobs,
        sessions: sessions.clone(),
        projects,
    });
    // The environments are started once in the jail after the handshake,
    // before the first tools/list is answered.
    server.follow_builds(
        gathered,
        builds.into_inner().unwrap_or_else(|e| e.into_inner()),
        checks_pending,
    );
    let reaper = tokio::spawn(sessions.clone().reap_forever());
    let tended = executor.clone();
    // Every second: reap what sandboxes orphaned, and tend the pool.
    let housekeeping = tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            every.tick().await;
            crate::exec::process::reap_orphans();
            tended.tend_pool().await;
        }
    });
    let framed = crate::server::framing::stdio();
    let (quit, status) = tokio::select! {
        served = server.clone().serve(framed.transport) => match served {
            Ok(service) => {
                let cancel = service.cancellation_token();
                let quit = tokio::select! {
                    r = service.waiting() => format!("{r:?}"),
                    quit = signals.received() => { cancel.cancel(); quit.to_string() }
                };
                (quit, ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("nix-sandbox-mcp: MCP initialization failed: {e}");
                ("no handshake".to_string(), ExitCode::from(1))
            }
        },
        quit = signals.received() => (format!("{quit} before the client's handshake"), ExitCode::SUCCESS),
    };
    tracing::info!("shutting down ({quit}); killing runs in flight");
    shutdown.cancel();
    server.stop_builds();
    reaper.abort();
    housekeeping.abort();
    sessions.close_all().await;
    executor.shutdown().await;
    // The last replies rmcp wrote are on their way to stdout.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), framed.writer).await;
    status
}
