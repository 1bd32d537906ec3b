//! The allowlist proxy against servers on this machine: what passes, what
//! is refused and how the refusal reads, the rebinding defence, tunnels
//! and plain HTTP, and the bounds. The proxy's resolver maps test names to
//! loopback (or this machine's own address); nothing leaves the machine.

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

/// A plain HTTP server on loopback that answers with what it saw.
struct Upstream {
    port: u16,
    hits: Arc<AtomicUsize>,
}

async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    async move { Ok::<_, std::convert::Infallible>(answer(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Upstream { port, hits }
}

async fn answer(req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
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
    let serving = Proxy::new(resolver(names))
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
    assert_eq!(report.denied_hosts(), vec!["denied.test".to_string()]);
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
        p.record.report().denied_hosts(),
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
    let _serving = Proxy::new(resolver(NAMES))
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
        eprintln!("SKIPPED: this machine has no global IPv4 address");
        return;
    };
    if nix_sandbox_mcp::network::refused_range(own).is_none() {
        eprintln!("SKIPPED: this machine's address {own} is public");
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
    assert_eq!(report.denied_hosts(), vec!["denied.test".to_string()]);
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
    let mut r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    for _ in 0..50 {
        if r.status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        r = get(p.addr, &format!("http://allowed.test:{}/", up.port)).await;
    }
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
