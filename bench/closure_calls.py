#!/usr/bin/env python3
"""A closure's size, seen through the server: two artifacts that differ only
in closure size (a static program plus empty padding store paths, in a store
of the bench's own: NIX_STORE_DIR), served with store views (the default)
and bound path by path (NIX_SANDBOX_STORE_VIEW=off), against bare bubblewrap
binding the same closure path by path. Rows, per closure size:

  host                the program started directly, no sandbox
  bare bwrap          bubblewrap starting the program, one bind per path
  MCP warm            one call at a time, the pool refilled between calls
                      (what a call costs when a sandbox is ready)
  MCP back-to-back    calls with no pause (the pool cannot keep up: each
                      call waits for a sandbox to be set up), calls/s, and
                      what one such call costs (a cold pool), ms

usage: bench/closure_calls.py [--bin target/release/nix-sandbox-mcp] [--runs 40] [--seconds 4] [--sizes 10,200]
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

from bench import ROOT, Server

TRUE_C = "int main(void) { return 0; }\n"


def make_store(top: pathlib.Path, sizes: list[int]) -> tuple[pathlib.Path, pathlib.Path, dict[int, list[str]]]:
    """A store with a static program and padding, and one artifact per size."""
    store = top / "store"
    program = store / ("0" * 32 + "-static-true")
    (program / "bin").mkdir(parents=True)
    source = top / "true.c"
    source.write_text(TRUE_C)
    subprocess.run(["cc", "-static", "-O2", "-o", str(program / "bin" / "true"), str(source)], check=True)
    padding = []
    for i in range(max(sizes)):
        p = store / f"{i + 1:032d}-padding-{i}"
        (p / "lib").mkdir(parents=True)
        padding.append(str(p))
    artifacts = top / "artifacts"
    closures = {}
    for n in sizes:
        closure = [str(program)] + padding[: n - 1]
        closures[n] = closure
        d = artifacts / f"c{n}"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({
            "version": 1, "name": f"c{n}", "description": f"a static program, {n} store paths",
            "interpreter": {"argv": [str(program / "bin" / "true"), "{file}"], "file_name": ".main"},
            "closure": closure, "links": {}, "limits": {}, "network": False,
        }))
    for p in [top, *top.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    return store, artifacts, closures


def bare(closure: list[str], program: str) -> list[str]:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for p in closure:
        args += ["--ro-bind", p, p]
    return args + [program]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "nix-sandbox-mcp"))
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--sizes", default="10,200")
    a = ap.parse_args()
    if shutil.which("cc") is None:
        raise SystemExit("closure_calls.py needs cc (a static program for the closure)")
    sizes = [int(s) for s in a.sizes.split(",")]
    # Not under /tmp, which every sandbox has its own of.
    top = pathlib.Path(tempfile.mkdtemp(prefix="nsm-closures-", dir="/var/tmp"))
    try:
        store, artifacts, closures = make_store(top, sizes)
        program = closures[sizes[0]][0] + "/bin/true"
        base_env = {"NIX_STORE_DIR": str(store), "NIX_SANDBOX_DIR": str(artifacts), "NIX_SANDBOX_BUILTIN": ""}
        host = []
        for _ in range(a.runs):
            t = time.perf_counter()
            subprocess.run([program], check=True)
            host.append((time.perf_counter() - t) * 1000)
        print(f"host process: {statistics.median(host):.2f} ms")
        print(f"{'closure':>8} {'bare bwrap ms':>14} {'ways':>16} {'warm ms':>8} {'÷ bare':>7} {'back-to-back /s':>16} {'cold ms':>8}")
        for n in sizes:
            bare_ms = []
            for _ in range(a.runs):
                t = time.perf_counter()
                subprocess.run(bare(closures[n], program), check=True)
                bare_ms.append((time.perf_counter() - t) * 1000)
            bare_med = statistics.median(bare_ms)
            for way, extra in (("store view", {}), ("path by path", {"NIX_SANDBOX_STORE_VIEW": "off"})):
                server = Server(a.bin, {**base_env, **extra}, ["--config", "/dev/null"])
                try:
                    server.request("tools/list", {})
                    warm = []
                    for _ in range(a.runs):
                        time.sleep(0.25)
                        t = time.perf_counter()
                        server.run(f"c{n}", ":")
                        warm.append((time.perf_counter() - t) * 1000)
                    done, deadline = 0, time.monotonic() + a.seconds
                    while time.monotonic() < deadline:
                        server.run(f"c{n}", ":")
                        done += 1
                    rate = done / a.seconds
                finally:
                    server.close()
                med = statistics.median(warm)
                first = f"{n:8d} {bare_med:14.2f}" if way == "store view" else " " * 23
                print(f"{first} {way:>16} {med:8.2f} {med / bare_med:7.2f} {rate:16.1f} {1000 / rate:8.2f}")
    finally:
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
