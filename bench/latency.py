#!/usr/bin/env python3
"""Latencies the tests check only by order and outcome (a busy answer comes
while the slot is held, a quick call finishes while a slow one runs, a
cancelled run leaves nothing behind), measured over MCP and printed as
medians and p95.

Rows:
  cancel to sandbox gone   from notifications/cancelled to the last process
                           of the run gone from the host (target: 100 ms)
  busy answer              a call to a server whose run slot and queue are full
  run, idle server         `run` of python `pass`
  run, one run in flight   the same while another call's run is in flight
  background start         a `run` with background=true, until its answer

usage: bench/latency.py [--bin target/release/nix-sandbox-mcp] [--runs 200]
"""

from __future__ import annotations

import json
import pathlib
import shutil
import statistics
import time
import uuid

from bench import Server, parse_args, workdir


class Client(Server):
    """A server whose requests can be left in flight and cancelled."""

    def send(self, method: str, params: dict) -> int:
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def cancel(self, request_id: int) -> None:
        msg = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def call(self, arguments: dict) -> dict:
        return self.request("tools/call", {"name": "run", "arguments": arguments})["result"]


def processes_with(marker: str) -> bool:
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker.encode() in (p / "cmdline").read_bytes():
                    return True
            except OSError:
                pass
    return False


def hold(client: Client) -> tuple[int, str]:
    """Starts a run that sleeps until cancelled; returns once it is running."""
    marker = str(uuid.uuid4().int % 10**8)
    rid = client.send("tools/call", {"name": "run", "arguments": {"env": "bash", "code": f"sleep {marker}"}})
    deadline = time.monotonic() + 30
    while not processes_with(marker):
        if time.monotonic() > deadline:
            raise SystemExit("a held run never started")
        time.sleep(0.005)
    return rid, marker


def release(client: Client, held: tuple[int, str]) -> float:
    """Cancels a held run; milliseconds until its last process is gone."""
    rid, marker = held
    t = time.perf_counter()
    client.cancel(rid)
    while processes_with(marker):
        time.sleep(0.001)
    return (time.perf_counter() - t) * 1000


def configured(work: str, name: str, toml: str) -> dict[str, str]:
    """The server environment that makes it read `toml` as its configuration."""
    home = pathlib.Path(work) / name
    (home / "nix-sandbox-mcp").mkdir(parents=True)
    (home / "nix-sandbox-mcp" / "config.toml").write_text(toml)
    return {"XDG_CONFIG_HOME": str(home)}


def main() -> None:
    a = parse_args(__doc__)
    work, env = workdir()
    plain = Client(a.bin, env)
    full = Client(a.bin, {**env, **configured(work, "full", "[server]\nmax_concurrent_runs = 1\nmax_queued_runs = 0\n")})
    rows: dict[str, list[float]] = {}

    def timed(label: str, fn) -> None:
        t = time.perf_counter()
        fn()
        rows.setdefault(label, []).append((time.perf_counter() - t) * 1000)

    quick = {"env": "python", "code": "pass"}
    for _ in range(5):  # warm caches and prepared sandboxes
        plain.call(quick)
    for _ in range(a.runs):
        rows.setdefault("cancel to sandbox gone", []).append(release(plain, hold(plain)))
        timed("run, idle server", lambda: plain.call(quick))
        held = hold(plain)
        timed("run, one run in flight", lambda: plain.call(quick))
        release(plain, held)

    def busy() -> None:
        r = full.call({"env": "bash", "code": ":"})
        assert r["structuredContent"]["error"]["code"] == "busy", r

    held = hold(full)
    for _ in range(a.runs):
        timed("busy answer", busy)
    release(full, held)

    background = Client(a.bin, {**env, **configured(work, "jobs", f"[server]\nmax_jobs = {a.runs + 10}\n")})
    for _ in range(a.runs):
        timed("background start", lambda: background.call({"env": "bash", "code": ":", "background": True}))

    for c in (plain, full, background):
        c.close()
    shutil.rmtree(work, ignore_errors=True)

    print(f"{'what':28} {'median ms':>10} {'p95 ms':>8}")
    for label, xs in rows.items():
        xs = sorted(xs)
        p95 = xs[min(len(xs) - 1, int(len(xs) * 0.95))]
        print(f"{label:28} {statistics.median(xs):10.2f} {p95:8.2f}")


if __name__ == "__main__":
    main()
