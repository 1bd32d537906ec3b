#!/usr/bin/env python3
"""Every speed table in one run, with one binary, one after the other, and
the gate that fails a build whose speed regressed:

  bench.py           per environment (bash, python, node): the host
                     interpreter, bare bubblewrap, a call over MCP with the
                     interpreter pre-started (warm), with a cold interpreter,
                     with a cold pool, with cgroups off, and the CLI
  session_bench.py   calls on a warm session against a fresh run, the
                     session's agent on the host, and the MCP round trip
  closure_calls.py   bash, python and node each as a Nix closure of 10 and
                     of 200 store paths: the interpreter on the host, bare
                     bubblewrap, a warm call, a call with a cold pool and
                     back-to-back calls, with store views and path by path
  sustained.py       calls per second with 1, 2, 4 and 8 in flight against
                     bare bubblewrap, for bash and for python
  streamable_http.py calls per second with 1, 8 and 32 in flight over HTTP
                     against stdio, and the memory of 1,000 idle
                     authenticated connections
  first_result.py    from starting the server to its first run's result
  credentials.py     a 100 MiB download from a host with a credential (the
                     proxy ends TLS and adds the header) against a plain
                     tunnel
  syscalls.py        what the sandbox adds to each system call its
                     programs make

Every number the gate checks is a ratio of two medians measured in the same
run (ours over bare bubblewrap, the host interpreter, a fresh run, the
smaller closure), never a time: a slower or busier machine moves both.

  --check        a short run of the rows bench/limits.toml names (about a
                 minute); prints each ratio against its limit and exits 1
                 when one is outside it
  --write-docs   rewrites the marked blocks of docs/performance.md,
                 docs/sessions.md, docs/scaling.md and README.md (<!-- speed:NAME --> ...
                 <!-- /speed:NAME -->) with this run's tables, naming the
                 machine and the date; with --check, from the short run
  --quick        a shorter full run (for a look, not for the docs)

usage: bench/speed.py [--bin target/release/nix-sandbox-mcp] [--check] [--write-docs] [--quick]
                      [--limits bench/limits.toml]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
import tomllib

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402
import closure_calls  # noqa: E402
import credentials  # noqa: E402
import first_result  # noqa: E402
import session_bench  # noqa: E402
import streamable_http  # noqa: E402
import sustained  # noqa: E402
import syscalls  # noqa: E402

DOCS = [HERE.parent / "docs" / name for name in ("performance.md", "sessions.md", "scaling.md")] + [HERE.parent / "README.md"]


def full(binary: str, quick: bool) -> list[tuple[str, dict]]:
    q = (lambda short, long: short) if quick else (lambda short, long: long)
    return [
        ("calls, per environment", bench.measure(binary, q(40, 150), q(5, 20))),
        ("sessions", session_bench.measure(binary, q(40, 150))),
        ("closures of 10 and 200 store paths", closure_calls.measure(binary, q(15, 40), q(2, 4), [10, 200])),
        ("sustained load, bash", sustained.measure(binary, "bash", [1, 2, 4, 8], 2, q(2, 4))),
        ("sustained load, python", sustained.measure(binary, "python", [1, 2, 4, 8], 2, q(2, 4))),
        ("Streamable HTTP against stdio", streamable_http.measure(binary, [1, 8, 32], 2, q(2, 4), 1000, balanced=True)),
        ("time to first result", first_result.measure(binary, q(5, 15))),
        ("credentials through the proxy", credentials.measure(binary, q(3, 9), 100)),
        ("the cost of a system call", syscalls.measure(binary, q(3, 9), 200_000)),
    ]


def short(binary: str) -> list[tuple[str, dict]]:
    """The rows the limits name, briefly."""
    return [
        ("calls, per environment", bench.measure(binary, 15, 0, variants=False)),
        ("sessions", session_bench.measure(binary, 20)),
        ("closures of 10 and 200 store paths",
         closure_calls.measure(binary, 3, 2, [10, 200], ways_wanted=("store view",))),
        ("sustained load, bash", sustained.measure(binary, "bash", [2], 2, 2, rlimits=False)),
        ("Streamable HTTP against stdio", streamable_http.measure(binary, [8], 2, 2, 1000)),
        ("time to first result", first_result.measure(binary, 3)),
        ("credentials through the proxy", credentials.measure(binary, 5, 100)),
    ]


def summary(results: list[tuple[str, dict]]) -> bench.Table:
    """The few numbers the README quotes, from this run's metrics."""
    m = {k: v for _, r in results for k, v in r["metrics"].items()}
    table = bench.Table("summary", ["what", "this run", "target"])
    rows = [
        ("a bash `run` call ÷ bare bubblewrap running bash", "calls.bash.run_over_bare", "≤ 0.5"),
        ("a python `run` call ÷ the host's own python", "calls.python.run_over_host", "≤ 0.5"),
        ("a warm bash session call, ms beyond its agent on the host", "sessions.bash.beyond_agent_ms", "≤ 0.5"),
        ("a warm python session call, ms beyond its agent", "sessions.python.beyond_agent_ms", "≤ 0.5"),
        ("a warm node session call, ms beyond its agent", "sessions.node.beyond_agent_ms", "≤ 0.5"),
        ("calls/s with 2 in flight ÷ bare bubblewrap's (bash)", "sustained.bash.k2.run_over_bare", "≥ 0.95"),
        ("start to first result, ms (host mode)", "first_result.host_mode.ms", "< 150"),
        ("start to first result, ms (three Nix artifacts)", "first_result.nix_artifacts.ms", "< 150"),
    ]
    for what, key, target in rows:
        if key in m:
            table.add([what, m[key], target])
    return table


def machine(binary: str) -> str:
    """One line naming where and when the numbers were measured."""
    cpu = next((line.split(":", 1)[1].strip() for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.machine())
    try:
        envs = json.loads(subprocess.run([binary, "envs", "--json"], capture_output=True, text=True,
                                         timeout=60).stdout)
        mechanism = envs.get("limits_mechanism", "unknown")
    except (ValueError, subprocess.SubprocessError):
        mechanism = "unknown"
    who = "root" if os.getuid() == 0 else f"a non-root user (uid {os.getuid()})"
    return (f"Measured by `bench/speed.py` on {datetime.date.today().isoformat()}: {cpu}, {os.cpu_count()} cores, "
            f"Linux {platform.release()}, server run as {who}, limits by {mechanism}.")


def markdown(table: dict) -> str:
    numeric = [all(isinstance(r[i], (int, float)) or r[i] == "" for r in table["rows"])
               for i in range(len(table["columns"]))]
    out = ["| " + " | ".join(table["columns"]) + " |",
           "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for r in table["rows"]:
        out.append("| " + " | ".join(bench.Table.cell(v) for v in r) + " |")
    return "\n".join(out)


def write_docs(results: list[tuple[str, dict]], header: str) -> list[str]:
    """Rewrites every marked block whose table this run has; returns the
    blocks written, and fails on a block this run has no table for."""
    tables = {t.name: t.to_json() for _, r in results for t in r["tables"]}
    written, missing = [], []
    pattern = re.compile(r"(<!-- speed:([a-z_]+) -->\n).*?(<!-- /speed:\2 -->)", re.S)
    for doc in DOCS:
        text = doc.read_text()

        def replace(m: re.Match) -> str:
            name = m.group(2)
            if name not in tables:
                missing.append(f"{doc.name}: {name}")
                return m.group(0)
            written.append(f"{doc.name}: {name}")
            return f"{m.group(1)}{header}\n\n{markdown(tables[name])}\n{m.group(3)}"

        doc.write_text(pattern.sub(replace, text))
    if missing:
        raise SystemExit("no table in this run for: " + ", ".join(missing) + " (run without --check)")
    return written


def check(results: list[tuple[str, dict]], limits_file: pathlib.Path) -> bool:
    limits = tomllib.loads(limits_file.read_text())
    metrics = {k: v for _, r in results for k, v in r["metrics"].items()}
    ok = True
    print(f"\n{'metric':58} {'value':>8} {'limit':>9}  verdict")
    for kind, sign in (("max", "<="), ("min", ">=")):
        for name, limit in limits.get(kind, {}).items():
            value = metrics.get(name)
            if value is None:
                verdict = "NOT MEASURED"
                ok = False
            elif (value <= limit) if kind == "max" else (value >= limit):
                verdict = "ok"
            else:
                verdict = "FAILED"
                ok = False
            shown = "-" if value is None else f"{value:.2f}"
            print(f"{name:58} {shown:>8} {sign} {limit:<6.2f}  {verdict}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(HERE.parent / "target" / "release" / "nix-sandbox-mcp"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--limits", default=str(HERE / "limits.toml"))
    a = ap.parse_args()
    if not pathlib.Path(a.bin).exists():
        raise SystemExit(f"{a.bin} not found: build it with `cargo build --release`")
    start = time.monotonic()
    results = short(a.bin) if a.check else full(a.bin, a.quick)
    results.append(("summary", {"tables": [summary(results)], "metrics": {}}))
    header = machine(a.bin)
    print(header)
    for title, r in results:
        print(f"\n== {title}" + (f" ({r['title']})" if r.get("title") else ""))
        for t in r["tables"]:
            print(t.text())
    if a.write_docs:
        for block in write_docs(results, header):
            print(f"wrote {block}")
    passed = check(results, pathlib.Path(a.limits)) if a.check else True
    print(f"\n{'--check' if a.check else 'the benches'} took {time.monotonic() - start:.0f} s")
    if not passed:
        raise SystemExit("bench/speed.py --check: a ratio is outside its limit (above); see docs/performance.md")


if __name__ == "__main__":
    main()
