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

from bench import Server, parse_args, workdir

PYTHON = "/usr/bin/python3"


def main() -> None:
    a = parse_args(__doc__, calls=200_000)
    work, env = workdir()
    code = ("import os, time\nt = time.perf_counter()\n"
            f"for _ in range({a.calls}): os.getppid()\n"
            f"print((time.perf_counter() - t) / {a.calls} * 1e9)\n")
    server = Server(a.bin, env)
    sandbox, host = [], []
    for _ in range(a.runs):
        r = server.request("tools/call", {"name": "run", "arguments": {"env": "python", "code": code}})
        sandbox.append(float(r["result"]["structuredContent"]["stdout"]))
        host.append(float(subprocess.run([PYTHON, "-c", code], capture_output=True, text=True,
                                         check=True).stdout))
    server.close()
    shutil.rmtree(work, ignore_errors=True)
    s, h = statistics.median(sandbox), statistics.median(host)
    print(f"os.getppid() loop, ns a turn (median of {a.runs} x {a.calls}):")
    print(f"  host {PYTHON:18} {h:7.1f}")
    print(f"  sandbox (MCP run)        {s:7.1f}")
    print(f"  added by the sandbox     {s - h:7.1f}")


if __name__ == "__main__":
    main()
