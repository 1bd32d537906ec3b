#!/usr/bin/env python3
"""Times one `run` call against its floor, in one interleaved run, and prints
medians, p95 and ratios to bare bubblewrap.

Rows, for the same program (`bash` running `:`, `python3` running `pass`,
`node` running `0`):
  host          the interpreter with no sandbox
  bare bwrap    bubblewrap with every namespace and /usr read-only (the floor)
  MCP run       a tools/call round trip to a running server (limits on; the
                sandbox waits with its interpreter already started)
  MCP, cold interpreter
                the same with interpreters started by the call
                (NIX_SANDBOX_WARM_START=off)
  MCP, cold pool
                the same with no sandbox set up ahead of the call: each call
                sets its own up (NIX_SANDBOX_POOL=off; what a call costs when
                a burst has used the pool up)
  MCP, rlimits  the same as MCP run with cgroups off (NIX_SANDBOX_LIMITS=rlimits)
  CLI run       `nix-sandbox-mcp run` (a whole process start per call, like bin/run)

The MCP client is a minimal JSON-RPC writer/reader on the server's pipes, so
the numbers are the server's cost, not a client library's.

usage: bench/bench.py [--bin target/release/nix-sandbox-mcp] [--runs 200] [--cli-runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


class Server:
    def __init__(self, binary: str, env: dict[str, str], args: list[str] | None = None) -> None:
        self.proc = subprocess.Popen([binary, *(args or []), "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env={**os.environ, **env})
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "1"}})
        self.notify("notifications/initialized")

    def notify(self, method: str) -> None:
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.next_id:
                return reply

    def run(self, env: str, code: str) -> None:
        r = self.request("tools/call", {"name": "run", "arguments": {"env": env, "code": code}})
        assert r["result"]["structuredContent"]["ok"], r

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def bare_bwrap(script: str, interpreter: str) -> list[str]:
    args = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr"]
    for d in ("bin", "lib", "lib64", "sbin"):
        p = pathlib.Path("/") / d
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    return args + ["--proc", "/proc", "--dev", "/dev", "--ro-bind", script, "/s", interpreter, "/s"]


def parse_args(doc: str, runs: int = 200, **extra: int | bool) -> argparse.Namespace:
    """--bin (checked to exist), --runs, --json, and each `extra` as an
    integer option, or a flag when its default is a bool."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "nix-sandbox-mcp"))
    ap.add_argument("--runs", type=int, default=runs)
    ap.add_argument("--json", help="also write the tables and metrics to this file (for bench/speed.py)")
    for name, default in extra.items():
        if isinstance(default, bool):
            ap.add_argument(f"--{name.replace('_', '-')}", action="store_true", default=default)
        else:
            ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    a = ap.parse_args()
    if not pathlib.Path(a.bin).exists():
        raise SystemExit(f"{a.bin} not found: build it with `cargo build --release`")
    return a


class Table:
    """A result table: printed for a person, and handed to bench/speed.py,
    which renders it into the docs."""

    def __init__(self, name: str, columns: list[str]) -> None:
        self.name = name
        self.columns = columns
        self.rows: list[list] = []

    def add(self, row: list) -> None:
        self.rows.append(row)

    @staticmethod
    def cell(v) -> str:
        if isinstance(v, float):
            return "" if v != v else f"{v:.2f}"
        return str(v)

    def text(self) -> str:
        cells = [self.columns] + [[self.cell(v) for v in r] for r in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                         for r in cells)

    def to_json(self) -> dict:
        return {"name": self.name, "columns": self.columns, "rows": self.rows}


def stats(xs: list[float]) -> tuple[float, float]:
    """Median and p95."""
    s = sorted(xs)
    return statistics.median(s), s[min(len(s) - 1, int(len(s) * 0.95))]


def write_json(a: argparse.Namespace, result: dict) -> None:
    """Writes `result` ({"tables": [Table], "metrics": {...}}) where --json says."""
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(
            {"tables": [t.to_json() for t in result["tables"]], "metrics": result["metrics"]}))


def report(a: argparse.Namespace, result: dict) -> None:
    """Prints `result`'s title and tables, and writes it where --json says."""
    print(result["title"])
    for t in result["tables"]:
        print(t.text())
    write_json(a, result)


def workdir() -> tuple[str, dict[str, str]]:
    """A scratch directory with an empty project, and the server environment for it."""
    work = tempfile.mkdtemp(prefix="nsm-bench-")
    os.chmod(work, 0o755)  # a root server runs sandboxes as an unprivileged uid
    project = pathlib.Path(work) / "project"
    project.mkdir(mode=0o755)
    return work, {"PROJECT_DIR": str(project), "RUST_LOG": "error"}


def quiet(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Runs a program to success, its output dropped (node outside a
    sandbox warns about missing certificates, the CLI about interpreters
    it passed over)."""
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


LABELS = ["host", "bare bwrap", "MCP run", "MCP, cold interpreter", "MCP, cold pool", "MCP run, rlimits only",
          "CLI run (bin/run)"]


def measure(binary: str, runs: int, cli_runs: int, variants: bool = True) -> dict:
    """`variants`: also the cold interpreter, cold pool and rlimits rows."""
    work, env = workdir()
    programs = {"bash": (":\n", "/usr/bin/bash"), "python": ("pass\n", "/usr/bin/python3"),
                "node": ("0\n", shutil.which("node") or "/usr/bin/node")}
    scripts = {}
    for name, (code, _) in programs.items():
        p = pathlib.Path(work) / f"{name}.script"
        p.write_text(code)
        scripts[name] = str(p)

    servers = {"MCP run": Server(binary, env)}
    if variants:
        servers["MCP, cold interpreter"] = Server(binary, {**env, "NIX_SANDBOX_WARM_START": "off"})
        servers["MCP, cold pool"] = Server(binary, {**env, "NIX_SANDBOX_POOL": "off"})
        servers["MCP run, rlimits only"] = Server(binary, {**env, "NIX_SANDBOX_LIMITS": "rlimits"})
    rows: dict[tuple[str, str], list[float]] = {}

    def add(label: str, prog: str, ms: float) -> None:
        rows.setdefault((prog, label), []).append(ms)

    for name, (code, interp) in programs.items():
        for _ in range(10):  # warm caches and the cgroup pool
            for server in servers.values():
                server.run(name, code)
            quiet(bare_bwrap(scripts[name], interp))
        for i in range(runs):
            add("host", name, timed(lambda: quiet([interp, scripts[name]])))
            add("bare bwrap", name, timed(lambda: quiet(bare_bwrap(scripts[name], interp))))
            for label, server in servers.items():
                add(label, name, timed(lambda: server.run(name, code)))
            if i < cli_runs:
                cli = [binary, "run", "--env", name, code]
                add("CLI run (bin/run)", name, timed(lambda: quiet(cli, {**os.environ, **env})))
    for server in servers.values():
        server.close()
    shutil.rmtree(work, ignore_errors=True)
    table = ratio_table("calls", rows, list(programs), [label for label in LABELS if any(k[1] == label for k in rows)])
    metrics = {}
    for name in programs:
        bare = statistics.median(rows[(name, "bare bwrap")])
        host = statistics.median(rows[(name, "host")])
        mcp = statistics.median(rows[(name, "MCP run")])
        metrics[f"calls.{name}.run_over_bare"] = mcp / bare
        metrics[f"calls.{name}.run_over_host"] = mcp / host
        metrics[f"calls.{name}.run_ms"] = mcp
    return {"tables": [table], "metrics": metrics}


def main() -> None:
    a = parse_args(__doc__, cli_runs=30)
    result = measure(a.bin, a.runs, a.cli_runs)
    for t in result["tables"]:
        print(t.text())
    write_json(a, result)


def ratio_table(name: str, rows: dict[tuple[str, str], list[float]], programs: list[str], labels: list[str]) -> Table:
    """Median, p95 and the median's ratios to bare bubblewrap and to the
    host, per (program, label)."""
    table = Table(name, ["program", "path", "median ms", "p95 ms", "÷ bare bwrap", "÷ host"])
    for name in programs:
        floor = statistics.median(rows[(name, "bare bwrap")])
        host = statistics.median(rows.get((name, "host"), [float("nan")]))
        for label in labels:
            if (name, label) not in rows:
                continue
            med, p95 = stats(rows[(name, label)])
            table.add([name, label, med, p95, med / floor, med / host])
    return table


if __name__ == "__main__":
    main()
