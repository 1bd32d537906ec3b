#!/usr/bin/env python3
"""What mounting a Nix closure costs bubblewrap: one read-only bind per store
path (what the jail does: only the closure is visible) against one bind of a
whole store directory (everything in it visible), for closures of 10 to 200
paths. Prints medians of bubblewrap starting `true`, interleaved.

usage: bench/closure_binds.py [--runs 100]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import tempfile
import time


def base() -> list[str]:
    args = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr"]
    for d in ("bin", "lib", "lib64", "sbin"):
        p = pathlib.Path("/") / d
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
    return args + ["--proc", "/proc", "--dev", "/dev"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    a = ap.parse_args()
    store = pathlib.Path(tempfile.mkdtemp(prefix="nsm-store-"))
    paths = []
    for i in range(200):
        p = store / f"{i:032d}-package-{i}"
        (p / "bin").mkdir(parents=True)
        paths.append(str(p))
    cases = {"no closure": base() + ["true"]}
    for n in (10, 50, 100, 200):
        binds = [arg for p in paths[:n] for arg in ("--ro-bind", p, p)]
        cases[f"{n} paths, one bind each"] = base() + binds + ["true"]
    cases["whole store, one bind"] = base() + ["--ro-bind", str(store), str(store), "true"]
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(a.runs):
        for k, argv in cases.items():
            t = time.perf_counter()
            subprocess.run(argv, check=True)
            times[k].append((time.perf_counter() - t) * 1000)
    floor = statistics.median(times["no closure"])
    print(f"{'mounts':28} {'median ms':>10} {'extra ms':>9} {'ms per bind':>12}")
    for k, xs in times.items():
        med = statistics.median(xs)
        n = int(k.split()[0]) if k[0].isdigit() else 1
        per = f"{(med - floor) / n:12.3f}" if k != "no closure" else ""
        print(f"{k:28} {med:10.2f} {med - floor:9.2f} {per}")


if __name__ == "__main__":
    main()
