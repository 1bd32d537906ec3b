#!/usr/bin/env python3
"""Time to first result: from starting `nix-sandbox-mcp --stdio` to the
result of the first `run` (initialize, tools/list, one bash call running
`:`), what a client waits for when it starts the server, against the same
for bare bubblewrap starting bash (the floor: a sandbox and an interpreter
started once). Interleaved, --runs of each:

  bare bwrap + bash      bubblewrap (every namespace, /usr read-only) running bash
  host mode              the server with no configuration: bash, python and
                         node found on the host
  three Nix artifacts    the server with NIX_SANDBOX_DIR holding three
                         artifacts named bash, python and node (10 store
                         paths each, built like closure_calls.py's), which
                         take the host presets' places, as the Nix
                         package's own presets do

usage: bench/first_result.py [--bin target/release/nix-sandbox-mcp] [--runs 10] [--json FILE]
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time

from bench import Table, bare_bwrap, parse_args, quiet, stats, timed, workdir, write_json


def first_result(binary: str, env: dict[str, str], run_env: str) -> float:
    """Milliseconds from the server's start to its first run result."""
    start = time.perf_counter()
    proc = subprocess.Popen([binary, "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={**os.environ, **env})

    def request(rid: int, method: str, params: dict) -> dict:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        proc.stdin.flush()
        while True:
            reply = json.loads(proc.stdout.readline())
            if reply.get("id") == rid:
                return reply

    request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "bench", "version": "1"}})
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    proc.stdin.flush()
    request(2, "tools/list", {})
    reply = request(3, "tools/call", {"name": "run", "arguments": {"env": run_env, "code": ":"}})
    elapsed = (time.perf_counter() - start) * 1000
    assert reply["result"]["structuredContent"]["ok"], reply
    proc.stdin.close()
    proc.wait(timeout=20)
    return elapsed


def measure(binary: str, runs: int) -> dict:
    from closure_calls import make_store
    work, env = workdir()
    top = pathlib.Path(tempfile.mkdtemp(prefix="nsm-first-", dir="/var/tmp"))
    try:
        script = pathlib.Path(work) / "bash.script"
        script.write_text(":\n")
        store, made = make_store(top, [10], plain_names=True)
        nix_env = {**env, "NIX_STORE_DIR": str(store), "NIX_SANDBOX_DIR": str(top / "artifacts"),
                   "NIX_SANDBOX_BUILTIN": ""}
        rows: dict[str, list[float]] = {"bare bwrap + bash": [], "host mode": [], "three Nix artifacts": []}
        for _ in range(runs):
            rows["bare bwrap + bash"].append(timed(lambda: quiet(bare_bwrap(str(script), "/usr/bin/bash"))))
            rows["host mode"].append(first_result(binary, env, "bash"))
            if "bash" in made:
                rows["three Nix artifacts"].append(first_result(binary, nix_env, "bash"))
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    floor = stats(rows["bare bwrap + bash"])[0]
    table = Table("first", ["path", "median ms", "p95 ms", "÷ bare bwrap"])
    metrics = {}
    keys = {"host mode": "host_mode", "three Nix artifacts": "nix_artifacts"}
    for label, xs in rows.items():
        if not xs:
            continue
        med, p95 = stats(xs)
        table.add([label, med, p95, med / floor])
        if label in keys:
            metrics[f"first_result.{keys[label]}.ms"] = med
            metrics[f"first_result.{keys[label]}.over_bare"] = med / floor
    return {"tables": [table], "metrics": metrics}


def main() -> None:
    a = parse_args(__doc__, runs=10)
    result = measure(a.bin, a.runs)
    for t in result["tables"]:
        print(t.text())
    write_json(a, result)


if __name__ == "__main__":
    main()
