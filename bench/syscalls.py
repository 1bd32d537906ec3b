#!/usr/bin/env python3
"""What a system call costs inside a sandbox: python calling os.getppid()
in a loop, in a `run` over MCP and with the same interpreter on the host,
in one interleaved run. The difference per call is what the sandbox adds
to every system call its programs make (the seccomp filter runs on each;
a build makes millions). Prints the median over --runs of each, in
nanoseconds per loop turn, and the difference.

usage: bench/syscalls.py [--bin target/release/nix-sandbox-mcp] [--runs 9] [--calls 200000]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess

from bench import Server, Table, parse_args, report, workdir

PYTHON = "/usr/bin/python3"


def measure(binary: str, runs: int, calls: int) -> dict:
    work, env = workdir()
    code = ("import os, time\nt = time.perf_counter()\n"
            f"for _ in range({calls}): os.getppid()\n"
            f"print((time.perf_counter() - t) / {calls} * 1e9)\n")
    server = Server(binary, env)
    sandbox, host = [], []
    for _ in range(runs):
        r = server.request("tools/call", {"name": "run", "arguments": {"env": "python", "code": code}})
        sandbox.append(float(r["result"]["structuredContent"]["stdout"]))
        host.append(float(subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                                         check=True).stdout))
    server.close()
    shutil.rmtree(work, ignore_errors=True)
    s, h = statistics.median(sandbox), statistics.median(host)
    table = Table("syscalls", ["os.getppid() loop", "ns a turn"])
    table.add([f"host {PYTHON}", h])
    table.add(["sandbox (MCP run)", s])
    table.add(["added by the sandbox", s - h])
    return {"tables": [table], "metrics": {"syscalls.added_ns": s - h, "syscalls.sandbox_over_host": s / h},
            "title": f"median of {runs} x {calls}"}


def main() -> None:
    a = parse_args(__doc__, runs=9, calls=200_000)
    result = measure(a.bin, a.runs, a.calls)
    report(a, result)


if __name__ == "__main__":
    main()
