//! `--stdio` and `serve --http`: the MCP server over standard input and
//! output or over Streamable HTTP, from start-up to shutdown (every run in
//! flight killed, every session closed).

use super::*;
use crate::server::http::HttpOptions;

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

/// The server, started: what both transports serve, and what stopping
/// it must end.
struct Running {
    server: SandboxServer,
    config: Arc<crate::config::Config>,
    sessions: Arc<Sessions>,
    executor: crate::exec::Executor,
    /// Cancelled at shutdown: every run in flight is killed.
    shutdown: CancellationToken,
    reaper: tokio::task::JoinHandle<()>,
    housekeeping: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts the server (`transport` names it in the log); `Err` is the
    /// exit status when it could not start or a signal came first.
    /// `http`: how it serves over HTTP, which names it among replicas.
    async fn start(
        opts: &StartOptions,
        signals: &mut Signals,
        transport: &str,
        http: Option<&HttpOptions>,
    ) -> Result<Running, ExitCode> {
        let app = tokio::select! {
            started = app::start(opts) => started.map_err(fail)?,
            quit = signals.received() => {
                tracing::info!("{quit} while starting; nothing to shut down");
                return Err(ExitCode::SUCCESS);
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
            "serving {} environment(s) over {transport}{}: {}; limits: {}",
            registry.len(),
            if checks_pending {
                ", once each starts in the sandbox"
            } else {
                ""
            },
            registry.names().join(", "),
            executor.enforcer().describe()
        );
        let commands =
            Arc::new(app::declared_commands(&config, &registry, project.as_ref()).map_err(fail)?);
        let shutdown = CancellationToken::new();
        let inherited = crate::config::read_inherited(&config.project.inherit_names());
        let sessions = Arc::new(Sessions::new(
            executor.clone(),
            project.clone(),
            inherited.clone(),
            app::session_limits(&config),
        ));
        let jobs = Jobs::new(app::job_limits(&config));
        let config = Arc::new(config);
        let server = SandboxServer::new(Shared {
            config: config.clone(),
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
            metrics: Arc::default(),
            replica: http.map(|h| crate::server::http::replica_name(&config.http, h)),
            jobs,
            sessions: sessions.clone(),
            projects,
        });
        // The environments are started once in the jail, before the first
        // tools/list is answered.
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
        Ok(Running {
            server,
            config,
            sessions,
            executor,
            shutdown,
            reaper,
            housekeeping,
        })
    }

    /// Kills every run in flight, closes every session, and removes what
    /// the sandboxes held.
    async fn stop(self, why: &str) {
        tracing::info!("shutting down ({why}); killing runs in flight");
        self.shutdown.cancel();
        self.server.stop_builds();
        self.reaper.abort();
        self.housekeeping.abort();
        self.sessions.close_all().await;
        self.executor.shutdown().await;
    }
}

pub(super) async fn serve_stdio(opts: &StartOptions) -> ExitCode {
    use rmcp::ServiceExt;
    let mut signals = Signals::listen();
    let running = match Running::start(opts, &mut signals, "stdio", None).await {
        Ok(r) => r,
        Err(status) => return status,
    };
    let framed = crate::server::framing::stdio();
    let (quit, status) = tokio::select! {
        served = running.server.clone().serve(framed.transport) => match served {
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
    running.stop(&quit).await;
    // The last replies rmcp wrote are on their way to stdout.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), framed.writer).await;
    status
}

/// `serve --http`: until SIGINT or SIGTERM, then a graceful stop (calls in
/// flight have the grace time, then their runs are killed).
pub(super) async fn serve_http(opts: &StartOptions, options: HttpOptions) -> ExitCode {
    let mut signals = Signals::listen();
    let running = match Running::start(opts, &mut signals, "HTTP", Some(&options)).await {
        Ok(r) => r,
        Err(status) => return status,
    };
    let quit = async move { signals.received().await.to_string() };
    let served = crate::server::http::serve(
        running.server.clone(),
        &running.config,
        options,
        running.shutdown.clone(),
        quit,
    )
    .await;
    let (why, status) = match served {
        Ok(why) => (why, ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("nix-sandbox-mcp: {e}");
            ("it could not serve".to_string(), ExitCode::from(1))
        }
    };
    running.stop(&why).await;
    status
}
