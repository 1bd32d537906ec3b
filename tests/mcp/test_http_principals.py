"""Each principal's work kept apart over `serve --http`: another principal
cannot continue, read, wait on, cancel or kill a principal's sessions,
jobs, tasks or confirmations even knowing their handles, nor take over its
MCP session; each has its share of the server, so one saturating its own
leaves the others running; the audit log names the principal; grants
limit environments and projects."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import anyio
import pytest

from harness import (BIN, PROTOCOL, STATELESS, call, dump, legacy_only, readable_tmpdir, run_async, start,
                     stateless_only, write_config)
from http_transport import HttpServer, client
from test_http import INIT, env, raw, run_ok, scratch

TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}

DEPLOY = """
[commands.deploy]
description = "Deploy"
env = "bash"
argv = ["echo", "deploying", "{{branch}}"]
confirm = true
[commands.deploy.params.branch]
type = "string"
required = true
"""


@contextlib.contextmanager
def two(config_text: str = "", http_config: str = "", principals: tuple[str, ...] = ("alice", "bob"),
        server_table: str = ""):
    audit = scratch() / "audit.jsonl"
    cfg = write_config(f'[server]\naudit_log = "{audit}"\n{server_table}' + config_text)
    s = HttpServer(BIN, scratch(), env={**env(), "PROJECT_DIR": str(readable_tmpdir())}, config=cfg,
                   principals=principals, http_config=http_config)
    s.audit = audit
    try:
        yield s
    finally:
        assert s.stop() == 0, s.log_tail()


@contextlib.asynccontextmanager
async def both(s: HttpServer, callbacks: dict | None = None):
    async with client(s.url, s.token("alice"), callbacks=callbacks) as a, \
            client(s.url, s.token("bob"), callbacks=callbacks) as b:
        await start(a, over_http=True)
        await start(b, over_http=True)
        yield a, b


def rpc(s: HttpServer, principal: str, method: str, params: dict, capabilities: dict | None = None,
        session_id: str | None = None) -> dict:
    """One JSON-RPC request by hand in the suite's revision; its response
    (from a JSON body or the SSE event that answers it)."""
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": dict(params)}
    headers = {"mcp-protocol-version": PROTOCOL}
    if STATELESS:
        body["params"]["_meta"] = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
                                   "io.modelcontextprotocol/clientCapabilities": capabilities or {}}
        headers["mcp-method"] = method
        if method == "tools/call":
            headers["mcp-name"] = params["name"]
        elif method.startswith("tasks/"):
            headers["mcp-name"] = params["taskId"]
    if session_id:
        headers["mcp-session-id"] = session_id
    code, _, answer = raw(s, body=body, token=principal, headers=headers)
    if isinstance(answer, bytes):
        events = [json.loads(line[5:]) for line in answer.decode().splitlines() if line.startswith("data:") and line[5:].strip()]
        answer = next(e for e in events if e.get("id") == 7)
    assert code in (200, 202), (code, answer)
    return answer


def test_jobs_are_their_starters_alone():
    with two() as s:
        async def t():
            async with both(s) as (a, b):
                sc, _, _ = await call(a, "bash", "sleep 30", background=True)
                job = sc["job"]
                for args in ({"id": job}, {"id": job, "wait_seconds": 1}, {"id": job, "kill": True}):
                    res = await b.call_tool("job", args)
                    assert res.is_error and res.structured_content["error"]["code"] == "unknown_job", dump(res.structured_content)
                listed = (await b.call_tool("job", {})).structured_content
                assert job not in json.dumps(listed), listed
                mine = (await a.call_tool("job", {"id": job})).structured_content
                assert mine["state"] in ("running", "queued"), mine
                await a.call_tool("job", {"id": job, "kill": True})
        run_async(t)


def test_sessions_are_their_principals_alone():
    with two() as s:
        async def t():
            async with both(s) as (a, b):
                sc = await run_ok(a, "secret=alice-only; echo ok", session="work")
                handle = sc["session"].get("handle")
                assert handle and handle.startswith("s_"), dump(sc)
                # Bob's session of the same name is his own.
                theirs = await run_ok(b, 'echo "[$secret]"', session="work")
                assert theirs["stdout"] == "[]\n" and theirs["session"]["handle"] != handle, dump(theirs)
                # Alice's handle does not reach her session for Bob.
                sc, _, err = await call(b, "bash", 'echo "[$secret]"', session=handle)
                assert err and "another client" in sc["error"]["message"], dump(sc)
                assert (await run_ok(a, 'echo "[$secret]"', session=handle))["stdout"] == "[alice-only]\n"
        run_async(t)


@stateless_only()
def test_tasks_are_their_principals_alone():
    with two() as s:
        started = rpc(s, "alice", "tools/call", {"name": "run", "arguments": {"env": "bash", "code": "sleep 20", "background": True}},
                      capabilities=TASKS)
        task = started["result"]["taskId"]
        for method in ("tasks/get", "tasks/cancel"):
            refused = rpc(s, "bob", method, {"taskId": task}, capabilities=TASKS)
            assert refused["error"]["code"] == -32602, refused
        assert rpc(s, "alice", "tasks/get", {"taskId": task}, capabilities=TASKS)["result"]["status"] == "working"
        rpc(s, "alice", "tasks/cancel", {"taskId": task}, capabilities=TASKS)


@legacy_only("a session of the MCP connection (Mcp-Session-Id)")
def test_an_mcp_session_is_its_principals_alone():
    with two() as s:
        code, headers, _ = raw(s, token="alice")
        sid = headers["mcp-session-id"]
        raw(s, token="alice", body={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={"mcp-session-id": sid, "mcp-protocol-version": PROTOCOL})
        listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        for method, body in (("POST", listed), ("GET", None)):
            code, _, answer = raw(s, token="bob", method=method, body=body,
                                  headers={"mcp-session-id": sid, "mcp-protocol-version": PROTOCOL})
            assert code == 404, (method, code, answer)
            assert answer["jsonrpc"] == "2.0" and "error" in answer, answer
        # Bob's DELETE ends no session of his, and none of alice's.
        raw(s, token="bob", method="DELETE", body=None, headers={"mcp-session-id": sid, "mcp-protocol-version": PROTOCOL})
        code, _, _ = raw(s, token="alice", body=listed, headers={"mcp-session-id": sid, "mcp-protocol-version": PROTOCOL})
        assert code == 200


def test_confirmations_are_their_askers_alone():
    async def never(*_: Any) -> Any:
        raise AssertionError("the question is answered in a retry, not asked")

    with two(config_text=DEPLOY) as s:
        async def t():
            async with both(s, callbacks={"elicitation_callback": never} if STATELESS else None) as (a, b):
                args = {"branch": "main"}
                if STATELESS:
                    first = await a.call_tool("deploy", args, allow_input_required=True)
                    state = first.request_state
                    res = await b.call_tool("deploy", args, input_responses={"confirm": {"action": "accept", "content": {"approve": True}}},
                                            request_state=state, allow_input_required=True)
                    assert res.is_error and res.structured_content["error"]["code"] == "confirmation_invalid", res
                    res = await a.call_tool("deploy", args, input_responses={"confirm": {"action": "accept", "content": {"approve": True}}},
                                            request_state=state, allow_input_required=True)
                    assert not res.is_error and "deploying main" in res.structured_content["stdout"], res
                else:
                    res = await a.call_tool("deploy", args)
                    token = res.structured_content["confirmation"]["token"]
                    confirm = {"token": token, "command": "deploy", "arguments": args}
                    theirs = await b.call_tool("confirm", confirm)
                    assert theirs.is_error and theirs.structured_content["error"]["code"] == "confirmation_invalid", theirs
                    assert "unknown" in theirs.structured_content["error"]["message"], theirs
                    # Another principal cannot spend it: it is still alice's.
                    mine = await a.call_tool("confirm", confirm)
                    assert not mine.is_error and "deploying main" in mine.structured_content["stdout"], mine
        run_async(t)
    events = [json.loads(line) for line in s.audit.read_text().splitlines()]
    ran = [e for e in events if e.get("event") == "run"]
    assert [e["principal"] for e in ran] == ["alice"], events


def test_one_principal_saturating_its_share_leaves_the_others_running():
    # Two run slots; each principal may hold one.
    with two(server_table="max_concurrent_runs = 2\n", http_config="[http.per_principal]\nmax_runs = 1\n") as s:
        async def t():
            done: list[str] = []
            async with both(s) as (a, b):
                async def alice(i: int) -> None:
                    await run_ok(a, "sleep 2")
                    done.append(f"alice{i}")

                async with anyio.create_task_group() as tg:
                    for i in range(3):
                        tg.start_soon(alice, i)
                    await anyio.sleep(0.5)
                    began = time.monotonic()
                    await run_ok(b, "echo bob")
                    done.append("bob")
                    assert time.monotonic() - began < 1.8, "bob waited for alice's runs"
            assert done[0] == "bob", done
        run_async(t)
    principals = {json.loads(line)["principal"] for line in s.audit.read_text().splitlines()}
    assert principals == {"alice", "bob"}


def test_grants_limit_environments_projects_and_tools():
    projects = {name: readable_tmpdir() for name in ("mine", "theirs")}
    for name, p in projects.items():
        (p / "name.txt").write_text(name)
        (p / "name.txt").chmod(0o644)
    config = DEPLOY + "".join(f'[projects.{n}]\npath = "{p}"\n' for n, p in projects.items())
    scopes = '[http.principals.carol]\nscopes = ["sandbox:run", "sandbox:env:bash", "sandbox:project:mine"]\n'
    with two(config_text=config, http_config=scopes, principals=("alice", "carol")) as s:
        async def t():
            async with client(s.url, s.token("carol")) as c:
                await start(c, over_http=True)
                assert [t.name for t in (await c.list_tools()).tools] == ["run", "job"]
                sc = await run_ok(c, "cat /project/name.txt", project="mine")
                assert sc["stdout"] == "mine", dump(sc)
                for args in ({"env": "python", "code": "print(1)", "project": "mine"},
                             {"env": "bash", "code": "echo", "project": "theirs"},
                             {"env": "bash", "code": "echo"}):
                    res = await c.call_tool("run", args)
                    assert res.is_error and res.structured_content["error"]["code"] == "forbidden", (args, res)
            async with client(s.url, s.token("alice")) as a:
                await start(a, over_http=True)
                assert "deploy" in [t.name for t in (await a.list_tools()).tools]
                assert (await run_ok(a, "cat /project/name.txt", project="theirs"))["stdout"] == "theirs"
        run_async(t)


def test_a_principals_patches_are_its_own():
    with two() as s:
        async def t():
            async with both(s) as (a, b):
                sc = await run_ok(a, "echo secret-change > /project/made-by-alice.txt")
                uri = sc["changes"]["patch_uri"]
                assert "secret-change" in (await a.read_resource(uri)).contents[0].text
                assert uri in [str(r.uri) for r in (await a.list_resources()).resources]
                assert uri not in [str(r.uri) for r in (await b.list_resources()).resources]
                with pytest.raises(Exception, match="no longer kept"):
                    await b.read_resource(uri)
        run_async(t)
