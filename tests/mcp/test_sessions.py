"""Sessions through a real MCP client: state persists per interpreter, is
isolated between sessions, survives exit calls, is lost (and said to be lost)
on timeouts, crashes and cancellation, is bounded in number, idle time and
lifetime, and leaves no process behind."""

from __future__ import annotations

import os
import pathlib
import shutil
import time
import uuid

import anyio
import pytest

from harness import (RawServer, call, dump, limits_mechanism, processes_with, readable_tmpdir, run_async, session,
                     stateless_only, write_config)


def marker() -> str:
    return str(uuid.uuid4().int % 10**8)


async def ok(s, env: str, code: str, name: str) -> dict:
    sc, text, err = await call(s, env, code, session=name)
    assert not err, text
    return sc


async def gone_within(m: str, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while processes_with(m) and time.monotonic() < deadline:
        await anyio.sleep(0.02)
    assert processes_with(m) == [], processes_with(m)


# A background process started by a session call, waited for until it runs
# its program: the session is paused (stopped) when the call returns, which
# would otherwise catch it between fork and exec.
def bash_bg(m: str) -> str:
    return f"sleep {m} & until grep -q {m} /proc/$!/cmdline 2>/dev/null; do :; done"


def node_bg(m: str) -> str:
    return (f"const c = require('child_process').spawn('sleep', ['{m}'], {{detached: true, stdio: 'ignore'}}); c.unref();\n"
            f"while (!(() => {{ try {{ return require('fs').readFileSync('/proc/' + c.pid + '/cmdline', 'utf8').includes('{m}') }} catch (e) {{ return false }} }})()) {{}}")


async def seen_within(m: str, count: int, seconds: float = 5) -> None:
    """Waits until `count` host processes carry `m` (a background `sleep` may
    still be starting when its call returns)."""
    deadline = time.monotonic() + seconds
    while len(processes_with(m)) < count and time.monotonic() < deadline:
        await anyio.sleep(0.02)
    assert len(processes_with(m)) == count, processes_with(m)


STATE = {
    "python": ("import json as j\nx = 41\ndef f(v):\n    return v + 1\nimport os\nos.mkdir('d'); os.chdir('d')\nopen('/workspace/kept.txt', 'w').write('file')",
               "print(f(x), j.dumps([1]), os.getcwd(), open('/workspace/kept.txt').read())",
               "42 [1] /workspace/d file\n"),
    "bash": ("x=41\nf() { echo $(( $1 + 1 )); }\nmkdir d && cd d\necho file > /workspace/kept.txt",
             "echo \"$(f $x) $PWD $(cat /workspace/kept.txt)\"",
             "42 /workspace/d file\n"),
    "node": ("const path = require('path')\nvar x = 41\nfunction f(v) { return v + 1 }\nclass K {}\nrequire('fs').writeFileSync('/workspace/kept.txt', 'file')",
             "console.log(f(x), path.join('a', 'b'), typeof K, require('fs').readFileSync('/workspace/kept.txt', 'utf8'))",
             "42 a/b function file\n"),
}


@pytest.mark.parametrize("env", sorted(STATE))
def test_state_persists_between_calls(env):
    setup, use, expected = STATE[env]

    async def t():
        async with session() as s:
            sc = await ok(s, env, setup, "work")
            # Under 2026-07-28 it also has a handle (test_a_session_has_a_handle_…).
            assert {k: v for k, v in sc["session"].items() if k != "handle"} == {"name": "work", "state": "new"}, dump(sc)
            sc = await ok(s, env, use, "work")
            assert sc["stdout"] == expected and sc["session"]["state"] == "continued", dump(sc)
            sc, text, _ = await call(s, env, use, session="work")
            assert text.startswith(f"[{env}, session work continued] exit 0"), text
    run_async(t)


def test_sessions_are_isolated_from_each_other_and_from_plain_runs():
    async def t():
        async with session() as s:
            await ok(s, "python", "secret = 1\nopen('mine', 'w').write('a')", "a")
            sc, _, err = await call(s, "python", "print(secret)", session="b")
            assert err and "NameError" in sc["stderr"], dump(sc)
            sc = await ok(s, "python", "import os; print(os.listdir('.'))", "b")
            assert sc["stdout"] == "[]\n", dump(sc)
            sc, _, _ = await call(s, "bash", "ls /workspace")
            assert sc["stdout"] == "", dump(sc)
            # Each session is its own sandbox: its own process tree.
            sc = await ok(s, "python", "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:2])", "a")
            sc2 = await ok(s, "python", "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:2])", "b")
            assert sc["stdout"] == sc2["stdout"] == "[1, 2]\n", (dump(sc), dump(sc2))
    run_async(t)


def test_a_session_belongs_to_its_environment():
    async def t():
        async with session() as s:
            await ok(s, "python", "x = 1", "data")
            sc, text, err = await call(s, "bash", "echo hi", session="data")
            assert err and sc["error"]["code"] == "session_mismatch", dump(sc)
            assert "python" in sc["error"]["message"] and "python" in sc["error"]["suggestion"], dump(sc)
            sc = await ok(s, "python", "print(x)", "data")
            assert sc["stdout"] == "1\n"
    run_async(t)


def test_bad_session_arguments_say_how_to_call():
    async def t():
        async with session() as s:
            for name in ("", "a b", "x" * 65, "../etc"):
                sc, _, err = await call(s, "bash", "true", session=name)
                assert err and sc["error"]["code"] == "invalid_input" and "session" in sc["error"]["message"], dump(sc)
            sc, _, err = await call(s, "bash", "true", session=5)
            assert err and sc["error"]["code"] == "invalid_input", dump(sc)
            sc, _, err = await call(s, "bash", "true", session="s", background=True)
            assert err and "background" in sc["error"]["message"], dump(sc)
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert "session" in tools["run"].input_schema["properties"]
    run_async(t)


PROTOCOL_LOOKALIKES = '{"id": 1, "status": 0}\\n{"ready": true}\\n{"id": 2, "status": 9, "exited": true}\\n'


def test_output_of_child_processes_is_output_not_protocol():
    codes = {
        "python": f"import os, subprocess, sys\nprint('{PROTOCOL_LOOKALIKES}', end='')\nos.system(\"printf 'from system\\\\n'\")\n"
                  "subprocess.run(['sh', '-c', 'echo from subprocess; echo to stderr >&2'])\nos.write(1, b'raw fd\\n')\nprint('after')",
        "bash": f"printf '{PROTOCOL_LOOKALIKES}'\n( echo from subshell )\necho from job & wait\nsh -c 'echo from child; echo to stderr >&2'\necho after",
        "node": f"process.stdout.write('{PROTOCOL_LOOKALIKES}')\nconsole.log(require('child_process').execSync('echo from child; echo to stderr >&2').toString().trim())\nconsole.log('after')",
    }

    async def t():
        async with session() as s:
            for env, code in codes.items():
                for _ in range(2):
                    sc = await ok(s, env, code, f"proto-{env}")
                    assert sc["stdout"].startswith('{"id": 1, "status": 0}\n{"ready": true}\n{"id": 2, "status": 9, "exited": true}\n'), dump(sc)
                    assert sc["stdout"].endswith("after\n") and "from" in sc["stdout"], dump(sc)
                    assert "to stderr" in sc["stderr"] or env == "python" and "to stderr" in sc["stderr"], dump(sc)
                    assert sc["session"]["state"] in ("new", "continued"), dump(sc)
    run_async(t)


def test_children_do_not_inherit_the_protocol_descriptors():
    async def t():
        async with session() as s:
            for env, code in [("python", "import os; os.system('ls /proc/self/fd')"),
                              ("node", "console.log(require('child_process').execSync('ls /proc/self/fd').toString().trim())")]:
                sc = await ok(s, env, code, f"fds-{env}")
                assert sc["stdout"].split() == ["0", "1", "2", "3"], dump(sc)
    run_async(t)


def test_large_output_on_both_streams_does_not_deadlock():
    code = "import sys\nfor i in range(2000):\n    sys.stdout.write('o' * 2000 + '\\n')\n    sys.stderr.write('e' * 2000 + '\\n')\nprint('end')"

    async def t():
        async with session() as s:
            for _ in range(2):
                with anyio.fail_after(30):
                    sc = await ok(s, "python", code, "big")
                assert sc["stdout"].endswith("end\n") and sc["stdout_dropped_bytes"] > 3_000_000, dump(sc)
                assert sc["stderr_dropped_bytes"] > 3_000_000, dump(sc)
            sc = await ok(s, "bash", "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo done", "bigsh")
            assert sc["stdout"].endswith("done\n"), dump(sc)
    run_async(t)


FAST = write_config("[defaults]\ntimeout_ms = 2000\n")


@pytest.mark.parametrize("env,setup,hang,probe", [
    ("python", "x = 1", "import subprocess, time\nsubprocess.Popen(['sleep', '{m}'])\ntime.sleep(60)", "print(x)"),
    ("bash", "x=1", "sleep {m} &\nsleep 60", "echo ${x:?unset}"),
    ("node", "var x = 1", "require('child_process').spawn('sleep', ['{m}'])\nsetTimeout(() => {}, 60000)", "console.log(x)"),
])
def test_a_timeout_kills_the_session_and_says_what_was_lost(env, setup, hang, probe):
    m = marker()

    async def t():
        async with session(config=FAST) as s:
            await ok(s, env, setup, "t")
            sc, text, err = await call(s, env, hang.replace("{m}", m), session="t")
            assert err and sc["error"]["code"] == "timeout" and sc["timed_out"], dump(sc)
            assert "2000 ms" in sc["session"]["reset"] and "gone" in sc["session"]["reset"], dump(sc)
            assert "session: a call exceeded" in text, text
            await gone_within(m)
            sc, text, err = await call(s, env, probe, session="t")
            assert err, dump(sc)
            assert sc["session"]["state"] == "restarted" and "time limit" in sc["session"]["restarted_because"], dump(sc)
            assert "fresh session" in text, text
            sc = await ok(s, env, setup, "t")
            assert sc["session"]["state"] == "continued"
    run_async(t)


def test_every_call_returns_all_it_printed_before_its_reply():
    """A call ends on the reply channel, apart from the output pipes; what the
    code printed before it replied must all be in its result, every time."""
    async def t():
        async with session() as s:
            for env, code in [
                ("bash", "echo line-{i}; echo err-{i} >&2"),
                # Lines that are not replies keep the daemon reading the reply
                # channel while the output arrives: the output must not be lost.
                ("bash", "for j in 1 2 3 4 5 6 7 8; do echo '{{}}' >&204; done; echo line-{i}; echo err-{i} >&2"),
                ("python", "import sys; print('line-{i}'); print('err-{i}', file=sys.stderr)"),
                ("node", "console.log('line-{i}'); console.error('err-{i}')"),
            ]:
                for i in range(60):
                    sc = await ok(s, env, code.format(i=i), f"all-{env}-{len(code)}")
                    assert (sc["stdout"], sc["stderr"]) == (f"line-{i}\n", f"err-{i}\n"), dump(sc)
    run_async(t)


def test_exit_ends_the_run_with_its_status_not_the_session():
    async def t():
        async with session() as s:
            for env, setup, exit_code, probe, expected in [
                ("python", "x = 7", "import sys; print('bye'); sys.exit(3)", "print(x)", "7\n"),
                ("python", "x = 7", "exit(4)", "print(x)", "7\n"),
                ("python", "x = 7", "raise SystemExit('a message')", "print(x)", "7\n"),
                ("node", "var x = 7", "console.log('bye'); process.exit(3)", "console.log(x)", "7\n"),
            ]:
                await ok(s, env, setup, f"exit-{env}")
                sc, _, err = await call(s, env, exit_code, session=f"exit-{env}")
                assert err and sc["error"]["code"] == "exit_nonzero" and sc["exit_code"] in (1, 3, 4), dump(sc)
                assert "reset" not in sc["session"], dump(sc)
                sc = await ok(s, env, probe, f"exit-{env}")
                assert sc["stdout"] == expected and sc["session"]["state"] == "continued", dump(sc)
            # bash: `exit` ends the shell; files and the directory stay, variables go.
            await ok(s, "bash", "x=7; mkdir -p sub && cd sub && echo kept > f", "sh")
            sc, _, err = await call(s, "bash", "echo bye; exit 5", session="sh")
            assert err and sc["exit_code"] == 5 and sc["stdout"] == "bye\n", dump(sc)
            assert "variables" in sc["session"]["reset"] and "kept" in sc["session"]["reset"], dump(sc)
            sc = await ok(s, "bash", "echo \"x=$x $PWD $(cat f)\"", "sh")
            assert sc["stdout"] == "x= /workspace/sub kept\n", dump(sc)
            sc = await ok(s, "bash", "exit 0", "sh")
            assert sc["exit_code"] == 0 and "reset" in sc["session"], dump(sc)
            sc = await ok(s, "bash", "echo alive", "sh")
            assert sc["stdout"] == "alive\n"
    run_async(t)


def test_a_crashed_interpreter_restarts_with_the_loss_stated():
    async def t():
        async with session() as s:
            for env, setup, crash, probe in [
                ("python", "x = 1", "import os; os._exit(9)", "print('x' in globals())"),
                ("python", "x = 1", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "print('x' in globals())"),
                ("node", "var x = 1", "process.reallyExit(9)", "console.log(typeof x !== 'undefined')"),
                ("bash", "x=1", "kill -9 $$", "[ -n \"$x\" ] && echo true || echo false"),
            ]:
                name = f"crash-{marker()}"
                await ok(s, env, setup, name)
                sc, text, err = await call(s, env, crash, session=name)
                assert err and "interpreter" in sc["session"]["reset"] and "gone" in sc["session"]["reset"], dump(sc)
                sc = await ok(s, env, probe, name)
                assert sc["stdout"].strip() in ("False", "false") and sc["session"]["state"] == "restarted", dump(sc)
    run_async(t)


def test_cancelling_a_session_call_kills_the_session():
    m = marker()

    async def t():
        async with session() as s:
            await ok(s, "python", "x = 1", "c")
            with pytest.raises(Exception):
                await s.call_tool("run", {"env": "python", "session": "c",
                                          "code": f"import subprocess; subprocess.run(['sleep', '{m}'])"}, read_timeout_seconds=1)
            await gone_within(m)
            sc, _, err = await call(s, "python", "print('x' in globals())", session="c")
            assert sc["stdout"] == "False\n" and "cancelled" in sc["session"]["restarted_because"], dump(sc)
    run_async(t)


LIMITED = write_config("[defaults]\ntimeout_ms = 5000\nmemory_mb = 128\npids = 32\n")


def test_limits_hold_for_the_whole_session():
    async def t():
        async with session(config=LIMITED) as s:
            # Memory held by earlier calls counts: 100 MiB kept, 60 MiB more is too much.
            await ok(s, "python", "keep = bytearray(100 << 20)\nfor i in range(0, len(keep), 4096): keep[i] = 1", "mem")
            sc, _, err = await call(s, "python", "more = bytearray(60 << 20)\nfor i in range(0, len(more), 4096): more[i] = 1", session="mem")
            assert err, dump(sc)
            if limits_mechanism() == "rlimits":
                assert "MemoryError" in sc["stderr"], dump(sc)
            else:
                assert sc["error"]["code"] == "memory_limit", dump(sc)
                assert "memory limit" in sc["session"]["reset"], dump(sc)
            # Processes: a fork bomb meets the limit and the server goes on.
            sc, _, err = await call(s, "bash", ":(){ :|:& };:\nsleep 10", session="bomb")
            assert err, dump(sc)
            if limits_mechanism() != "rlimits":
                assert "processes" in sc["limits_reached"], dump(sc)
            sc = await ok(s, "bash", "echo fine", "other")
            assert sc["stdout"] == "fine\n"
    run_async(t)


LOOP = ("import os\nn = 0\nwhile True:\n    n += 1\n    if n % 1000 == 0:\n"
        "        open('/workspace/c.tmp', 'w').write(str(n))\n        os.replace('/workspace/c.tmp', '/workspace/count')\n")
# The same loop in bash alone (a Nix-built bash environment has no python).
BASH_LOOP = ("n=0; while :; do n=$((n + 1)); if ((n % 100 == 0)); then "
             "echo $n > /workspace/c.tmp; mv /workspace/c.tmp /workspace/count; fi; done")
# Calls that wait (ten seconds at most) until the loop's count goes past
# what it was when the call began, and print both.
BASH_ADVANCED = ("count() { cat /workspace/count 2>/dev/null || echo 0; }\na=$(count); b=$a\n"
                 "for ((i = 0; i < 500; i++)); do b=$(count); [ \"$b\" -gt \"$a\" ] && break; sleep 0.02; done\necho \"$a $b\"")
PYTHON_ADVANCED = ("import time\ndef count():\n    try:\n        return int(open('/workspace/count').read())\n"
                   "    except (OSError, ValueError):\n        return 0\n"
                   "a = b = count()\ndeadline = time.monotonic() + 10\nwhile b <= a and time.monotonic() < deadline:\n"
                   "    time.sleep(0.02)\n    b = count()\nprint(a, b)")


async def loop_pid(m: str, seconds: float = 5) -> int:
    """The host pid of the loop carrying `m`: the one whose parent does not
    carry it too (bash forks before each `mv`, and a fork not yet turned
    into `mv` carries the loop's command line)."""
    deadline = time.monotonic() + seconds
    while True:
        carrying = {int(p.split(":", 1)[0]) for p in processes_with(m)}
        loops = []
        for pid in carrying:
            try:
                parent = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if parent not in carrying:
                loops.append(pid)
        if len(loops) == 1:
            return loops[0]
        assert time.monotonic() < deadline, f"no one loop carries {m}: {processes_with(m)}"
        await anyio.sleep(0.02)


def cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and of its children it has waited for."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("env,start,advanced", [
    ("bash", f"bash -c '{BASH_LOOP}' loop-{{m}} &\nuntil grep -q loop-{{m}} /proc/$!/cmdline 2>/dev/null; do :; done",
     BASH_ADVANCED),
    ("python", f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {LOOP!r}, 'loop-{{m}}'])", PYTHON_ADVANCED),
])
def test_background_work_does_not_run_between_calls(env, start, advanced):
    """A session's processes are stopped between calls (frozen cgroup, or
    SIGSTOP without one): a busy loop left behind uses (almost) no CPU
    while the session waits, as the host counts it, and goes on during the
    next call, as the call sees it."""
    m = marker()

    async def goes_on(s) -> None:
        out = (await ok(s, env, advanced, "busy"))["stdout"].split()
        assert int(out[1]) > int(out[0]), f"the loop did not go on during a call: {out}"

    async def t():
        async with session() as s:
            await ok(s, env, start.format(m=m), "busy")
            loop = await loop_pid(f"loop-{m}")
            await goes_on(s)
            before = cpu_seconds(loop)
            await anyio.sleep(2)
            between = cpu_seconds(loop) - before
            assert between < 0.1, f"{between:.2f} s of CPU in two seconds between calls"
            await goes_on(s)
    run_async(t)


def test_idle_sessions_are_closed_and_the_next_call_says_so():
    m = marker()
    config = write_config("[server]\nsession_idle_seconds = 1\n")

    async def t():
        async with session(config=config) as s:
            await ok(s, "bash", f"x=1; {bash_bg(m)}", "idle")
            await seen_within(m, 1)
            # Closed (its processes gone) once idle for a second.
            await gone_within(m, 15)
            sc, text, err = await call(s, "bash", "echo $x", session="idle")
            assert err and sc["error"]["code"] == "session_expired", dump(sc)
            assert "idle for 1 s" in sc["error"]["message"] and "state is gone" in sc["error"]["message"], dump(sc)
            assert 'session "idle" to start a fresh one' in sc["error"]["suggestion"], dump(sc)
            sc = await ok(s, "bash", "echo \"[$x]\"", "idle")
            assert sc["stdout"] == "[]\n" and sc["session"]["state"] == "new", dump(sc)
            # A call longer than the idle time is not idleness: the session
            # and its state outlive it.
            await ok(s, "bash", "y=2; sleep 2.5", "long")
            sc = await ok(s, "bash", "echo $y", "long")
            assert sc["stdout"] == "2\n" and sc["session"]["state"] == "continued", dump(sc)
    run_async(t)


def test_sessions_end_at_their_maximum_lifetime_even_when_busy():
    config = write_config("[server]\nsession_max_lifetime_seconds = 2\n")

    async def t():
        async with session(config=config) as s:
            await ok(s, "python", "x = 1", "old")
            t0 = time.monotonic()
            while time.monotonic() - t0 < 6:
                sc, _, err = await call(s, "python", "print(x)", session="old")
                if err:
                    break
                await anyio.sleep(0.3)
            assert err and sc["error"]["code"] == "session_expired" and "lifetime" in sc["error"]["message"], dump(sc)
    run_async(t)


def test_the_least_recently_used_session_makes_room():
    config = write_config("[server]\nmax_sessions = 2\n")

    async def t():
        async with session(config=config) as s:
            await ok(s, "python", "a = 1", "a")
            await ok(s, "python", "b = 1", "b")
            await ok(s, "python", "print(a)", "a")
            await ok(s, "python", "c = 1", "c")
            sc, _, err = await call(s, "python", "print(b)", session="b")
            assert err and sc["error"]["code"] == "session_expired" and "least recently used" in sc["error"]["message"], dump(sc)
            sc = await ok(s, "python", "print(a)", "a")
            assert sc["stdout"] == "1\n"
            # Back to back, so that the least recently used session may still
            # be being paused after its call when the next needs room: being
            # paused is not being in a call, and it still goes.
            for round in range(5):
                await ok(s, "python", "x = 1", f"kept{round}")
                await ok(s, "python", "x = 2", f"lru{round}")
                await ok(s, "python", "x += 1", f"kept{round}")
                await ok(s, "python", "x = 3", f"newest{round}")
                sc, _, err = await call(s, "python", "print(x)", session=f"lru{round}")
                assert err and sc["error"]["code"] == "session_expired", dump(sc)
                assert (await ok(s, "python", "print(x)", f"kept{round}"))["stdout"] == "2\n"
    run_async(t)


def test_a_session_in_a_call_is_never_closed_to_make_room():
    """With every session in a call, a new one is refused as busy, naming
    them; once the call has returned, the new one takes its place."""
    project = readable_tmpdir()
    config = write_config('[server]\nmax_sessions = 1\n[project]\nmode = "readwrite"\n')
    m = marker()

    async def t():
        async with session(project=str(project), config=config) as s:
            results: dict[str, dict] = {}

            async def hold() -> None:
                results["held"] = await ok(
                    s, "bash", f"sleep 1{m} & until [ -e /project/release ]; do sleep 0.02; done; kill $!; echo released", "held")

            async with anyio.create_task_group() as tg:
                tg.start_soon(hold)
                await seen_within(m, 1)
                sc, _, err = await call(s, "bash", "echo new", session="new")
                assert err and sc["error"]["code"] == "busy", dump(sc)
                assert "all 1 sessions (held) are in a call" in sc["error"]["message"], dump(sc)
                assert "held" not in results, dump(results)
                (project / "release").touch()
            assert results["held"]["stdout"] == "released\n", dump(results)
            assert (await ok(s, "bash", "echo new", "new"))["stdout"] == "new\n"
            sc, _, err = await call(s, "bash", "echo again", session="held")
            assert err and sc["error"]["code"] == "session_expired", dump(sc)
    try:
        run_async(t)
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_calls_on_one_session_run_one_at_a_time():
    async def t():
        async with session() as s:
            await ok(s, "bash", "n=0", "seq")
            results = []

            async def bump():
                results.append(await ok(s, "bash", "n=$((n+1)); sleep 0.2; echo $n", "seq"))
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(bump)
            assert sorted(r["stdout"] for r in results) == ["1\n", "2\n", "3\n"], results
    run_async(t)


def test_sessions_die_with_the_server():
    m = marker()

    async def t():
        async with session() as s:
            await ok(s, "bash", bash_bg(m), "a")
            await ok(s, "python", f"import subprocess; p = subprocess.Popen(['sleep', '{m}.5'])", "b")
            await ok(s, "node", node_bg(f"{m}.7"), "c")
            await seen_within(m, 3)
    run_async(t)
    deadline = time.monotonic() + 5
    while processes_with(m) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes_with(m) == []

    # Killed outright, the server still takes its sessions with it.
    srv = RawServer()
    srv.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": "run", "arguments": {"env": "bash", "session": "k", "code": bash_bg(m)}}})
    assert srv.recv()["result"]["structuredContent"]["ok"]
    anyio.run(seen_within, m, 1)
    srv.close()
    deadline = time.monotonic() + 5
    while processes_with(m) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes_with(m) == []


# --- Handles (2026-07-28): a session a call names gets a handle bound to the
# caller; calls may name the handle or the name.

@stateless_only()
def test_a_session_has_a_handle_that_reaches_it_and_nothing_else_does():
    import re

    async def t():
        async with session() as s:
            sc, _, err = await call(s, "python", "x = 41", session="work")
            assert not err, dump(sc)
            handle = sc["session"]["handle"]
            assert re.fullmatch(r"s_([a-z0-9]{1,16}_)?[0-9a-f]{32}", handle) and sc["session"]["name"] == "work", dump(sc)
            sc, _, err = await call(s, "python", "x += 1; print(x)", session=handle)
            assert not err and sc["stdout"] == "42\n" and sc["session"]["state"] == "continued", dump(sc)
            assert sc["session"]["handle"] == handle, dump(sc)
            sc, _, err = await call(s, "python", "print(x)", session="work")
            assert not err and sc["stdout"] == "42\n", dump(sc)
            # A handle never issued: said so, and nothing runs.
            sc, _, err = await call(s, "python", "print(x)", session="s_" + "0" * 32)
            assert err and sc["error"]["code"] == "session_expired" and "never issued" in sc["error"]["message"], dump(sc)
            # Another server's handle is one this server never issued.
            async with session() as other:
                theirs, _, err = await call(other, "python", "y = 1", session="work")
                assert not err and theirs["session"]["handle"] != handle, dump(theirs)
            sc, _, err = await call(s, "python", "print(y)", session=theirs["session"]["handle"])
            assert err and sc["error"]["code"] == "session_expired", dump(sc)
    run_async(t)
