#!/usr/bin/env python3
"""Sustained throughput: calls per second with k calls always in flight (a
new one the moment one ends, so the server has no idle time to prepare the
next sandbox ahead), against bare bubblewrap running the same program the
same way, k at a time, in the same run.

Rows, per k (default 1, 2, 4, 8), each for --seconds in each of --rounds
rounds; within a round the rows of one k run back to back, in an order
that is reversed every other round, so that a drift in the host's speed
(other tenants, frequency) falls on every row alike rather than on the
last one:
  bare bwrap    k threads, each starting bubblewrap (every namespace, /usr
                read-only) back to back
  MCP run       k tools/call requests in flight on one server (limits on:
                the cgroup where the server has one, rlimits otherwise)
  MCP, rlimits  the same with cgroups off (NIX_SANDBOX_LIMITS=rlimits)

The server runs with max_concurrent_runs = the largest k, so that every
call in flight has a sandbox, and a memory budget that holds every call in
flight and as many sandboxes prepared ahead: on a machine with little
memory the default budget (half of it) would otherwise hold fewer, and
the rate measured would be the budget's (which queues calls beyond it, by
design), not the sandboxes'. Any call that is not ok is counted by its
error code and printed: under load there must be none. The ratio is over
all rounds; beside it, the lowest and highest of the rounds' own ratios
(each against bare bubblewrap in the same round), which show how much of a
difference between two rows is noise.

Each row also shows the CPU time a call costs: all the machine's busy
time during the row (/proc/stat, so the client's and the kernel's
threads count too) over the calls made. Once the cores are busy, the
rate is the cores over this cost, so it says where a gap comes from.
Keep the machine otherwise idle.

Run it as root and as a non-root user (without a delegated cgroup, the
non-root server has rlimits only: the row that matters most to users).

usage: bench/sustained.py [--bin target/release/nix-sandbox-mcp] [--seconds 2] [--rounds 6] [--env bash]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import time

from bench import ROOT, Server, Table, bare_bwrap, report, workdir

PROGRAMS = {"bash": (":\n", "/usr/bin/bash"), "python": ("pass\n", "/usr/bin/python3"),
            "node": ("0\n", shutil.which("node") or "/usr/bin/node")}


class Pipelined(Server):
    """A server kept busy with k requests in flight."""

    def send_run(self, env: str, code: str) -> int:
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
               "params": {"name": "run", "arguments": {"env": env, "code": code}}}
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def sustain(self, env: str, code: str, k: int, seconds: float) -> tuple[int, collections.Counter]:
        """Calls completed ok in `seconds` with `k` always in flight, and the
        error codes of those that were not."""
        failures: collections.Counter = collections.Counter()
        in_flight = {self.send_run(env, code) for _ in range(k)}
        deadline = time.monotonic() + seconds
        ok = 0
        while in_flight:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") not in in_flight:
                continue
            in_flight.discard(reply["id"])
            content = reply.get("result", {}).get("structuredContent") or {}
            if content.get("ok"):
                ok += 1
            else:
                failures[(content.get("error") or {}).get("code") or json.dumps(reply)[:200]] += 1
            if time.monotonic() < deadline:
                in_flight.add(self.send_run(env, code))
        return ok, failures


def busy_seconds() -> float:
    """CPU time the whole machine has spent busy (not idle or waiting
    for I/O) since it started."""
    ticks = [int(x) for x in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def bare(script: str, interpreter: str, k: int, seconds: float) -> int:
    argv = bare_bwrap(script, interpreter)
    deadline = time.monotonic() + seconds

    def worker() -> int:
        n = 0
        while time.monotonic() < deadline:
            subprocess.run(argv, check=True)
            n += 1
        return n

    with concurrent.futures.ThreadPoolExecutor(k) as pool:
        return sum(pool.map(lambda _: worker(), range(k)))


# The default memory limit of a sandbox (config.example.toml, memory_mb).
SANDBOX_MEMORY_MB = 1024


def measure(binary: str, env_name: str, ks: list[int], seconds: float, rounds: int, rlimits: bool = True) -> dict:
    code, interpreter = PROGRAMS[env_name]
    work, env = workdir()
    script = pathlib.Path(work) / "script"
    script.write_text(code)
    config = pathlib.Path(work) / "config.toml"
    budget_mb = 2 * max(ks) * SANDBOX_MEMORY_MB
    config.write_text(
        f"[server]\nmax_concurrent_runs = {max(ks)}\nmax_queued_runs = {4 * max(ks)}\nmemory_budget_mb = {budget_mb}\n"
    )
    servers = {"MCP run": Pipelined(binary, env, ["--config", str(config)])}
    if rlimits:
        servers["MCP run, rlimits only"] = Pipelined(binary, {**env, "NIX_SANDBOX_LIMITS": "rlimits"},
                                                     ["--config", str(config)])
    for s in servers.values():  # warm caches, the pool and the cgroups
        s.sustain(env_name, code, max(ks), 1)
    bare(str(script), interpreter, 1, 1)

    rows = {"bare bwrap": lambda k: (bare(str(script), interpreter, k, seconds), {})}
    for label, s in servers.items():
        rows[label] = lambda k, s=s: s.sustain(env_name, code, k, seconds)
    done: dict[tuple[int, str], int] = collections.Counter()
    cpu: dict[tuple[int, str], float] = collections.Counter()
    failures: dict[tuple[int, str], collections.Counter] = collections.defaultdict(collections.Counter)
    round_ratios: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
    for n in range(rounds):
        order = list(rows) if n % 2 == 0 else list(reversed(rows))
        for k in ks:
            this_round = {}
            for label in order:
                before = busy_seconds()
                ok, failed = rows[label](k)
                cpu[(k, label)] += busy_seconds() - before
                done[(k, label)] += ok
                failures[(k, label)].update(failed)
                this_round[label] = ok
            for label in servers:
                round_ratios[(k, label)].append(this_round[label] / max(this_round["bare bwrap"], 1))
    for s in servers.values():
        s.close()
    shutil.rmtree(work, ignore_errors=True)

    total = seconds * rounds
    table = Table(f"sustained_{env_name}", ["k", "path", "calls/s", "÷ bare bwrap", "rounds", "CPU ms a call",
                                            "failed"])
    metrics = {}
    for k in ks:
        floor = done[(k, "bare bwrap")] / total
        for label in rows:
            rate = done[(k, label)] / total
            failed = ", ".join(f"{c} x{n}" for c, n in failures[(k, label)].items()) or "-"
            per_call = cpu[(k, label)] / max(done[(k, label)], 1) * 1000
            spread = round_ratios.get((k, label))
            spread_text = f"{min(spread):.2f}-{max(spread):.2f}" if spread else "-"
            table.add([k, label, rate, rate / floor, spread_text, per_call, failed])
            if label != "bare bwrap":
                key = "run" if label == "MCP run" else "rlimits"
                metrics[f"sustained.{env_name}.k{k}.{key}_over_bare"] = rate / floor
                metrics[f"sustained.{env_name}.k{k}.{key}_failed"] = float(sum(failures[(k, label)].values()))
    return {"tables": [table], "metrics": metrics,
            "title": f"{env_name}, {rounds} x {seconds:g} s per row, uid {os.getuid()}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "nix-sandbox-mcp"))
    ap.add_argument("--seconds", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--env", choices=sorted(PROGRAMS), default="bash")
    ap.add_argument("--json", help="also write the tables and metrics to this file (for bench/speed.py)")
    a = ap.parse_args()
    if not pathlib.Path(a.bin).exists():
        raise SystemExit(f"{a.bin} not found: build it with `cargo build --release`")
    result = measure(a.bin, a.env, [int(k) for k in a.ks.split(",")], a.seconds, a.rounds)
    report(a, result)


if __name__ == "__main__":
    main()
