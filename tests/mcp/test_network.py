"""Network by allowlist through the real binary: the sandbox's only way out
is the daemon's proxy, which lets through the hosts an environment lists and
refuses the rest, visibly. No test leaves this machine: the upstream servers
listen on loopback, and the proxy's resolver is pointed at them with
NIX_SANDBOX_TEST_RESOLVE (names under .test)."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import shutil
import socket
import tempfile
import threading

import pytest

from harness import MODE, call, dump, require_test_knobs, run_async, session, write_config

require_test_knobs()

pytestmark = pytest.mark.skipif(MODE != "host", reason="the proxy is tested in host mode")


class Upstream:
    """A plain HTTP server on loopback that counts the requests it gets, and
    a TCP echo server for CONNECT tunnels."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream.hits.append(self.headers.get("Host", ""))
                body = b"hello from upstream\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.echo = socket.socket()
        self.echo.bind(("127.0.0.1", 0))
        self.echo.listen(8)
        self.echo_port = self.echo.getsockname()[1]
        threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        while True:
            try:
                conn, _ = self.echo.accept()
            except OSError:
                return
            data = conn.recv(1024)
            conn.sendall(b"echo:" + data)
            conn.close()

    def close(self) -> None:
        self.http.shutdown()
        self.echo.close()


@pytest.fixture(scope="module")
def upstream():
    u = Upstream()
    yield u
    u.close()


NAMES = ["allowed.test", "api.example.test", "example.test", "denied.test", "rebind.test"]


def server_env() -> dict[str, str]:
    return {"NIX_SANDBOX_TEST_RESOLVE": ",".join(f"{n}=127.0.0.1" for n in NAMES)}


CONFIG = (
    '[environments.web]\npreset = "python"\n'
    # The upstream servers are on this machine's loopback, which the proxy
    # refuses unless a range is listed: here it is, for the test.
    'network = { allow = ["allowed.test", "*.example.test", "127.0.0.0/8"] }\n'
    '[environments.strict]\npreset = "python"\nnetwork = { allow = ["rebind.test"] }\n'
    '[environments.offline]\npreset = "python"\n'
)


def fetch(url: str) -> str:
    return (
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    print('status', urllib.request.urlopen({url!r}, timeout=10).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('status', e.code); print(e.read().decode())\n"
        "except Exception as e:\n"
        "    print('failed', type(e).__name__, e)\n"
    )


def with_server(fn, config: str = CONFIG):
    async def t():
        async with session(config=write_config(config), env=server_env()) as s:
            await fn(s)
    run_async(t)


def test_an_allowed_host_is_reached_through_the_proxy(upstream):
    async def t(s):
        sc, text, err = await call(s, "web", fetch(f"http://allowed.test:{upstream.port}/"))
        assert not err and "status 200" in sc["stdout"], dump(sc)
        assert "network_denied" not in sc, dump(sc)
        assert sc["network"]["allowed"][0]["host"] == "allowed.test", dump(sc)
    with_server(t)
    assert f"allowed.test:{upstream.port}" in upstream.hits


def test_a_denied_host_gets_a_403_naming_it_and_the_result_lists_it(upstream):
    before = len(upstream.hits)

    async def t(s):
        sc, text, err = await call(s, "web", fetch(f"http://denied.test:{upstream.port}/"))
        assert "status 403" in sc["stdout"] and "denied.test" in sc["stdout"], dump(sc)
        assert "allowlist" in sc["stdout"], dump(sc)
        assert sc["network_denied"] == ["denied.test"], dump(sc)
        assert "network: refused denied.test" in text and "allowlist" in text, text
    with_server(t)
    assert len(upstream.hits) == before


def test_a_wildcard_matches_subdomains_only(upstream):
    async def t(s):
        sc, _, _ = await call(s, "web", fetch(f"http://api.example.test:{upstream.port}/"))
        assert "status 200" in sc["stdout"], dump(sc)
        sc, _, _ = await call(s, "web", fetch(f"http://example.test:{upstream.port}/"))
        assert "status 403" in sc["stdout"] and sc["network_denied"] == ["example.test"], dump(sc)
    with_server(t)


def test_an_allowed_name_that_resolves_to_loopback_is_refused(upstream):
    """DNS rebinding: the name is on the list, its address is this
    machine's loopback, which the list does not name: refused."""
    before = len(upstream.hits)

    async def t(s):
        sc, _, _ = await call(s, "strict", fetch(f"http://rebind.test:{upstream.port}/"))
        assert "status 403" in sc["stdout"], dump(sc)
        assert sc["network_denied"] == ["rebind.test"], dump(sc)
        assert sc["network"]["denied"][0]["rule"] == "refused-address", dump(sc)
    with_server(t)
    assert len(upstream.hits) == before


def test_connect_tunnels_carry_bytes_both_ways(upstream):
    code = (
        "import os, socket\n"
        "proxy = os.environ['HTTPS_PROXY'].rsplit(':', 1)\n"
        "s = socket.create_connection(('127.0.0.1', int(proxy[1])), timeout=10)\n"
        f"s.sendall(b'CONNECT allowed.test:{upstream.echo_port} HTTP/1.1\\r\\nHost: allowed.test:{upstream.echo_port}\\r\\n\\r\\n')\n"
        "head = b''\n"
        "while b'\\r\\n\\r\\n' not in head:\n"
        "    head += s.recv(1)\n"
        "print(head.split(b'\\r\\n')[0].decode())\n"
        "s.sendall(b'ping')\n"
        "print(s.recv(100).decode())\n"
    )

    async def t(s):
        sc, _, err = await call(s, "web", code)
        assert not err and " 200" in sc["stdout"] and "echo:ping" in sc["stdout"], dump(sc)
    with_server(t)


def test_code_that_ignores_the_proxy_reaches_nothing(upstream):
    """No route out, no resolver: a direct connection to the upstream's port
    (on loopback, which in the sandbox is its own) or a DNS lookup fails."""
    before = len(upstream.hits)
    code = (
        "import socket\n"
        f"for target in [('127.0.0.1', {upstream.port}), ('allowed.test', {upstream.port})]:\n"
        "    try:\n"
        "        socket.create_connection(target, timeout=5)\n"
        "        print('reached', target)\n"
        "    except OSError as e:\n"
        "        print('failed', target, type(e).__name__)\n"
    )

    async def t(s):
        sc, _, err = await call(s, "web", code)
        assert not err and "reached" not in sc["stdout"] and sc["stdout"].count("failed") == 2, dump(sc)
    with_server(t)
    assert len(upstream.hits) == before


def test_an_environment_without_network_has_no_proxy(upstream):
    async def t(s):
        sc, _, err = await call(s, "offline", "import os\nprint(sorted(k for k in os.environ if 'proxy' in k.lower()))")
        assert not err and sc["stdout"].strip() == "[]", dump(sc)
        sc, _, _ = await call(s, "offline", fetch(f"http://allowed.test:{upstream.port}/"))
        assert "failed" in sc["stdout"], dump(sc)
    with_server(t)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed on this host")
def test_curl_follows_the_proxy_variables(upstream):
    config = CONFIG + '[environments.shell]\npreset = "bash"\nnetwork = { allow = ["allowed.test", "127.0.0.0/8"] }\n'

    async def t(s):
        sc, _, err = await call(s, "shell", f"curl -sS http://allowed.test:{upstream.port}/; curl -sS -o /dev/null -w '%{{http_code}}\\n' http://denied.test:{upstream.port}/")
        assert "hello from upstream" in sc["stdout"] and "403" in sc["stdout"], dump(sc)
    with_server(t, config)


def test_sessions_and_jobs_report_their_own_denials(upstream):
    async def t(s):
        sc, _, _ = await call(s, "web", fetch(f"http://denied.test:{upstream.port}/"), session="net")
        assert sc["network_denied"] == ["denied.test"], dump(sc)
        sc, _, _ = await call(s, "web", fetch(f"http://allowed.test:{upstream.port}/"), session="net")
        assert "status 200" in sc["stdout"] and "network_denied" not in sc, dump(sc)
        started, _, _ = await call(s, "web", fetch(f"http://example.test:{upstream.port}/"), background=True)
        res = await s.call_tool("job", {"id": started["job"], "wait_seconds": 30})
        job = res.structured_content
        assert job["state"] == "finished" and job["network_denied"] == ["example.test"], dump(job)
    with_server(t)


def test_the_audit_log_records_allowed_and_denied_hosts(upstream):
    log = pathlib.Path(tempfile.mkdtemp()) / "audit.jsonl"
    config = CONFIG + f'[server]\naudit_log = "{log}"\n'

    async def t(s):
        await call(s, "web", fetch(f"http://allowed.test:{upstream.port}/") + fetch(f"http://denied.test:{upstream.port}/"))
    with_server(t, config)
    entry = json.loads(log.read_text().splitlines()[-1])
    assert [a["host"] for a in entry["network"]["allowed"]] == ["allowed.test"], entry
    assert [d["host"] for d in entry["network"]["denied"]] == ["denied.test"], entry
    os.remove(log)


def command_fetch(name: str, urls: list[str], network: str | None, env: str = "web") -> str:
    script = "".join(fetch(u) for u in urls)
    argv = json.dumps(["python3", "-c", script])
    line = f"network = {network}\n" if network else ""
    return f'[commands.{name}]\ndescription = "Fetch"\nenv = "{env}"\nargv = {argv}\n{line}'


def test_a_declared_commands_network_is_its_own_off_by_default_else_its_allowlist(upstream):
    allowed, denied = f"http://allowed.test:{upstream.port}/", f"http://denied.test:{upstream.port}/"
    config = (CONFIG
              # In an environment with network, a command without `network` has none.
              + command_fetch("fetch_default", [allowed], None)
              # Its own allowlist, narrower than the environment's, through the proxy.
              + command_fetch("fetch_listed", [allowed, denied], '{ allow = ["allowed.test", "127.0.0.0/8"] }',
                              env="offline"))

    async def t(s):
        r = await s.call_tool("fetch_default", {})
        out = r.structured_content["stdout"]
        assert out.startswith("failed"), out
        assert "network" not in r.structured_content or not r.structured_content["network"].get("allowed"), r
        r = await s.call_tool("fetch_listed", {})
        sc = r.structured_content
        assert sc["stdout"].startswith("status 200\nstatus 403"), sc
        assert [a["host"] for a in sc["network"]["allowed"]] == ["allowed.test"], sc
        assert "denied.test" in " ".join(sc["network_denied"]), sc
    with_server(t, config)
