"""The server over Streamable HTTP, for the suite's HTTP pass
(NSM_TRANSPORT=http) and the HTTP tests: the real binary started with
`serve --http`, credentials of a tokens file or of a test OAuth issuer
on loopback (NSM_AUTH=tokens|oauth), and clients that present them."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import threading
import time
from typing import Any, AsyncIterator

TRANSPORT = os.environ.get("NSM_TRANSPORT", "stdio")
if TRANSPORT not in ("stdio", "http"):
    raise SystemExit(f"NSM_TRANSPORT={TRANSPORT!r}: expected stdio or http")
AUTH = os.environ.get("NSM_AUTH", "tokens")
if AUTH not in ("tokens", "oauth"):
    raise SystemExit(f"NSM_AUTH={AUTH!r}: expected tokens or oauth")

ALL_SCOPES = "sandbox:run sandbox:commands sandbox:confirm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token_line(name: str, token: str) -> str:
    return f"{name} sha256:{hashlib.sha256(token.encode()).hexdigest()}\n"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Issuer:
    """A test OAuth authorization server on loopback: a key pair, its JWKS
    (and RFC 8414 metadata), and access tokens signed with it."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "test-key-1"
        self.fetches = 0
        self.up = True
        issuer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                if not issuer.up:
                    self.send_response(503)
                    self.end_headers()
                    return
                if self.path == "/jwks.json":
                    issuer.fetches += 1
                    body = json.dumps(issuer.jwks()).encode()
                elif self.path == "/.well-known/oauth-authorization-server":
                    body = json.dumps({"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks.json"}).encode()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def jwks(self) -> dict:
        n = self.key.public_key().public_numbers()
        as_bytes = lambda i: i.to_bytes((i.bit_length() + 7) // 8, "big")  # noqa: E731
        return {"keys": [{"kty": "RSA", "kid": self.kid, "use": "sig", "alg": "RS256",
                          "n": b64url(as_bytes(n.n)), "e": b64url(as_bytes(n.e))}]}

    def token(self, audience: str, sub: str = "tester", scope: str = ALL_SCOPES, key: Any = None,
              kid: str | None = None, alg: str = "RS256", **claims: Any) -> str:
        import jwt
        now = int(time.time())
        body = {"iss": self.url, "aud": audience, "sub": sub, "iat": now, "exp": now + 600, "scope": scope}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key or self.key, algorithm=alg, headers={"kid": kid or self.kid})

    def close(self) -> None:
        self.httpd.shutdown()


_ISSUER: Issuer | None = None


def issuer() -> Issuer:
    global _ISSUER
    if _ISSUER is None:
        _ISSUER = Issuer()
    return _ISSUER


class HttpServer:
    """`serve --http` on a loopback port, its log drained to a file.
    `principals`: names given tokens of a tokens file; `oauth`: also (or
    instead) accept the test issuer's tokens; `http_config`: more of the
    [http] table, as TOML lines."""

    def __init__(self, bin: str, scratch: pathlib.Path, config: str | None = None, env: dict | None = None,
                 cwd: str | None = None, principals: tuple[str, ...] = ("tester",), oauth: bool = False,
                 http_config: str = "", extra_args: tuple[str, ...] = (), address: str | None = None,
                 tokens_mode: int = 0o600, log: pathlib.Path | None = None, tokens: dict | None = None,
                 sockets: tuple[Any, ...] = ()) -> None:
        """`tokens`: the principals' tokens, when another server's are to be
        taken (replicas behind one balancer); else new ones. `sockets`: passed
        as systemd passes a socket unit's (fd 3 on, LISTEN_FDS, LISTEN_PID),
        to `--http systemd`."""
        self.dir = scratch
        self.tokens = dict(tokens) if tokens else {name: "nsm_" + secrets.token_urlsafe(32) for name in principals}
        inet = [s for s in sockets if getattr(s, "family", None) in (socket.AF_INET, socket.AF_INET6)]
        self.port = inet[0].getsockname()[1] if inet else free_port()
        self.resource = f"http://127.0.0.1:{self.port}/mcp"
        table = ""
        if principals:
            path = self.dir / "tokens"
            path.write_text("".join(token_line(n, t) for n, t in self.tokens.items()))
            path.chmod(tokens_mode)
            table += f"tokens_file = {json.dumps(str(path))}\n"
        if oauth:
            table += f"resource = {json.dumps(self.resource)}\n"
        table += http_config
        text = pathlib.Path(config).read_text() if config else ""
        # The [http] table goes first: a table's keys end where the next begins.
        top = f"[http]\n{table}\n"
        if oauth:
            top += f"[http.oauth]\nissuer = {json.dumps(issuer().url)}\n"
        cfg = self.dir / "config.toml"
        cfg.write_text(top + "\n" + text)
        self.log = log or self.dir / "server.log"
        self.address = address or f"127.0.0.1:{self.port}"
        args = [bin, "--config", str(cfg), "serve", "--http", self.address, *extra_args]
        fds = tuple(s.fileno() for s in sockets)
        if sockets:
            args = [*systemd_activation(fds), *args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, env=env, cwd=cwd, stdin=subprocess.DEVNULL, pass_fds=fds,
                                         stdout=subprocess.DEVNULL, stderr=log, start_new_session=False)
        self.url = self.resource
        deadline = time.time() + 90
        while time.time() < deadline:
            if b"listening on" in self.log.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve --http exited {self.proc.returncode}: {self.log_tail()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"serve --http did not listen within 90 s: {self.log_tail()}")

    def token(self, principal: str = "tester") -> str:
        if principal in self.tokens:
            return self.tokens[principal]
        return issuer().token(self.resource, sub=principal)

    def log_tail(self, size: int = 4000) -> str:
        return self.log.read_bytes()[-size:].decode(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def systemd_activation(fds: tuple[int, ...]) -> list[str]:
    """A command prefix that passes open descriptors `fds` to the command as
    systemd passes a socket unit's: at 3, 4, …, with LISTEN_FDS and the
    command's own pid in LISTEN_PID."""
    import sys
    script = (
        "import os, sys\n"
        "fds = [int(f) for f in sys.argv[1].split(',')]\n"
        "moved = [os.dup(f) for f in fds]\n"
        "for i, f in enumerate(moved):\n"
        "    os.dup2(f, 3 + i)\n"
        "    os.set_inheritable(3 + i, True)\n"
        "for f in set(fds + moved) - set(range(3, 3 + len(fds))):\n"
        "    os.close(f)\n"
        "os.environ.update(LISTEN_FDS=str(len(fds)), LISTEN_PID=str(os.getpid()))\n"
        "os.execv(sys.argv[2], sys.argv[2:])\n"
    )
    return [sys.executable, "-c", script, ",".join(map(str, fds))]


@contextlib.asynccontextmanager
async def client(url: str, token: str | None, headers: dict | None = None,
                 callbacks: dict | None = None, terminate_on_close: bool = True) -> AsyncIterator[Any]:
    """An MCP client session over Streamable HTTP presenting `token`;
    `callbacks`: the ClientSession's (elicitation_callback, ...)."""
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    async with create_mcp_http_client(headers=h) as http_client:
        async with streamable_http_client(url, http_client=http_client, terminate_on_close=terminate_on_close) as (r, w):
            async with ClientSession(r, w, **(callbacks or {})) as s:
                yield s
