#!/usr/bin/env python3
"""What mounting a Nix closure costs bubblewrap, by the ways it can be done,
for closures of 10 to 200 store paths (synthetic, empty). Each row times
bubblewrap starting `true`, in a user and mount namespace of its own made for
the row (as the server's nest gives each sandbox), rounds interleaved;
medians, and the extra over no closure at all:

  one bind each     one read-only bind per store path (what the jail does:
                    only the closure is visible)
  prepared view     the closure's binds made once, in a namespace bubblewrap
                    starts from, then one recursive bind of that tree (only
                    the closure is visible; the one-time cost of making the
                    view is printed apart). The server's first store views
                    worked this way; it now mounts a copy of the view from
                    outside once bubblewrap has made every other mount,
                    which bench/closure_calls.py measures
  whole store       one bind of the whole store directory (everything in it
                    visible)

usage: bench/closure_binds.py [--runs 100] [--sizes 10,50,100,200]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384


def base() -> list[str]:
    args = ["bwrap", "--unshare-all", "--ro-bind", "/usr", "/usr"]
    for d in ("bin", "lib", "lib64", "sbin"):
        p = pathlib.Path("/") / d
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
    return args + ["--proc", "/proc", "--dev", "/dev"]


def mount(src: str, dst: str, fstype: str | None, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None, flags, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount {src} on {dst}")


def make_view(paths: list[str], view: str) -> float:
    """The closure's binds under `view`, read-only; returns the seconds taken."""
    started = time.perf_counter()
    mount("none", view, "tmpfs", 0)
    for p in paths:
        at = os.path.join(view, os.path.basename(p))
        os.mkdir(at)
        mount(p, at, None, MS_BIND | MS_REC)
        mount("none", at, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    mount("none", view, None, MS_REMOUNT | MS_RDONLY)
    return time.perf_counter() - started


def run_case(kind: str, n: int, store: str, runs: int) -> None:
    """In a fresh namespace (see main): times `runs` starts, prints JSON."""
    paths = sorted(str(p) for p in pathlib.Path(store).iterdir())[:n]
    setup = 0.0
    if kind == "no closure":
        extra: list[str] = []
    elif kind == "one bind each":
        extra = [arg for p in paths for arg in ("--ro-bind", p, f"/nix/store/{os.path.basename(p)}")]
    elif kind == "prepared view":
        view = tempfile.mkdtemp(prefix="nsm-view-")
        setup = make_view(paths, view)
        extra = ["--ro-bind", view, "/nix/store"]
    else:
        extra = ["--ro-bind", store, "/nix/store"]
    argv = base() + extra + ["true"]
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append((time.perf_counter() - t) * 1000)
    print(json.dumps({"times": times, "setup_ms": setup * 1000}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--sizes", default="10,50,100,200")
    ap.add_argument("--case", nargs=3, metavar=("KIND", "N", "STORE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case:
        run_case(a.case[0], int(a.case[1]), a.case[2], a.runs)
        return
    sizes = [int(s) for s in a.sizes.split(",")]
    store = tempfile.mkdtemp(prefix="nsm-store-")
    os.chmod(store, 0o755)
    for i in range(max(sizes)):
        (pathlib.Path(store) / f"{i:032d}-package-{i}" / "bin").mkdir(parents=True)
    cases = [("no closure", 0)]
    cases += [(kind, n) for n in sizes for kind in ("one bind each", "prepared view")]
    cases += [("whole store", max(sizes))]
    times: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    setup: dict[tuple[str, int], float] = {}
    rounds = 5
    for _ in range(rounds):
        for kind, n in cases:
            out = subprocess.run(
                ["unshare", "--user", "--map-root-user", "--mount", sys.executable, __file__,
                 "--runs", str(max(1, a.runs // rounds)), "--case", kind, str(n), store],
                check=True, capture_output=True, text=True,
            ).stdout
            got = json.loads(out)
            times[(kind, n)] += got["times"]
            setup[(kind, n)] = got["setup_ms"]
    floor = statistics.median(times[("no closure", 0)])
    print(f"{'mounts':34} {'median ms':>10} {'extra ms':>9} {'view made once, ms':>19}")
    for (kind, n), xs in times.items():
        med = statistics.median(xs)
        label = kind if kind == "no closure" else f"{n} paths, {kind}"
        once = f"{setup[(kind, n)]:19.1f}" if kind == "prepared view" else ""
        print(f"{label:34} {med:10.2f} {med - floor:9.2f} {once}")


if __name__ == "__main__":
    main()
