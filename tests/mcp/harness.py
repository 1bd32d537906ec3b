"""Drives the real nix-sandbox-mcp binary over stdio with the official MCP
Python SDK. Each test starts its own server (about 0.2 s) so tests stay
independent; helpers cover the common shapes of a call."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import select
import subprocess
import tempfile
from typing import Any, AsyncIterator

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("NSM_BIN", str(ROOT / "target" / "debug" / "nix-sandbox-mcp"))
# "closure" when the environments are Nix artifacts (no host /usr inside).
MODE = os.environ.get("NSM_MODE", "host")
PASSTHROUGH = ("NIX_SANDBOX_DIR", "NIX_SANDBOX_ENVS", "NIX_SANDBOX_BUILTIN", "NIX_STORE_DIR", "RUST_LOG", "XDG_CONFIG_HOME")


def server_params(config: str | None = None, project: str | None = None, env: dict[str, str] | None = None) -> StdioServerParameters:
    args = ["--stdio"]
    if config is not None:
        args = ["--config", config, "--stdio"]
    e = {k: os.environ[k] for k in PASSTHROUGH if k in os.environ}
    e["PROJECT_DIR"] = project or str(fixture_project())
    e.update(env or {})
    return StdioServerParameters(command=BIN, args=args, env=e)


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
async def session(**kwargs: Any) -> AsyncIterator[ClientSession]:
    with open(os.devnull, "w") if not os.environ.get("NSM_SHOW_SERVER_LOG") else contextlib.nullcontext(None) as errlog:
        ctx = stdio_client(server_params(**kwargs), errlog=errlog) if errlog else stdio_client(server_params(**kwargs))
        async with ctx as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                yield s


def run_async(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


async def call(s: ClientSession, env: str, code: str, **extra: Any) -> tuple[dict, str, bool]:
    """Calls run; returns (structured content, text, is_error)."""
    res = await s.call_tool("run", {"env": env, "code": code, **extra})
    text = "".join(getattr(c, "text", "") for c in res.content)
    return res.structured_content or {}, text, bool(res.is_error)


def processes_with(marker: str) -> list[str]:
    """Host processes whose command line contains `marker`."""
    found = []
    me = str(os.getpid())
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit() or p.name == me:
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            found.append(f"{p.name}: {cmd}")
    return found


_MECHANISM: str | None = None


def limits_mechanism() -> str:
    """"cgroup v2", "cgroup v1" or "rlimits", as the server reports it."""
    global _MECHANISM
    if _MECHANISM is None:
        import subprocess

        p = server_params()
        out = subprocess.run([BIN, "envs", "--json"], env={**os.environ, **(p.env or {})}, capture_output=True, check=True)
        _MECHANISM = json.loads(out.stdout)["limits_mechanism"]
    return _MECHANISM


def write_config(text: str) -> str:
    fd, path = tempfile.mkstemp(prefix="nsm-config-", suffix=".toml")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def dump(v: Any) -> str:
    return json.dumps(v, indent=1)[:4000]


class RawServer:
    """The server driven with hand-written JSON-RPC lines."""

    def __init__(self, config: str | None = None) -> None:
        p = server_params(config=config)
        self.proc = subprocess.Popen([p.command, *p.args], env={**os.environ, **(p.env or {})}, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
        assert self.recv()["result"]["protocolVersion"] == "2025-11-25"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg) -> None:
        line = msg if isinstance(msg, (bytes, str)) else json.dumps(msg)
        self.proc.stdin.write(line.encode() if isinstance(line, str) else line)
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 10) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "no answer from the server"
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
