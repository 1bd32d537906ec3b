//! A CONNECT to a host with credentials or request rules: the proxy ends
//! the sandbox's TLS with a certificate of its own authority for exactly
//! that host, serves HTTP/1.1 or HTTP/2 (by ALPN) on it, decides each
//! request, adds the host's credentials, and sends the request on its own
//! TLS connection to the host, verified against the trusted roots with the
//! host's name.
//!
//! Credentials never cross hosts: a request must name the CONNECT host
//! (`Host`, `:authority`, an absolute URI; 421 otherwise), the TLS name
//! the sandbox asks for must be that host, and the upstream connection is
//! only ever to that host. Redirects are passed back, never followed: one
//! to another host is a new CONNECT, which carries that host's credentials
//! or none. Responses go back with the credentials' exact values replaced
//! by asterisks (headers, and bodies that are not compressed), so that an
//! endpoint that echoes the request does not hand the value over; so do a
//! WebSocket's messages (`websocket.rs`).

use hyper::client::conn::{http1 as client1, http2 as client2};
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use tokio::sync::Mutex;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use super::websocket;
use super::*;
use crate::network::ca::Authority;
use crate::network::credentials::RequestRefusal;

/// HTTP/2 frames a peer may send the proxy, and what the proxy buffers
/// per stream before a peer reads: larger than the protocol's defaults
/// (16 KiB and 400 KiB) so that large bodies move in few frames.
const H2_MAX_FRAME: u32 = 256 * 1024;
const H2_STREAM_WINDOW: u32 = 4 * 1024 * 1024;
const H2_CONNECTION_WINDOW: u32 = 8 * 1024 * 1024;
const H2_SEND_BUFFER: usize = 1024 * 1024;

/// What the proxy intercepts with: its authority, and TLS to the hosts.
pub struct Interceptor {
    authority: Authority,
    /// TLS to hosts, offering HTTP/2 (for a sandbox that speaks it) or
    /// only HTTP/1.1: each side of the proxy speaks what the sandbox chose.
    upstream_h2: TlsConnector,
    upstream_h1: TlsConnector,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl Interceptor {
    pub fn new(authority: Authority) -> Interceptor {
        let connector =
            |alpn: &[&[u8]]| TlsConnector::from(Arc::new(crate::trust::client_config(alpn)));
        Interceptor {
            authority,
            upstream_h2: connector(&[b"h2", b"http/1.1"]),
            upstream_h1: connector(&[b"http/1.1"]),
        }
    }

    /// What a sandbox trusts (the system's roots and the authority), as PEM.
    pub fn bundle_pem(&self) -> String {
        self.authority.bundle_pem()
    }
}

/// Whether an authority (`host[:port]`) names `name` on `port`.
fn names(authority: &str, name: &str, port: u16) -> bool {
    let (host, given) = match authority.rsplit_once(':') {
        Some((h, p)) => match p.parse::<u16>() {
            Ok(p) => (h, Some(p)),
            Err(_) => return false,
        },
        None => (authority, None),
    };
    given.is_none_or(|p| p == port) && matches!(Host::parse(host), Ok(Host::Name(n)) if n == name)
}

/// Serves the sandbox's side of an intercepted CONNECT until it closes.
pub(super) async fn serve(
    client: hyper::upgrade::Upgraded,
    upstream: TcpStream,
    target: Target,
    run: Arc<Run>,
    slot: Arc<OwnedSemaphorePermit>,
) {
    let Some(interceptor) = run.interceptor.clone() else {
        return;
    };
    let Host::Name(name) = target.host.clone() else {
        return;
    };
    let config = match interceptor.authority.server_config(&name) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("proxy: no certificate for {name}: {e}");
            return;
        }
    };
    let deadline = Instant::now() + run.policy.bounds.header_timeout;
    let acceptor = LazyConfigAcceptor::new(Default::default(), TokioIo::new(client));
    let start = match tokio::time::timeout_at(deadline, acceptor).await {
        Ok(Ok(start)) => start,
        _ => return,
    };
    // The sandbox's TLS must ask for the host it CONNECTed to (or none).
    if let Some(sni) = start.client_hello().server_name()
        && !matches!(Host::parse(sni), Ok(Host::Name(n)) if n == name)
    {
        let denial = refused(
            &target,
            "CONNECT",
            "",
            RequestRefusal::OtherName(sni.into()),
        );
        run.record.denied(&denial, target.port);
        return;
    }
    let tls = match tokio::time::timeout_at(deadline, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!("proxy: TLS with the sandbox for {name}: {e}");
            return;
        }
        Err(_) => return,
    };
    let sandbox_h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let header_timeout = run.policy.bounds.header_timeout;
    let upstream = Arc::new(Upstream {
        tls: if sandbox_h2 {
            interceptor.upstream_h2.clone()
        } else {
            interceptor.upstream_h1.clone()
        },
        authority: if target.port == 443 {
            name.clone()
        } else {
            format!("{name}:{}", target.port)
        },
        name: name.clone(),
        flow: Flow::new(&run, &target),
        target,
        first: std::sync::Mutex::new(Some(upstream)),
        sender: Mutex::new(None),
        run,
        _slot: slot,
    });
    let service = service_fn(move |req| {
        let upstream = upstream.clone();
        async move { Ok::<_, Infallible>(request(req, &upstream).await) }
    });
    let mut server = auto::Builder::new(TokioExecutor::new());
    server
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .max_headers(MAX_HEADERS);
    server
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        .max_concurrent_streams(64)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_frame_size(H2_MAX_FRAME)
        .max_send_buf_size(H2_SEND_BUFFER);
    let served = server
        .serve_connection_with_upgrades(TokioIo::new(tls), service)
        .await;
    if let Err(e) = served {
        tracing::debug!("proxy: intercepted connection to {name}: {e}");
    }
}

/// A refused request, as the record and the 403 name it.
fn refused(target: &Target, method: &str, path: &str, refusal: RequestRefusal) -> Denial {
    Denial::Request {
        host: target.host.clone(),
        method: method.to_string(),
        path: path.to_string(),
        refusal,
    }
}

async fn request(mut req: Request<Incoming>, upstream: &Arc<Upstream>) -> Response<ProxyBody> {
    let (run, target) = (&upstream.run, &upstream.target);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let recorded_path = recorded(&path);
    let deny = |refusal| {
        let denial = refused(target, method.as_str(), &recorded_path, refusal);
        Refusal::Denied(denial).respond(run, target)
    };
    // Every name the request gives must be the CONNECT host's.
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    let host_header = req
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect::<Vec<_>>();
    let scheme_ok = matches!(req.uri().scheme_str(), None | Some("https"));
    if let Some(other) = authority
        .iter()
        .chain(&host_header)
        .find(|a| !names(a, &upstream.name, target.port))
        .cloned()
        .or_else(|| (!scheme_ok).then(|| req.uri().to_string()))
    {
        let mut response = deny(RequestRefusal::OtherHost(other));
        *response.status_mut() = StatusCode::MISDIRECTED_REQUEST;
        return response;
    }
    if method == Method::CONNECT {
        return deny(RequestRefusal::Tunnel);
    }
    // Over HTTP/1.1 only: HTTP/2 refuses a request with an Upgrade header,
    // and the proxy does not offer its extended CONNECT (RFC 8441).
    let websocket = opens_websocket(req.headers());
    let sandbox_side = websocket.then(|| hyper::upgrade::on(&mut req));
    let credentials = match run
        .policy
        .interception
        .decide(&upstream.name, &method, &path)
    {
        Ok(c) => c,
        Err(refusal) => return deny(refusal),
    };
    let (mut parts, body) = req.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    let mut secrets = Vec::new();
    for credential in credentials {
        match credential.header() {
            Ok((header, value)) => {
                secrets.push(value.as_bytes().to_vec());
                parts.headers.insert(header, value);
            }
            Err(why) => {
                tracing::warn!("proxy: {why}");
                return text(
                    StatusCode::BAD_GATEWAY,
                    "proxy_internal_error",
                    format!(
                        "{NAME} proxy: the credential for {} cannot be read now; the request \
                         was not sent (the server's log says why)",
                        credential.host()
                    ),
                );
            }
        }
    }
    if websocket {
        let compression = websocket::Compression::starring(&secrets);
        websocket::ask_host(&mut parts.headers, compression);
    }
    let version = parts.version;
    let body = Metered::new(body, upstream.flow.clone(), Direction::Sent, run.clone()).boxed();
    let response = match upstream.send(parts, body).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    if let Some(sandbox_side) = sandbox_side
        && response.status() == StatusCode::SWITCHING_PROTOCOLS
    {
        let flow = upstream.flow.clone();
        return websocket::switch(
            response,
            sandbox_side,
            secrets,
            flow,
            run.clone(),
            upstream.clone(),
        );
    }
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.version = version;
    let body = Metered::new(
        body,
        upstream.flow.clone(),
        Direction::Received,
        run.clone(),
    );
    redact_headers(&mut parts.headers, &secrets);
    let encoded = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    let body = if secrets.is_empty() || encoded {
        body.boxed()
    } else {
        Redacted::body(body, secrets).boxed()
    };
    let body = if version == hyper::Version::HTTP_2 {
        RecordSized::body(body).boxed()
    } else {
        body
    };
    Response::from_parts(parts, body)
}

/// The proxy's connection to the host, made again when the host closes it.
struct Upstream {
    tls: TlsConnector,
    name: String,
    target: Target,
    /// `name[:port]`, as `Host` and `:authority` give it to the host.
    authority: String,
    /// The bytes of this CONNECT's requests and responses.
    flow: Arc<Flow>,
    /// The connection opened (and checked) before the CONNECT was answered.
    first: std::sync::Mutex<Option<TcpStream>>,
    sender: Mutex<Option<Sender>>,
    run: Arc<Run>,
    /// The CONNECT's connection slot: held while the sandbox's connection,
    /// or a WebSocket it became, is open.
    _slot: Arc<OwnedSemaphorePermit>,
}

enum Sender {
    Http1(client1::SendRequest<ProxyBody>),
    Http2(client2::SendRequest<ProxyBody>),
}

impl Upstream {
    /// Sends a request (its head without `Host`) to the host.
    async fn send(
        &self,
        mut parts: hyper::http::request::Parts,
        body: ProxyBody,
    ) -> Result<Response<Incoming>, Response<ProxyBody>> {
        let mut guard = self.sender.lock().await;
        let usable = match guard.as_mut() {
            Some(Sender::Http1(s)) => s.ready().await.is_ok(),
            Some(Sender::Http2(s)) => s.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            *guard = Some(self.connect().await?);
        }
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".to_string());
        let Some(sender) = guard.as_mut() else {
            return Err(self.failed("no connection to the host".to_string()));
        };
        let invalid = |_| self.failed("the request's path is not valid".to_string());
        match sender {
            Sender::Http2(s) => {
                // Streams share the connection: the lock is not held.
                let mut s = s.clone();
                drop(guard);
                parts.version = hyper::Version::HTTP_2;
                parts.uri = format!("https://{}{path}", self.authority)
                    .parse()
                    .map_err(invalid)?;
                self.timed(s.send_request(Request::from_parts(parts, body)))
                    .await
            }
            Sender::Http1(s) => {
                parts.version = hyper::Version::HTTP_11;
                parts.uri = path.parse().map_err(invalid)?;
                if let Ok(v) = HeaderValue::from_str(&self.authority) {
                    parts.headers.insert(header::HOST, v);
                }
                // The connection is the lock: the next request waits for
                // this one's response (`ready` above).
                self.timed(s.send_request(Request::from_parts(parts, body)))
                    .await
            }
        }
    }

    async fn timed(
        &self,
        pending: impl Future<Output = hyper::Result<Response<Incoming>>>,
    ) -> Result<Response<Incoming>, Response<ProxyBody>> {
        let idle = self.run.policy.bounds.idle_timeout;
        match tokio::time::timeout(idle, pending).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.failed(e.to_string())),
            Err(_) => Err(text(
                StatusCode::GATEWAY_TIMEOUT,
                "connection_read_timeout",
                format!(
                    "{NAME} proxy: {} sent no response within {}s",
                    self.target,
                    idle.as_secs()
                ),
            )),
        }
    }

    fn failed(&self, why: String) -> Response<ProxyBody> {
        upstream_failed(&self.run, &self.target, why)
    }

    /// A TLS connection to the host (the first one opened already), and
    /// an HTTP/2 or HTTP/1.1 client on it by what the host chose.
    async fn connect(&self) -> Result<Sender, Response<ProxyBody>> {
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let tcp = match first {
            Some(tcp) => tcp,
            None => open(&self.run, &self.target)
                .await
                .map_err(|refusal| refusal.respond(&self.run, &self.target))?,
        };
        let server_name = ServerName::try_from(self.name.clone())
            .map_err(|e| self.failed(format!("not a TLS name: {e}")))?;
        let deadline = self.run.policy.bounds.connect_timeout;
        let tls = match tokio::time::timeout(deadline, self.tls.connect(server_name, tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                self.run.record.failed(&self.name, self.target.port);
                return Err(text(
                    StatusCode::BAD_GATEWAY,
                    "tls_certificate_error",
                    format!(
                        "{NAME} proxy: {} could not be verified, so nothing was sent to it: {e}. \
                         The proxy checks the host's certificate against the system's trusted \
                         authorities and the name {}.",
                        self.target, self.name
                    ),
                ));
            }
            Err(_) => return Err(Refusal::Timeout.respond(&self.run, &self.target)),
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        if h2 {
            let (sender, connection) = client2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(MAX_HEAD_BYTES as u32)
                .initial_stream_window_size(H2_STREAM_WINDOW)
                .initial_connection_window_size(H2_CONNECTION_WINDOW)
                .max_frame_size(H2_MAX_FRAME)
                .max_send_buf_size(H2_SEND_BUFFER)
                .handshake::<_, ProxyBody>(io)
                .await
                .map_err(|e| self.failed(e.to_string()))?;
            self.run.drive(connection);
            Ok(Sender::Http2(sender))
        } else {
            let (sender, connection) = client1::Builder::new()
                .max_buf_size(MAX_HEAD_BYTES)
                .max_headers(MAX_HEADERS)
                .handshake::<_, ProxyBody>(io)
                .await
                .map_err(|e| self.failed(e.to_string()))?;
            // A WebSocket's handshake takes the connection over.
            self.run.drive(connection.with_upgrades());
            Ok(Sender::Http1(sender))
        }
    }
}

/// Replaces each secret's bytes in header values by asterisks.
/// Only a value holding one is copied: this runs on every response.
pub(super) fn redact_headers(headers: &mut HeaderMap, secrets: &[Vec<u8>]) {
    for value in headers.values_mut() {
        if !holds_secret(value.as_bytes(), secrets) {
            continue;
        }
        let mut bytes = value.as_bytes().to_vec();
        redact(&mut bytes, secrets);
        if let Ok(v) = HeaderValue::from_bytes(&bytes) {
            *value = v;
        }
    }
}

/// Whether `bytes` hold any whole secret.
pub(super) fn holds_secret(bytes: &[u8], secrets: &[Vec<u8>]) -> bool {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .any(|s| memchr::memmem::find(bytes, s).is_some())
}

/// Replaces every occurrence of each secret in `bytes` by as many
/// asterisks (callers that need to know whether there is one ask
/// [`holds_secret`] first).
pub(super) fn redact(bytes: &mut [u8], secrets: &[Vec<u8>]) {
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        let finder = memchr::memmem::Finder::new(secret);
        let mut from = 0;
        while let Some(at) = finder.find(&bytes[from..]) {
            let start = from + at;
            bytes[start..start + secret.len()].fill(b'*');
            from = start + secret.len();
        }
    }
}

/// The length of the longest end of `bytes` that is the start of a secret
/// (and not a whole one): what must wait for the next frame.
pub(super) fn partial_secret_at_end(bytes: &[u8], secrets: &[Vec<u8>]) -> usize {
    secrets
        .iter()
        .filter_map(|secret| {
            (1..secret.len().min(bytes.len() + 1))
                .rev()
                .find(|&n| bytes.ends_with(&secret[..n]))
        })
        .max()
        .unwrap_or(0)
}

/// A body whose data is rewritten on its way: what the rewriting has
/// ready goes first, trailers (rewritten too) after all of it.
struct Rewritten<B, R> {
    inner: B,
    rewrite: R,
    trailers: Option<HeaderMap>,
    ended: bool,
}

/// What follows what a [`Rewrite`] has taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Maybe more data, at once.
    More,
    /// Nothing ready: the body waits for its source.
    Waiting,
    /// Nothing: the body has ended.
    End,
}

/// How a [`Rewritten`] body's data changes.
trait Rewrite {
    /// Takes the next frame's data.
    fn take(&mut self, data: Bytes);
    /// What can go now, given what comes after it.
    fn ready(&mut self, next: Next) -> Option<Bytes>;
    /// Whether nothing taken is still to go.
    fn drained(&self) -> bool;
    fn trailers(&self, _trailers: &mut HeaderMap) {}
}

impl<B, R> Rewritten<B, R> {
    fn new(inner: B, rewrite: R) -> Rewritten<B, R> {
        Rewritten {
            inner,
            rewrite,
            trailers: None,
            ended: false,
        }
    }
}

impl<B, R> Body for Rewritten<B, R>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
    R: Rewrite + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let next = if this.ended { Next::End } else { Next::More };
            if let Some(data) = this.rewrite.ready(next) {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if this.ended {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => this.rewrite.take(data),
                    // Trailers end the body: what is held goes first.
                    Err(frame) => {
                        if let Ok(mut trailers) = frame.into_trailers() {
                            this.rewrite.trailers(&mut trailers);
                            this.trailers = Some(trailers);
                        }
                        this.ended = true;
                    }
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => this.ended = true,
                Poll::Pending => {
                    return match this.rewrite.ready(Next::Waiting) {
                        Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.trailers.is_none() && self.rewrite.drained()
    }
}

/// A response body's secrets replaced by asterisks, also where a secret
/// spans two frames: an end of a frame that could begin a secret waits
/// for the next one (or the body's end). A frame without any passes as it
/// is, uncopied.
struct Redacted {
    secrets: Vec<Vec<u8>>,
    held: Vec<u8>,
    out: Option<Bytes>,
}

impl Redacted {
    fn body<B>(inner: B, secrets: Vec<Vec<u8>>) -> Rewritten<B, Redacted> {
        let redacted = Redacted {
            secrets,
            held: Vec::new(),
            out: None,
        };
        Rewritten::new(inner, redacted)
    }
}

impl Rewrite for Redacted {
    fn take(&mut self, data: Bytes) {
        let clean = self.held.is_empty() && !holds_secret(&data, &self.secrets);
        let out = if clean {
            let keep = partial_secret_at_end(&data, &self.secrets);
            self.held.extend_from_slice(&data[data.len() - keep..]);
            data.slice(..data.len() - keep)
        } else {
            let mut buf = bytes::BytesMut::with_capacity(self.held.len() + data.len());
            buf.extend_from_slice(&self.held);
            buf.extend_from_slice(&data);
            redact(&mut buf, &self.secrets);
            let keep = partial_secret_at_end(&buf, &self.secrets);
            let out = buf.split_to(buf.len() - keep).freeze();
            self.held.clear();
            self.held.extend_from_slice(&buf);
            out
        };
        self.out = (!out.is_empty()).then_some(out);
    }

    fn ready(&mut self, next: Next) -> Option<Bytes> {
        match self.out.take() {
            Some(out) => Some(out),
            // At the end, what is held is no whole secret: it goes as it is.
            None if next == Next::End && !self.held.is_empty() => {
                Some(Bytes::from(std::mem::take(&mut self.held)))
            }
            None => None,
        }
    }

    fn drained(&self) -> bool {
        self.out.is_none() && self.held.is_empty()
    }

    fn trailers(&self, trailers: &mut HeaderMap) {
        redact_headers(trailers, &self.secrets);
    }
}

/// The most of a body that one HTTP/2 DATA frame carries so that the
/// frame (a 9-byte header and the data) fills one TLS record exactly.
const H2_RECORD_DATA: usize = 16 * 1024 - 9;

/// A body re-cut into pieces of `H2_RECORD_DATA` bytes, each sent as one
/// HTTP/2 frame in one TLS record. The host's frames come as they were cut
/// (16 KiB and its frame header): sent as they are, each would take a full
/// record and a 9-byte one, and the sandbox's TLS reads twice as many
/// records. What the body has ready is joined up to the size; a shorter
/// piece goes when nothing more is ready, so nothing waits for data.
struct RecordSized {
    buf: bytes::BytesMut,
}

impl RecordSized {
    fn body<B>(inner: B) -> Rewritten<B, RecordSized> {
        let sized = RecordSized {
            buf: bytes::BytesMut::new(),
        };
        Rewritten::new(inner, sized)
    }
}

impl Rewrite for RecordSized {
    fn take(&mut self, data: Bytes) {
        if self.buf.capacity() - self.buf.len() < data.len() {
            self.buf.reserve(data.len().max(4 * H2_RECORD_DATA));
        }
        self.buf.extend_from_slice(&data);
    }

    fn ready(&mut self, next: Next) -> Option<Bytes> {
        if self.buf.len() >= H2_RECORD_DATA {
            return Some(self.buf.split_to(H2_RECORD_DATA).freeze());
        }
        (next != Next::More && !self.buf.is_empty()).then(|| self.buf.split().freeze())
    }

    fn drained(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn secrets_are_starred_also_across_frames() {
        let secrets = vec![b"s3cr3t-token".to_vec()];
        let mut one = b"a s3cr3t-token b s3cr3t-token".to_vec();
        assert!(holds_secret(&one, &secrets));
        redact(&mut one, &secrets);
        assert_eq!(one, b"a ************ b ************".to_vec());

        let frames = ["xx s3cr", "3t-to", "ken yy s3", "cr"];
        let body = http_body_util::StreamBody::new(futures::stream::iter(
            frames
                .iter()
                .map(|f| Ok::<_, BoxError>(Frame::data(Bytes::from_static(f.as_bytes())))),
        ));
        let redacted = Redacted::body(body, secrets);
        let out = futures::executor::block_on(redacted.collect())
            .unwrap()
            .to_bytes();
        assert_eq!(
            &out[..],
            b"xx ************ yy s3cr",
            "an unfinished start goes at the end"
        );
    }

    #[test]
    fn http2_pieces_fill_records_and_nothing_waits() {
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, BoxError>>();
        let mut body = RecordSized::body(http_body_util::StreamBody::new(rx));
        let mut next = || {
            body.frame()
                .now_or_never()
                .map(|f| f.map(|f| f.unwrap().into_data().map(|d| d.len()).unwrap_or(0)))
        };
        // What is ready goes at once, even short of a record.
        tx.unbounded_send(Ok(Frame::data(Bytes::from(vec![1; 100]))))
            .unwrap();
        assert_eq!(next(), Some(Some(100)));
        assert_eq!(next(), None, "nothing ready: the body waits");
        // 16 KiB frames come out a record's worth each.
        for _ in 0..3 {
            tx.unbounded_send(Ok(Frame::data(Bytes::from(vec![2; 16 * 1024]))))
                .unwrap();
        }
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        tx.unbounded_send(Ok(Frame::trailers(trailers))).unwrap();
        drop(tx);
        let sizes: Vec<_> = std::iter::from_fn(|| next().flatten()).collect();
        assert_eq!(
            sizes,
            [H2_RECORD_DATA, H2_RECORD_DATA, H2_RECORD_DATA, 27, 0]
        );
        assert!(body.is_end_stream());
    }

    #[test]
    fn a_request_must_name_the_connect_host() {
        let name = "api.example.com";
        for ok in ["api.example.com", "API.example.com.", "api.example.com:443"] {
            assert!(names(ok, name, 443), "{ok}");
        }
        for bad in [
            "evil.example",
            "api.example.com:8443",
            "api.example.com.evil.example",
            "api.example.com@evil.example",
            "",
        ] {
            assert!(!names(bad, name, 443), "{bad}");
        }
    }
}
