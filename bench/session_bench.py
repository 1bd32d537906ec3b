#!/usr/bin/env python3
"""Times calls on a warm session against the code's own run time, in one
interleaved run, and prints medians, p95 and the overhead per call.

For each interpreter (bash, python, node), rows:
  bare bwrap        bubblewrap starting the interpreter on a trivial program
  fresh run         `run` over MCP without a session (a prepared sandbox)
  session, empty    `run` on a warm session with a trivial program
  session, 10 ms    `run` on a warm session with a program that sleeps 10 ms
  agent on the host the session's own agent program (daemon/src/sessions/)
                    run by the host's interpreter, no sandbox, no server:
                    what the code itself costs to hand over and evaluate
  MCP round trip    tools/list: the protocol's own cost, no sandbox

Each session call comes after other rows' calls, at an agent's pace rather
than back to back, so that the session has been paused between calls as it
is when an agent thinks between them. The session overhead is what a call
costs beyond the code's own run time: "session, empty" minus "agent on the
host", and "session, 10 ms" minus 10 ms.

usage: bench/session_bench.py [--bin target/release/nix-sandbox-mcp] [--runs 200] [--json FILE]
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import subprocess

from bench import ROOT, Server, Table, bare_bwrap, parse_args, quiet, ratio_table, timed, workdir, write_json

# name: (setup, empty program, 10 ms program, interpreter, agent). bash has
# no builtin sleep (an external `sleep` costs a fork and exec): it waits
# 10 ms reading a FIFO nobody writes to.
PROGRAMS = {
    "bash": ("mkfifo /tmp/never && exec 9<>/tmp/never", ":", "read -t 0.01 -u 9 || :", "/usr/bin/bash", "agent.sh"),
    "python": ("import time", "pass", "time.sleep(0.01)", "/usr/bin/python3", "agent.py"),
    "node": ("0", "0", "setTimeout(() => {}, 10)", shutil.which("node") or "/usr/bin/node", "agent.js"),
}


class HostAgent:
    """A session agent run by the host's interpreter on two pipes."""

    def __init__(self, interpreter: str, agent: str) -> None:
        requests_r, self.requests = os.pipe()
        replies_r, replies_w = os.pipe()
        path = ROOT / "daemon" / "src" / "sessions" / agent
        self.proc = subprocess.Popen([interpreter, str(path), str(requests_r), str(replies_w)],
                                     pass_fds=(requests_r, replies_w), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd="/tmp")
        os.close(requests_r)
        os.close(replies_w)
        self.replies = os.fdopen(replies_r, "rb")
        self.replies.readline()
        self.next_id = 0

    def call(self, code: str) -> None:
        self.next_id += 1
        body = code.encode()
        os.write(self.requests, b"%d %d\n" % (self.next_id, len(body)) + body)
        assert b'"status":0' in self.replies.readline().replace(b" ", b"")

    def close(self) -> None:
        os.close(self.requests)
        self.proc.wait(timeout=10)


def measure(binary: str, runs: int) -> dict:
    work, env = workdir()
    server = Server(binary, env)
    programs = {n: p for n, p in PROGRAMS.items() if pathlib.Path(p[3]).exists()}
    rows: dict[tuple[str, str], list[float]] = {}

    def add(prog: str, label: str, ms: float) -> None:
        rows.setdefault((prog, label), []).append(ms)

    def in_session(env: str, code: str) -> None:
        r = server.request("tools/call", {"name": "run", "arguments": {"env": env, "code": code, "session": f"bench-{env}"}})
        assert r["result"]["structuredContent"]["ok"], r

    for name, (setup, empty, sleep, interp, agent_file) in programs.items():
        script = pathlib.Path(work) / f"{name}.script"
        script.write_text(empty + "\n")
        agent = HostAgent(interp, agent_file)
        in_session(name, setup)
        for _ in range(10):  # start the session, warm caches
            in_session(name, empty)
            server.run(name, empty)
            agent.call(empty)
        for _ in range(runs):
            add(name, "bare bwrap", timed(lambda: quiet(bare_bwrap(str(script), interp))))
            add(name, "fresh run", timed(lambda: server.run(name, empty)))
            add(name, "session, empty", timed(lambda: in_session(name, empty)))
            add(name, "agent on the host", timed(lambda: agent.call(empty)))
            add(name, "session, 10 ms", timed(lambda: in_session(name, sleep)))
            add(name, "MCP round trip", timed(lambda: server.request("tools/list", {})))
        agent.close()
    server.close()
    shutil.rmtree(work, ignore_errors=True)

    table = ratio_table("sessions", rows, list(programs),
                        ["bare bwrap", "fresh run", "session, empty", "session, 10 ms", "agent on the host",
                         "MCP round trip"])
    overhead = Table("session_overhead", ["program", "session, empty", "beyond the agent on the host",
                                          "beyond a 10 ms sleep"])
    metrics = {}
    for name in programs:
        med = {label: statistics.median(rows[(name, label)])
               for label in ("fresh run", "session, empty", "session, 10 ms", "agent on the host", "MCP round trip")}
        beyond_agent = med["session, empty"] - med["agent on the host"]
        overhead.add([name, med["session, empty"], beyond_agent, med["session, 10 ms"] - 10])
        metrics[f"sessions.{name}.empty_ms"] = med["session, empty"]
        metrics[f"sessions.{name}.beyond_agent_ms"] = beyond_agent
        metrics[f"sessions.{name}.session_over_fresh"] = med["session, empty"] / med["fresh run"]
        metrics[f"sessions.{name}.session_over_agent_and_round_trip"] = (
            med["session, empty"] / (med["agent on the host"] + med["MCP round trip"]))
    return {"tables": [table, overhead], "metrics": metrics}


def main() -> None:
    a = parse_args(__doc__)
    result = measure(a.bin, a.runs)
    for t in result["tables"]:
        print(t.text())
        print()
    write_json(a, result)


if __name__ == "__main__":
    main()
