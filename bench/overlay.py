#!/usr/bin/env python3
"""What the project's copy-on-write overlay costs a call, by project size.

For a project of 10 files and one of 10,000 (in 100 directories), times a
`run` of bash `:` through a running server, interleaved, in these modes:
  ro bind        readonly with the nest off (NIX_SANDBOX_NEST=off): a plain
                 read-only bind of the project, the floor
  readonly       readonly in the nest (a read-only overlay)
  overlay        the default: writable overlay, nothing changed
  overlay, edit  the same, the run changes one file (the change is scanned
                 and the patch made before the result returns)
and prints medians, p95 and the difference from `ro bind` for the same
project, and bare bubblewrap binding the project read-only, for scale.

Calls come one at a time, as an agent makes them: each after a pause
(--pause-ms, 50) in which the server that took the last call prepares its
replacement sandbox (staging an overlay among it). Without the pause each
call would also pay for the previous call's replacement being prepared on
the other core, which is sustained load, not what a mode costs a call.

usage: bench/overlay.py [--bin target/release/nix-sandbox-mcp] [--runs 100] [--pause-ms 50]
"""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import subprocess
import time

from bench import Server, bare_bwrap, parse_args, timed, workdir


def make_project(root: pathlib.Path, files: int) -> None:
    per_dir = max(1, files // 100)
    for i in range(files):
        d = root / f"d{i // per_dir:03}"
        d.mkdir(exist_ok=True, mode=0o777)
        (d / f"f{i}.txt").write_text(f"file {i}\n")
        os.chmod(d / f"f{i}.txt", 0o666)
    (root / "edit.txt").write_text("before\n")
    os.chmod(root / "edit.txt", 0o666)
    os.chmod(root, 0o777)


def main() -> None:
    a = parse_args(__doc__, pause_ms=50)
    rows: dict[tuple[int, str], list[float]] = {}
    work, env = workdir()
    script = pathlib.Path(work) / "s"
    script.write_text(":\n")
    for files in (10, 10_000):
        project = pathlib.Path(work) / f"p{files}"
        project.mkdir()
        make_project(project, files)
        cfg = {}
        for mode in ("readonly", "overlay"):
            cfg[mode] = pathlib.Path(work) / f"{mode}.toml"
            cfg[mode].write_text(f'[project]\nmode = "{mode}"\n')
        base = {**env, "PROJECT_DIR": str(project)}
        servers = {
            "ro bind": Server(a.bin, {**base, "NIX_SANDBOX_NEST": "off"}, ["--config", str(cfg["readonly"])]),
            "readonly": Server(a.bin, base, ["--config", str(cfg["readonly"])]),
            "overlay": Server(a.bin, base, ["--config", str(cfg["overlay"])]),
        }
        calls = {
            "ro bind": lambda: servers["ro bind"].run("bash", ":"),
            "readonly": lambda: servers["readonly"].run("bash", ":"),
            "overlay": lambda: servers["overlay"].run("bash", ":"),
            "overlay, edit": lambda: servers["overlay"].run("bash", "echo after > /project/edit.txt"),
        }
        bare = bare_bwrap(str(script), "/usr/bin/bash")
        bare[1:1] = ["--ro-bind", str(project), "/project"]
        calls["bare bwrap"] = lambda: subprocess.run(bare, check=True)
        for fn in calls.values():
            for _ in range(10):
                fn()
        for _ in range(a.runs):
            for label, fn in calls.items():
                time.sleep(a.pause_ms / 1000)
                rows.setdefault((files, label), []).append(timed(fn))
        for s in servers.values():
            s.close()
    shutil.rmtree(work, ignore_errors=True)

    print(f"{'files':>6} {'mode':16} {'median ms':>10} {'p95 ms':>8} {'- ro bind ms':>13}")
    for files in (10, 10_000):
        floor = statistics.median(rows[(files, "ro bind")])
        for label in ("bare bwrap", "ro bind", "readonly", "overlay", "overlay, edit"):
            xs = sorted(rows[(files, label)])
            med = statistics.median(xs)
            p95 = xs[min(len(xs) - 1, int(len(xs) * 0.95))]
            print(f"{files:>6} {label:16} {med:10.2f} {p95:8.2f} {med - floor:13.2f}")


if __name__ == "__main__":
    main()
