"""Replicas behind a stock load balancer: haproxy (the distribution's), run
with deploy/haproxy/haproxy.cfg exactly, in front of two `serve --http`
replicas on loopback. Plain calls spread over both; a session's calls and a
task's polls reach the replica holding them; a replica killed mid-load
leaves nothing behind, its sessions answer session_expired from the other,
whose calls keep working; restarted, it takes calls again. A confirmation's
retry reaches the replica that asked."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import time
import uuid
from typing import Any

import anyio
import pytest

from harness import (BIN, PROTOCOL, ROOT, call, dump, legacy_only, processes_with, run_async, stateless_only, start,
                     write_config)
from http_transport import HttpServer, client, free_port
from test_http import env, eventually, scratch

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
SHARES = "[http.per_principal]\n" + "".join(f"{k} = 100000\n" for k in ("max_connections", "max_streams", "max_runs"))

pytestmark = pytest.mark.skipif(not os.path.exists(HAPROXY), reason="haproxy is not installed (.ci/run installs it)")


class Fleet:
    """Replicas a and b, and haproxy in front of them."""

    def __init__(self, config: str | None = None) -> None:
        self.dir = scratch()
        self.config = config
        self.ports = {"a": free_port(), "b": free_port()}
        self.replicas: dict[str, HttpServer] = {}
        for name in self.ports:
            self.start(name)
        self.lb_port = free_port()
        self.log = self.dir / "haproxy.log"
        lb_env = {**os.environ, "NSM_LB_BIND": f"127.0.0.1:{self.lb_port}",
                  "NSM_REPLICA_A": f"127.0.0.1:{self.ports['a']}", "NSM_REPLICA_B": f"127.0.0.1:{self.ports['b']}"}
        with open(self.log, "wb") as log:
            self.haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], env=lb_env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log)
        self.url = f"http://127.0.0.1:{self.lb_port}/mcp"
        assert eventually(lambda: self.both_up(), 30), self.log.read_text()

    def start(self, name: str) -> None:
        # One token for every replica: the principal is the same wherever
        # the balancer sends a call.
        self.replicas[name] = HttpServer(
            BIN, scratch(), config=self.config, env=env(), principals=("tester",), tokens=getattr(self, "tokens", None),
            http_config=f'replica = "{name}"\n{SHARES}', address=f"127.0.0.1:{self.ports[name]}")
        self.tokens = self.replicas[name].tokens

    def token(self) -> str:
        return self.replicas["a"].token()

    def both_up(self) -> bool:
        # haproxy's health checks have seen each replica answer /healthz.
        return all(self.runs_reach(n) for n in ("a", "b"))

    def runs_reach(self, name: str) -> bool:
        try:
            return any(self.call_plain()["replica"] == name for _ in range(4))
        except Exception:  # noqa: BLE001
            return False

    def call_plain(self, code: str = "echo hi") -> dict:
        """One stateless run through the balancer; which replica ran it."""
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.lb_port, timeout=30)
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "run", "arguments": {"env": "bash", "code": code},
                           "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                     "io.modelcontextprotocol/clientCapabilities": {}}}}
        conn.request("POST", "/mcp", body=json.dumps(body), headers={
            "authorization": f"Bearer {self.token()}", "content-type": "application/json",
            "accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call", "mcp-name": "run"})
        r = conn.getresponse()
        text = r.read().decode()
        conn.close()
        if r.status != 200:
            return {"status": r.status, "replica": None, "text": text}
        events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
        answer = next(e for e in events if e.get("id") == 1)
        return {"status": 200, "replica": self.which(), "answer": answer}

    def which(self) -> str | None:
        """The replica whose run count grew since last asked."""
        counts = {n: self.run_count(n) for n in self.replicas}
        grew = [n for n in counts if counts[n] > getattr(self, "_counts", {}).get(n, 0)]
        self._counts = counts
        return grew[0] if len(grew) == 1 else None

    def run_count(self, name: str) -> int:
        import http.client
        s = self.replicas[name]
        if s.proc.poll() is not None:
            return getattr(self, "_counts", {}).get(name, 0)
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[name], timeout=10)
        conn.request("GET", "/metrics", headers={"authorization": f"Bearer {s.token()}"})
        text = conn.getresponse().read().decode()
        conn.close()
        return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                   if line.startswith("nix_sandbox_mcp_runs_total{"))

    def close(self) -> None:
        self.haproxy.terminate()
        self.haproxy.wait(10)
        for s in self.replicas.values():
            s.stop()


@contextlib.contextmanager
def fleet(config: str | None = None):
    f = Fleet(config)
    try:
        yield f
    finally:
        f.close()


@stateless_only()
def test_plain_runs_spread_over_the_replicas():
    with fleet() as f:
        where: dict[Any, int] = {}
        for _ in range(200):
            r = f.call_plain()
            assert r["status"] == 200 and r["answer"]["result"]["structuredContent"]["ok"], r
            where[r["replica"]] = where.get(r["replica"], 0) + 1
        assert where.get("a", 0) >= 40 and where.get("b", 0) >= 40, where


@stateless_only()
def test_a_sessions_calls_reach_its_replica():
    with fleet() as f:
        async def t():
            async with client(f.url, f.token()) as c:
                await start(c, over_http=True)
                first, _, err = await call(c, "bash", "n=0", session="counter")
                assert not err, dump(first)
                handle = first["session"]["handle"]
                holder = handle.split("_")[1]
                assert holder in ("a", "b"), handle
                # Behind a balancer a session is named by its handle (a name
                # is an alias on the replica that made it).
                for i in range(1, 21):
                    sc, _, err = await call(c, "bash", "n=$((n+1)); echo $n", session=handle)
                    assert not err and sc["stdout"] == f"{i}\n", dump(sc)
        run_async(t)


@stateless_only()
def test_a_task_is_polled_through_the_balancer():
    with fleet() as f:
        import http.client

        def rpc(method: str, params: dict, name: str) -> dict:
            conn = http.client.HTTPConnection("127.0.0.1", f.lb_port, timeout=30)
            body = {"jsonrpc": "2.0", "id": 5, "method": method,
                    "params": {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
                                                    "io.modelcontextprotocol/clientCapabilities":
                                                        {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}}
            conn.request("POST", "/mcp", body=json.dumps(body), headers={
                "authorization": f"Bearer {f.token()}", "content-type": "application/json",
                "accept": "application/json, text/event-stream", "mcp-protocol-version": PROTOCOL,
                "mcp-method": method, "mcp-name": name})
            text = conn.getresponse().read().decode()
            conn.close()
            if text.startswith("{"):
                return json.loads(text)
            return next(json.loads(line[5:]) for line in text.splitlines()
                        if line.startswith("data:") and '"id":5' in line)

        made = rpc("tools/call", {"name": "run", "arguments": {"env": "bash", "code": "sleep 1; echo polled",
                                                               "background": True}}, "run")
        task = made["result"]["taskId"]
        assert task.split("_")[1] in ("a", "b"), task
        deadline = time.monotonic() + 30
        while True:
            got = rpc("tasks/get", {"taskId": task}, task)
            assert "result" in got, got  # every poll reached the replica holding it
            if got["result"]["status"] == "completed":
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        assert "polled" in json.dumps(got["result"]["result"]), got


@stateless_only()
def test_a_confirmations_retry_reaches_the_replica_that_asked_and_no_other_runs_it():
    from mcp import types
    config = write_config(
        '[commands.deploy]\ndescription = "Deploy a branch"\nenv = "bash"\n'
        'argv = ["echo", "deploying", "{{branch}}"]\ndanger = "high"\nconfirm = true\n'
        '[commands.deploy.params.branch]\ntype = "string"\nrequired = true\n')
    args = {"branch": "main"}
    yes = {"confirm": {"action": "accept", "content": {"approve": True}}}

    async def never(*_: Any) -> Any:
        raise AssertionError("the server must not ask the client anything under 2026-07-28")

    with fleet(config) as f:
        async def t():
            callbacks = {"elicitation_callback": never}
            async with client(f.url, f.token(), callbacks=callbacks) as c:
                await start(c, over_http=True)
                holders = set()
                # Round robin sends each retry to the other replica unless
                # the balancer routes it by the state.
                for _ in range(4):
                    first = await c.call_tool("deploy", args, allow_input_required=True)
                    assert isinstance(first, types.InputRequiredResult), first
                    holder, _, sealed = first.request_state.partition("~")
                    assert holder in ("a", "b") and sealed.startswith("rs1."), first.request_state
                    holders.add(holder)
                    done = await c.call_tool("deploy", args, input_responses=yes, request_state=first.request_state,
                                             allow_input_required=True)
                    assert not done.is_error and done.structured_content["stdout"] == "deploying main\n", done
                assert holders == {"a", "b"}, holders
                first = await c.call_tool("deploy", args, allow_input_required=True)
                holder = first.request_state.partition("~")[0]
                other = "b" if holder == "a" else "a"
            # Sent straight to the other replica, the retry runs nothing there.
            async with client(f"http://127.0.0.1:{f.ports[other]}/mcp", f.token(), callbacks=callbacks) as c:
                await start(c, over_http=True)
                res = await c.call_tool("deploy", args, input_responses=yes, request_state=first.request_state,
                                        allow_input_required=True)
                sc = res.structured_content or {}
                assert res.is_error and sc["error"]["code"] == "confirmation_invalid", dump(sc)
                assert f"issued by replica {holder}" in sc["error"]["message"], dump(sc)
                assert "nothing ran" in sc["error"]["message"] and "stdout" not in sc, dump(sc)
        run_async(t)


@stateless_only()
def test_a_replica_killed_mid_load_leaves_nothing_and_the_other_goes_on():
    m = str(uuid.uuid4().int % 10**8)
    with fleet() as f:
        async def t() -> None:
            async with client(f.url, f.token()) as c:
                await start(c, over_http=True)
                # A session on each replica.
                held: dict[str, str] = {}
                for i in range(20):
                    sc, _, err = await call(c, "bash", f"marker={m}", session=f"s{i}")
                    assert not err, dump(sc)
                    held.setdefault(sc["session"]["handle"].split("_")[1], sc["session"]["handle"])
                    if len(held) == 2:
                        break
                assert set(held) == {"a", "b"}, held
                # Load on both; replica a killed in the middle of it.
                results: list[Any] = []

                async def load() -> None:
                    for _ in range(15):
                        try:
                            results.append(await anyio.to_thread.run_sync(f.call_plain, f"sleep 0.{m}"))
                        except Exception as e:  # noqa: BLE001
                            results.append(e)

                async with anyio.create_task_group() as tg:
                    for _ in range(3):
                        tg.start_soon(load)
                    await anyio.sleep(0.5)
                    f.replicas["a"].proc.kill()
                    f.replicas["a"].proc.wait()
                # The other kept working: after haproxy saw a go, every call ran.
                assert eventually(lambda: f.call_plain()["status"] == 200, 10)
                tail = [f.call_plain() for _ in range(10)]
                assert all(r["status"] == 200 and r["answer"]["result"]["structuredContent"]["ok"] for r in tail), tail
                # Nothing of a's is left: no sandbox process.
                assert eventually(lambda: not [p for p in processes_with(m) if "sleep" in p], 10), processes_with(m)
                # a's session answers session_expired, from b, naming a.
                sc, _, err = await call(c, "bash", "echo $marker", session=held["a"])
                assert err and sc["error"]["code"] == "session_expired", dump(sc)
                assert "held by replica a" in sc["error"]["message"], dump(sc)
                sc, _, err = await call(c, "bash", "echo $marker", session=held["b"])
                assert not err and sc["stdout"] == f"{m}\n", dump(sc)
                # Restarted, a takes calls again, and has removed the
                # cgroups its killed self left.
                killed = f.replicas["a"].proc.pid
                f.start("a")
                assert eventually(lambda: f.runs_reach("a"), 30), f.log.read_text()
                left = [str(p) for p in pathlib.Path("/sys/fs/cgroup").glob(f"*/**/nix-sandbox-mcp-{killed}-*")]
                assert left == [], left
        run_async(t)


@legacy_only("an MCP session (Mcp-Session-Id) that the balancer keeps on one replica")
def test_a_2025_clients_mcp_session_sticks_to_one_replica():
    with fleet() as f:
        async def t():
            async with client(f.url, f.token()) as c:
                await start(c, over_http=True)
                await call(c, "bash", "n=0", session="counter")
                for i in range(1, 11):
                    sc, _, err = await call(c, "bash", "n=$((n+1)); echo $n", session="counter")
                    assert not err and sc["stdout"] == f"{i}\n", dump(sc)
        run_async(t)
