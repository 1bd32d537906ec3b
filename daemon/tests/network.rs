//! The allowlist proxy against servers on this machine: what passes, what
//! is refused and how the refusal reads, the rebinding defence, tunnels
//! and plain HTTP, and the bounds; then real bubblewrap jails whose only
//! way out is the proxy's listener in their network namespace, used by
//! real tools (Python's urllib, curl, pip, npm) and bypassed by code that
//! ignores the proxy, which must fail. The proxy's resolver maps test
//! names to loopback (or this machine's own address); nothing leaves the
//! machine.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use nix_sandbox_mcp::network::{Bounds, NetworkLimit, Policy, Proxy, Resolver, RunRecord, Serving};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::skip::skip;

/// A plain HTTP server on loopback that answers with what it saw.
struct Upstream {
    port: u16,
    hits: Arc<AtomicUsize>,
}

async fn upstream() -> Upstream {
    upstream_with(Vec::new()).await
}

/// Extra paths the upstream serves: (path, content type, body).
type Files = Vec<(String, &'static str, Vec<u8>)>;

async fn upstream_with(files: Files) -> Upstream {
    let files = Arc::new(files);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (counter, files) = (counter.clone(), files.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let files = files.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(req, &files).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Upstream { port, hits }
}

async fn answer(req: Request<Incoming>, files: &Files) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    if let Some((_, content_type, body)) = files.iter().find(|(p, _, _)| *p == path) {
        let mut r = Response::new(Full::new(Bytes::from(body.clone())));
        r.headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        return r;
    }
    let mut seen = format!("uri={}\n", req.uri());
    for (name, value) in req.headers() {
        seen.push_str(&format!("{name}={}\n", value.to_str().unwrap_or("?")));
    }
    let body = match path.as_str() {
        "/big" => vec![b'x'; 4 << 20],
        "/silent" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Vec::new()
        }
        "/echo" => req.into_body().collect().await.unwrap().to_bytes().to_vec(),
        _ => format!("hello from upstream\n{seen}").into_bytes(),
    };
    Response::new(Full::new(Bytes::from(body)))
}

/// A TCP echo server on loopback, the far end of CONNECT tunnels.
async fn echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

struct Running {
    addr: SocketAddr,
    record: RunRecord,
    serving: Serving,
}

fn resolver(names: &[(&str, &str)]) -> Resolver {
    Resolver::with_fixed(
        names
            .iter()
            .map(|(n, a)| (n.to_string(), a.parse::<IpAddr>().unwrap())),
    )
}

fn start(entries: &[&str], bounds: Bounds, names: &[(&str, &str)]) -> Running {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let policy = Arc::new(Policy::from_entries(entries, bounds).unwrap());
    let record = RunRecord::new();
    let serving = Proxy::new(resolver(names), None)
        .serve(listener, policy, record.clone())
        .unwrap();
    Running {
        addr,
        record,
        serving,
    }
}

/// The usual test names: all on loopback, which the policy must name.
const NAMES: &[(&str, &str)] = &[
    ("allowed.test", "127.0.0.1"),
    ("a.wild.test", "127.0.0.1"),
    ("deep.a.wild.test", "127.0.0.1"),
    ("wild.test", "127.0.0.1"),
    ("badwild.test", "127.0.0.1"),
    ("denied.test", "127.0.0.1"),
    ("echo.test", "127.0.0.1"),
];

fn standard() -> Running {
    start(
        &["allowed.test", "*.wild.test", "echo.test", "127.0.0.0/8"],
        Bounds::default(),
        NAMES,
    )
}

#[derive(Debug)]
struct Reply {
    status: StatusCode,
    proxy_status: String,
    body: String,
}

/// Sends one request through the proxy on a new connection.
async fn send(proxy: SocketAddr, req: Request<Full<Bytes>>) -> Reply {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let response = sender.send_request(req).await.unwrap();
    let status = response.status();
    let proxy_status = response
        .headers()
        .get("proxy-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = match response.into_body().collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(e) => format!("<body failed: {e}>"),
    };
    Reply {
        status,
        proxy_status,
        body,
    }
}

async fn get(proxy: SocketAddr, url: &str) -> Reply {
    send(
        proxy,
        Request::get(url).body(Full::new(Bytes::new())).unwrap(),
    )
    .await
}

/// GETs `url` until it is served (a slot freed a moment ago may still be
/// held while the proxy notices its connection closed), for 5 s at most;
/// the last reply.
async fn get_once_served(proxy: SocketAddr, url: &str) -> Reply {
    let mut r = get(proxy, url).await;
    for _ in 0..50 {
        if r.status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = get(proxy, url).await;
    }
    r
}

/// Opens a CONNECT tunnel; the error is the refusal.
async fn tunnel(
    proxy: SocketAddr,
    target: &str,
) -> Result<TokioIo<hyper::upgrade::Upgraded>, Reply> {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri(target)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    if response.status() != StatusCode::OK {
        let status = response.status();
        let proxy_status = response
            .headers()
            .get("proxy-status")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        return Err(Reply {
            status,
            proxy_status,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    Ok(TokioIo::new(hyper::upgrade::on(response).await.unwrap()))
}

#[tokio::test]
async fn an_allowed_name_reaches_its_server_by_plain_http() {
    let up = upstream().await;
    let p = standard();
    let url = format!("http://Allowed.TEST.:{}/hello?x=1", up.port);
    let req = Request::get(&url)
        .header("proxy-authorization", "Basic c2VjcmV0")
        .header("connection", "x-private")
        .header("x-private", "1")
        .header("host", "evil.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = send(p.addr, req).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.starts_with("hello from upstream\n"), "{}", r.body);
    // Origin form upstream, Host from the URL, one-hop headers removed.
    assert!(r.body.contains("uri=/hello?x=1\n"), "{}", r.body);
    assert!(
        r.body.contains(&format!("host=allowed.test:{}\n", up.port)),
        "{}",
        r.body
    );
    for gone in ["proxy-authorization", "x-private", "evil.test"] {
        assert!(!r.body.contains(gone), "{gone} forwarded: {}", r.body);
    }
    drop(p.serving);
    let report = p.record.report();
    assert_eq!(report.allowed.len(), 1, "{report:?}");
    let h = &report.allowed[0];
    assert_eq!(
        (h.host.as_str(), h.port, h.connections),
        ("allowed.test", up.port, 1)
    );
    assert!(h.bytes_received > 0, "{report:?}");
    assert!(report.denied.is_empty());
}

#[tokio::test]
async fn a_name_not_on_the_list_gets_a_403_that_names_it() {
    let up = upstream().await;
    let p = standard();
    let r = get(p.addr, &format!("http://denied.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        r.body
            .contains(&format!("access to denied.test:{} denied", up.port)),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("denied.test is not on this environment's network allowlist (allowed: allowed.test, *.wild.test, echo.test, 127.0.0.0/8)"),
        "{}",
        r.body
    );
    assert!(r.body.contains("add \"denied.test\""), "{}", r.body);
    assert!(
        r.proxy_status.contains("error=http_request_denied"),
        "{}",
        r.proxy_status
    );
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
    let report = p.record.report();
    assert_eq!(report.denied_subjects(), vec!["denied.test".to_string()]);
    assert_eq!(report.denied[0].rule, "not-on-allowlist");
    assert!(report.allowed.is_empty());
}

#[tokio::test]
async fn wildcards_reach_subdomains_only() {
    let up = upstream().await;
    let p = standard();
    for (host, status) in [
        ("a.wild.test", StatusCode::OK),
        ("deep.a.wild.test", StatusCode::OK),
        ("wild.test", StatusCode::FORBIDDEN),
        ("badwild.test", StatusCode::FORBIDDEN),
    ] {
        let r = get(p.addr, &format!("http://{host}:{}/", up.port)).await;
        assert_eq!(r.status, status, "{host}: {}", r.body);
    }
    assert_eq!(
        p.record.report().denied_subjects(),
        vec!["badwild.test".to_string(), "wild.test".to_string()]
    );
}

#[tokio::test]
async fn a_listed_name_that_resolves_to_loopback_is_refused() {
    let up = upstream().await;
    // The same name and address as the passing tests, without 127.0.0.0/8.
    let p = start(&["allowed.test", "echo.test"], Bounds::default(), NAMES);
    let r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        r.body
            .contains("allowed.test resolves to 127.0.0.1, a loopback address (127.0.0.0/8)"),
        "{}",
        r.body
    );
    assert!(r.body.contains("add \"127.0.0.0/8\""), "{}", r.body);
    assert!(
        r.proxy_status.contains("error=destination_ip_prohibited"),
        "{}",
        r.proxy_status
    );
    let Err(refused) = tunnel(p.addr, "echo.test:443").await else {
        panic!("the tunnel was opened");
    };
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
    let report = p.record.report();
    assert_eq!(report.denied.len(), 2);
    assert!(report.denied.iter().all(|d| d.rule == "refused-address"));
    // `network = true` refuses it too.
    let open = Policy::any_public();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let _serving = Proxy::new(resolver(NAMES), None)
        .serve(listener, Arc::new(open), RunRecord::new())
        .unwrap();
    let r = get(addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = get(addr, &format!("http://127.0.0.1:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
}

/// This machine's own IPv4 address on its network, if it has one.
fn own_address() -> Option<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

#[tokio::test]
async fn a_listed_name_that_resolves_to_this_machines_lan_address_is_refused() {
    let Some(own) = own_address() else {
        skip(
            "a_listed_name_that_resolves_to_this_machines_lan_address_is_refused",
            "this machine has no global IPv4 address",
        );
        return;
    };
    if nix_sandbox_mcp::network::refused_range(own).is_none() {
        skip(
            "a_listed_name_that_resolves_to_this_machines_lan_address_is_refused",
            &format!("this machine's address {own} is public"),
        );
        return;
    }
    let own = own.to_string();
    let p = start(&["lan.test"], Bounds::default(), &[("lan.test", &own)]);
    let r = get(p.addr, "http://lan.test:9/").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert!(
        r.body.contains(&format!("lan.test resolves to {own}")),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn ip_literals_pass_only_when_listed() {
    let up = upstream().await;
    let p = start(&["allowed.test"], Bounds::default(), NAMES);
    let r = get(p.addr, &format!("http://127.0.0.1:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.contains("127.0.0.1 is an IP address"), "{}", r.body);
    let p = start(&["127.0.0.1"], Bounds::default(), NAMES);
    let r = get(p.addr, &format!("http://127.0.0.1:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let r = get(p.addr, &format!("http://127.0.0.2:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
}

#[tokio::test]
async fn connect_tunnels_bytes_both_ways_and_counts_them() {
    let port = echo().await;
    let p = standard();
    let mut t = tunnel(p.addr, &format!("echo.test:{port}")).await.unwrap();
    let mut buf = [0u8; 4];
    for _ in 0..3 {
        t.write_all(b"ping").await.unwrap();
        t.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }
    drop(t);
    let Err(refused) = tunnel(p.addr, &format!("denied.test:{port}")).await else {
        panic!("the tunnel was opened");
    };
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body.contains("denied.test"), "{}", refused.body);
    // The tunnel's bytes are recorded when it closes.
    let mut report = p.record.report();
    for _ in 0..50 {
        if report.bytes_sent == 12 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        report = p.record.report();
    }
    assert_eq!(
        (report.bytes_sent, report.bytes_received),
        (12, 12),
        "{report:?}"
    );
    assert_eq!(report.allowed[0].host, "echo.test");
    assert_eq!(report.denied_subjects(), vec!["denied.test".to_string()]);
}

#[tokio::test]
async fn requests_that_are_not_proxy_requests_get_a_400_saying_how() {
    let p = standard();
    let r = get(p.addr, "/hello").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("absolute form"), "{}", r.body);
    let r = get(p.addr, "https://allowed.test/").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.body.contains("CONNECT"), "{}", r.body);
    let Err(r) = tunnel(p.addr, "allowed.test").await else {
        panic!("the tunnel was opened");
    };
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = get(p.addr, "http://127.1/").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body.contains("numeric address"), "{}", r.body);
}

/// A WebSocket host on loopback: it answers any handshake with a 101 and
/// then echoes bytes; each handshake's head goes to the channel.
async fn websocket_echo() -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (heads, seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let heads = heads.clone();
            tokio::spawn(async move {
                let Some(head) = read_head(&mut stream).await else {
                    return;
                };
                let _ = heads.send(head);
                let switched = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                                Connection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n";
                if stream.write_all(switched.as_bytes()).await.is_ok() {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                }
            });
        }
    });
    (port, seen)
}

/// Reads a head up to its blank line, byte by byte (nothing after it).
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Opens a WebSocket to `url` through the proxy as plain HTTP; the answer's head.
async fn open_websocket(proxy: SocketAddr, url: &str, host: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    let handshake = format!(
        "GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n"
    );
    stream.write_all(handshake.as_bytes()).await.unwrap();
    let head = read_head(&mut stream).await.unwrap();
    (stream, head)
}

#[tokio::test]
async fn a_websocket_as_plain_http_is_joined_to_its_host_and_keeps_its_slot() {
    let (port, mut seen) = websocket_echo().await;
    let up = upstream().await;
    let bounds = Bounds {
        max_connections: 1,
        ..Bounds::default()
    };
    let p = start(&["allowed.test", "127.0.0.0/8"], bounds, NAMES);
    let host = format!("allowed.test:{port}");
    let (mut socket, head) = open_websocket(p.addr, &format!("http://{host}/socket"), &host).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let asked = seen.recv().await.unwrap().to_ascii_lowercase();
    assert!(asked.starts_with("get /socket http/1.1"), "{asked}");
    for line in [
        "upgrade: websocket",
        "connection: upgrade",
        "sec-websocket-version: 13",
        // No credential to star here: compression stays the sandbox's choice.
        "sec-websocket-extensions: permessage-deflate",
    ] {
        assert!(asked.contains(line), "{line} missing: {asked}");
    }
    // Bytes both ways, after the switch.
    socket.write_all(b"frames both ways").await.unwrap();
    let mut echoed = [0u8; 16];
    socket.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"frames both ways");
    // The WebSocket holds the run's one connection.
    let r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    drop(socket);
    let r = get_once_served(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let report = p.record.report();
    let ws = report.allowed.iter().find(|h| h.port == port).unwrap();
    assert!(ws.bytes_sent >= 16 && ws.bytes_received >= 16, "{report:?}");
}

#[tokio::test]
async fn an_upgrade_a_host_may_decline_is_dropped() {
    let up = upstream().await;
    let p = standard();
    let req = Request::get(format!("http://allowed.test:{}/plain", up.port))
        .header("connection", "Upgrade, HTTP2-Settings")
        .header("upgrade", "h2c")
        .header("http2-settings", "AAMAAABkAAQAAP__")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = send(p.addr, req).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    for gone in ["upgrade=", "http2-settings="] {
        assert!(!r.body.contains(gone), "{gone} forwarded: {}", r.body);
    }
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_naming_it() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = standard();
    let r = get(p.addr, &format!("http://allowed.test:{closed}/")).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert!(
        r.body
            .contains(&format!("cannot connect to allowed.test:{closed}")),
        "{}",
        r.body
    );
    assert_eq!(p.record.report().allowed[0].failures, 1);
}

#[tokio::test]
async fn connections_beyond_the_bound_are_turned_away_with_a_429() {
    let up = upstream().await;
    let port = echo().await;
    let bounds = Bounds {
        max_connections: 2,
        ..Bounds::default()
    };
    let p = start(&["echo.test", "allowed.test", "127.0.0.0/8"], bounds, NAMES);
    let a = tunnel(p.addr, &format!("echo.test:{port}")).await.unwrap();
    let b = tunnel(p.addr, &format!("echo.test:{port}")).await.unwrap();
    let r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.body.contains("max_connections"), "{}", r.body);
    assert_eq!(
        p.record.report().limits_reached,
        vec![NetworkLimit::Connections]
    );
    // A flood of idle connections costs no slot once the bound is reached,
    // and the proxy serves again when the tunnels close.
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(TcpStream::connect(p.addr).await.unwrap());
    }
    drop((a, b, flood));
    let r = get_once_served(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn the_transfer_budget_cuts_traffic_off() {
    let up = upstream().await;
    let port = echo().await;
    let bounds = Bounds {
        max_transfer_bytes: 1 << 20,
        ..Bounds::default()
    };
    let p = start(&["allowed.test", "echo.test", "127.0.0.0/8"], bounds, NAMES);
    // A 4 MiB body stops after about 1 MiB.
    let r = get(p.addr, &format!("http://allowed.test:{}/big", up.port)).await;
    assert!(
        r.body.len() < 2 << 20,
        "{} bytes came through",
        r.body.len()
    );
    assert_eq!(
        p.record.report().limits_reached,
        vec![NetworkLimit::Transfer]
    );
    // Once it is used up, nothing new is contacted.
    let r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.body.contains("transfer budget"), "{}", r.body);
    assert!(tunnel(p.addr, &format!("echo.test:{port}")).await.is_err());
    // A session's next call starts with a full budget.
    let taken = p.record.take();
    assert_eq!(taken.limits_reached, vec![NetworkLimit::Transfer]);
    let r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn huge_headers_are_refused_and_the_proxy_keeps_serving() {
    let up = upstream().await;
    let p = standard();
    let req = Request::get(format!("http://allowed.test:{}/", up.port))
        .header("x-big", "a".repeat(1 << 20))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let stream = TcpStream::connect(p.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    match sender.send_request(req).await {
        Ok(r) => assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
        Err(e) => eprintln!("the proxy closed the connection: {e}"),
    }
    assert_eq!(up.hits.load(Ordering::SeqCst), 0);
    let r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn silent_upstreams_and_idle_tunnels_time_out() {
    let up = upstream().await;
    let port = echo().await;
    let bounds = Bounds {
        idle_timeout: Duration::from_secs(1),
        ..Bounds::default()
    };
    let p = start(&["allowed.test", "echo.test", "127.0.0.0/8"], bounds, NAMES);
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        get(p.addr, &format!("http://allowed.test:{}/silent", up.port)),
    )
    .await
    .expect("the proxy answers");
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.body);
    let mut t = tunnel(p.addr, &format!("echo.test:{port}")).await.unwrap();
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(20), t.read(&mut buf))
        .await
        .expect("the idle tunnel is closed");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
}

#[tokio::test]
async fn stopping_the_proxy_ends_its_tunnels_and_its_listener() {
    let port = echo().await;
    let p = standard();
    let mut t = tunnel(p.addr, &format!("echo.test:{port}")).await.unwrap();
    t.write_all(b"x").await.unwrap();
    let mut buf = [0u8; 1];
    t.read_exact(&mut buf).await.unwrap();
    drop(p.serving);
    let n = tokio::time::timeout(Duration::from_secs(20), t.read(&mut buf))
        .await
        .expect("the tunnel ends with the proxy");
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    let mut refused = false;
    for _ in 0..50 {
        if TcpStream::connect(p.addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "the listener outlived the proxy");
}

#[tokio::test]
async fn request_bodies_are_forwarded_and_counted() {
    let up = upstream().await;
    let p = standard();
    let body = "b".repeat(100_000);
    let req = Request::post(format!("http://allowed.test:{}/echo", up.port))
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let r = send(p.addr, req).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, body);
    let mut report = p.record.report();
    for _ in 0..50 {
        if report.bytes_received >= 100_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        report = p.record.report();
    }
    assert_eq!(report.bytes_sent, 100_000, "{report:?}");
    assert_eq!(report.bytes_received, 100_000, "{report:?}");
}

// Real jails. The jail is built the way a proxied environment's should be:
// every namespace new (network included), the host's system directories
// and prepared /etc, of the network files only those the proxy needs, the
// proxy variables, and the daemon's listener in its network namespace
// before its command starts.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use nix_sandbox_mcp::network::{PROXY_PORT, listen_in, proxy_env};
use nix_sandbox_mcp::platform::Platform;

const PYTHON: &str = "/usr/bin/python3";

/// bubblewrap, or `None` (test skipped) where there is none usable.
fn platform(test: &str) -> Option<Platform> {
    match Platform::probe(None) {
        Ok(p) => Some(p),
        Err(e) => {
            skip(test, &format!("no usable bubblewrap: {e}"));
            None
        }
    }
}

/// bubblewrap started with `command`, blocked until the proxy listens.
struct Jail {
    child: std::process::Child,
    init: i32,
    block: OwnedFd,
}

async fn jail(platform: &Platform, own_network: bool, command: &[String]) -> Jail {
    let layout = &platform.layout;
    let mut args: Vec<String> = [
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
    ]
    .map(String::from)
    .to_vec();
    if own_network {
        args.push("--unshare-net".into());
    }
    if layout.features.disable_userns {
        args.push("--disable-userns".into());
    }
    for (k, v) in proxy_env(PROXY_PORT) {
        args.extend(["--setenv".into(), k, v]);
    }
    let ro = |args: &mut Vec<String>, src: &Path, dest: &Path| {
        args.extend([
            "--ro-bind".into(),
            src.display().to_string(),
            dest.display().to_string(),
        ]);
    };
    for dir in &layout.system_dirs {
        ro(&mut args, dir, dir);
    }
    for (target, link) in &layout.system_links {
        args.extend([
            "--symlink".into(),
            target.display().to_string(),
            link.display().to_string(),
        ]);
    }
    ro(&mut args, &layout.etc_dir, Path::new("/etc"));
    for f in &layout.etc_host {
        ro(&mut args, f, f);
    }
    for f in &layout.etc_network {
        ro(&mut args, f, f);
    }
    let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    let (block_r, block_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
    args.extend(
        [
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--chdir", "/tmp",
        ]
        .map(String::from),
    );
    args.extend(["--json-status-fd".into(), status_w.as_raw_fd().to_string()]);
    args.extend(["--block-fd".into(), block_r.as_raw_fd().to_string()]);
    let mut cmd = Command::new(&platform.bwrap);
    cmd.args(&args)
        .arg("--")
        .args(command)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((uid, gid)) = platform.run_as {
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    }
    let keep = [status_w.as_raw_fd(), block_r.as_raw_fd()];
    // SAFETY: runs between fork and exec; fcntl is async-signal-safe and
    // the descriptors are open in the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            for fd in keep {
                let fd = std::os::fd::BorrowedFd::borrow_raw(fd);
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop((status_w, block_r));
    // bubblewrap names the sandbox's init in its first status line.
    let mut status = tokio::net::unix::pipe::Receiver::from_owned_fd(status_r).unwrap();
    let mut text = String::new();
    let init = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 1024];
        loop {
            let n = status.read(&mut buf).await.unwrap();
            assert!(n > 0, "bubblewrap failed to start");
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            if let Some(pid) = text.lines().find_map(|l| {
                serde_json::from_str::<serde_json::Value>(l).ok()?["child-pid"].as_i64()
            }) {
                return pid as i32;
            }
        }
    })
    .await
    .expect("bubblewrap reports its init");
    Jail {
        child,
        init,
        block: block_w,
    }
}

struct Ran {
    stdout: String,
    stderr: String,
}

impl Ran {
    /// The statuses a script printed as `exit=N` lines, in order.
    fn exits(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("exit="))
            .collect()
    }
}

impl Jail {
    /// Starts the command and waits for it to end.
    async fn run(self) -> Ran {
        rustix::io::write(&self.block, b"x").unwrap();
        let child = self.child;
        let output = tokio::time::timeout(
            Duration::from_secs(120),
            tokio::task::spawn_blocking(move || child.wait_with_output()),
        )
        .await
        .expect("the jail ends")
        .unwrap()
        .unwrap();
        Ran {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

/// A jail with the proxy serving `entries`, running `script` with /bin/sh.
async fn proxied_sh(
    platform: &Platform,
    entries: &[&str],
    names: &[(&str, &str)],
    script: String,
) -> (Ran, RunRecord) {
    proxied(
        platform,
        entries,
        names,
        &["/bin/sh".to_string(), "-c".into(), script],
    )
    .await
}

/// A jail with the proxy serving `entries`, running `command`.
async fn proxied(
    platform: &Platform,
    entries: &[&str],
    names: &[(&str, &str)],
    command: &[String],
) -> (Ran, RunRecord) {
    let jail = jail(platform, true, command).await;
    let (init, run_as) = (jail.init, platform.run_as);
    let listener = tokio::task::spawn_blocking(move || listen_in(init, run_as, PROXY_PORT))
        .await
        .unwrap()
        .expect("a listener in the jail's network namespace");
    let policy = Arc::new(Policy::from_entries(entries, Bounds::default()).unwrap());
    let record = RunRecord::new();
    let serving = Proxy::new(resolver(names), None)
        .serve(listener, policy, record.clone())
        .unwrap();
    let ran = jail.run().await;
    drop(serving);
    (ran, record)
}

/// Whether the host's python is there (the test skipped when not).
fn python_present(test: &str) -> bool {
    if Path::new(PYTHON).exists() {
        return true;
    }
    skip(test, &format!("{PYTHON} is not installed"));
    false
}

/// A port on this machine's own address with a listener behind it, proven
/// reachable from the host: what code in the jail tries to reach directly.
fn host_listener() -> Option<(std::net::TcpListener, SocketAddr)> {
    let own = own_address()?;
    let listener = std::net::TcpListener::bind((own, 0)).ok()?;
    let addr = listener.local_addr().ok()?;
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    Some((listener, addr))
}

const URLLIB_PROBE: &str = r#"
import http.client, json, socket, sys, urllib.error, urllib.request
up, echo, direct_host, direct_port = sys.argv[1:5]
result = {}
def attempt(name, f):
    try:
        result[name] = ["ok", f()]
    except urllib.error.HTTPError as e:
        result[name] = ["http", e.code, e.read().decode()]
    except Exception as e:
        result[name] = ["error", type(e).__name__, str(e)]
get = lambda url: urllib.request.urlopen(url, timeout=30).read().decode()
attempt("allowed", lambda: get(f"http://allowed.test:{up}/hello"))
attempt("denied", lambda: get(f"http://denied.test:{up}/"))
def tunnel():
    c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=30)
    c.set_tunnel("echo.test", int(echo))
    c.connect()
    c.sock.sendall(b"ping")
    return c.sock.recv(4).decode()
attempt("tunnel", tunnel)
def direct(host, port):
    socket.create_connection((host, int(port)), timeout=5).close()
    return "connected"
attempt("direct_host", lambda: direct(direct_host, direct_port))
attempt("direct_loopback", lambda: direct("127.0.0.1", up))
attempt("dns", lambda: socket.getaddrinfo("allowed.test", 80))
no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
attempt("urllib_without_proxy", lambda: no_proxy.open(f"http://{direct_host}:{direct_port}/", timeout=5).read().decode())
print(json.dumps(result))
"#;

#[tokio::test]
async fn a_jail_reaches_allowed_hosts_through_the_proxy_and_nothing_else() {
    let Some(platform) =
        platform("a_jail_reaches_allowed_hosts_through_the_proxy_and_nothing_else")
    else {
        return;
    };
    if !python_present("a_jail_reaches_allowed_hosts_through_the_proxy_and_nothing_else") {
        return;
    }
    let up = upstream().await;
    let echo_port = echo().await;
    // Code that ignores the proxy aims at this machine's own address when
    // it has one, else at loopback (then only the namespace is shown).
    let host = host_listener();
    let (direct_host, direct_port) = match &host {
        Some((_, addr)) => (addr.ip().to_string(), addr.port()),
        None => {
            eprintln!("NOTE: no global IPv4 address here; direct probes use loopback only");
            ("127.0.0.1".to_string(), up.port)
        }
    };
    let command = [
        PYTHON.to_string(),
        "-c".into(),
        URLLIB_PROBE.into(),
        up.port.to_string(),
        echo_port.to_string(),
        direct_host.clone(),
        direct_port.to_string(),
    ];
    let (ran, record) = proxied(
        &platform,
        &["allowed.test", "echo.test", "127.0.0.0/8"],
        NAMES,
        &command,
    )
    .await;
    let result: serde_json::Value = serde_json::from_str(ran.stdout.trim())
        .unwrap_or_else(|e| panic!("{e}: {} / {}", ran.stdout, ran.stderr));
    let r = |k: &str| result[k].as_array().unwrap().clone();
    let allowed = r("allowed");
    assert_eq!(allowed[0], "ok", "{allowed:?}");
    assert!(
        allowed[1]
            .as_str()
            .unwrap()
            .starts_with("hello from upstream")
    );
    let denied = r("denied");
    assert_eq!(
        (denied[0].as_str(), denied[1].as_i64()),
        (Some("http"), Some(403))
    );
    assert!(
        denied[2]
            .as_str()
            .unwrap()
            .contains("denied.test is not on this environment's network allowlist"),
        "{denied:?}"
    );
    assert_eq!(r("tunnel"), vec!["ok", "ping"]);
    // Without the proxy: no route, no loopback server, no DNS.
    for probe in [
        "direct_host",
        "direct_loopback",
        "dns",
        "urllib_without_proxy",
    ] {
        assert_eq!(r(probe)[0], "error", "{probe}: {:?}", r(probe));
    }
    if host.is_some() {
        assert!(
            r("direct_host")[2]
                .as_str()
                .unwrap()
                .contains("unreachable"),
            "{:?}",
            r("direct_host")
        );
    }
    assert!(
        r("direct_loopback")[2]
            .as_str()
            .unwrap()
            .contains("refused"),
        "{:?}",
        r("direct_loopback")
    );
    let report = record.report();
    assert_eq!(report.denied_subjects(), vec!["denied.test".to_string()]);
    let reached: Vec<&str> = report.allowed.iter().map(|h| h.host.as_str()).collect();
    assert_eq!(reached, vec!["allowed.test", "echo.test"], "{report:?}");
}

#[tokio::test]
async fn curl_in_a_jail_follows_the_proxy_and_fails_without_it() {
    let Some(platform) = platform("curl_in_a_jail_follows_the_proxy_and_fails_without_it") else {
        return;
    };
    if !Path::new("/usr/bin/curl").exists() {
        skip(
            "curl_in_a_jail_follows_the_proxy_and_fails_without_it",
            "curl is not installed",
        );
        return;
    }
    let up = upstream().await;
    let host = host_listener();
    let direct = match &host {
        Some((_, addr)) => addr.to_string(),
        None => format!("127.0.0.1:{}", up.port),
    };
    let p = up.port;
    let script = format!(
        "curl -sS -m 30 http://allowed.test:{p}/hello; echo \"exit=$?\"
         curl -sS -m 30 -p http://allowed.test:{p}/hello; echo \"exit=$?\"
         curl -sS -m 30 -o /dev/null -w '%{{http_code}}\\n' http://denied.test:{p}/; echo \"exit=$?\"
         curl -sS -m 5 --noproxy '*' http://{direct}/; echo \"exit=$?\"
         curl -sS -m 5 --noproxy '*' http://127.0.0.1:{p}/; echo \"exit=$?\"
         curl -sS -m 5 --noproxy '*' http://allowed.test:{p}/; echo \"exit=$?\""
    );
    let (ran, record) =
        proxied_sh(&platform, &["allowed.test", "127.0.0.0/8"], NAMES, script).await;
    let exits = ran.exits();
    assert_eq!(exits.len(), 6, "{} / {}", ran.stdout, ran.stderr);
    // Plain HTTP forwarding, then the same through a CONNECT tunnel (-p).
    assert_eq!(
        &exits[..3],
        ["0", "0", "0"],
        "{} / {}",
        ran.stdout,
        ran.stderr
    );
    assert_eq!(
        ran.stdout.matches("hello from upstream").count(),
        2,
        "{}",
        ran.stdout
    );
    assert!(ran.stdout.contains("403\n"), "{}", ran.stdout);
    // --noproxy: 7 (could not connect) or 6 (could not resolve).
    assert_eq!(
        &exits[3..],
        ["7", "7", "6"],
        "{} / {}",
        ran.stdout,
        ran.stderr
    );
    assert_eq!(
        record.report().denied_subjects(),
        vec!["denied.test".to_string()]
    );
}

/// A wheel built by the host's Python: the smallest package pip accepts.
fn wheel() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.whl");
    let build = r#"
import sys, zipfile
files = {
    "tinypkg/__init__.py": "VALUE = 42\n",
    "tinypkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
    "tinypkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("tinypkg-1.0.dist-info/RECORD", "".join(f"{n},,\n" for n in files) + "tinypkg-1.0.dist-info/RECORD,,\n")
"#;
    let ok = Command::new(PYTHON)
        .args(["-c", build])
        .arg(&path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "building the test wheel");
    std::fs::read(path).unwrap()
}

#[tokio::test]
async fn pip_downloads_from_an_allowed_index_only() {
    let Some(platform) = platform("pip_downloads_from_an_allowed_index_only") else {
        return;
    };
    if !python_present("pip_downloads_from_an_allowed_index_only") {
        return;
    }
    let has_pip = Command::new(PYTHON)
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pip {
        skip(
            "pip_downloads_from_an_allowed_index_only",
            &format!("{PYTHON} has no pip"),
        );
        return;
    }
    let wheel = wheel();
    let index = "<html><body><a href=\"/files/tinypkg-1.0-py3-none-any.whl\">tinypkg-1.0-py3-none-any.whl</a></body></html>";
    let up = upstream_with(vec![
        (
            "/simple/tinypkg/".into(),
            "text/html",
            index.as_bytes().to_vec(),
        ),
        (
            "/files/tinypkg-1.0-py3-none-any.whl".into(),
            "application/octet-stream",
            wheel,
        ),
    ])
    .await;
    let pip = |host: &str| {
        format!(
            "{PYTHON} -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
             --retries 0 --timeout 20 --trusted-host {host} --index-url http://{host}:{}/simple/ -d /tmp/dl-{host} tinypkg; \
             echo \"exit=$?\"; ls /tmp/dl-{host}",
            up.port
        )
    };
    let script = format!("{}\n{}", pip("pypi.test"), pip("denied.test"));
    let (ran, record) = proxied_sh(
        &platform,
        &["pypi.test", "127.0.0.0/8"],
        &[("pypi.test", "127.0.0.1")],
        script,
    )
    .await;
    let exits = ran.exits();
    assert_eq!(exits.first(), Some(&"0"), "{} / {}", ran.stdout, ran.stderr);
    assert!(
        ran.stdout.contains("tinypkg-1.0-py3-none-any.whl"),
        "{}",
        ran.stdout
    );
    assert_ne!(exits.get(1), Some(&"0"), "{} / {}", ran.stdout, ran.stderr);
    // pip reports a 403 from an index as "no versions"; the record names the host.
    let report = record.report();
    assert_eq!(report.denied_subjects(), vec!["denied.test".to_string()]);
    assert!(
        report
            .allowed
            .iter()
            .any(|h| h.host == "pypi.test" && h.bytes_received > 0)
    );
}

#[tokio::test]
async fn npm_reads_an_allowed_registry_only() {
    let Some(platform) = platform("npm_reads_an_allowed_registry_only") else {
        return;
    };
    if !Path::new("/usr/bin/npm").exists() {
        skip("npm_reads_an_allowed_registry_only", "npm is not installed");
        return;
    }
    let up = upstream().await;
    let metadata = format!(
        r#"{{"name":"tinypkg","dist-tags":{{"latest":"1.2.3"}},"versions":{{"1.2.3":{{"name":"tinypkg","version":"1.2.3","dist":{{"tarball":"http://registry.test:{}/tinypkg/-/tinypkg-1.2.3.tgz","shasum":"0000000000000000000000000000000000000000"}}}}}}}}"#,
        up.port
    );
    let registry = upstream_with(vec![(
        "/tinypkg".into(),
        "application/json",
        metadata.into_bytes(),
    )])
    .await;
    let npm = |host: &str| {
        format!(
            "npm view tinypkg version --registry http://{host}:{}/ --fetch-retries 0 \
             --no-update-notifier --cache /tmp/npm-cache 2>&1; echo \"exit=$?\"",
            registry.port
        )
    };
    let script = format!("{}\n{}", npm("registry.test"), npm("denied.test"));
    let (ran, record) = proxied_sh(
        &platform,
        &["registry.test", "127.0.0.0/8"],
        &[("registry.test", "127.0.0.1")],
        script,
    )
    .await;
    let exits = ran.exits();
    assert_eq!(exits.first(), Some(&"0"), "{} / {}", ran.stdout, ran.stderr);
    assert!(ran.stdout.starts_with("1.2.3\n"), "{}", ran.stdout);
    assert_ne!(exits.get(1), Some(&"0"), "{}", ran.stdout);
    assert!(ran.stdout.contains("403"), "{}", ran.stdout);
    assert_eq!(
        record.report().denied_subjects(),
        vec!["denied.test".to_string()]
    );
}

#[tokio::test]
async fn the_listener_is_refused_for_a_jail_that_shares_the_network() {
    let Some(platform) = platform("the_listener_is_refused_for_a_jail_that_shares_the_network")
    else {
        return;
    };
    let jail = jail(&platform, false, &["/bin/true".to_string()]).await;
    let (init, run_as) = (jail.init, platform.run_as);
    let err = tokio::task::spawn_blocking(move || listen_in(init, run_as, PROXY_PORT))
        .await
        .unwrap()
        .expect_err("no listener in the daemon's own namespace");
    assert!(err.to_string().contains("--unshare-net"), "{err}");
    jail.run().await;
}

/// Whether a child of this process other than `except` is in the network
/// namespace `ns` (`listen_in`'s child, once it has joined it).
fn a_child_joined(ns: &Path, except: i32) -> bool {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == except.to_string() {
            return false;
        }
        let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().nth(1)?.to_string()));
        parent.as_deref() == Some(me.as_str())
            && std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .ok()
                .as_deref()
                == Some(ns)
    })
}

#[tokio::test]
async fn a_listener_made_before_the_sandbox_loopback_is_up_serves_once_it_is() {
    // bubblewrap names its init before the init brings loopback up; a
    // namespace whose loopback comes up only once the listener is being
    // made stands for that. Each step waits for the one before: the shell
    // says it runs in its namespaces, the listener is made (or is being
    // made: on some kernels a bind waits for loopback), and only then is
    // loopback brought up, by the shell, told to on its standard input.
    const TEST: &str = "a_listener_made_before_the_sandbox_loopback_is_up_serves_once_it_is";
    let (Ok(unshare), Ok(ip)) = (which::which("unshare"), which::which("ip")) else {
        skip(TEST, "needs unshare and ip");
        return;
    };
    if !Path::new(PYTHON).exists() {
        skip(TEST, &format!("{PYTHON} is not installed"));
        return;
    }
    let script = format!(
        "echo ready; read go; {ip} -o link show lo; {ip} link set lo up; {PYTHON} -c 'import socket; \
         socket.create_connection((\"127.0.0.1\", {PROXY_PORT}), timeout=20).sendall(b\"hi\")'",
        ip = ip.display()
    );
    let mut child = match Command::new(unshare)
        .args(["--user", "--map-root-user", "--net", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            skip(TEST, &format!("cannot run unshare: {e}"));
            return;
        }
    };
    let pid = child.id() as i32;
    let mut go = child.stdin.take().unwrap();
    // The shell's lines, as it writes them.
    let (lines, said) = std::sync::mpsc::channel::<String>();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(stdout).map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let next_line = |what: &str| {
        said.recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("the shell never said {what}: {e}"))
    };
    let stop = |mut child: std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
    };
    // unshare execs the shell: once it speaks, it runs in the new namespaces.
    let ready = next_line("it was ready");
    assert_eq!(ready, "ready");
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    assert_ne!(theirs, own, "the shell shares the test's network namespace");
    let listening = tokio::task::spawn_blocking(move || listen_in(pid, None, PROXY_PORT));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !listening.is_finished() && !a_child_joined(&theirs, pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "listen_in never entered the namespace"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    std::io::Write::write_all(&mut go, b"go\n").unwrap();
    drop(go);
    // What loopback was when the shell was told to bring it up.
    let lo = next_line("how loopback was");
    assert!(lo.contains("state DOWN"), "loopback was up already: {lo}");
    let listener = match listening.await.unwrap() {
        Ok(l) => l,
        Err(e) => {
            stop(child);
            panic!("no listener: {e}");
        }
    };
    listener.set_nonblocking(true).unwrap();
    let listener = TcpListener::from_std(listener).unwrap();
    let mut got = Vec::new();
    let accepted = tokio::time::timeout(Duration::from_secs(20), async {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.read_to_end(&mut got).await.unwrap();
    })
    .await;
    stop(child);
    assert!(accepted.is_ok(), "nothing connected");
    assert_eq!(got, b"hi");
}
