"""Long runs through a real MCP client: progress notifications during a run,
cancellation (the SDK sends notifications/cancelled when a call is cancelled
or its read timeout passes), and background jobs from start to finish.
Nothing may be left running afterwards."""

from __future__ import annotations

import shutil
import time
import uuid

import anyio
import pytest
from mcp import MCPError
from mcp.types import REQUEST_TIMEOUT

from harness import (TaskClient, call, dump, fixture_project, processes_with, readable_tmpdir, run_async, session, stateless_only,
                     write_config)


def marker() -> str:
    return str(uuid.uuid4().int % 10**8)


def test_progress_arrives_during_a_five_second_run():
    updates: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total, message))

    async def t():
        async with session() as s:
            code = "for i in 1 2 3 4 5; do echo \"step $i\"; sleep 1; done"
            res = await s.call_tool("run", {"env": "bash", "code": code}, progress_callback=on_progress)
            assert not res.is_error and res.structured_content["stdout"].endswith("step 5\n")
    run_async(t)
    assert len(updates) >= 4, updates
    progress = [p for p, _, _ in updates]
    assert progress == sorted(progress) and progress[-1] >= 3, progress
    assert all(total == 30 for _, total, _ in updates), updates
    messages = [m for _, _, m in updates]
    assert any("stdout" in m and "last: step" in m for m in messages), messages


async def gone_within(m: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while processes_with(m) and time.monotonic() < deadline:
        await anyio.sleep(0.02)
    assert processes_with(m) == [], processes_with(m)


def test_cancelling_a_call_kills_its_sandbox_promptly():
    """Cancelled, the run's processes (a detached one too) are gone within
    seconds; bench/latency.py measures how fast."""
    m = marker()

    async def t():
        async with session() as s:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, s, "bash", f"setsid sleep {m}.1 & sleep {m}")
                deadline = time.monotonic() + 5
                while not processes_with(m) and time.monotonic() < deadline:
                    await anyio.sleep(0.02)
                assert processes_with(m), "the run never started"
                tg.cancel_scope.cancel()
            await gone_within(m)
            sc, _, err = await call(s, "bash", "echo still serving")
            assert not err and sc["stdout"] == "still serving\n"
    run_async(t)


def test_a_client_read_timeout_cancels_the_run():
    m = marker()
    seen_running: list[bool] = []

    async def t():
        async with session() as s:
            async def watch() -> None:
                while not processes_with(m):
                    await anyio.sleep(0.02)
                seen_running.append(True)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                # The client's own timeout, not a closed connection (a crashed
                # server) nor an error reply from the server.
                with pytest.raises(MCPError) as raised:
                    await s.call_tool("run", {"env": "bash", "code": f"sleep {m}"}, read_timeout_seconds=3)
                tg.cancel_scope.cancel()
            assert (raised.value.code, raised.value.message) == (REQUEST_TIMEOUT, "Request 'tools/call' timed out"), (
                raised.value.code, raised.value.message)
            assert seen_running, "the run was never seen on the host before the read timeout"
            await gone_within(m)
            sc, _, err = await call(s, "bash", "echo still serving")
            assert not err and sc["stdout"] == "still serving\n", dump(sc)
    run_async(t)


def job(s, **args):
    return s.call_tool("job", args)


def test_a_background_job_from_start_to_finish():
    project = readable_tmpdir()

    async def t():
        # Read-write, so that the running job sees the file the test creates.
        async with session(project=str(project), config=write_config('[project]\nmode = "readwrite"\n')) as s:
            # The job waits for a file the test creates: the call returns while it runs.
            code = "echo first; while [ ! -e /project/release ]; do sleep 0.05; done; echo second >&2; echo third; exit 3"
            sc, text, err = await call(s, "bash", code, background=True)
            assert not err and sc["ok"] and sc["job"] == "job-1" and sc["state"] in ("queued", "running"), dump(sc)
            assert 'job(id="job-1"' in text

            seen = ""
            deadline = time.monotonic() + 5
            while "first" not in seen and time.monotonic() < deadline:
                await anyio.sleep(0.1)
                r = (await job(s, id="job-1")).structured_content
                seen += r["stdout"]
            assert r["state"] == "running" and seen == "first\n" and r["stdout_offset"] == 6, dump(r)

            (project / "release").touch()
            r = await job(s, id="job-1", wait_seconds=10)
            sc = r.structured_content
            assert sc["state"] == "finished" and sc["exit_code"] == 3, dump(sc)
            assert sc["stdout"] == "third\n" and sc["stderr"] == "second\n", "only output new since the last read"
            assert r.is_error and sc["error"]["code"] == "exit_nonzero"

            sc = (await job(s, id="job-1", stdout_offset=0)).structured_content
            assert sc["stdout"] == "first\nthird\n", "an offset re-reads"

            listing = (await job(s)).structured_content
            assert [(j["job"], j["state"], j.get("exit_code")) for j in listing["jobs"]] == [("job-1", "finished", 3)]
    try:
        run_async(t)
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_a_job_can_be_killed_and_leaves_nothing():
    m = marker()

    async def t():
        async with session() as s:
            sc, _, _ = await call(s, "bash", f"setsid sleep {m}.1 & sleep {m}", background=True)
            deadline = time.monotonic() + 5
            while len(processes_with(m)) < 2 and time.monotonic() < deadline:
                await anyio.sleep(0.02)
            assert len(processes_with(m)) == 2, f"the job is not running: {processes_with(m)}"
            r = await job(s, id=sc["job"], kill=True)
            assert r.structured_content["state"] == "finished", dump(r.structured_content)
            assert r.structured_content["error"]["code"] == "cancelled"
            assert processes_with(m) == []
    run_async(t)


def test_jobs_outlive_the_call_but_not_the_server():
    m = marker()

    async def t():
        async with session() as s:
            await call(s, "bash", f"sleep {m}", background=True)
            deadline = time.monotonic() + 5
            while not processes_with(m) and time.monotonic() < deadline:
                await anyio.sleep(0.02)
            assert processes_with(m), "the job runs after its call returned"
    run_async(t)
    assert processes_with(m) == []


def test_jobs_have_their_own_time_limit_and_are_bounded():
    config = write_config("[server]\nmax_jobs = 2\njob_timeout_seconds = 2\n[defaults]\ntimeout_ms = 500\n")

    async def t():
        async with session(config=config) as s:
            a, _, _ = await call(s, "bash", "sleep 1; echo outlived the run limit", background=True)
            b, _, _ = await call(s, "bash", "sleep 60", background=True)
            sc, text, err = await call(s, "bash", "true", background=True)
            assert err and sc["error"]["code"] == "busy" and "2 jobs are already running" in sc["error"]["message"], dump(sc)
            r = (await job(s, id=a["job"], wait_seconds=5)).structured_content
            assert r["exit_code"] == 0 and r["stdout"] == "outlived the run limit\n", dump(r)
            r = (await job(s, id=b["job"], wait_seconds=5)).structured_content
            assert r["timed_out"] and r["error"]["code"] == "timeout", dump(r)
            # The error names the job's own limit, not the environment's.
            assert "2000 ms" in r["error"]["message"], dump(r)
    run_async(t)


def test_a_killed_job_frees_its_place_at_once_and_finished_ones_are_kept_within_a_count():
    config = write_config("[server]\nmax_jobs = 1\njob_retention_count = 2\n")

    async def t():
        async with session(config=config) as s:
            first, _, _ = await call(s, "bash", "sleep 60", background=True)
            sc, _, err = await call(s, "bash", "true", background=True)
            assert err and sc["error"]["code"] == "busy", dump(sc)
            await job(s, id=first["job"], kill=True)
            # No waiting: the kill itself gave the place back.
            ids = [first["job"]]
            for i in range(3):
                sc, _, err = await call(s, "bash", f"echo {i}", background=True)
                assert not err, dump(sc)
                ids.append(sc["job"])
                r = (await job(s, id=sc["job"], wait_seconds=10)).structured_content
                assert r["state"] == "finished" and r["stdout"] == f"{i}\n", dump(r)
            listing = (await job(s)).structured_content
            assert [j["job"] for j in listing["jobs"]] == ids[-2:], dump(listing)
            r = await job(s, id=ids[0])
            assert r.is_error and r.structured_content["error"]["code"] == "unknown_job"
    run_async(t)


def test_a_job_that_never_ran_keeps_its_real_error_code():
    config = write_config("[server]\nmax_concurrent_runs = 1\n")

    async def t():
        async with session(config=config) as s:
            running, _, _ = await call(s, "bash", "sleep 60", background=True)
            queued, _, _ = await call(s, "bash", "echo never", background=True)
            await job(s, id=queued["job"], kill=True)
            r = (await job(s, id=queued["job"], wait_seconds=10)).structured_content
            assert r["state"] == "finished" and r["error"]["code"] == "cancelled", dump(r)
            assert "doctor" not in r["error"]["suggestion"], dump(r)
            await job(s, id=running["job"], kill=True)
    run_async(t)


def test_job_errors_say_what_to_do():
    async def t():
        async with session() as s:
            r = await job(s, id="job-99")
            assert r.is_error and r.structured_content["error"]["code"] == "unknown_job"
            assert "no jobs" in r.structured_content["error"]["suggestion"].lower()
            listing = (await job(s)).structured_content
            assert listing["ran"]["server"].startswith("nix-sandbox-mcp "), listing
            assert {k: v for k, v in listing.items() if k != "ran"} == {"ok": True, "jobs": []}

            # Real jobs, so that each bound is what refuses the call (for an
            # unknown id, the id is refused before any bound is looked at).
            running, _, err = await call(s, "bash", "sleep 60", background=True)
            assert not err, dump(running)
            done, _, err = await call(s, "bash", "echo done", background=True)
            assert not err, dump(done)
            r = (await job(s, id=done["job"], wait_seconds=10)).structured_content
            assert r["state"] == "finished" and r["stdout"] == "done\n", dump(r)
            # On a loaded machine the first job may still wait for its
            # sandbox; the listing at the end expects it running.
            deadline = time.monotonic() + 30
            while (await job(s, id=running["job"])).structured_content["state"] == "queued":
                assert time.monotonic() < deadline, "the first job did not start in 30 s"
                await anyio.sleep(0.05)
            ids = (running["job"], done["job"])
            for id_ in ids:
                for bad, message in (
                    ({"wait_seconds": 500}, "`wait_seconds` must be between 0 and 60"),
                    ({"wait_seconds": 60.5}, "`wait_seconds` must be between 0 and 60"),
                    ({"wait_seconds": -1}, "`wait_seconds` must be between 0 and 60"),
                    ({"stdout_offset": -1}, "`stdout_offset` must be a byte offset (an integer of 0 or more), not a number"),
                    ({"stderr_offset": 1.5}, "`stderr_offset` must be a byte offset (an integer of 0 or more), not a number"),
                    ({"kill": "yes"}, "`kill` must be true or false, not a string"),
                ):
                    r = await s.call_tool("job", {"id": id_, **bad})
                    sc = r.structured_content
                    assert r.is_error and sc["error"]["code"] == "invalid_input", (id_, bad, dump(sc))
                    assert sc["error"]["message"] == message, (id_, bad, dump(sc))
            # At the bounds themselves, the call is answered (the finished
            # job's wait ends at once).
            for fine in ({"wait_seconds": 60}, {"wait_seconds": 0}, {"stdout_offset": 0}):
                r = await s.call_tool("job", {"id": done["job"], **fine})
                assert not r.is_error and r.structured_content["state"] == "finished", (fine, dump(r.structured_content))
            for bad, message in (
                ({"id": 5}, "`id` must be a string, not a number"),
                ({"what": 1}, "unknown argument `what`; job takes `id`, `wait_seconds`, `kill`, `stdout_offset`, `stderr_offset`"),
            ):
                r = await s.call_tool("job", bad)
                sc = r.structured_content
                assert r.is_error and sc["error"]["code"] == "invalid_input" and sc["error"]["message"] == message, (bad, dump(sc))
            # None of the refused calls touched the jobs.
            listing = (await job(s)).structured_content
            assert [(j["job"], j["state"]) for j in listing["jobs"]] == [(ids[0], "running"), (ids[1], "finished")], dump(listing)
            await job(s, id=running["job"], kill=True)
    run_async(t)


def test_waiting_on_a_job_reports_progress():
    updates: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append(message)

    async def t():
        async with session() as s:
            sc, _, _ = await call(s, "bash", "sleep 3", background=True)
            await s.call_tool("job", {"id": sc["job"], "wait_seconds": 10}, progress_callback=on_progress)
    run_async(t)
    assert len(updates) >= 2 and all("job-1" in u for u in updates), updates


# --- Jobs as tasks (the io.modelcontextprotocol/tasks extension, 2026-07-28).
# The Python SDK has no client for the extension: raw JSON-RPC.

@stateless_only()
def test_a_background_run_is_a_task_polled_to_its_result():
    # Read-write, so that the running job sees the file the test creates: it
    # ends only once the test has seen it working.
    c = TaskClient(config=write_config('[project]\nmode = "readwrite"\n'))
    gate = fixture_project() / f"go-{uuid.uuid4().hex[:8]}"
    try:
        r = c.run(f"echo started; while [ ! -e /project/{gate.name} ]; do sleep 0.05; done; echo done",
                  background=True)["result"]
        assert r["resultType"] == "task" and r["status"] == "working", r
        task_id = r["taskId"]
        assert task_id.startswith("t_") and len(task_id) == 34 and r["pollIntervalMs"] == 1000, r
        assert r["createdAt"].endswith("Z") and r["ttlMs"] > 0, r
        # Working: the new output so far, as the job tool gives it.
        deadline = time.monotonic() + 20
        seen = ""
        while "started" not in seen and time.monotonic() < deadline:
            got = c.get(task_id)["result"]
            assert got["status"] in ("working", "completed"), got
            seen += got["_meta"]["nix-sandbox-mcp/job"].get("stdout", "")
            time.sleep(0.1)
        assert "started" in seen and got["status"] == "working", (seen, got)
        gate.touch()
        done = c.until(task_id, "completed")
        result = done["result"]
        # The result is the job tool's for it: the output new since the last poll.
        assert result["isError"] is False and result["structuredContent"]["exit_code"] == 0, done
        assert result["structuredContent"]["ran"]["environment"] == "bash", result
    finally:
        c.srv.close()
        gate.unlink(missing_ok=True)


@stateless_only()
def test_a_cancelled_task_kills_its_run():
    marker = f"nsm-task-{uuid.uuid4().hex[:8]}"
    c = TaskClient()
    try:
        task_id = c.run(f"exec -a {marker} sleep 60", background=True)["result"]["taskId"]
        deadline = time.monotonic() + 20
        while not processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker), "the task's run started"
        assert c.request("tasks/cancel", {"taskId": task_id})["result"]["resultType"] == "complete"
        c.until(task_id, "cancelled")
        assert processes_with(marker) == [], processes_with(marker)
    finally:
        c.srv.close()


@stateless_only()
def test_an_unknown_task_is_refused_and_the_extension_is_asked_for():
    c = TaskClient()
    other = TaskClient()
    try:
        r = c.get("t_" + "0" * 32)
        assert r["error"]["code"] == -32602 and "never issued" in r["error"]["message"], r
        theirs = other.run("sleep 5", background=True)["result"]["taskId"]
        r = c.get(theirs)
        assert r["error"]["code"] == -32602 and "never issued" in r["error"]["message"], r
        # Without the extension: tasks/* is refused with the capability it
        # needs, and a background run is a job, as under 2025-11-25.
        r = c.request("tasks/get", {"taskId": theirs}, capabilities={})
        assert r["error"]["code"] == -32021, r
        r = c.request("tools/call", {"name": "run", "arguments": {"env": "bash", "code": "true", "background": True}},
                      capabilities={})
        assert r["result"]["structuredContent"]["job"].startswith("job-"), r
    finally:
        c.srv.close()
        other.srv.close()
