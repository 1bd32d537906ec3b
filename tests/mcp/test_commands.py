"""Declared commands through the real binary and the official MCP client:
tools generated from declarations, every refusal of a bad value, argv
injection attempts, confirmation by token (reuse, expiry, a token for other
arguments) and by elicitation (accept, decline, cancel), limits and
cancellation, and the project's declaration file edited while the server
runs."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import tempfile
import time
import uuid
from typing import Any, AsyncIterator

import anyio
import pytest
from mcp import types
from mcp.client.session import ClientSession
from http_transport import TRANSPORT
from harness import (BIN, TaskClient, call_tool, dump, legacy_only, processes_with, readable_tmpdir, require_test_knobs,
                     run_async, server_params, session, stateless_only, tool_changes, write_config)

require_test_knobs()

# A project with a file, a directory and symlinks out of it.
def make_project(commands: str | None = None) -> pathlib.Path:
    root = readable_tmpdir()
    proj = root / "project"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "main.txt").write_text("main\n")
    (root / "secret.txt").write_text("secret\n")
    (proj / "secret-link").symlink_to(root / "secret.txt")
    (proj / "etc-link").symlink_to("/etc")
    for p in (proj, proj / "src"):
        p.chmod(0o755)
    if commands is not None:
        write_declarations(proj, commands)
    return proj


def write_declarations(proj: pathlib.Path, text: str) -> None:
    d = proj / ".nix-sandbox-mcp"
    d.mkdir(exist_ok=True)
    d.chmod(0o755)
    # Written whole and renamed, as editors do: the server never reads half a file.
    tmp = d / ".commands.toml.tmp"
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.rename(d / "commands.toml")


@contextlib.asynccontextmanager
async def client(config: str | None = None, project: pathlib.Path | None = None, env: dict[str, str] | None = None,
                 elicit: Any = None, notifications: list | None = None,
                 log: pathlib.Path | None = None) -> AsyncIterator[ClientSession]:
    """A client session; the server's log goes to `log` when one is given."""
    async def on_message(message: Any) -> None:
        if notifications is not None:
            notifications.append(message)

    async with session(config=config, project=str(project) if project else None, env=env, elicit=elicit,
                       on_message=on_message, log=log) as s:
        yield s


async def call(s: ClientSession, tool: str, args: dict | None = None, **kw: Any) -> tuple[dict, str, bool]:
    res = await call_tool(s, tool, args, **kw)
    text = "".join(getattr(c, "text", "") for c in res.content)
    return res.structured_content or {}, text, bool(res.is_error)


def audit_events(path: str) -> list[dict]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if '"kind":"command"' in line]


ECHO = """
[commands.echo]
description = "Print values, one per line"
env = "bash"
argv = ["printf", "[%s]\\\\n", "{{text}}", "{{count}}", "{{ratio}}", "{{flag}}", "{{level}}", "{{file}}"]
[commands.echo.params.text]
type = "string"
[commands.echo.params.count]
type = "integer"
min = 1
max = 10
[commands.echo.params.ratio]
type = "number"
max = 1
[commands.echo.params.flag]
type = "boolean"
[commands.echo.params.level]
type = "enum"
values = ["low", "high"]
[commands.echo.params.file]
type = "path"
"""


def test_each_command_is_a_tool_with_a_schema_from_its_parameters():
    config = write_config(ECHO + """
[commands.search]
description = "Search the project"
env = "bash"
argv = ["grep", "-rn", "{{pattern}}", "{{where}}"]
danger = "safe"
separator = true
[commands.search.params.pattern]
type = "string"
required = true
description = "Text to find"
[commands.search.params.where]
type = "path"
default = "src"

[commands.publish]
description = "Publish the site"
env = "bash"
argv = ["true"]
danger = "high"
network = true
confirm = true

[commands.run]
description = "Run the app"
env = "bash"
argv = ["true"]

[commands.hidden]
description = "Not offered"
env = "bash"
argv = ["true"]
disabled = true
""")

    async def t():
        async with client(config=config, project=make_project()) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert list(tools) == ["run", "job", "echo", "publish", "cmd_run", "search", "confirm"], list(tools)
            assert "Declared commands have their own tools: echo, publish, cmd_run, search." in tools["run"].description

            search = tools["search"]
            assert search.description == "Search the project"
            assert search.input_schema == {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Text to find"},
                    "where": {"type": "string", "description": "Path in the project", "default": "src"},
                    "background": {"type": "boolean", "description": "Return a job id at once"},
                },
                "required": ["pattern"],
                "additionalProperties": False,
            }, dump(search.input_schema)
            assert search.annotations.read_only_hint is True and search.annotations.destructive_hint is False
            assert search.annotations.open_world_hint is False
            assert search.output_schema["required"] == ["ok"] and "stdout" in search.output_schema["properties"]

            props = tools["echo"].input_schema["properties"]
            assert props["count"] == {"type": "integer", "minimum": 1, "maximum": 10}
            assert props["ratio"] == {"type": "number", "maximum": 1.0}
            assert props["flag"] == {"type": "boolean"} and props["level"] == {"type": "string", "enum": ["low", "high"]}
            assert tools["echo"].annotations.read_only_hint is False and tools["echo"].annotations.destructive_hint is False

            publish = tools["publish"].annotations
            assert publish.destructive_hint is True and publish.open_world_hint is True
            assert tools["confirm"].input_schema["required"] == ["token", "command"]

            sc, _, err = await call(s, "search", {"pattern": "main"})
            assert not err and sc["stdout"] == "/project/src/main.txt:1:main\n", dump(sc)
            sc, _, err = await call(s, "search", {"pattern": "-v"})
            assert err and sc["error"]["code"] == "invalid_input" and "`pattern`" in sc["error"]["message"]
    run_async(t)


@pytest.mark.parametrize(
    "args,param,words",
    [
        ({"text": "a\u0000b"}, "text", "NUL"),
        ({"text": "-rf"}, "text", "'-'"),
        ({"text": "--upload-pack=touch /tmp/pwned"}, "text", "'-'"),
        ({"text": ""}, "text", "empty"),
        ({"text": 5}, "text", "must be a string"),
        ({"count": 11}, "count", "at most 10"),
        ({"count": 0}, "count", "at least 1"),
        ({"count": 2.5}, "count", "integer"),
        ({"count": "3"}, "count", "must be an integer"),
        ({"ratio": 1.5}, "ratio", "at most 1"),
        ({"ratio": -0.5}, "ratio", "negative"),
        ({"flag": "true"}, "flag", "true or false"),
        ({"flag": 1}, "flag", "true or false"),
        ({"level": "medium"}, "level", "one of: low, high"),
        ({"file": "../secret.txt"}, "file", "outside the project"),
        ({"file": "src/../../secret.txt"}, "file", "outside the project"),
        ({"file": "secret-link"}, "file", "outside the project"),
        ({"file": "etc-link/passwd"}, "file", "outside the project"),
        ({"file": "/etc/passwd"}, "file", "outside the project"),
        ({"file": "-src"}, "file", "'-'"),
        ({"unknown": 1}, "unknown", "unknown parameter"),
    ],
)
def test_bad_values_are_refused_naming_the_parameter(args, param, words):
    config = write_config(ECHO)

    async def t():
        async with client(config=config, project=make_project()) as s:
            sc, text, err = await call(s, "echo", args)
            assert err and sc["error"]["code"] == "invalid_input", dump(sc)
            assert f"`{param}`" in sc["error"]["message"] and words in sc["error"]["message"], dump(sc)
            assert "stdout" not in sc, "nothing ran"
            assert "Call echo with {" in sc["error"]["suggestion"], dump(sc)
    run_async(t)


def test_values_reach_the_program_as_single_arguments():
    config = write_config(ECHO)
    hostile = "a b; touch /workspace/pwned $(id) `id` | cat && rm -rf / '\"\n*"

    async def t():
        async with client(config=config, project=make_project()) as s:
            sc, _, err = await call(s, "echo", {"text": hostile, "count": 3, "ratio": 0.5, "flag": False,
                                                "level": "high", "file": "src/./main.txt"})
            assert not err, dump(sc)
            assert sc["stdout"] == f"[{hostile}]\n[3]\n[0.5]\n[false]\n[high]\n[/project/src/main.txt]\n", dump(sc)
            # An optional parameter left out leaves out its argument; nothing else.
            sc, _, err = await call(s, "echo", {"count": 2})
            assert not err and sc["stdout"] == "[2]\n", dump(sc)
    run_async(t)


def test_a_required_parameter_and_a_shell_script_parameter():
    config = write_config("""
[commands.fetch]
description = "Fetch a remote"
env = "bash"
argv = ["git", "ls-remote", "{{remote}}"]
[commands.fetch.params.remote]
type = "string"
required = true
""")

    async def t():
        async with client(config=config, project=make_project()) as s:
            sc, _, err = await call(s, "fetch", {})
            assert err and sc["error"]["code"] == "invalid_input" and "missing parameter `remote`" in sc["error"]["message"]
            sc, _, err = await call(s, "fetch", {"remote": "--upload-pack=touch /workspace/pwned"})
            assert err and sc["error"]["code"] == "invalid_input" and "`remote`" in sc["error"]["message"], dump(sc)
    run_async(t)

    bad = write_config('[commands.sh]\ndescription = "x"\nenv = "bash"\nargv = ["sh", "-c", "echo {{x}}"]\n[commands.sh.params.x]\ntype = "string"\n')
    p = server_params(config=bad)
    out = subprocess.run([p.command, *p.args], env={**os.environ, **(p.env or {})}, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert f"{bad}:4: key `commands.sh.argv`" in out.stderr and "inject" in out.stderr and "fix:" in out.stderr, out.stderr


CONFIRMED = """
[server]
audit_log = "{audit}"
[commands.deploy]
description = "Deploy a branch"
env = "bash"
argv = ["echo", "deploying", "{{branch}}"]
danger = "high"
confirm = true
[commands.deploy.params.branch]
type = "string"
required = true
"""


def confirmed_config() -> tuple[str, str]:
    audit = str(readable_tmpdir() / "audit.jsonl")
    return write_config(CONFIRMED.replace("{audit}", audit)), audit


def test_confirmation_by_token_works_once_and_only_for_its_invocation():
    config, audit = confirmed_config()
    tokens: list[str] = []
    # The most the server logs without naming rmcp: still no token.
    server_log = readable_tmpdir() / "server.log"

    async def t():
        async with client(config=config, project=make_project(), env={"RUST_LOG": "trace"}, log=server_log) as s:
            sc, text, err = await call(s, "deploy", {"branch": "main"})
            assert err and sc["error"]["code"] == "confirmation_required", dump(sc)
            conf = sc["confirmation"]
            assert conf["command"] == "deploy" and conf["arguments"] == {"branch": "main"}
            assert conf["argv"] == ["echo", "deploying", "main"] and conf["expires_in_s"] == 60
            assert len(conf["token"]) == 43 and conf["token"] in text and "echo deploying main" in text
            tokens.append(conf["token"])

            sc, _, err = await call(s, "confirm", {"token": conf["token"], "command": "deploy", "arguments": {"branch": "main"}})
            assert not err and sc["stdout"] == "deploying main\n", dump(sc)

            sc, _, err = await call(s, "confirm", {"token": conf["token"], "command": "deploy", "arguments": {"branch": "main"}})
            assert err and sc["error"]["code"] == "confirmation_invalid" and "already used" in sc["error"]["message"], dump(sc)

            # A token issued for one branch does not run another, and is then used up.
            sc, _, _ = await call(s, "deploy", {"branch": "main"})
            token = sc["confirmation"]["token"]
            tokens.append(token)
            sc, _, err = await call(s, "confirm", {"token": token, "command": "deploy", "arguments": {"branch": "prod"}})
            assert err and sc["error"]["code"] == "confirmation_invalid" and "different invocation" in sc["error"]["message"]
            assert "stdout" not in sc
            sc, _, err = await call(s, "confirm", {"token": token, "command": "deploy", "arguments": {"branch": "main"}})
            assert err and sc["error"]["code"] == "confirmation_invalid"

            sc, _, err = await call(s, "confirm", {"token": "A" * 43, "command": "deploy", "arguments": {"branch": "main"}})
            assert err and sc["error"]["code"] == "confirmation_invalid"
    run_async(t)
    events = audit_events(audit)
    assert [e["event"] for e in events] == ["asked", "confirmed", "run", "asked", "refused"], dump(events)
    assert all(e["via"] == "token" for e in events if e["event"] != "run")
    assert events[2]["exit_code"] == 0
    log = pathlib.Path(audit).read_text()
    assert not any(t in log for t in tokens), "tokens are never logged"
    log = server_log.read_text()
    assert "shutting down" in log and not any(t in log for t in tokens), "nor in the server's log, even at trace"


def test_an_expired_token_runs_nothing():
    config, audit = confirmed_config()

    async def t():
        async with client(config=config, project=make_project(), env={"NIX_SANDBOX_TEST_CONFIRM_TTL_MS": "1000"}) as s:
            sc, _, _ = await call(s, "deploy", {"branch": "main"})
            # The server issued the token before it answered: one TTL after
            # the answer (the same monotonic clock), the token has expired.
            expires = time.monotonic() + 1.0
            assert sc["confirmation"]["expires_in_s"] == 1
            while time.monotonic() < expires:
                await anyio.sleep(expires - time.monotonic())
            sc, _, err = await call(s, "confirm", {"token": sc["confirmation"]["token"], "command": "deploy",
                                                   "arguments": {"branch": "main"}})
            assert err and sc["error"]["code"] == "confirmation_expired" and "stdout" not in sc, dump(sc)
    run_async(t)
    assert [e["event"] for e in audit_events(audit)] == ["asked", "expired"]


@pytest.mark.parametrize(
    "answer,code",
    [
        (("accept", {"approve": True}), None),
        (("accept", {"approve": False}), "confirmation_declined"),
        (("decline", None), "confirmation_declined"),
        (("cancel", None), "confirmation_declined"),
    ],
)
def test_confirmation_by_elicitation(answer, code):
    config, audit = confirmed_config()
    asked: list[Any] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        action, content = answer
        return types.ElicitResult(action=action, content=content)

    async def t():
        async with client(config=config, project=make_project(), elicit=elicit) as s:
            names = [t.name for t in (await s.list_tools()).tools]
            assert "confirm" in names, "listed for clients that cannot ask"
            sc, _, err = await call(s, "deploy", {"branch": "feature x"})
            if code is None:
                assert not err and sc["stdout"] == "deploying feature x\n", dump(sc)
            else:
                assert err and sc["error"]["code"] == code and "stdout" not in sc, dump(sc)
                assert "nothing ran" in sc["error"]["message"]
    run_async(t)
    assert len(asked) == 1
    assert 'echo deploying "feature x"' in asked[0].message and "deploy" in asked[0].message, asked[0].message
    assert asked[0].requested_schema["properties"]["approve"]["type"] == "boolean"
    events = [e["event"] for e in audit_events(audit)]
    assert events == (["asked", "confirmed", "run"] if code is None else ["asked", "declined"]), events


@legacy_only("under 2026-07-28 the question goes back in the result, and the client, not the server, waits for the user")
def test_a_call_waiting_for_the_users_answer_reports_progress():
    """While the user thinks, the call reports that it waits for them (which
    keeps clients with short request timeouts waiting); once they agree, the
    run's progress goes on from there: the values only grow."""
    config, _ = confirmed_config()
    updates: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total, message))

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        await anyio.sleep(2.5)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def t():
        async with client(config=config, project=make_project(), elicit=elicit) as s:
            sc, _, err = await call(s, "deploy", {"branch": "main"}, progress_callback=on_progress)
            assert not err and sc["stdout"] == "deploying main\n", dump(sc)
    run_async(t)
    waiting = [u for u in updates if u[2] and u[2].startswith("waiting for the user to confirm deploy")]
    assert len(waiting) >= 2, updates
    values = [u[0] for u in updates]
    assert values == sorted(values) and len(set(values)) == len(values), updates


def test_an_unanswered_question_expires_and_runs_nothing():
    """The question lasts 1.5 s here; the user answers after 3 s (under
    2026-07-28, the retry then brings an expired state)."""
    config, audit = confirmed_config()

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        await anyio.sleep(3)
        return types.ElicitResult(action="accept", content={"approve": True})

    async def t():
        async with client(config=config, project=make_project(), elicit=elicit,
                          env={"NIX_SANDBOX_TEST_CONFIRM_TTL_MS": "1500"}) as s:
            sc, _, err = await call(s, "deploy", {"branch": "main"})
            assert err and sc["error"]["code"] == "confirmation_expired", dump(sc)
    run_async(t)
    assert [e["event"] for e in audit_events(audit)] == ["asked", "expired"]


def test_limits_and_cancellation_apply_to_commands():
    m = str(uuid.uuid4().int % 10**8)
    config = write_config(f"""
[commands.slow]
description = "Sleep"
env = "bash"
argv = ["sleep", "{{{{seconds}}}}"]
timeout_ms = 1500
[commands.slow.params.seconds]
type = "integer"
[commands.loud]
description = "Print a lot"
env = "bash"
argv = ["seq", "1", "100000"]
output_bytes = 256
[commands.wait]
description = "Wait"
env = "bash"
argv = ["sleep", "{m}"]
""")
    updates: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total, message))

    async def t():
        async with client(config=config, project=make_project()) as s:
            sc, _, err = await call(s, "slow", {"seconds": 30}, progress_callback=on_progress)
            assert err and sc["error"]["code"] == "timeout" and sc["limit"] == "timeout", dump(sc)
            assert "1500 ms" in sc["error"]["message"]
            assert updates and all(total == 1.5 for _, total, _ in updates), updates

            sc, _, err = await call(s, "loud")
            assert not err and sc["stdout_dropped_bytes"] > 0 and len(sc["stdout"]) < 1024, dump(sc)
            assert sc["stdout"].startswith("1\n2\n") and sc["stdout"].rstrip().endswith("100000")

            with pytest.raises(Exception):
                await s.call_tool("wait", {}, read_timeout_seconds=1)
            deadline = time.monotonic() + 5
            while processes_with(f"sleep {m}") and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            assert processes_with(f"sleep {m}") == []
    run_async(t)


def test_editing_the_declaration_file_changes_the_tools():
    proj = make_project("""
[commands.list]
description = "List the sources"
env = "bash"
argv = ["ls", "src"]
""")
    notes: list[Any] = []

    async def t():
        async with client(project=proj, notifications=notes) as s, tool_changes(s, notes):
            assert s.server_capabilities.tools.list_changed is True
            names = [t.name for t in (await s.list_tools()).tools]
            assert names[2:] == ["list"], names
            sc, _, err = await call(s, "list")
            assert not err and sc["stdout"] == "main.txt\n", dump(sc)

            write_declarations(proj, """
[commands.list]
description = "List the sources"
env = "bash"
argv = ["ls", "src"]

[commands.show]
description = "Show a file"
env = "bash"
argv = ["cat", "{{file}}"]
danger = "high"
[commands.show.params.file]
type = "path"
required = true
""")
            deadline = time.monotonic() + 10
            while not any(isinstance(n, types.ToolListChangedNotification) for n in notes) and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            assert any(isinstance(n, types.ToolListChangedNotification) for n in notes), notes
            names = [t.name for t in (await s.list_tools()).tools]
            assert names[2:] == ["list", "show"], names
            sc, _, err = await call(s, "show", {"file": "src/main.txt"})
            assert not err and sc["stdout"] == "main\n", dump(sc)

            # A broken edit withdraws the file's commands rather than keep stale ones.
            notes.clear()
            write_declarations(proj, "[commands.show]\nargv = 5\n")
            deadline = time.monotonic() + 10
            while not notes and time.monotonic() < deadline:
                await anyio.sleep(0.1)
            names = [t.name for t in (await s.list_tools()).tools]
            assert names == ["run", "job"], names
    run_async(t)


def test_a_read_write_project_s_declaration_file_is_ignored():
    proj = make_project('[commands.list]\ndescription = "x"\nenv = "bash"\nargv = ["ls"]\n')
    config = write_config('[project]\nmode = "readwrite"\n')

    async def t():
        async with client(config=config, project=proj) as s:
            assert [t.name for t in (await s.list_tools()).tools] == ["run", "job"]
    run_async(t)


# --- Confirmation in rounds (2026-07-28): the question in the result, a
# sealed requestState, and every way a state can be refused. Driven by hand
# (the first round, then retries with chosen answers and states).

async def first_round(s: ClientSession, args: dict) -> types.InputRequiredResult:
    first = await s.call_tool("deploy", args, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    assert list(first.input_requests) == ["confirm"] and first.request_state, first
    return first


async def answer(s: ClientSession, args: dict, state: str | None, action: str = "accept",
                 approve: bool = True) -> tuple[dict, bool]:
    content = {"approve": approve} if action == "accept" else None
    res = await s.call_tool("deploy", args, input_responses={"confirm": {"action": action, "content": content}},
                            request_state=state, allow_input_required=True)
    assert isinstance(res, types.CallToolResult), res
    return res.structured_content or {}, bool(res.is_error)


def never(*_: Any) -> Any:
    raise AssertionError("the server must not ask the client anything under 2026-07-28")


@stateless_only()
def test_the_question_comes_back_in_the_result_and_the_answer_runs_it_once():
    config, audit = confirmed_config()
    args = {"branch": "main"}

    async def t():
        async with client(config=config, project=make_project(), elicit=never) as s:
            first = await first_round(s, args)
            question = first.input_requests["confirm"].params
            assert "echo deploying main" in question.message and "environment bash" in question.message, question
            assert "network off" in question.message and "a copy of the project" in question.message, question
            assert question.requested_schema["properties"]["approve"]["type"] == "boolean"
            sc, err = await answer(s, args, first.request_state)
            assert not err and sc["stdout"] == "deploying main\n", dump(sc)
            # The same state again: used.
            sc, err = await answer(s, args, first.request_state)
            assert err and sc["error"]["code"] == "confirmation_invalid" and "already used" in sc["error"]["message"], dump(sc)
            assert "nothing ran" in sc["error"]["message"] and "stdout" not in sc, dump(sc)
            # A retry that does not answer is asked again, with a new state.
            first = await first_round(s, args)
            again = await s.call_tool("deploy", args, request_state=first.request_state, allow_input_required=True)
            assert isinstance(again, types.InputRequiredResult) and again.request_state != first.request_state, again
    run_async(t)
    events = [e["event"] for e in audit_events(audit)]
    assert events == ["asked", "confirmed", "run", "refused", "asked", "asked"], events


@stateless_only()
@pytest.mark.parametrize("tamper", ["altered", "made up", "huge", "not base64", "other arguments", "other server"])
def test_a_state_that_is_not_this_calls_runs_nothing(tamper):
    config, audit = confirmed_config()
    args = {"branch": "main"}
    # Over HTTP every server is a replica, named in its states: another
    # server's state names the server that issued it.
    other_server = "issued by replica" if TRANSPORT == "http" else "not issued by this server"
    words = {"other arguments": "another command or other arguments", "other server": other_server}.get(
        tamper, "not issued by this server")

    async def t():
        async with client(config=config, project=make_project(), elicit=never) as s:
            state = (await first_round(s, args)).request_state
            retry_args = args
            if tamper == "altered":
                middle = len(state) // 2
                state = state[:middle] + ("A" if state[middle] != "A" else "B") + state[middle + 1:]
            elif tamper == "made up":
                state = "rs1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
            elif tamper == "huge":
                state = state + "A" * (4 << 20)
            elif tamper == "not base64":
                state = "rs1.\u00e9\u00e9\u00e9.!!!\n\x00"
            elif tamper == "other arguments":
                retry_args = {"branch": "prod"}
            else:
                # Another server (another key), asked the same question.
                async with client(config=config, project=make_project(), elicit=never) as other:
                    state = (await first_round(other, args)).request_state
            sc, err = await answer(s, retry_args, state)
            assert err and sc["error"]["code"] == "confirmation_invalid" and words in sc["error"]["message"], dump(sc)
            assert "nothing ran" in sc["error"]["message"] and "stdout" not in sc, dump(sc)
    run_async(t)
    assert "run" not in [e["event"] for e in audit_events(audit)]


@stateless_only()
def test_an_expired_state_runs_nothing():
    """States last as long as the question (1.5 s here); the answer comes
    after 3 s."""
    config, audit = confirmed_config()
    args = {"branch": "main"}

    async def t():
        async with client(config=config, project=make_project(), elicit=never,
                          env={"NIX_SANDBOX_TEST_CONFIRM_TTL_MS": "1500"}) as s:
            state = (await first_round(s, args)).request_state
            await anyio.sleep(3)
            sc, err = await answer(s, args, state)
            assert err and sc["error"]["code"] == "confirmation_expired" and "expired" in sc["error"]["message"], dump(sc)
    run_async(t)
    assert [e["event"] for e in audit_events(audit)] == ["asked", "expired"]


@stateless_only()
@pytest.mark.parametrize("action,approve", [("accept", False), ("decline", True), ("cancel", True)])
def test_a_declined_answer_runs_nothing(action, approve):
    config, audit = confirmed_config()
    args = {"branch": "main"}

    async def t():
        async with client(config=config, project=make_project(), elicit=never) as s:
            state = (await first_round(s, args)).request_state
            sc, err = await answer(s, args, state, action, approve)
            assert err and sc["error"]["code"] == "confirmation_declined" and "nothing ran" in sc["error"]["message"], dump(sc)
    run_async(t)
    assert [e["event"] for e in audit_events(audit)] == ["asked", "declined"]


@stateless_only()
def test_a_client_that_cannot_ask_gets_a_token_under_2026_too():
    config, _ = confirmed_config()

    async def t():
        async with client(config=config, project=make_project()) as s:
            sc, _, err = await call(s, "deploy", {"branch": "main"})
            assert err and sc["error"]["code"] == "confirmation_required", dump(sc)
            conf = sc["confirmation"]
            sc, _, err = await call(s, "confirm", {"token": conf["token"], "command": "deploy", "arguments": {"branch": "main"}})
            assert not err and sc["stdout"] == "deploying main\n", dump(sc)
    run_async(t)


# --- Declared commands in the background: a job (or, for a client that
# declares the tasks extension under 2026-07-28, a task).

def test_a_declared_command_runs_in_the_background_when_asked():
    config, audit = confirmed_config()

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"approve": True})

    async def t():
        async with client(config=config, project=make_project(), elicit=elicit) as s:
            deploy = {t.name: t for t in (await s.list_tools()).tools}["deploy"]
            assert deploy.input_schema["properties"]["background"]["type"] == "boolean", deploy.input_schema
            sc, _, err = await call(s, "deploy", {"branch": "main", "background": True})
            assert not err and sc["job"].startswith("job-") and "stdout" not in sc, dump(sc)
            res = await s.call_tool("job", {"id": sc["job"], "wait_seconds": 30})
            assert res.structured_content["stdout"] == "deploying main\n", res.structured_content
            sc, _, err = await call(s, "deploy", {"branch": "main", "background": "yes"})
            assert err and sc["error"]["code"] == "invalid_input" and "`background`" in sc["error"]["message"], dump(sc)
    run_async(t)
    assert [e["event"] for e in audit_events(audit)] == ["asked", "confirmed", "run"]


@stateless_only()
def test_a_declared_command_in_the_background_is_a_task_for_a_client_that_declares_tasks():
    config, _ = confirmed_config()
    c = TaskClient(config=config)
    try:
        # A token for a client that cannot ask its user; then the confirmed run, as a task.
        conf = c.call("deploy", {"branch": "main", "background": True})["result"]["structuredContent"]["confirmation"]
        r = c.call("confirm", {"token": conf["token"], "command": "deploy", "arguments": conf["arguments"]})["result"]
        assert r["resultType"] == "task" and r["taskId"].startswith("t_"), r
        # Each poll gives the output new since the last: gathered until the end.
        seen, deadline = "", time.monotonic() + 30
        while time.monotonic() < deadline:
            got = c.get(r["taskId"])["result"]
            seen += got["_meta"]["nix-sandbox-mcp/job"].get("stdout", "")
            if got["status"] != "working":
                break
            time.sleep(0.1)
        assert got["status"] == "completed" and got["result"]["isError"] is False, got
        assert seen == "deploying main\n", seen
    finally:
        c.srv.close()
