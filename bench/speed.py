#!/usr/bin/env python3
"""Every speed table in one run, with one binary, one after the other:

  bench.py           per environment (bash, python, node): the host
                     interpreter, bare bubblewrap, a call over MCP with the
                     interpreter pre-started (warm), with a cold interpreter,
                     with a cold pool, with cgroups off, and the CLI
  closure_calls.py   bash, python and node each as a Nix closure of 10 and
                     of 200 store paths: the interpreter on the host, bare
                     bubblewrap, a warm call, a call with a cold pool and
                     back-to-back calls, with store views and path by path
  sustained.py       calls per second with 1, 2, 4 and 8 in flight against
                     bare bubblewrap, for bash and for python
  syscalls.py        what the sandbox adds to each system call its
                     programs make

docs/performance.md shows the tables and what each row means. Options are
passed to each bench that takes them; --quick shortens every one (for a
look, not for the docs).

usage: bench/speed.py [--bin target/release/nix-sandbox-mcp] [--quick]
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(HERE.parent / "target" / "release" / "nix-sandbox-mcp"))
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if not pathlib.Path(a.bin).exists():
        raise SystemExit(f"{a.bin} not found: build it with `cargo build --release`")
    quick = a.quick
    runs = [
        ("calls, per environment", "bench.py", ["--runs", "40" if quick else "150", "--cli-runs", "5" if quick else "20"]),
        ("closures of 10 and 200 store paths, per interpreter", "closure_calls.py",
         ["--runs", "15" if quick else "40", "--seconds", "2" if quick else "4"]),
        ("sustained load, bash", "sustained.py", ["--env", "bash", "--seconds", "2" if quick else "4"]),
        ("sustained load, python", "sustained.py", ["--env", "python", "--seconds", "2" if quick else "4"]),
        ("the cost of a system call", "syscalls.py", ["--runs", "3" if quick else "9"]),
    ]
    for title, script, args in runs:
        print(f"\n== {title} ({script})", flush=True)
        subprocess.run([sys.executable, str(HERE / script), "--bin", a.bin, *args], check=True)


if __name__ == "__main__":
    main()
