#!/usr/bin/env python3
"""Times calls on a warm session against the code's own run time, in one
interleaved run, and prints medians, p95 and the overhead per call.

For each interpreter (bash, python, node), rows:
  bare bwrap        bubblewrap starting the interpreter on a trivial program
  fresh run         `run` over MCP without a session (a prepared sandbox)
  session, empty    `run` on a warm session with a trivial program
  session, 10 ms    `run` on a warm session with a program that sleeps 10 ms
  MCP round trip    tools/list: the protocol's own cost, no sandbox

The session overhead is what a call costs beyond the code's own run time:
"session, empty" itself, and "session, 10 ms" minus 10 ms.

usage: bench/session_bench.py [--bin target/release/nix-sandbox-mcp] [--runs 200]
"""

from __future__ import annotations

import pathlib
import shutil
import statistics
import subprocess

from bench import Server, bare_bwrap, parse_args, print_table, timed, workdir

# name: (setup, empty program, 10 ms program, interpreter). bash has no
# builtin sleep (an external `sleep` costs a fork and exec): it waits 10 ms
# reading a FIFO nobody writes to.
PROGRAMS = {
    "bash": ("mkfifo /tmp/never && exec 9<>/tmp/never", ":", "read -t 0.01 -u 9 || :", "/usr/bin/bash"),
    "python": ("import time", "pass", "time.sleep(0.01)", "/usr/bin/python3"),
    "node": ("0", "0", "setTimeout(() => {}, 10)", "/usr/bin/node"),
}


def main() -> None:
    a = parse_args(__doc__)
    work, env = workdir()
    server = Server(a.bin, env)
    programs = {n: p for n, p in PROGRAMS.items() if pathlib.Path(p[3]).exists()}
    rows: dict[tuple[str, str], list[float]] = {}

    def add(prog: str, label: str, ms: float) -> None:
        rows.setdefault((prog, label), []).append(ms)

    def in_session(env: str, code: str) -> None:
        r = server.request("tools/call", {"name": "run", "arguments": {"env": env, "code": code, "session": f"bench-{env}"}})
        assert r["result"]["structuredContent"]["ok"], r

    for name, (setup, empty, sleep, interp) in programs.items():
        script = pathlib.Path(work) / f"{name}.script"
        script.write_text(empty + "\n")
        in_session(name, setup)
        for _ in range(10):  # start the session, warm caches
            in_session(name, empty)
            server.run(name, empty)
        for _ in range(a.runs):
            add(name, "bare bwrap", timed(lambda: subprocess.run(bare_bwrap(str(script), interp), check=True)))
            add(name, "fresh run", timed(lambda: server.run(name, empty)))
            add(name, "session, empty", timed(lambda: in_session(name, empty)))
            add(name, "session, 10 ms", timed(lambda: in_session(name, sleep)))
            add(name, "MCP round trip", timed(lambda: server.request("tools/list", {})))
    server.close()
    shutil.rmtree(work, ignore_errors=True)

    print_table(rows, list(programs), ["bare bwrap", "fresh run", "session, empty", "session, 10 ms", "MCP round trip"])
    for name in programs:
        empty_ms = statistics.median(rows[(name, "session, empty")])
        slept_ms = statistics.median(rows[(name, "session, 10 ms")]) - 10
        print(f"{name:8} session overhead per call: {empty_ms:.2f} ms (empty program), {slept_ms:.2f} ms (beyond a 10 ms sleep)")


if __name__ == "__main__":
    main()
