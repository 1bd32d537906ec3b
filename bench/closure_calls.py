#!/usr/bin/env python3
"""A closure's size, seen through the server, per interpreter: bash, python
and node, each in a store of the bench's own (NIX_STORE_DIR) as a closure of
10 and of 200 store paths (the interpreter, the libraries it loads, and
empty padding paths), served with store views (the default) and bound path
by path (NIX_SANDBOX_STORE_VIEW=off). Rows, per interpreter and closure size:

  host                the interpreter started directly, no sandbox
  bare bwrap          bubblewrap starting it, one bind per store path
  warm                one call at a time, the pool refilled between calls
                      (a sandbox ready, its interpreter pre-started)
  cold pool           one call at a time with no sandbox kept ready
                      (NIX_SANDBOX_POOL=off): the call sets its own up
  back-to-back        calls with no pause, calls/s (the pool cannot keep
                      up: each call waits for a sandbox to be set up);
                      the closures of one interpreter take turns, in
                      short windows, so that they share the machine's drift

The interpreters are the host's own, copied into the bench's store with the
libraries `ldd` names (linked where the sandbox's loader looks for them),
python with its standard library: what an environment built by Nix holds,
at the sizes of a small and of a large closure.

usage: bench/closure_calls.py [--bin target/release/nix-sandbox-mcp] [--runs 40] [--seconds 4] [--sizes 10,200]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench import ROOT, Server, Table, quiet, write_json

# name: (host program, interpreter kind, code, code file name)
PROGRAMS = {
    "bash": ("bash", "bash", ":\n", ".main.sh"),
    "python": ("python3", "python", "pass\n", ".main.py"),
    "node": ("node", "node", "0\n", ".main.js"),
}
# Where the daemon accepts an artifact's links (registry/artifact.rs): a link
# is a file directly in one of these.
LINK_DIRS = {"/bin", "/usr/bin", "/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/share"}


def store_path(store: pathlib.Path, n: int, name: str) -> pathlib.Path:
    return store / f"{n:032d}-{name}"


def loaded_libraries(program: str) -> list[pathlib.Path]:
    """The shared objects `program` loads, its loader included (ldd)."""
    out = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    found = re.findall(r"(?:=>\s*)?(/\S+)\s+\(0x", out)
    return [pathlib.Path(p) for p in found]


def links_for(libraries: list[pathlib.Path], libs: pathlib.Path) -> dict[str, str] | None:
    """Links that show `libs` (a copy of the host's tree) where the loader
    looks: each library's directory when that is linkable, else the file.
    None when a library sits where no link may go."""
    links = {}
    for lib in libraries:
        if str(lib.parent.parent) in LINK_DIRS:
            links[str(lib.parent)] = str(libs / lib.parent.relative_to("/"))
        elif str(lib.parent) in LINK_DIRS:
            links[str(lib)] = str(libs / lib.relative_to("/"))
        else:
            return None
    return links


def make_store(top: pathlib.Path, sizes: list[int], plain_names: bool = False) -> tuple[pathlib.Path, dict]:
    """The bench's store and one artifact per interpreter and size; returns
    the store and, per artifact name, (program, interpreter, closure, links).
    Artifacts are named for their interpreter and size (`bash10`), or, with
    `plain_names` and one size, for the interpreter alone (`bash`), as the
    Nix package's presets are."""
    store = top / "store"
    artifacts = top / "artifacts"
    libs = store_path(store, 1, "host-libs")
    made = {}
    padding = [store_path(store, 100 + i, f"padding-{i}") for i in range(max(sizes))]
    for p in padding:
        (p / "lib").mkdir(parents=True)
    for index, (name, (program, kind, _, file_name)) in enumerate(PROGRAMS.items()):
        # The system's own first (as bench.py), not a version manager's shim.
        host = next((c for c in (f"/usr/bin/{program}", shutil.which(program)) if c and os.path.exists(c)), None)
        if host is None:
            print(f"{name}: no {program} on this host, left out", file=sys.stderr)
            continue
        real = pathlib.Path(os.path.realpath(host))
        libraries = loaded_libraries(str(real))
        links = links_for(libraries, libs)
        if links is None:
            print(f"{name}: a library of {real} cannot be linked into a closure, left out", file=sys.stderr)
            continue
        for lib in libraries:
            copy = libs / lib.relative_to("/")
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), copy)
        prefix = store_path(store, 10 + index, name)
        (prefix / "bin").mkdir(parents=True)
        interpreter = prefix / "bin" / real.name
        shutil.copy2(real, interpreter)
        if kind == "python":
            # The standard library where the interpreter looks for it, next
            # to its own prefix.
            stdlib = subprocess.run([str(real), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                    capture_output=True, text=True, check=True).stdout.strip()
            shutil.copytree(stdlib, prefix / "lib" / pathlib.Path(stdlib).name, symlinks=False,
                            ignore_dangling_symlinks=True)
        for n in sizes:
            closure = [str(prefix), str(libs)] + [str(p) for p in padding[: max(n - 2, 0)]]
            artifact = name if plain_names and len(sizes) == 1 else f"{name}{n}"
            d = artifacts / artifact
            d.mkdir(parents=True)
            (d / "manifest.json").write_text(json.dumps({
                "version": 1, "name": artifact, "description": f"{name}, {n} store paths",
                "interpreter": {"argv": [str(interpreter), "{file}"], "file_name": file_name, "kind": kind},
                "closure": closure, "links": links, "limits": {}, "network": False,
            }))
            made[artifact] = (name, str(interpreter), closure, links)
    for p in [top, *top.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    return store, made


def bare(closure: list[str], links: dict[str, str], program: str, script: str) -> list[str]:
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for p in closure:
        args += ["--ro-bind", p, p]
    for link, target in links.items():
        args += ["--symlink", target, link]
    return args + ["--ro-bind", script, "/s", program, "/s"]


def median_ms(fn, runs: int, pause: float = 0.0) -> float:
    times = []
    for _ in range(runs):
        if pause:
            time.sleep(pause)
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


# Back-to-back calls/s are measured in this many windows per closure,
# taking turns between the sizes, so that the machine's drift over the
# bench moves every size alike (their ratio is what the limits hold).
WINDOWS = 8


def back_to_back(server: Server, made: dict, name: str, seconds: float) -> dict[str, float]:
    """Calls/s with no pause for each of `name`'s closures: `seconds` in
    all for each, in WINDOWS turns, the order reversed every other turn."""
    artifacts = [a for a, (n, *_) in made.items() if n == name]
    code = PROGRAMS[name][2]
    done = dict.fromkeys(artifacts, 0)
    for turn in range(WINDOWS):
        for artifact in (artifacts if turn % 2 == 0 else artifacts[::-1]):
            deadline = time.monotonic() + seconds / WINDOWS
            while time.monotonic() < deadline:
                server.run(artifact, code)
                done[artifact] += 1
    return {a: n / seconds for a, n in done.items()}


def measure(binary: str, runs: int, seconds: float, sizes: list[int], ways_wanted: tuple[str, ...] = ("store view", "path by path")) -> dict:
    if shutil.which("ldd") is None:
        raise SystemExit("closure_calls.py needs ldd (to copy the interpreters' libraries into its store)")
    if min(sizes) < 2:
        raise SystemExit("--sizes: a closure holds at least the interpreter and its libraries (2 paths)")
    # Not under /tmp, which every sandbox has its own of.
    top = pathlib.Path(tempfile.mkdtemp(prefix="nsm-closures-", dir="/var/tmp"))
    try:
        store, made = make_store(top, sizes)
        base_env = {"NIX_STORE_DIR": str(store), "NIX_SANDBOX_DIR": str(top / "artifacts"),
                    "NIX_SANDBOX_BUILTIN": "", "RUST_LOG": "error"}
        scripts = {}
        for name, (_, _, code, file_name) in PROGRAMS.items():
            scripts[name] = top / f"script{file_name}"
            scripts[name].write_text(code)
            scripts[name].chmod(0o644)
        rows = {}
        for artifact, (name, interpreter, closure, links) in made.items():
            rows[artifact] = {
                "host": median_ms(lambda: quiet([interpreter, str(scripts[name])]), runs),
                "bare": median_ms(lambda: quiet(bare(closure, links, interpreter, str(scripts[name]))), runs),
            }
        ways = tuple((way, extra) for way, extra in (("store view", {}), ("path by path", {"NIX_SANDBOX_STORE_VIEW": "off"}))
                     if way in ways_wanted)
        for way, extra in ways:
            server = Server(binary, {**base_env, **extra}, ["--config", "/dev/null"])
            try:
                server.request("tools/list", {})
                for artifact, (name, *_) in made.items():
                    code = PROGRAMS[name][2]
                    rows[artifact][(way, "warm")] = median_ms(lambda: server.run(artifact, code), runs, pause=0.25)
                for name in PROGRAMS:
                    for artifact, rate in back_to_back(server, made, name, seconds).items():
                        rows[artifact][(way, "rate")] = rate
            finally:
                server.close()
            server = Server(binary, {**base_env, **extra, "NIX_SANDBOX_POOL": "off"}, ["--config", "/dev/null"])
            try:
                server.request("tools/list", {})
                for artifact, (name, *_) in made.items():
                    code = PROGRAMS[name][2]
                    rows[artifact][(way, "cold")] = median_ms(lambda: server.run(artifact, code), runs)
            finally:
                server.close()
    finally:
        shutil.rmtree(top, ignore_errors=True)
    table = Table("closures", ["program", "paths", "host ms", "bare bwrap ms", "way", "warm ms", "÷ bare", "÷ host",
                               "cold pool ms", "back to back, calls/s"])
    metrics = {}
    for artifact, r in rows.items():
        name = made[artifact][0]
        n = artifact[len(name):]
        for i, (way, _) in enumerate(ways):
            warm = r[(way, "warm")]
            first = [name, n, r["host"], r["bare"]] if i == 0 else ["", "", "", ""]
            table.add([*first, way, warm, warm / r["bare"], warm / r["host"], r[(way, "cold")], r[(way, "rate")]])
            key = "view" if way == "store view" else "paths"
            metrics[f"closures.{name}.{n}.{key}.rate"] = r[(way, "rate")]
    for name in PROGRAMS:
        for key in ("view", "paths"):
            small, large = (metrics.get(f"closures.{name}.{n}.{key}.rate") for n in (min(sizes), max(sizes)))
            if small and large:
                metrics[f"closures.{name}.{key}.large_over_small"] = large / small
    return {"tables": [table], "metrics": metrics}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "nix-sandbox-mcp"))
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--sizes", default="10,200")
    ap.add_argument("--json", help="also write the tables and metrics to this file (for bench/speed.py)")
    a = ap.parse_args()
    result = measure(a.bin, a.runs, a.seconds, [int(s) for s in a.sizes.split(",")])
    for t in result["tables"]:
        print(t.text())
    write_json(a, result)


if __name__ == "__main__":
    main()
