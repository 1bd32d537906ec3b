"""Drives the real nix-sandbox-mcp binary with the official MCP Python SDK,
over stdio or, with NSM_TRANSPORT=http, Streamable HTTP (http_transport.py). Each test starts its own server (about 0.2 s) so tests stay
independent; helpers cover the common shapes of a call."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import json
import os
import pathlib
import select
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from typing import Any, AsyncIterator

import anyio
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from http_transport import AUTH, TRANSPORT, HttpServer
from http_transport import client as http_client

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("NSM_BIN", str(ROOT / "target" / "debug" / "nix-sandbox-mcp"))
# "closure" when the environments are Nix artifacts (no host /usr inside).
MODE = os.environ.get("NSM_MODE", "host")
# The protocol revision the tests speak: "2025-11-25" (an `initialize`
# handshake) or "2026-07-28" (stateless: `server/discover`, then `_meta` on
# every request). test-local.sh runs the suite once with each.
PROTOCOL = os.environ.get("NSM_PROTOCOL", "2025-11-25")
if PROTOCOL not in ("2025-11-25", "2026-07-28"):
    raise SystemExit(f"NSM_PROTOCOL={PROTOCOL!r}: expected 2025-11-25 or 2026-07-28")
STATELESS = PROTOCOL == "2026-07-28"
PASSTHROUGH = ("NIX_SANDBOX_DIR", "NIX_SANDBOX_ENVS", "NIX_SANDBOX_BUILTIN", "NIX_SANDBOX_LIMITS", "NIX_STORE_DIR", "RUST_LOG",
               "XDG_CONFIG_HOME")


def _scratch(parent: str) -> pathlib.Path:
    d = pathlib.Path(tempfile.mkdtemp(prefix="nsm-tests-", dir=parent))
    d.chmod(0o755)  # a root server's sandbox (uid 65534) enters what is made under it
    return d


def _remove(path: pathlib.Path) -> None:
    def writable_and_again(fn, p, _exc):  # a sandbox may leave a directory without write permission
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
            fn(p)
    shutil.rmtree(path, onerror=writable_and_again)


# Everything a run of the tests writes (projects, configurations, logs) lives
# under one directory per run, removed when the run ends: `tempfile` makes
# its files there, and `var_tmpdir` under /var/tmp (for paths outside /tmp).
SCRATCH = _scratch(tempfile.gettempdir())
tempfile.tempdir = str(SCRATCH)
_VAR_SCRATCH: list[pathlib.Path] = []
atexit.register(lambda: [_remove(d) for d in (SCRATCH, *_VAR_SCRATCH)])


def var_tmpdir() -> pathlib.Path:
    """A fresh directory under /var/tmp, removed with the run's scratch."""
    if not _VAR_SCRATCH:
        _VAR_SCRATCH.append(_scratch("/var/tmp"))
    d = pathlib.Path(tempfile.mkdtemp(prefix="nsm-test-", dir=_VAR_SCRATCH[0]))
    d.chmod(0o755)
    return d


def require_test_knobs() -> None:
    """Fails the calling module's collection unless BIN was built with the
    `test-knobs` feature, whose variables (NIX_SANDBOX_TEST_*) it needs: a
    test build refuses a malformed one, a release ignores it."""
    probe = subprocess.run([BIN, "envs"], capture_output=True, text=True,
                           env={**os.environ, "NIX_SANDBOX_TEST_CONFIRM_TTL_MS": "never"})
    if probe.returncode == 0:
        import pytest
        pytest.fail(f"{BIN} has no test knobs: build it with `cargo build --features test-knobs` (as test-local.sh does)",
                    pytrace=False)


def server_params(config: str | None = None, project: str | None = None, env: dict[str, str] | None = None,
                  cwd: str | None = None) -> StdioServerParameters:
    """`project=""`: no PROJECT_DIR (the server picks its project itself)."""
    args = ["--stdio"]
    if config is not None:
        args = ["--config", config, "--stdio"]
    e = {k: os.environ[k] for k in PASSTHROUGH if k in os.environ}
    if project != "":
        e["PROJECT_DIR"] = project or str(fixture_project())
    e.update(env or {})
    return StdioServerParameters(command=BIN, args=args, env=e, cwd=cwd)


def readable_tmpdir() -> pathlib.Path:
    """A fresh directory a root server's sandbox (uid 65534) can enter."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="nsm-test-"))
    d.chmod(0o755)
    return d


_PROJECT: pathlib.Path | None = None


def fixture_project() -> pathlib.Path:
    """A project directory with a file and a symlink pointing outside it."""
    global _PROJECT
    if _PROJECT is None:
        root = readable_tmpdir()
        proj = root / "project"
        proj.mkdir()
        (proj / "data.txt").write_text("project data\n")
        (root / "outside.txt").write_text("outside\n")
        (proj / "outside-link").symlink_to(root / "outside.txt")
        for p in (proj, proj / "data.txt", root / "outside.txt"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        _PROJECT = proj
    return _PROJECT


@contextlib.asynccontextmanager
async def session(elicit: Any = None, on_message: Any = None, log: pathlib.Path | None = None,
                  **kwargs: Any) -> AsyncIterator[ClientSession]:
    """A client session with a server of its own, over the suite's
    transport (NSM_TRANSPORT): stdio, or Streamable HTTP with a token.
    `elicit`, `on_message`: the client's callbacks; `log`: where the
    server's log goes (else nowhere, or stderr with NSM_SHOW_SERVER_LOG)."""
    callbacks = {"elicitation_callback": elicit, "message_handler": on_message}
    if TRANSPORT == "http":
        async with http_session(callbacks=callbacks, log=log, **kwargs) as s:
            yield s
        return
    quiet = log is None and not os.environ.get("NSM_SHOW_SERVER_LOG")
    with open(log or os.devnull, "w") if log or quiet else contextlib.nullcontext(None) as errlog:
        ctx = stdio_client(server_params(**kwargs), errlog=errlog) if errlog else stdio_client(server_params(**kwargs))
        async with ctx as (r, w):
            async with ClientSession(r, w, **callbacks) as s:
                await start(s)
                yield s


def http_server(config: str | None = None, project: str | None = None, env: dict[str, str] | None = None,
                cwd: str | None = None, **kw: Any) -> HttpServer:
    """`serve --http` with what `server_params` gives a stdio server, and
    credentials of the suite's kind (NSM_AUTH)."""
    from mcp.client.stdio import get_default_environment
    params = server_params(config=config, project=project, env=env, cwd=cwd)
    e = {**get_default_environment(), **(params.env or {})}
    if AUTH == "oauth":
        kw.setdefault("oauth", True)
        kw.setdefault("principals", ())
    # The suite tests the server's own bounds: the one principal's share is
    # all of it (shares are tested in test_http_principals.py).
    kw.setdefault("http_config", SUITE_SHARES)
    d = pathlib.Path(tempfile.mkdtemp(prefix="http-"))
    d.chmod(0o700)
    return HttpServer(BIN, d, config=config, env=e, cwd=cwd, **kw)


SUITE_SHARES = "[http.per_principal]\n" + "".join(
    f"{k} = 100000\n" for k in ("max_connections", "max_streams", "max_runs", "max_jobs", "max_mcp_sessions"))


@contextlib.asynccontextmanager
async def http_session(principal: str = "tester", callbacks: dict | None = None, **kwargs: Any) -> AsyncIterator[ClientSession]:
    server = http_server(**kwargs)
    try:
        async with http_client(server.url, server.token(principal), callbacks=callbacks) as s:
            await start(s)
            yield s
    finally:
        code = server.stop()
        if os.environ.get("NSM_SHOW_SERVER_LOG"):
            print(server.log_tail(20000))
        assert code == 0, f"serve --http exited {code}: {server.log_tail()}"


def stdio_only(why: str) -> Any:
    """Marks a test of what only the stdio transport has (`why`): skipped
    in the HTTP pass, where it is reported at the test."""
    import pytest
    return pytest.mark.skipif(TRANSPORT != "stdio", reason=f"stdio only: {why}")


async def start(s: ClientSession, over_http: bool = TRANSPORT == "http") -> None:
    """Begins talking to the server in the revision the tests speak
    (`over_http`: the session is over HTTP, whatever the suite's transport)."""
    if STATELESS:
        result = await s.discover()
        assert result.supported_versions and PROTOCOL in result.supported_versions, result
        if over_http:
            # As a client does before calling: a call mirrors the arguments
            # the tools mark `x-mcp-header` into headers (Mcp-Param-Session),
            # which it knows from the listing.
            await s.list_tools()
    else:
        await s.initialize()


async def call_tool(s: ClientSession, name: str, args: dict | None = None, **kw: Any) -> types.CallToolResult:
    """Calls a tool as a client does: under the stateless revision an
    `input_required` answer goes through the session's callbacks (the
    elicitation callback for a question) and the call is made again with
    the answers and the state, as the SDK's high-level client does."""
    if not STATELESS:
        return await s.call_tool(name, args or {}, **kw)
    from mcp.client._input_required import run_input_required_driver
    from mcp.client.context import ClientRequestContext

    async def retry(responses: Any, state: str | None) -> Any:
        return await s.call_tool(name, args or {}, input_responses=responses, request_state=state,
                                 allow_input_required=True, **kw)

    async def dispatch(key: str, req: Any) -> Any:
        ctx = ClientRequestContext(session=s, request_id=key, meta=req.params.meta if req.params else None)
        return await s.dispatch_input_request(ctx, req)

    first = await retry(None, None)
    if not isinstance(first, types.InputRequiredResult):
        return first
    return await run_input_required_driver(first, dispatch=dispatch, retry=retry)


@contextlib.asynccontextmanager
async def tool_changes(s: ClientSession, notes: list) -> AsyncIterator[None]:
    """While open, each `notifications/tools/list_changed` the server sends
    is in `notes`: under 2025-11-25 the session's message handler (the
    caller's) puts them there; under 2026-07-28 they come on a
    `subscriptions/listen` stream this opens, and are put there as the same
    notification."""
    if not STATELESS:
        yield
        return
    from mcp.client.subscriptions import listen
    from mcp.shared.subscriptions import ToolsListChanged
    async with listen(s, tools_list_changed=True) as sub:
        assert sub.honored.tools_list_changed, sub.honored
        async with anyio.create_task_group() as tg:
            async def collect() -> None:
                async for event in sub:
                    if isinstance(event, ToolsListChanged):
                        notes.append(types.ToolListChangedNotification())
            tg.start_soon(collect)
            yield
            tg.cancel_scope.cancel()


def legacy_only(why: str) -> Any:
    """Marks a test of what only the handshake revisions have (`why`):
    skipped in the stateless pass, where it is reported at the test."""
    import pytest
    return pytest.mark.skipif(STATELESS, reason=f"2025-11-25 only: {why}")


def stateless_only() -> Any:
    """Marks a test of what only 2026-07-28 has: skipped in the 2025-11-25 pass."""
    import pytest
    return pytest.mark.skipif(not STATELESS, reason="2026-07-28 only: runs in the stateless pass of the suite")


class RootsClient:
    """A client with roots it can change, and the tool-list notifications it got."""

    def __init__(self, roots: list[str] | None) -> None:
        self.roots = roots
        self.asked = 0
        self.tools_changed = 0

    async def list_roots(self, _context: Any) -> types.ListRootsResult:
        self.asked += 1
        return types.ListRootsResult(roots=[types.Root(uri=u) for u in self.roots or []])

    async def on_message(self, message: Any) -> None:
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            self.tools_changed += 1

    async def wait_tools_changed(self, seen: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.tools_changed <= seen and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert self.tools_changed > seen, "no notifications/tools/list_changed"


@contextlib.asynccontextmanager
async def roots_session(client: RootsClient, cwd: pathlib.Path, project: str = "", env: dict[str, str] | None = None,
                        config: str | None = None) -> AsyncIterator[ClientSession]:
    """A session of a client that lists `client.roots` (none: no roots
    capability), with the server started in `cwd`; no PROJECT_DIR unless `project`."""
    params = server_params(project=project, cwd=str(cwd), env=env, config=config)
    with open(os.devnull, "w") if not os.environ.get("NSM_SHOW_SERVER_LOG") else contextlib.nullcontext(None) as errlog:
        ctx = stdio_client(params, errlog=errlog) if errlog else stdio_client(params)
        async with ctx as (r, w):
            callback = client.list_roots if client.roots is not None else None
            async with ClientSession(r, w, list_roots_callback=callback, message_handler=client.on_message) as s:
                init = await s.initialize()
                assert init.capabilities.tools and init.capabilities.tools.list_changed
                yield s


def run_async(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


async def call(s: ClientSession, env: str, code: str, **extra: Any) -> tuple[dict, str, bool]:
    """Calls run; returns (structured content, text, is_error)."""
    res = await s.call_tool("run", {"env": env, "code": code, **extra})
    text = "".join(getattr(c, "text", "") for c in res.content)
    return res.structured_content or {}, text, bool(res.is_error)


# Orphans of the servers the tests start (and of their sandboxes) are
# reparented to this process rather than to init, so that a sandbox left
# behind is still known to be ours: other test runs on the machine have
# sandboxes of their own.
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def descends_from_us(pid: str) -> bool:
    me = os.getpid()
    while pid not in ("0", "1"):
        try:
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = stat.rsplit(")", 1)[1].split()[1]
        if pid == str(me):
            return True
    return False


def processes_with(marker: str, ours: bool = False) -> list[str]:
    """Host processes whose command line contains `marker`; with `ours`, only
    those descending from this test process."""
    found = []
    me = str(os.getpid())
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit() or p.name == me:
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and (not ours or descends_from_us(p.name)):
            found.append(f"{p.name}: {cmd}")
    return found


_LIMITS: dict | None = None


def limits_info() -> dict:
    """How the server enforces limits here (`envs --json`)."""
    global _LIMITS
    if _LIMITS is None:
        p = server_params()
        out = subprocess.run([BIN, "envs", "--json"], env={**os.environ, **(p.env or {})}, capture_output=True, check=True)
        _LIMITS = json.loads(out.stdout)
    return _LIMITS


def limits_mechanism() -> str:
    """"cgroup v2", "cgroup v1" or "rlimits", as the server reports it."""
    return limits_info()["limits_mechanism"]


def cpu_quota() -> bool:
    """Whether the server enforces `cpus` here (a cgroup with the cpu controller)."""
    return limits_info()["cpu_quota"]


def write_config(text: str) -> str:
    fd, path = tempfile.mkstemp(prefix="nsm-config-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def dump(v: Any) -> str:
    return json.dumps(v, indent=1)[:4000]


# What every request carries under the stateless revision.
STATELESS_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
}


class RawServer:
    """The server driven with hand-written JSON-RPC lines. Its log goes to a
    file, whose end a failed `recv` shows."""

    def __init__(self, config: str | None = None, env: dict[str, str] | None = None) -> None:
        p = server_params(config=config, env=env)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([p.command, *p.args], env={**os.environ, **(p.env or {})}, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log)
        # Lines read from the server but not yet returned: replies that
        # arrive together come in one read.
        self.pending = b""
        if STATELESS:
            self.send({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {}})
            assert PROTOCOL in self.recv()["result"]["supportedVersions"]
            return
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert self.recv()["result"]["protocolVersion"] == "2025-11-25"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg) -> None:
        """Sends `msg`: bytes or a string as they are; a request as a dict
        with, under the stateless revision, the `_meta` it requires."""
        if isinstance(msg, dict) and STATELESS and "method" in msg and "id" in msg:
            params = msg.setdefault("params", {})
            if isinstance(params, dict):
                meta = params.setdefault("_meta", {})
                for key, value in STATELESS_META.items():
                    meta.setdefault(key, value)
        line = msg if isinstance(msg, (bytes, str)) else json.dumps(msg)
        self.proc.stdin.write(line.encode() if isinstance(line, str) else line)
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 10) -> dict:
        """The next line the server writes, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        out = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no answer from the server within {timeout} s; its log ends:\n{self.log_tail()}"
            chunk = os.read(out, 1 << 16)
            assert chunk, f"the server closed its output; its log ends:\n{self.log_tail()}"
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def log_tail(self, size: int = 4000) -> str:
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - size))
        return self.log.read().decode(errors="replace")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def shut_down(self, timeout: float = 20) -> None:
        """Ends the session the way a client does: stdin closes, the server exits."""
        self.proc.stdin.close()
        self.proc.wait(timeout=timeout)


def zombie_children(pid: int) -> list[int]:
    """Processes that have ended but that `pid`, their parent, has not reaped."""
    found = []
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            rest = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if rest[0] == "Z" and int(rest[1]) == pid:
            found.append(int(p.name))
    return found


def local_addresses() -> list[tuple[socket.AddressFamily, str]]:
    """This machine's own addresses, from the kernel's tables: IPv4 from
    /proc/net/fib_trie (`/32 host LOCAL` entries), IPv6 from /proc/net/if_inet6
    (global and host scope, usable ones; a link-local address needs an
    interface to aim at). The only addresses a network test may aim at."""
    v4: list[str] = []
    last = None
    for line in pathlib.Path("/proc/net/fib_trie").read_text().splitlines():
        line = line.strip()
        if line.startswith("|-- "):
            last = line[4:]
        elif line == "/32 host LOCAL" and last and last not in v4:
            v4.append(last)
    v6: list[str] = []
    inet6 = pathlib.Path("/proc/net/if_inet6")
    for line in inet6.read_text().splitlines() if inet6.exists() else []:
        hexaddr, _, _, scope, flags, _ = line.split()
        # scope 0x00 global, 0x10 host; flags 0x40 tentative, 0x08 failed duplicate detection
        if int(scope, 16) in (0x00, 0x10) and int(flags, 16) & 0x48 == 0:
            v6.append(str(ipaddress.IPv6Address(bytes.fromhex(hexaddr))))
    assert "127.0.0.1" in v4, v4
    if all(ipaddress.ip_address(a).is_loopback for a in v4 + v6):
        warnings.warn("this machine has no address besides loopback; only loopback is probed")
    return [(socket.AF_INET, a) for a in v4] + [(socket.AF_INET6, a) for a in v6]


class HostListeners:
    """A TCP listener and a UDP socket on each of this machine's own addresses
    (loopback and every interface): what a sandbox with a network would reach.
    `reached()` says what arrived."""

    def __init__(self) -> None:
        self.token = f"nsm-probe-{uuid.uuid4().hex[:12]}"
        self.targets: list[tuple[socket.AddressFamily, str, socket.socket, socket.socket]] = []
        for family, host in local_addresses():
            tcp = socket.socket(family, socket.SOCK_STREAM)
            tcp.bind((host, 0))
            tcp.listen(16)
            tcp.setblocking(False)
            udp = socket.socket(family, socket.SOCK_DGRAM)
            udp.bind((host, 0))
            udp.setblocking(False)
            self.targets.append((family, host, tcp, udp))

    def ports(self) -> list[tuple[int, str, int, int]]:
        """(family number, address, TCP port, UDP port) for each listener pair."""
        return [(int(f), h, t.getsockname()[1], u.getsockname()[1]) for f, h, t, u in self.targets]

    def python_probe(self) -> str:
        """Connects to every listener and sends the token over TCP and UDP;
        prints `tcp <address> connected` or `tcp <address> failed <errno>`."""
        return (
            "import socket\n"
            f"token = {self.token.encode()!r}\n"
            f"for family, host, tcp, udp in {self.ports()!r}:\n"
            "    c = socket.socket(family, socket.SOCK_STREAM); c.settimeout(3)\n"
            "    try:\n"
            "        c.connect((host, tcp)); c.sendall(token); print('tcp', host, 'connected')\n"
            "    except OSError as e:\n"
            "        print('tcp', host, 'failed', e.errno)\n"
            "    c.close()\n"
            "    u = socket.socket(family, socket.SOCK_DGRAM)\n"
            "    try:\n"
            "        u.sendto(token, (host, udp)); print('udp', host, 'sent')\n"
            "    except OSError as e:\n"
            "        print('udp', host, 'failed', e.errno)\n"
        )

    def expected(self) -> list[str]:
        """What `reached()` says when every probe got through."""
        return sorted(f"{proto} {host} {self.token}" for _, host, _, _ in self.targets for proto in ("tcp", "udp"))

    def reached(self) -> list[str]:
        """Every connection and datagram the listeners got, as `tcp <address>
        <what was sent>` and `udp <address> <what was sent>`, sorted."""
        seen = []
        for _, host, tcp, udp in self.targets:
            while True:
                try:
                    conn, _ = tcp.accept()
                except BlockingIOError:
                    break
                conn.settimeout(5)
                data = b""
                with conn:
                    while chunk := conn.recv(4096):
                        data += chunk
                seen.append(f"tcp {host} {data.decode(errors='replace')}")
            while True:
                try:
                    data, _ = udp.recvfrom(4096)
                except BlockingIOError:
                    break
                seen.append(f"udp {host} {data.decode(errors='replace')}")
        return sorted(seen)

    def close(self) -> None:
        for _, _, tcp, udp in self.targets:
            tcp.close()
            udp.close()


TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}


class TaskClient:
    """A raw client that declares the tasks extension on every request (the
    Python SDK has no client for the extension)."""

    def __init__(self, config: str | None = None) -> None:
        self.srv = RawServer(config=config)
        self.next_id = 100

    def request(self, method: str, params: dict, capabilities: dict | None = None) -> dict:
        self.next_id += 1
        meta = {"io.modelcontextprotocol/clientCapabilities": TASKS if capabilities is None else capabilities}
        self.srv.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": {**params, "_meta": meta}})
        while True:
            reply = self.srv.recv(timeout=30)
            if reply.get("id") == self.next_id:
                return reply

    def call(self, tool: str, args: dict) -> dict:
        return self.request("tools/call", {"name": tool, "arguments": args})

    def run(self, code: str, **extra) -> dict:
        return self.request("tools/call", {"name": "run", "arguments": {"env": "bash", "code": code, **extra}})

    def get(self, task_id: str) -> dict:
        return self.request("tasks/get", {"taskId": task_id})

    def until(self, task_id: str, status: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            r = self.get(task_id)["result"]
            if r["status"] == status or time.monotonic() > deadline:
                assert r["status"] == status, r
                return r
            time.sleep(0.1)
