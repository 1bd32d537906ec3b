//! Streamable HTTP (`serve --http`): the MCP server for a team, remote
//! agents and CI, on rmcp's Streamable HTTP service (both revisions:
//! 2026-07-28's stateless POSTs and listen streams, 2025-11-25's
//! `Mcp-Session-Id` and SSE), with hyper serving the connections.
//!
//! - `address.rs`: where it listens (TCP, a Unix socket) and whether only
//!   this machine can reach that; `activation.rs`: the socket systemd
//!   passes instead (socket activation).
//! - `tls.rs`: rustls, with `--tls-cert`/`--tls-key`.
//! - `gate.rs`: one request, from arrival to the principal's service.
//! - `hosts.rs`: `Host` and `Origin` (DNS rebinding).
//! - `auth.rs`: credentials: `tokens.rs` (the tokens file), `oauth.rs`
//!   (JWT access tokens, protected resource metadata).
//! - `principals.rs`: each principal's service, server and shares.
//! - `refusal.rs`: every refusal a status and a JSON-RPC error.
//!
//! `/healthz` and `/readyz` answer a balancer's probes without credentials
//! (they say nothing a caller could use); `/metrics` needs them where the
//! server does.
//!
//! Secure by default: loopback unless told otherwise, and a non-loopback
//! address only with credentials required. Bounded: request heads (size,
//! count, time, which is also the idle time between requests), bodies
//! (size, time), connections (all, and each principal's), each principal's
//! streams and MCP sessions, and principals.

pub mod activation;
mod address;
mod auth;
mod gate;
mod hosts;
mod oauth;
mod principals;
mod refusal;
mod tls;
pub mod tokens;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

pub use activation::Listen;
pub use address::Address;
use auth::Auth;
use gate::{Connection, Gate};
use hosts::{Allowed, LOOPBACK_HOSTS};
use principals::{Counter, Principals, Shares};
use refusal::Refusal;

use super::SandboxServer;
use crate::config::Config;

/// How `serve --http` was asked to serve.
#[derive(Debug)]
pub struct HttpOptions {
    pub address: Address,
    /// The listening socket systemd passed (`--http systemd`), which
    /// listens at `address`; without it the server binds `address`.
    pub socket: Option<std::os::fd::OwnedFd>,
    /// A PEM certificate chain and its key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// How long calls in flight may go on once the server is told to stop,
    /// before their runs are killed.
    pub grace: Duration,
    /// `--replica`: this server's name among replicas, over [http] replica.
    pub replica: Option<String>,
}

/// Why the server could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "{address} can be reached from other machines, and [http] requires no credentials; set [http] tokens_file (`nix-sandbox-mcp token add NAME` makes one) or [http.oauth], or listen on a loopback address such as 127.0.0.1:8765"
    )]
    OpenToTheNetwork { address: Address },
    #[error(transparent)]
    Tokens(#[from] tokens::TokensError),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: Address,
        source: std::io::Error,
    },
}

/// As stdio's longest message.
const DEFAULT_MAX_BODY: u64 = 16 * 1024 * 1024;

/// Serves `server` over HTTP until `quit` resolves (its value is why);
/// then refuses new requests, lets calls in flight finish for the grace
/// time, kills the runs of those left (cancelling `runs`), and closes every
/// connection. Returns why it stopped.
pub async fn serve(
    server: SandboxServer,
    config: &Config,
    options: HttpOptions,
    runs: CancellationToken,
    quit: impl Future<Output = String>,
) -> Result<String, HttpError> {
    let settings = &config.http;
    let auth = Auth::new(settings)?;
    if !options.address.is_local() && !auth.required() {
        return Err(HttpError::OpenToTheNetwork {
            address: options.address.clone(),
        });
    }
    let tls = match &options.tls {
        Some((cert, key)) => Some(tls::acceptor(cert, key).map_err(HttpError::Tls)?),
        None => None,
    };
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.map(String::from).to_vec();
    hosts.extend(options.address.host_names());
    hosts.extend(
        settings
            .allowed_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase()),
    );
    let mut origins: Vec<String> = settings
        .allowed_origins
        .iter()
        .map(|o| o.to_ascii_lowercase())
        .collect();
    if options.address.is_local() {
        origins.extend(
            ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"].map(String::from),
        );
    }
    let max_body = or_default(settings.max_body_bytes, DEFAULT_MAX_BODY as usize);
    let streams_stop = CancellationToken::new();
    let rmcp_config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts.clone())
        .with_allowed_origins(origins.clone())
        .enforce_origin_validation()
        .with_max_request_body_bytes(max_body)
        .with_cancellation_token(streams_stop.clone());
    let shares = shares(&server, settings, auth.required());
    let server_replica = server.shared.replica.clone();
    let gate = Arc::new(Gate {
        auth,
        allowed: Allowed { hosts, origins },
        principals: Principals::new(
            server,
            rmcp_config,
            shares,
            or_default(settings.max_principals, 4096),
        ),
        max_body,
        body_timeout: Duration::from_secs(or_default(settings.body_timeout_seconds, 30) as u64),
        quitting: CancellationToken::new(),
        calls: Counter::default(),
        metrics: settings.metrics.unwrap_or(true),
    });
    let limits = ConnectionLimits {
        idle: Duration::from_secs(or_default(settings.idle_timeout_seconds, 30) as u64),
        header_bytes: or_default(settings.max_header_bytes, 16 * 1024).max(8192),
        headers: or_default(settings.max_headers, 64),
    };
    let listener = Listener::open(&options.address, options.socket)
        .await
        .map_err(|source| HttpError::Listen {
            address: options.address.clone(),
            source,
        })?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let shown = match listener.local() {
        Some(a) => format!("{scheme}://{a}{}", gate::ENDPOINT),
        None => format!("{} ({scheme}, path {})", options.address, gate::ENDPOINT),
    };
    eprintln!("nix-sandbox-mcp: listening on {shown}");
    if let Some(r) = &server_replica {
        eprintln!("nix-sandbox-mcp: replica {r}");
    }
    tracing::info!(
        "serving MCP over HTTP on {shown}; credentials: {}",
        match (settings.tokens_file.is_some(), settings.oauth.is_some()) {
            (true, true) => "tokens file and OAuth",
            (true, false) => "tokens file",
            (false, true) => "OAuth",
            (false, false) => "none (this machine only)",
        }
    );
    let reloads = tokio::spawn(reload_on_hangup(gate.clone()));
    let connections = Counter::default();
    let max_connections = or_default(settings.max_connections, 1024);
    let graceful = GracefulShutdown::new();
    tokio::pin!(quit);
    let why = loop {
        tokio::select! {
            accepted = listener.accept() => {
                let io = match accepted {
                    Ok(io) => io,
                    Err(e) => {
                        tracing::warn!("cannot accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let place = connections.take(max_connections);
                let (gate, tls, watcher) = (gate.clone(), tls.clone(), graceful.watcher());
                tokio::spawn(async move {
                    let _place = match place {
                        Some(p) => p,
                        None => return refuse_connection(io, limits, "this server has as many connections open as it takes").await,
                    };
                    match (io, tls) {
                        (io, Some(tls)) => match tokio::time::timeout(limits.idle, tls.accept(io)).await {
                            Ok(Ok(io)) => serve_connection(io, gate, limits, watcher).await,
                            Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
                            Err(_) => tracing::debug!("TLS handshake timed out"),
                        },
                        (io, None) => serve_connection(io, gate, limits, watcher).await,
                    }
                });
            }
            why = &mut quit => break why,
        }
    };
    drop(listener);
    tracing::info!(
        "no longer accepting connections ({why}); calls in flight have {} s to finish",
        options.grace.as_secs()
    );
    gate.quitting.cancel();
    settle(&gate.calls, options.grace).await;
    runs.cancel();
    settle(&gate.calls, Duration::from_secs(3)).await;
    streams_stop.cancel();
    reloads.abort();
    if tokio::time::timeout(Duration::from_secs(3), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("connections still open at shutdown were dropped");
    }
    Ok(why)
}

/// This server's name among replicas: `--replica`, `[http] replica`, else
/// six hex digits of the SHA-256 of the host's name and the address
/// (distinct for replicas on one host, as they listen on distinct
/// addresses).
pub fn replica_name(settings: &crate::config::http::HttpSettings, options: &HttpOptions) -> String {
    use sha2::{Digest, Sha256};
    if let Some(r) = options.replica.as_ref().or(settings.replica.as_ref()) {
        return r.clone();
    }
    let address = &options.address;
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let digest = Sha256::digest(format!("{host}\0{address}").as_bytes());
    digest[..3].iter().map(|b| format!("{b:02x}")).collect()
}

/// Each principal's share of the server. Without credentials there is one
/// principal, whose share is the server's own bounds.
fn shares(
    server: &SandboxServer,
    settings: &crate::config::http::HttpSettings,
    shared: bool,
) -> Shares {
    let executor = &server.shared.executor;
    let (running, queued) = (executor.max_concurrent_runs(), executor.max_queued_runs());
    let server_jobs = server.shared.jobs.limits().max_jobs;
    let server_sessions = server.shared.sessions.limits().max_sessions;
    let per = settings.per_principal;
    let n = |v, shared_default, alone| or_default(v, if shared { shared_default } else { alone });
    Shares {
        connections: n(per.max_connections, 256, usize::MAX),
        streams: n(per.max_streams, 64, usize::MAX),
        runs: n(per.max_runs, running.div_ceil(2).max(1), running),
        waiting: queued.div_ceil(2).max(1),
        sessions: n(per.max_sessions, server_sessions, server_sessions),
        jobs: n(per.max_jobs, server_jobs.div_ceil(2).max(1), server_jobs),
        mcp_sessions: n(per.max_mcp_sessions, 16, 64),
    }
}

/// An optional bound of [http], else `default`.
fn or_default(v: Option<crate::config::Positive>, default: usize) -> usize {
    v.map_or(default, |p| p.0 as usize)
}

/// Waits until no call is in flight, or `limit` passes.
async fn settle(calls: &Counter, limit: Duration) {
    let until = Instant::now() + limit;
    while calls.get() > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, Clone, Copy)]
struct ConnectionLimits {
    idle: Duration,
    header_bytes: usize,
    headers: usize,
}

fn http1(limits: ConnectionLimits) -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(limits.idle)
        .max_buf_size(limits.header_bytes)
        .max_headers(limits.headers);
    b
}

async fn serve_connection<I>(
    io: I,
    gate: Arc<Gate>,
    limits: ConnectionLimits,
    watcher: hyper_util::server::graceful::Watcher,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let connection = Arc::new(Connection::default());
    let service =
        hyper::service::service_fn(move |request| gate.clone().handle(connection.clone(), request));
    let conn = http1(limits).serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!("HTTP connection ended: {e}");
    }
}

/// Answers one request on a connection over the bound with 503, then closes it.
async fn refuse_connection<I>(io: I, limits: ConnectionLimits, why: &'static str)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |_| async move {
        Ok::<_, std::convert::Infallible>(
            Refusal::new(http::StatusCode::SERVICE_UNAVAILABLE, why)
                .retry_after(1)
                .into_response(),
        )
    });
    let mut b = http1(limits);
    b.keep_alive(false);
    let _ = tokio::time::timeout(limits.idle, b.serve_connection(TokioIo::new(io), service)).await;
}

/// SIGHUP: the tokens file read again.
async fn reload_on_hangup(gate: Arc<Gate>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        return;
    };
    while hangups.recv().await.is_some() {
        match gate.auth.reload() {
            Some(Ok(n)) => {
                tracing::info!("SIGHUP: the tokens file was read again; it names {n} principal(s)")
            }
            Some(Err(e)) => tracing::error!("SIGHUP: {e}; the principals stay as they were"),
            None => tracing::info!("SIGHUP: there is no tokens file to read again"),
        }
    }
}

/// A bound socket, TCP or Unix.
enum Listener {
    Tcp(tokio::net::TcpListener),
    /// The path is removed when the server stops, unless systemd made it.
    Unix(tokio::net::UnixListener, Option<PathBuf>),
}

type Stream = Box<dyn Io>;
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Listener {
    /// systemd's socket when it passed one, else `address` bound.
    async fn open(
        address: &Address,
        socket: Option<std::os::fd::OwnedFd>,
    ) -> std::io::Result<Listener> {
        if let Some(socket) = socket {
            return match address {
                Address::Tcp(_) => {
                    let l = std::net::TcpListener::from(socket);
                    l.set_nonblocking(true)?;
                    Ok(Listener::Tcp(tokio::net::TcpListener::from_std(l)?))
                }
                Address::Unix(_) => {
                    let l = std::os::unix::net::UnixListener::from(socket);
                    l.set_nonblocking(true)?;
                    Ok(Listener::Unix(tokio::net::UnixListener::from_std(l)?, None))
                }
            };
        }
        match address {
            Address::Tcp(a) => Ok(Listener::Tcp(tokio::net::TcpListener::bind(a).await?)),
            Address::Unix(path) => {
                use std::os::unix::fs::{FileTypeExt, PermissionsExt};
                // A socket left by a server that was killed is replaced; one a
                // server still answers on is not.
                if let Ok(meta) = std::fs::symlink_metadata(path) {
                    if !meta.file_type().is_socket() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AlreadyExists,
                            "the path exists and is not a socket",
                        ));
                    }
                    if tokio::net::UnixStream::connect(path).await.is_ok() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::AddrInUse,
                            "a server is listening on it",
                        ));
                    }
                    std::fs::remove_file(path)?;
                }
                let listener = tokio::net::UnixListener::bind(path)?;
                // Who may connect is who may use the socket: its owner.
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                Ok(Listener::Unix(listener, Some(path.clone())))
            }
        }
    }

    fn local(&self) -> Option<std::net::SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr().ok(),
            Listener::Unix(..) => None,
        }
    }

    async fn accept(&self) -> std::io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok(Box::new(s))
            }
            Listener::Unix(l, _) => Ok(Box::new(l.accept().await?.0)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, Some(path)) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}
