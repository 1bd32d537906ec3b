//! The HTTP proxy a sandbox reaches the world through, one per sandbox,
//! serving on a listener the daemon holds (see `entry.rs`).
//!
//! It speaks HTTP/1.1 with hyper and takes two kinds of request: CONNECT
//! `host:port` (a byte tunnel, for TLS and anything else) and plain HTTP in
//! absolute form (`GET http://host/path`), forwarded on a fresh upstream
//! connection with hop-by-hop headers removed and `Host` set from the
//! target, so the host checked is the host asked (a WebSocket, `ws://`,
//! is joined to the host once it switches, as a tunnel is). Anything else
//! gets a 400 that says how to use the proxy. For each target the policy
//! is asked first, then the proxy resolves the name itself, checks every
//! address, and connects to a checked address (never resolving again).
//! Refusals are answered with a text body naming the host and the rule,
//! and a `Proxy-Status` header (RFC 9209); 403 for the policy, 429 for a
//! bound, 502 and 504 for upstream failures.
//!
//! Bounds, per run: `max_connections` client connections at once (one more
//! set of as many is answered with a 429, anything beyond is closed
//! unread); the transfer budget over both directions of every tunnel and
//! body; request heads of at most [`MAX_HEAD_BYTES`] and [`MAX_HEADERS`]
//! headers (hyper answers 431 beyond); a time limit on request heads, on
//! resolving plus connecting, and on silence in either direction. Memory
//! per connection is therefore a few buffers of fixed size, and a flood of
//! connections costs no more than `2 × max_connections` of them. Nothing
//! here can hold a run past its timeout: the run ends by killing the
//! sandbox, independently of the proxy, and dropping [`Serving`] then ends
//! every task and socket of the proxy at once.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full, combinators::BoxBody};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::policy::{Denial, Host, Policy};
use super::record::{NetworkLimit, RunRecord};
use super::resolve::Resolver;

mod flow;
mod intercept;
mod websocket;
use flow::{Direction, Flow, Metered, tunnel};
pub use intercept::Interceptor;
use websocket::opens_websocket;

/// Largest request or response head (start line and headers), in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most headers in a request or response head.
pub const MAX_HEADERS: usize = 100;
/// Buffer of each direction of a tunnel.
const TUNNEL_BUFFER: usize = 16 * 1024;
/// How the proxy names itself in `Proxy-Status` and bodies.
const NAME: &str = "nix-sandbox-mcp";
/// Pause after a failed accept (out of descriptors), so it does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;

/// Serves sandboxes' proxies. One per daemon; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Proxy {
    resolver: Resolver,
    /// For hosts with credentials or request rules, when any has them.
    interceptor: Option<Arc<Interceptor>>,
}

/// A proxy serving one sandbox. Dropping it stops the proxy: the listener
/// closes, and every connection and tunnel through it ends.
#[derive(Debug)]
pub struct Serving {
    stop: CancellationToken,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Proxy {
    pub fn new(resolver: Resolver, interceptor: Option<Interceptor>) -> Proxy {
        Proxy {
            resolver,
            interceptor: interceptor.map(Arc::new),
        }
    }

    /// Serves `listener` under `policy` until the returned value is dropped,
    /// recording into `record`. Needs a tokio runtime.
    pub fn serve(
        &self,
        listener: std::net::TcpListener,
        policy: Arc<Policy>,
        record: RunRecord,
    ) -> io::Result<Serving> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let stop = CancellationToken::new();
        let bounds = policy.bounds;
        let mut server = http1::Builder::new();
        server
            .timer(TokioTimer::new())
            .header_read_timeout(bounds.header_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .max_headers(MAX_HEADERS)
            .keep_alive(true);
        let slots = bounds.max_connections as usize;
        let run = Arc::new(Run {
            policy,
            record,
            resolver: self.resolver.clone(),
            interceptor: self.interceptor.clone(),
            stop: stop.clone(),
            slots: Arc::new(Semaphore::new(slots)),
            refusals: Arc::new(Semaphore::new(slots)),
            server,
        });
        run.spawn(accept(listener, run.clone()));
        Ok(Serving { stop })
    }
}

/// One sandbox's proxy.
struct Run {
    policy: Arc<Policy>,
    record: RunRecord,
    resolver: Resolver,
    interceptor: Option<Arc<Interceptor>>,
    stop: CancellationToken,
    /// Connections served.
    slots: Arc<Semaphore>,
    /// Connections over the bound, answered with a 429.
    refusals: Arc<Semaphore>,
    server: http1::Builder,
}

impl Run {
    /// Spawns `work`, ended when the proxy stops.
    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// Runs an upstream connection until it ends or the proxy stops.
    fn drive<E: std::fmt::Display>(
        &self,
        connection: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        self.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("proxy upstream connection: {e}");
            }
        });
    }

    fn max_transfer(&self) -> u64 {
        self.policy.bounds.max_transfer_bytes
    }
}

async fn accept(listener: TcpListener, run: Arc<Run>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!("proxy accept: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if let Ok(slot) = run.slots.clone().try_acquire_owned() {
            run.spawn(serve_client(stream, run.clone(), slot));
            continue;
        }
        run.record.reached(NetworkLimit::Connections);
        if let Ok(slot) = run.refusals.clone().try_acquire_owned() {
            run.spawn(refuse_client(stream, run.clone(), slot));
        }
    }
}

async fn serve_client(stream: TcpStream, run: Arc<Run>, slot: OwnedSemaphorePermit) {
    // Tunnels outlive the HTTP connection they started on; they keep the slot.
    let slot = Arc::new(slot);
    let service = {
        let run = run.clone();
        service_fn(move |req| {
            let (run, slot) = (run.clone(), slot.clone());
            async move { Ok::<_, Infallible>(handle(req, run, slot).await) }
        })
    };
    let served = run
        .server
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!("proxy connection: {e}");
    }
}

async fn refuse_client(stream: TcpStream, run: Arc<Run>, _slot: OwnedSemaphorePermit) {
    let max = run.policy.bounds.max_connections;
    let service = service_fn(move |_req| async move {
        Ok::<_, Infallible>(text(
            StatusCode::TOO_MANY_REQUESTS,
            "connection_limit_reached",
            format!(
                "{NAME} proxy: this run already has {max} connections open through the proxy \
                 (the environment's network max_connections); close some and retry."
            ),
        ))
    });
    let mut server = run.server.clone();
    server.keep_alive(false);
    let _ = server.serve_connection(TokioIo::new(stream), service).await;
}

/// Where a request goes.
struct Target {
    host: Host,
    port: u16,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Ip(std::net::IpAddr::V6(v6)) => write!(f, "[{v6}]:{}", self.port),
            host => write!(f, "{host}:{}", self.port),
        }
    }
}

async fn handle(
    mut req: Request<Incoming>,
    run: Arc<Run>,
    slot: Arc<OwnedSemaphorePermit>,
) -> Response<ProxyBody> {
    if req.method() != Method::CONNECT {
        return forward(req, run, slot).await;
    }
    let target = match connect_target(req.uri()) {
        Ok(t) => t,
        Err(message) => return bad_request(message),
    };
    let intercepted = run.policy.intercepts(&target.host);
    if intercepted && run.interceptor.is_none() {
        return text(
            StatusCode::BAD_GATEWAY,
            "proxy_internal_error",
            format!(
                "{NAME} proxy: {target} has credentials or request rules, but the proxy has no certificate authority"
            ),
        );
    }
    let upstream = match open(&run, &target).await {
        Ok(s) => s,
        Err(refusal) => return refusal.respond(&run, &target),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let tunnel_run = run.clone();
    run.spawn(async move {
        let client = match on_upgrade.await {
            Ok(client) => client,
            Err(e) => return tracing::debug!("proxy upgrade: {e}"),
        };
        if intercepted {
            intercept::serve(client, upstream, target, tunnel_run, slot).await;
        } else {
            let flow = Flow::new(&tunnel_run, &target);
            tunnel(TokioIo::new(client), upstream, flow, &tunnel_run).await;
            drop(slot);
        }
    });
    Response::new(Empty::new().map_err(|never| match never {}).boxed())
}

fn bad_request(message: String) -> Response<ProxyBody> {
    text(
        StatusCode::BAD_REQUEST,
        "http_request_error",
        format!("{NAME} proxy: {message}"),
    )
}

/// The target of a CONNECT request; the error is the 400's message.
fn connect_target(uri: &Uri) -> Result<Target, String> {
    let (Some(authority), None) = (uri.authority(), uri.scheme()) else {
        return Err("CONNECT takes host:port".to_string());
    };
    let Some(port) = authority.port_u16() else {
        return Err(format!(
            "CONNECT {authority}: the port is missing (write host:port)"
        ));
    };
    let host =
        Host::parse(authority.host()).map_err(|why| format!("{}: {why}", authority.host()))?;
    Ok(Target { host, port })
}

/// The target of a plain HTTP request; the error is the 400's message.
fn forward_target(uri: &Uri) -> Result<Target, String> {
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "https:// URLs go through CONNECT (clients do this when HTTPS_PROXY is set)"
                    .to_string(),
            );
        }
        Some(other) => {
            return Err(format!(
                "{other}:// is not forwarded; use CONNECT host:port"
            ));
        }
        None => {
            return Err(
                "this is the sandbox's HTTP proxy; send requests in absolute form \
                 (GET http://host/path) or use CONNECT host:port, as clients do when \
                 HTTP_PROXY and HTTPS_PROXY point here"
                    .to_string(),
            );
        }
    }
    let Some(authority) = uri.authority() else {
        return Err("the URL has no host".to_string());
    };
    let host =
        Host::parse(authority.host()).map_err(|why| format!("{}: {why}", authority.host()))?;
    Ok(Target {
        host,
        port: authority.port_u16().unwrap_or(80),
    })
}

/// Why a target was not reached.
enum Refusal {
    Denied(Denial),
    Budget,
    Resolve(io::Error),
    Connect(SocketAddr, io::Error),
    Timeout,
}

impl Refusal {
    /// The response to the client, after recording the outcome.
    fn respond(self, run: &Run, target: &Target) -> Response<ProxyBody> {
        let host = target.host.to_string();
        let (status, error, message) = match self {
            Refusal::Denied(denial) => {
                run.record.denied(&denial, target.port);
                tracing::debug!("proxy denied {target}: {denial}");
                let error = match denial {
                    Denial::Address { .. } => "destination_ip_prohibited",
                    Denial::NotListed { .. } | Denial::Request { .. } => "http_request_denied",
                };
                let body = format!(
                    "{NAME} proxy: access to {target} denied.\n{denial}.\n{}.\n",
                    denial.remedy()
                );
                return text(
                    StatusCode::FORBIDDEN,
                    &format!("{error}; details=\"{}\"", denial.rule()),
                    body,
                );
            }
            Refusal::Budget => {
                return text(
                    StatusCode::TOO_MANY_REQUESTS,
                    "proxy_internal_error",
                    format!(
                        "{NAME} proxy: this run has used its network transfer budget of {} MiB \
                         (the environment's network transfer_mb); {target} was not contacted.",
                        run.max_transfer() >> 20
                    ),
                );
            }
            Refusal::Resolve(e) => (
                StatusCode::BAD_GATEWAY,
                "dns_error",
                format!("{NAME} proxy: cannot resolve {host}: {e}"),
            ),
            Refusal::Connect(addr, e) => (
                StatusCode::BAD_GATEWAY,
                "destination_unavailable",
                format!("{NAME} proxy: cannot connect to {target} ({addr}): {e}"),
            ),
            Refusal::Timeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "connection_timeout",
                format!(
                    "{NAME} proxy: {target} did not answer within {}s",
                    run.policy.bounds.connect_timeout.as_secs()
                ),
            ),
        };
        run.record.failed(&host, target.port);
        text(status, error, message)
    }
}

/// A connection to `target`, if the policy allows it: ask the policy,
/// resolve, check every address, connect to a checked one.
async fn open(run: &Run, target: &Target) -> Result<TcpStream, Refusal> {
    run.policy.admits(&target.host).map_err(Refusal::Denied)?;
    if run.record.exhausted(run.max_transfer()) {
        run.record.reached(NetworkLimit::Transfer);
        return Err(Refusal::Budget);
    }
    let deadline = Instant::now() + run.policy.bounds.connect_timeout;
    let addrs = match &target.host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => tokio::time::timeout_at(deadline, run.resolver.resolve(name))
            .await
            .map_err(|_| Refusal::Timeout)?
            .map_err(Refusal::Resolve)?,
    };
    run.policy
        .check_addresses(&target.host, &addrs)
        .map_err(Refusal::Denied)?;
    let mut last = None;
    for ip in addrs {
        let addr = SocketAddr::new(ip.to_canonical(), target.port);
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Err(_) => return Err(Refusal::Timeout),
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                run.record.opened(&target.host.to_string(), target.port);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some(Refusal::Connect(addr, e)),
        }
    }
    Err(last.unwrap_or(Refusal::Timeout))
}

/// Forwards a plain HTTP request in absolute form; a WebSocket it opens
/// keeps `slot` (the client connection's) while it is open.
async fn forward(
    mut req: Request<Incoming>,
    run: Arc<Run>,
    slot: Arc<OwnedSemaphorePermit>,
) -> Response<ProxyBody> {
    let target = match forward_target(req.uri()) {
        Ok(t) => t,
        Err(message) => return bad_request(message),
    };
    // Plain HTTP never carries credentials; request rules still hold.
    if let Host::Name(name) = &target.host
        && let Err(refusal) = run
            .policy
            .interception
            .decide(name, req.method(), req.uri().path())
    {
        let denial = Denial::Request {
            host: target.host.clone(),
            method: req.method().to_string(),
            path: recorded(req.uri().path()),
            refusal,
        };
        return Refusal::Denied(denial).respond(&run, &target);
    }
    let upstream = match open(&run, &target).await {
        Ok(s) => s,
        Err(refusal) => return refusal.respond(&run, &target),
    };
    let flow = Flow::new(&run, &target);
    let handshake = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS)
        .handshake::<_, ProxyBody>(TokioIo::new(upstream))
        .await;
    let (mut sender, connection) = match handshake {
        Ok(pair) => pair,
        Err(e) => return upstream_failed(&run, &target, e.to_string()),
    };
    // A WebSocket's handshake takes the connection over.
    run.drive(connection.with_upgrades());
    let websocket = opens_websocket(req.headers());
    let sandbox_side = websocket.then(|| hyper::upgrade::on(&mut req));

    let (mut parts, body) = req.into_parts();
    let origin_form = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = origin_form
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"));
    parts.version = hyper::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    if websocket {
        websocket::ask_host(&mut parts.headers, websocket::Compression::Allowed);
    }
    if let Ok(v) = HeaderValue::from_str(&host_header(&target)) {
        parts.headers.insert(header::HOST, v);
    }
    let body = Metered::new(body, flow.clone(), Direction::Sent, run.clone()).boxed();
    let sent = tokio::time::timeout(
        run.policy.bounds.idle_timeout,
        sender.send_request(Request::from_parts(parts, body)),
    )
    .await;
    let response = match sent {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return upstream_failed(&run, &target, e.to_string()),
        Err(_) => {
            return text(
                StatusCode::GATEWAY_TIMEOUT,
                "connection_read_timeout",
                format!(
                    "{NAME} proxy: {target} sent no response within {}s",
                    run.policy.bounds.idle_timeout.as_secs()
                ),
            );
        }
    };
    if let Some(sandbox_side) = sandbox_side
        && response.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        return websocket::switch(response, sandbox_side, Vec::new(), flow, run, slot);
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Response::from_parts(
        parts,
        Metered::new(body, flow, Direction::Received, run).boxed(),
    )
}

/// A refused request's path as the record keeps it: its first 200 characters.
fn recorded(path: &str) -> String {
    path.chars().take(200).collect()
}

/// The `Host` header for `target`: the port only when it is not 80.
fn host_header(target: &Target) -> String {
    match (&target.host, target.port) {
        (Host::Ip(std::net::IpAddr::V6(v6)), 80) => format!("[{v6}]"),
        (host, 80) => host.to_string(),
        _ => target.to_string(),
    }
}

fn upstream_failed(run: &Run, target: &Target, why: String) -> Response<ProxyBody> {
    run.record.failed(&target.host.to_string(), target.port);
    text(
        StatusCode::BAD_GATEWAY,
        "http_response_incomplete",
        format!("{NAME} proxy: {target} failed: {why}"),
    )
}

/// Removes the headers that belong to one hop (RFC 9110, 7.6.1), including
/// those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("proxy-connection"),
        HeaderName::from_static("keep-alive"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

/// A plain-text response from the proxy itself.
fn text(status: StatusCode, proxy_error: &str, body: String) -> Response<ProxyBody> {
    let body = if body.ends_with('\n') {
        body
    } else {
        body + "\n"
    };
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("{NAME}; error={proxy_error}")) {
        headers.insert("proxy-status", v);
    }
    response
}
