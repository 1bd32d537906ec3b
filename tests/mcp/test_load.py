"""Sustained load through the real binary, with limits on: back-to-back calls
with 1 and 8 in flight must all run (no `sandbox_unavailable`), whatever
else the user running the server has running; a fork bomb is still held.
test-local.sh runs this file as a non-root user too, where the server has no
cgroup and limits processes with RLIMIT_NPROC inside each sandbox."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time
import uuid

import anyio
import pytest

from harness import RawServer, call, dump, processes_with, run_async, session, var_tmpdir, write_config

LOAD = write_config("[defaults]\npids = 64\n[server]\nmax_concurrent_runs = 8\nmax_queued_runs = 64\n")


async def back_to_back(in_flight: int, seconds: float) -> tuple[int, list[dict]]:
    """Calls with `in_flight` always outstanding, for `seconds`; returns the
    number of calls and the failed results."""
    done = 0
    failures: list[dict] = []
    async with session(config=LOAD) as s:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                sc, _, err = await call(s, "bash", "true")
                done += 1
                if err:
                    failures.append(sc)

        async with anyio.create_task_group() as tg:
            for _ in range(in_flight):
                tg.start_soon(worker)
    return done, failures


@pytest.mark.parametrize("in_flight", [1, 8])
@pytest.mark.parametrize("limits", ["auto", "rlimits"])
def test_back_to_back_calls_all_run(in_flight, limits, monkeypatch):
    monkeypatch.setenv("NIX_SANDBOX_LIMITS", limits)
    done, failures = run_async(back_to_back, in_flight, 3.0)
    assert done > 10, done
    assert failures == [], dump(failures[:3])


def test_many_processes_of_the_same_user_do_not_stop_runs():
    """The process limit counts the sandbox's own processes, not the host
    user's: a thousand more processes of the user running the server change
    nothing."""
    extra = [subprocess.Popen(["sleep", "60"]) for _ in range(1000)]
    try:
        async def t():
            async with session(config=LOAD) as s:
                for _ in range(5):
                    sc, _, err = await call(s, "bash", "for i in 1 2 3 4 5 6 7 8; do sleep 0.1 & done; wait; echo ran")
                    assert not err and sc["stdout"] == "ran\n", dump(sc)
        run_async(t)
    finally:
        for p in extra:
            p.kill()
        for p in extra:
            p.wait()


def test_the_process_limit_still_holds_with_many_host_processes():
    extra = [subprocess.Popen(["sleep", "60"]) for _ in range(300)]
    try:
        async def t():
            async with session(config=write_config("[defaults]\npids = 16\ntimeout_ms = 10000\n")) as s:
                code = ("import os, time\nn = 0\ntry:\n    while n < 100:\n        if os.fork() == 0:\n"
                        "            time.sleep(5)\n            os._exit(0)\n        n += 1\n"
                        "except OSError:\n    pass\nprint('started', n)\nos._exit(0)\n")
                sc, _, _ = await call(s, "python", code)
                started = int(sc["stdout"].split()[-1])
                assert 0 < started < 16, dump(sc)
        run_async(t)
    finally:
        for p in extra:
            p.kill()
        for p in extra:
            p.wait()


def test_the_memory_budget_bounds_what_runs_at_once():
    """Sandboxes alive at once promise at most the memory budget: with room
    for one 128 MiB sandbox, a second run waits for the first to end. Right
    after start-up the pool is preparing a sandbox, which holds the budget
    already: the first run takes its share as soon as it is ready, instead
    of waiting until the pool lets an idle sandbox go (a minute)."""
    config = write_config("[defaults]\nmemory_mb = 128\n[server]\nmemory_budget_mb = 200\nmax_concurrent_runs = 4\n")
    # The first holds its sandbox for two seconds from when the host sees
    # it run (a `sleep` carrying a marker); the second is sent only then.
    m = str(uuid.uuid4().int % 10**8)
    first = f"import subprocess, time\nsubprocess.run(['sleep', '2.{m}'])\nprint(time.time())"
    second = "import time\nprint(time.time())"

    async def t():
        async with session(config=config) as s:
            results, took = {}, {}

            async def go(name, code):
                began = time.monotonic()
                results[name] = await call(s, "python", code)
                took[name] = time.monotonic() - began

            async with anyio.create_task_group() as tg:
                tg.start_soon(go, "first", first)
                deadline = time.monotonic() + 20
                while not processes_with(m) and "first" not in results and time.monotonic() < deadline:
                    await anyio.sleep(0.02)
                assert processes_with(m), f"the first run was never seen running: {dump(results)}"
                tg.start_soon(go, "second", second)
            (a, _, a_err), (b, _, b_err) = results["first"], results["second"]
            assert not a_err and not b_err, dump(results)
            assert float(b["stdout"]) >= float(a["stdout"]), dump(results)
            assert took["first"] < 20, (took, dump(results))
    run_async(t)


def test_an_environment_larger_than_the_budget_is_dropped_with_the_fix():
    """An environment whose memory limit the budget could never hold is not
    offered; the warning says why and what to change."""
    config = write_config("[server]\nmemory_budget_mb = 256\n[environments.small]\npreset = \"bash\"\nmemory_mb = 64\n"
                          "[environments.big]\npreset = \"bash\"\nmemory_mb = 512\n")
    import harness
    params = harness.server_params(config=config)
    out = subprocess.run([harness.BIN, "--config", config, "envs", "--json"], env={**os.environ, **(params.env or {})},
                         capture_output=True, check=True)
    listing = json.loads(out.stdout)
    assert [e["name"] for e in listing["environments"]] == ["small"], dump(listing)
    assert any("big" in w and "512 MiB" in w and "256 MiB" in w for w in listing["warnings"]), dump(listing["warnings"])


def waiting_sandboxes(server_pid: int) -> int:
    """The server's prepared sandboxes: its bubblewrap children (each waits
    on its block descriptor until a call takes it)."""
    count = 0
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            parent = (p / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if b"bwrap\0--args\0" in cmd and parent == str(server_pid):
            count += 1
    return count


def settles_at(server_pid: int, want, within: float = 15) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        n = waiting_sandboxes(server_pid)
        if want(n):
            return n
        time.sleep(0.1)
    return waiting_sandboxes(server_pid)


def test_the_pool_follows_demand():
    """A quiet environment keeps two sandboxes ready, not one per run slot;
    after a burst of six calls, six are kept for it. An environment that
    fails its start check keeps none."""
    prefix = var_tmpdir() / "prefix"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy("/bin/false", prefix / "bin" / "python3")
    for p in (prefix.parent, prefix, prefix / "bin"):
        p.chmod(0o755)
    config = write_config(
        "[server]\nmax_concurrent_runs = 8\n[environments.bash]\npreset = \"bash\"\n"
        f'[environments.broken]\ninterpreter = ["{prefix}/bin/python3", "{{file}}"]\n'
    )
    server = RawServer(config=config)
    try:
        server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert server.recv()["id"] == 1
        quiet = settles_at(server.proc.pid, lambda n: n == 2)
        assert quiet == 2, f"{quiet} sandboxes wait for a quiet environment (and none for a broken one)"
        for i in range(6):
            server.send({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                         "params": {"name": "run", "arguments": {"env": "bash", "code": "sleep 0.3"}}})
        replies = [server.recv(30) for _ in range(6)]
        assert all(r["result"]["structuredContent"]["ok"] for r in replies), replies
        busy = settles_at(server.proc.pid, lambda n: n >= 6)
        assert busy >= 6, f"{busy} sandboxes wait after a burst of six calls"
    finally:
        server.close()


def test_without_the_pool_no_sandbox_waits_and_calls_still_run():
    """NIX_SANDBOX_POOL=off: nothing is set up ahead of a call; each call
    sets its own sandbox up."""
    server = RawServer(env={"NIX_SANDBOX_POOL": "off"})
    try:
        server.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert server.recv()["id"] == 1
        for i in range(3):
            server.send({"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",
                         "params": {"name": "run", "arguments": {"env": "python", "code": f"print({i} * 7)"}}})
            reply = server.recv(30)["result"]["structuredContent"]
            assert reply["ok"] and reply["stdout"] == f"{i * 7}\n", reply
        time.sleep(0.5)
        assert waiting_sandboxes(server.proc.pid) == 0
    finally:
        server.close()
