"""Every error code the README documents, produced through the real server
by a real run: one case per code, and a check that the README's list and
the cases are the same set. `internal` (a run that ends without an exit
status) and `output_incomplete` (a stream still open after every process of
the sandbox is gone) cannot be provoked from outside; their examples are the
Rust tests named in RUST_EXAMPLES."""

from __future__ import annotations

import pathlib
import re
import shutil
import time
import uuid

import anyio
import pytest

from harness import MODE, ROOT, call, dump, limits_mechanism, processes_with, readable_tmpdir, run_async, session, var_tmpdir, write_config

RUST_EXAMPLES = {
    "internal": ("daemon/tests/error_codes.rs", "a_run_without_an_exit_status_is_an_internal_error"),
    "output_incomplete": ("daemon/src/server/result.rs", "output_that_could_not_be_read_is_never_a_success"),
}


def documented_codes() -> set[str]:
    readme = (ROOT / "README.md").read_text()
    sentence = re.search(r"stable `error\.code` \(([^)]*)\)", readme)
    assert sentence, "README.md no longer lists the error codes after 'stable `error.code` ('"
    return set(re.findall(r"`([a-z_]+)`", sentence.group(1)))


async def run_error(s, env: str, code: str, **extra) -> dict:
    sc, text, err = await call(s, env, code, **extra)
    assert err and sc["ok"] is False, dump(sc)
    assert f"error[{sc['error']['code']}]" in text and sc["error"]["suggestion"], text
    return sc


async def exit_nonzero(s):
    # 130 and 143 are what programs exit with after handling SIGINT or
    # SIGTERM: statuses, not deaths by signal.
    for status in (130, 143):
        sc = await run_error(s, "bash", f"exit {status}")
        assert sc["error"]["code"] == "exit_nonzero" and sc["exit_code"] == status and "signal" not in sc, dump(sc)
    return await run_error(s, "bash", "exit 3")


async def killed_by_signal(s):
    sc = await run_error(s, "bash", "kill -SEGV $$")
    assert sc["signal"] == "SIGSEGV", dump(sc)
    return sc


async def timeout(s):
    return await run_error(s, "bash", "sleep 30")


# Codes a host without a cgroup cannot produce: skipped, with the reason,
# before the server starts (a skip raised inside the session's task group
# reaches pytest without its reason).
NEEDS_A_CGROUP = {
    "memory_limit": "without a memory cgroup, allocation fails inside the program (exit_nonzero)",
    "process_limit": "without a pids cgroup, fork fails inside the program (exit_nonzero)",
}


async def memory_limit(s):
    return await run_error(s, "python", "x = []\nwhile True: x.append(bytearray(8 << 20))")


async def process_limit(s):
    # Each child waits until the parent has ended (the pipe's end it keeps
    # closes then), so all are alive when a fork is refused, however slow.
    return await run_error(
        s, "python", "import os\nr, w = os.pipe()\nfor i in range(64):\n    if os.fork() == 0:\n        os.close(w)\n"
        "        os.read(r, 1)\n        os._exit(0)\n"
    )


async def cpu_limit(s):
    # Its own server, whose time limit is far beyond the CPU limit: the CPU
    # limit must fire first however slowly the loop is scheduled.
    async with session(config=write_config("[defaults]\ncpu_seconds = 1\ntimeout_ms = 60000\n")) as own:
        return await run_error(own, "python", "while True: pass")


async def output_limit(s):
    return await run_error(s, "python", "import sys\nwhile True: sys.stdout.write('x' * 65536)")


async def file_size_limit(s):
    # exec, so the program the limit kills is the run's own.
    return await run_error(s, "bash", "exec head -c 3000000 /dev/zero > /workspace/big")


async def cancelled(s):
    sc, _, err = await call(s, "bash", "sleep 30", background=True)
    assert not err, dump(sc)
    r = await s.call_tool("job", {"id": sc["job"], "kill": True})
    return r.structured_content


async def unknown_env(s):
    sc = await run_error(s, "cobol", "DISPLAY 'HI'.")
    assert "bash" in sc["error"]["suggestion"], dump(sc)
    return sc


async def unknown_job(s):
    r = await s.call_tool("job", {"id": "job-99"})
    assert r.is_error
    return r.structured_content


async def session_expired(s):
    sc, _, err = await call(s, "bash", "x=1", session="brief")
    assert not err, dump(sc)
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        await anyio.sleep(0.5)
        sc, _, err = await call(s, "bash", "echo $x", session="brief")
        if err:
            return sc
    raise AssertionError(f"the session outlived its 2 s lifetime: {dump(sc)}")


async def session_mismatch(s):
    sc, _, err = await call(s, "python", "x = 1", session="data")
    assert not err, dump(sc)
    return await run_error(s, "bash", "echo hi", session="data")


async def invalid_input(s):
    # Empty code, refused the same way as by `nix-sandbox-mcp run`.
    sc = await run_error(s, "bash", "  \n")
    assert "only whitespace" in sc["error"]["message"], dump(sc)
    return sc


async def until(done, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, what
        await anyio.sleep(0.02)


async def busy(s):
    # Its own server: one run at a time and one call queued. A run holds
    # the slot until the test releases it (a file it creates in the
    # read-write project), so two more calls sent while it is seen running
    # find the slot taken: one waits in the queue, the other is refused.
    project = readable_tmpdir()
    config = write_config('[server]\nmax_concurrent_runs = 1\nmax_queued_runs = 1\n[project]\nmode = "readwrite"\n')
    m = str(uuid.uuid4().int % 10**8)
    results: dict[str, dict] = {}
    try:
        async with session(project=str(project), config=config) as own:
            async def one(name: str, code: str) -> None:
                results[name] = (await call(own, "bash", code))[0]

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "holder", f"sleep 1{m} & while [ ! -e /project/release ]; do sleep 0.02; done; kill $!; echo released")
                await until(lambda: processes_with(m) or "holder" in results, f"the run never started: {results}")
                assert "holder" not in results, dump(results)
                tg.start_soon(one, "b", "echo b")
                tg.start_soon(one, "c", "echo c")
                await until(lambda: results.keys() & {"b", "c"}, f"neither call was answered: {results}")
                (project / "release").touch()
    finally:
        shutil.rmtree(project, ignore_errors=True)
    assert results["holder"]["stdout"] == "released\n", dump(results)
    refused = [n for n in "bc" if results[n].get("error", {}).get("code") == "busy"]
    assert len(refused) == 1, dump(results)
    queued = "c" if refused == ["b"] else "b"
    assert results[queued]["ok"] and results[queued]["stdout"] == f"{queued}\n", dump(results)
    return results[refused[0]]


async def sandbox_unavailable(s):
    # The interpreter's directory disappears after start-up: bubblewrap
    # cannot set the sandbox up, and the call says it is the host's fault.
    # (Once the tools are listed, the start checks are over.)
    await s.list_tools()
    shutil.rmtree(GONE)
    for _ in range(3):
        sc, _, err = await call(s, "gone", "echo never")
        if err and sc["error"]["code"] == "sandbox_unavailable":
            assert "doctor" in sc["error"]["suggestion"], dump(sc)
            return sc
    raise AssertionError(dump(sc))


# A copy of bash in an install prefix of its own, for `sandbox_unavailable`
# (outside /tmp, which every sandbox has its own of).
GONE = var_tmpdir() / "prefix"
GONE.parent.chmod(0o755)
if MODE == "host":
    (GONE / "bin").mkdir(parents=True)
    shutil.copy(shutil.which("bash", path="/usr/bin:/bin"), GONE / "bin" / "bash")
    for p in (GONE, GONE / "bin"):
        p.chmod(0o755)
CONFIG = write_config(
    "[defaults]\ntimeout_ms = 3000\nmemory_mb = 128\npids = 16\ncpu_seconds = 1\nfile_size_mb = 1\noutput_limit_mb = 1\n"
    "[server]\nmax_concurrent_runs = 1\nmax_queued_runs = 1\nsession_max_lifetime_seconds = 2\n"
    '[environments.bash]\npreset = "bash"\n[environments.python]\npreset = "python"\n'
    f'[environments.gone]\ninterpreter = "{GONE}/bin/bash {{file}}"\n'
)

CASES = {f.__name__: f for f in (
    exit_nonzero, killed_by_signal, timeout, memory_limit, process_limit, cpu_limit, output_limit, file_size_limit,
    cancelled, unknown_env, unknown_job, session_expired, session_mismatch, invalid_input, busy, sandbox_unavailable,
)}


def test_every_documented_code_has_an_example():
    documented = documented_codes()
    assert documented == set(CASES) | set(RUST_EXAMPLES), (
        f"documented, no example: {sorted(documented - set(CASES) - set(RUST_EXAMPLES))}; "
        f"example, not documented: {sorted(set(CASES) | set(RUST_EXAMPLES) - documented)}"
    )
    for code, (path, test) in RUST_EXAMPLES.items():
        source = (ROOT / path).read_text()
        assert f"fn {test}(" in source and f'"{code}"' in source, (code, path, test)


@pytest.mark.skipif(MODE != "host", reason="host-mode environments")
@pytest.mark.parametrize("code", sorted(CASES))
def test_the_code_is_produced(code):
    if code in NEEDS_A_CGROUP and limits_mechanism() == "rlimits":
        pytest.skip(NEEDS_A_CGROUP[code])

    async def t():
        async with session(config=CONFIG) as s:
            sc = await CASES[code](s)
            assert sc["error"]["code"] == code, dump(sc)
    run_async(t)
