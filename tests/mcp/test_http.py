"""Streamable HTTP (`serve --http`) through the real binary: secure by
default (loopback, Host and Origin, bounds on requests and connections,
every refusal a status and a JSON-RPC error), the tokens file (`token
add`, SIGHUP, a file others may write), TLS, a Unix socket, and a
graceful stop. OAuth is in test_http_oauth.py, principals kept apart in
test_http_principals.py. Each test starts its own server."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from typing import Any

import anyio
import pytest

from harness import (BIN, PROTOCOL, call, dump, legacy_only, processes_with, run_async, server_params, start,
                     stateless_only, write_config)
from http_transport import HttpServer, client, free_port, token_line

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


def env() -> dict:
    from mcp.client.stdio import get_default_environment
    return {**get_default_environment(), **(server_params().env or {})}


def scratch() -> pathlib.Path:
    d = pathlib.Path(tempfile.mkdtemp(prefix="http-"))
    d.chmod(0o700)
    return d


@contextlib.contextmanager
def server(**kw: Any):
    s = HttpServer(BIN, scratch(), env=env(), **kw)
    try:
        yield s
    finally:
        code = s.stop()
        assert code == 0, f"exit {code}: {s.log_tail()}"


def raw(srv: HttpServer, body: Any = INIT, token: str | None = "tester", method: str = "POST", path: str = "/mcp",
        headers: dict | None = None, timeout: float = 15) -> tuple[int, dict, Any]:
    """One request by hand; (status, headers, the body as JSON when it is)."""
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if token:
        h["authorization"] = f"Bearer {srv.token(token) if token in srv.tokens else token}"
    h.update(headers or {})
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, path, body=data, headers=h)
    except (BrokenPipeError, ConnectionResetError):
        # The server answered the head (a refusal) and closed before the
        # body was sent: its answer is still there to read.
        pass
    r = conn.getresponse()
    text = r.read()
    conn.close()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return r.status, {k.lower(): v for k, v in r.getheaders()}, parsed


def eventually(check: Any, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def refused(status: int, got: tuple[int, dict, Any], words: str = "") -> dict:
    """Asserts a refusal: the status, and a JSON-RPC error body (with `words`)."""
    code, headers, body = got
    assert code == status, (code, body)
    assert headers.get("content-type", "").startswith("application/json"), headers
    assert body["jsonrpc"] == "2.0" and body["id"] is None and isinstance(body["error"]["code"], int), body
    assert words in body["error"]["message"], body
    return headers


async def run_ok(s: Any, code: str = "echo hi", **extra: Any) -> dict:
    sc, text, err = await call(s, "bash", code, **extra)
    assert not err, text
    return sc


# --- Secure by default ------------------------------------------------------

def test_an_address_others_can_reach_needs_credentials():
    port = free_port()
    out = subprocess.run([BIN, "serve", "--http", f"0.0.0.0:{port}"], env=env(), capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out
    assert "tokens_file" in out.stderr and "[http.oauth]" in out.stderr and "loopback" in out.stderr, out.stderr
    for bad in ["8765", "example.com:80", "unix:relative"]:
        out = subprocess.run([BIN, "serve", "--http", bad], env=env(), capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "expected HOST:PORT" in out.stderr, out.stderr


def test_with_tokens_any_address_serves_and_a_loopback_one_needs_none():
    with server(address=f"0.0.0.0:{free_port()}") as s:
        s.port = int(s.address.rsplit(":", 1)[1])
        refused(401, raw(s, token=None))
        assert raw(s)[0] == 200
    with server(principals=()) as s:
        code, headers, _ = raw(s, token=None)
        assert code == 200 and headers.get("mcp-session-id"), headers


def test_host_and_origin_are_checked_before_anything_else():
    with server(http_config='allowed_hosts = ["sandbox.example"]\nallowed_origins = ["https://app.example"]\n') as s:
        refused(403, raw(s, headers={"host": "evil.example"}), "DNS rebinding")
        refused(403, raw(s, token=None, headers={"host": "evil.example"}), "DNS rebinding")
        refused(403, raw(s, headers={"origin": "https://evil.example"}), "Origin")
        refused(403, raw(s, headers={"origin": "null"}), "Origin")
        assert raw(s, headers={"host": "sandbox.example"})[0] == 200
        assert raw(s, headers={"origin": "https://app.example"})[0] == 200
        assert raw(s, headers={"origin": f"http://localhost:{s.port}"})[0] == 200
        refused(404, raw(s, path="/other"), "/mcp")


def test_bodies_and_heads_are_bounded_in_size_and_time():
    cfg = "max_body_bytes = 2048\nbody_timeout_seconds = 1\nidle_timeout_seconds = 2\nmax_headers = 20\n"
    with server(http_config=cfg) as s:
        refused(413, raw(s, body=b"{" + b" " * 4096 + b"}"), "larger than 2048")
        # A body that stops arriving.
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(f"POST /mcp HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {s.token()}\r\n"
                     "content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"a\"".encode())
        sock.settimeout(10)
        answer = sock.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 408") and '"jsonrpc":"2.0"' in answer, answer
        sock.close()
        # A head that stops arriving is closed at the idle time (2 s here).
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(b"POST /mcp HTTP/1.1\r\nhost: loc")
        sock.settimeout(15)
        began = time.monotonic()
        assert sock.recv(4096) == b""
        assert 1.5 < time.monotonic() - began < 8
        sock.close()
        # So is a keep-alive connection left idle after its request.
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=15)
        conn.request("POST", "/mcp", body=json.dumps(INIT), headers={
            "authorization": f"Bearer {s.token()}", "content-type": "application/json",
            "accept": "application/json, text/event-stream"})
        r = conn.getresponse()
        r.read()
        assert r.status == 200 and not r.will_close
        began = time.monotonic()
        assert conn.sock.recv(1) == b""
        assert 1.5 < time.monotonic() - began < 8
        conn.close()
        # Too many headers: hyper refuses the head itself (431, no body to read).
        many = {f"x-h{i}": "v" for i in range(40)}
        assert raw(s, body=None, headers=many)[0] == 431
        assert raw(s, body=None, headers={"x-big": "v" * 20000})[0] == 431
        # Still serving.
        assert raw(s)[0] == 200


def test_connections_are_bounded_overall_and_per_principal():
    cfg = "max_connections = 2\n[http.per_principal]\nmax_connections = 1\nmax_streams = 1\n"
    with server(http_config=cfg, principals=("alice", "bob")) as s:
        held = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        held.request("POST", "/mcp", body=json.dumps(INIT), headers={
            "authorization": f"Bearer {s.token('alice')}", "content-type": "application/json",
            "accept": "application/json, text/event-stream"})
        r = held.getresponse()
        r.read()
        assert r.status == 200
        # Alice's one connection is held: another of hers is refused.
        refused(429, raw(s, token="alice"), "connections open")
        # Bob has his own share (one connection: the second server-wide,
        # once the server has seen alice's refused one close).
        assert eventually(lambda: raw(s, token="bob")[0] == 200)
        # The second place server-wide: a connection the server answers
        # (bob's closed one may still hold its place for a moment, and a
        # connection opened then is refused: open another until one is
        # answered), kept open.
        def answered() -> http.client.HTTPConnection | None:
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
            try:
                c.request("GET", "/healthz")
                r = c.getresponse()
                r.read()
                if r.status == 200:
                    return c
            except (OSError, http.client.HTTPException):
                pass
            c.close()
            return None
        kept: list = []
        assert eventually(lambda: kept.append(answered()) or kept[-1] is not None)
        other = kept[-1]
        third = socket.create_connection(("127.0.0.1", s.port))
        third.sendall(b"POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-length: 2\r\n\r\n{}")
        third.settimeout(10)
        answer = third.recv(4096).decode()
        assert answer.startswith("HTTP/1.1 503") and "connections open" in answer, answer
        for c in (held, other, third):
            c.close()


@legacy_only("a GET stream of an MCP session held open")
def test_a_principals_streams_are_bounded():
    with server(http_config="[http.per_principal]\nmax_streams = 1\n", principals=("alice", "bob")) as s:
        code, headers, _ = raw(s, token="alice")
        sid = headers["mcp-session-id"]
        raw(s, token="alice", body={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={"mcp-session-id": sid, "mcp-protocol-version": PROTOCOL})
        stream = http.client.HTTPConnection("127.0.0.1", s.port, timeout=15)
        stream.request("GET", "/mcp", headers={"authorization": f"Bearer {s.token('alice')}", "mcp-session-id": sid,
                                               "accept": "text/event-stream", "mcp-protocol-version": PROTOCOL})
        assert stream.getresponse().status == 200
        h = refused(429, raw(s, token="alice"), "requests in flight")
        assert h["retry-after"] == "1"
        assert raw(s, token="bob")[0] == 200
        stream.close()
        assert eventually(lambda: raw(s, token="alice")[0] == 200)


# --- Tokens ----------------------------------------------------------------

def test_tokens_are_required_checked_and_never_logged():
    with server(principals=("alice",), extra_args=("-vv",)) as s:
        refused(401, raw(s, token=None), "bearer token")
        h = refused(401, raw(s, token="nsm_" + "A" * 43), "not valid")
        assert h["www-authenticate"].startswith("Bearer realm=") and 'error="invalid_token"' in h["www-authenticate"]
        refused(400, raw(s, token=None, headers={"authorization": "Basic YWxpY2U6eA=="}), "Bearer")
        refused(401, raw(s, token=s.token("alice")[:-1]))
        refused(401, raw(s, token="a.b.c"), "not valid")
        assert raw(s, token="alice")[0] == 200
        time.sleep(0.2)
        assert s.token("alice") not in s.log_tail(10**7)


def test_sighup_reads_the_tokens_file_again():
    with server(principals=("alice",)) as s:
        path = s.dir / "tokens"
        new = "nsm_" + uuid.uuid4().hex
        path.write_text(token_line("bob", new))
        refused(401, raw(s, token=new))
        s.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while raw(s, token=new)[0] != 200:
            assert time.monotonic() < deadline, s.log_tail()
            time.sleep(0.1)
        refused(401, raw(s, token="alice"))
        # A broken file keeps the principals as they were.
        path.write_text("bob not-a-hash\n")
        s.proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert raw(s, token=new)[0] == 200
        assert "the principals stay as they were" in s.log_tail()


def test_a_tokens_file_others_may_write_is_refused():
    d = scratch()
    with pytest.raises(RuntimeError, match="may be written by its group or others"):
        HttpServer(BIN, d, env=env(), tokens_mode=0o666)


def test_token_add_prints_a_token_once_and_the_server_takes_it():
    d = scratch()
    path = d / "tokens"
    out = subprocess.run([BIN, "token", "add", "alice", "--file", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert token.startswith("nsm_") and "shown only now" in out.stderr
    assert (path.stat().st_mode & 0o777) == 0o600 and token not in path.read_text()
    again = subprocess.run([BIN, "token", "add", "alice", "--file", str(path)], capture_output=True, text=True, timeout=30)
    assert again.returncode == 1 and "already has a principal named" in again.stderr
    config = write_config(f'[http]\ntokens_file = "{path}"\n')
    out = subprocess.run([BIN, "--config", config, "token", "add", "bob"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and path.read_text().count("\n") == 2, out.stderr
    s = HttpServer(BIN, d, env=env(), principals=())
    try:
        (d / "tokens").write_text(path.read_text()) if path != d / "tokens" else None
    finally:
        s.stop()
    with server(principals=(), http_config=f'tokens_file = "{path}"\n') as s:
        assert raw(s, token=token)[0] == 200
        assert raw(s, token=out.stdout.strip())[0] == 200


# --- TLS, a Unix socket ------------------------------------------------------

def self_signed(d: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = d / "cert.pem", d / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_serves_mcp_and_a_bad_certificate_is_refused_at_start():
    d = scratch()
    cert, key = self_signed(d)
    with server(extra_args=("--tls-cert", str(cert), "--tls-key", str(key))) as s:
        assert f"https://127.0.0.1:{s.port}/mcp" in s.log_tail()
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.check_hostname = True

        async def t():
            import httpx2
            async with httpx2.AsyncClient(verify=ctx, headers={"authorization": f"Bearer {s.token()}"},
                                          timeout=httpx2.Timeout(30, read=300)) as http_client:
                from mcp.client.session import ClientSession
                from mcp.client.streamable_http import streamable_http_client
                async with streamable_http_client(f"https://localhost:{s.port}/mcp", http_client=http_client) as (r, w):
                    async with ClientSession(r, w) as c:
                        await start(c, over_http=True)
                        assert (await run_ok(c, "echo over tls"))["stdout"] == "over tls\n"
        run_async(t)
        # Plain HTTP to the TLS port gets nothing served.
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            raw(s, timeout=5)
    (d / "bad.pem").write_text("not a certificate\n")
    with pytest.raises(RuntimeError, match="TLS"):
        HttpServer(BIN, scratch(), env=env(), extra_args=("--tls-cert", str(d / "bad.pem"), "--tls-key", str(key)))


def test_a_unix_socket_is_its_owners_alone():
    d = scratch()
    path = d / "mcp.sock"
    with server(principals=(), address=f"unix:{path}") as s:
        assert (path.stat().st_mode & 0o777) == 0o600

        async def t():
            import httpx2
            transport = httpx2.AsyncHTTPTransport(uds=str(path))
            async with httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(30, read=300)) as http_client:
                from mcp.client.session import ClientSession
                from mcp.client.streamable_http import streamable_http_client
                async with streamable_http_client("http://localhost/mcp", http_client=http_client) as (r, w):
                    async with ClientSession(r, w) as c:
                        await start(c, over_http=True)
                        assert (await run_ok(c, "echo over a socket"))["stdout"] == "over a socket\n"
        run_async(t)
    assert not path.exists(), "the socket is removed when the server stops"


def listening(family: int = socket.AF_INET, path: pathlib.Path | None = None,
              kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket as a systemd socket unit makes one: bound, and listening
    when it is a stream."""
    sock = socket.socket(family, kind)
    sock.bind(str(path) if path else ("127.0.0.1", 0))
    if kind == socket.SOCK_STREAM:
        sock.listen(64)
    return sock


def holders_of(sock: socket.socket, pid: int) -> list[int]:
    """The processes in `pid`'s tree, other than `pid`, that hold `sock` open."""
    target = f"socket:[{os.fstat(sock.fileno()).st_ino}]"
    tree, found = [pid], []
    while tree:
        p = tree.pop()
        with contextlib.suppress(OSError):
            for t in os.listdir(f"/proc/{p}/task"):
                tree += [int(c) for c in pathlib.Path(f"/proc/{p}/task/{t}/children").read_text().split()]
        if p == pid:
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{p}/fd/{f}") == target for f in os.listdir(f"/proc/{p}/fd")):
                found.append(p)
    return found


def test_systemd_socket_activation_serves_on_the_socket_it_passes_and_keeps_it_from_sandboxes():
    tcp = listening()
    with server(address="systemd", sockets=(tcp,)) as s:
        assert f"listening on http://127.0.0.1:{s.port}/mcp" in s.log_tail()
        seen: list = []

        async def t():
            async with client(s.url, s.token()) as c:
                await start(c, over_http=True)
                # A session keeps its sandbox running while the tree is read.
                sc = await run_ok(c, "for f in /proc/self/fd/*; do readlink $f; done; echo ok", session="open")
                assert sc["stdout"].endswith("ok\n") and "socket:" not in sc["stdout"], sc
                seen.extend(holders_of(tcp, s.proc.pid))
                await run_ok(c, "true", session=sc["session"]["handle"])
        run_async(t)
        assert seen == [], f"processes the server started hold its listening socket: {seen}"
    tcp.close()

    d = scratch()
    path = d / "mcp.sock"
    unix = listening(socket.AF_UNIX, path)
    with server(principals=(), address="systemd", sockets=(unix,)) as s:
        assert f"listening on unix:{path}" in s.log_tail(), s.log_tail()
    assert path.exists(), "the socket systemd made is systemd's: the server leaves it"
    unix.close()


def test_systemd_activation_without_one_listening_stream_socket_is_refused_with_the_reason():
    def refused_start(sockets: tuple, words: str) -> None:
        with pytest.raises(RuntimeError, match="exited 2") as e:
            HttpServer(BIN, scratch(), env=env(), address="systemd", sockets=sockets)
        assert words in str(e.value), str(e.value)

    refused_start((), "no socket was passed")
    a, b = listening(), listening()
    refused_start((a, b), "systemd passed 2 sockets")
    udp = listening(kind=socket.SOCK_DGRAM)
    refused_start((udp,), "not a listening stream socket")
    bound = socket.socket()
    bound.bind(("127.0.0.1", 0))
    refused_start((bound,), "not a listening stream socket")
    with open(os.devnull) as not_a_socket:
        refused_start((not_a_socket,), "the socket passed is not usable")
    for sock in (a, b, udp, bound):
        sock.close()


# --- Stopping -----------------------------------------------------------------

def test_stopping_lets_calls_finish_within_the_grace_then_kills_their_runs():
    m = str(uuid.uuid4().int % 10**8)

    async def t(grace: int, code: str) -> tuple[dict, str, bool] | BaseException:
        s = HttpServer(BIN, scratch(), env=env(), extra_args=("--grace-seconds", str(grace)))
        got: list[Any] = []
        try:
            async with client(s.url, s.token(), terminate_on_close=False) as c:
                await start(c, over_http=True)
                await c.list_tools()  # the tools' schemas, which a call reads, known before the server stops

                async def one() -> None:
                    try:
                        got.append(await call(c, "bash", code))
                    except BaseException as e:  # noqa: BLE001
                        got.append(e)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one)
                    deadline = time.monotonic() + 10
                    while not processes_with(m) and time.monotonic() < deadline:
                        await anyio.sleep(0.05)
                    assert processes_with(m), s.log_tail()
                    s.proc.send_signal(signal.SIGTERM)
                    await anyio.sleep(0.3)
                    # Refused from now on: no new connection is accepted.
                    with pytest.raises(OSError):
                        socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
        finally:
            code_ = s.stop(60)
        assert code_ == 0, s.log_tail()
        return got[0]

    sc, text, err = run_async(t, 30, f"sleep 1.{m}; echo finished")
    assert not err and sc["stdout"] == "finished\n", text
    sc, text, err = run_async(t, 1, f"sleep 60.{m}; echo never")
    assert err and sc["error"]["code"] == "cancelled", text
    assert processes_with(m) == []


# --- What a fleet watches --------------------------------------------------------

def test_health_readiness_and_metrics():
    with server(principals=("alice",)) as s:
        code, _, body = raw(s, method="GET", path="/healthz", token=None, body=None)
        assert (code, body) == (200, {"status": "live"})
        # Ready once the environments' start checks are done.
        assert eventually(lambda: raw(s, method="GET", path="/readyz", token=None, body=None)[0] == 200, 60)
        code, _, body = raw(s, method="GET", path="/readyz", token=None, body=None)
        assert body["status"] == "ready" and "bash" in body["environments"], body
        refused(401, raw(s, method="GET", path="/metrics", token=None, body=None))

        async def t():
            async with client(s.url, s.token("alice")) as c:
                await start(c, over_http=True)
                await run_ok(c, "echo counted")
                sc, _, err = await call(c, "bash", "exit 3")
                assert err and sc["error"]["code"] == "exit_nonzero"
        run_async(t)
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=15)
        conn.request("GET", "/metrics", headers={"authorization": f"Bearer {s.token('alice')}"})
        r = conn.getresponse()
        text = r.read().decode()
        assert r.status == 200 and r.headers["content-type"].startswith("application/openmetrics-text"), text
        for want in ['nix_sandbox_mcp_runs_total{env="bash",kind="run",outcome="ok"} 1',
                     'nix_sandbox_mcp_runs_total{env="bash",kind="run",outcome="exit_nonzero"} 1',
                     'nix_sandbox_mcp_run_duration_seconds_count{env="bash"} 2',
                     'nix_sandbox_mcp_http_refused_total{reason="unauthenticated"} 1',
                     "nix_sandbox_mcp_memory_budget_mib "]:
            assert want in text, (want, text)
    with server(principals=(), http_config="metrics = false\n") as s:
        refused(404, raw(s, method="GET", path="/metrics", token=None, body=None))


def test_a_replicas_sessions_and_tasks_are_held_by_it_and_said_so_elsewhere():
    a = HttpServer(BIN, scratch(), env=env(), http_config='replica = "a"\n')
    # --replica names instances of one service that share a configuration.
    b = HttpServer(BIN, scratch(), env=env(), http_config='replica = "a"\n', extra_args=("--replica", "b"))
    try:
        assert "replica a" in a.log_tail() and "replica b" in b.log_tail()
        with pytest.raises(RuntimeError, match="exited 2") as e:
            HttpServer(BIN, scratch(), env=env(), extra_args=("--replica", "B_1"))
        assert "a replica's name is 1 to 16 lower-case letters and digits" in str(e.value)

        async def t():
            async with client(a.url, a.token()) as ca, client(b.url, b.token()) as cb:
                await start(ca, over_http=True)
                await start(cb, over_http=True)
                sc = await run_ok(ca, "x=kept-on-a", session="work")
                handle = sc["session"]["handle"]
                assert handle.startswith("s_a_"), dump(sc)
                sc, _, err = await call(cb, "bash", "echo $x", session=handle)
                assert err and sc["error"]["code"] == "session_expired", dump(sc)
                assert "held by replica a, and this is b" in sc["error"]["message"], dump(sc)
                assert (await run_ok(ca, "echo $x", session=handle))["stdout"] == "kept-on-a\n"
        run_async(t)
    finally:
        assert a.stop() == 0 and b.stop() == 0
    bad = subprocess.run([BIN, "--config", write_config('[http]\nreplica = "A/1"\n'), "serve", "--http", "127.0.0.1:0"],
                         env=env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "http.replica" in bad.stderr and "lower-case letters and digits" in bad.stderr, bad.stderr


@stateless_only()
def test_a_session_call_names_its_session_in_a_header_a_balancer_can_route_by():
    with server() as s:
        body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "run", "arguments": {"env": "bash", "code": "echo hi", "session": "work"},
                           "_meta": {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
                                     "io.modelcontextprotocol/clientCapabilities": {}}}}
        base = {"mcp-protocol-version": PROTOCOL, "mcp-method": "tools/call", "mcp-name": "run"}
        code, _, answer = raw(s, body=body, headers=base)
        assert code == 400 and answer["error"]["code"] == -32020 and "Mcp-Param-Session" in answer["error"]["message"], answer
        code, _, answer = raw(s, body=body, headers={**base, "mcp-param-session": "other"})
        assert code == 400 and answer["error"]["code"] == -32020, answer
        code, _, answer = raw(s, body=body, headers={**base, "mcp-param-session": "work"})
        assert code == 200, answer
