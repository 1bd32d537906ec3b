#!/usr/bin/env python3
"""Streamable HTTP against stdio: calls per second with k calls always in
flight (k = 1, 8, 32 by default) on one server over stdio and one over HTTP
(`serve --http` on loopback, a bearer token, the 2026-07-28 revision: a
stateless POST a call, k keep-alive connections), both with the same
configuration, in the same run; then the server's memory with 1,000 idle
authenticated connections open against its memory idle.

Rows, per k, each for --seconds in each of --runs rounds, the two
transports' order reversed every other round (a drift in the host's speed
falls on both alike):
  stdio   k tools/call requests in flight on one server's standard input
  HTTP    k connections, each a tools/call POST at a time
  2 replicas behind haproxy
          (with --balanced, where haproxy is installed) the same k
          connections to haproxy running deploy/haproxy/haproxy.cfg in
          front of two replicas on this machine's cores

A second table says what that is per replica and per core, and what N
replicas of M cores would give if runs stay bound by CPU and nothing is
shared between replicas (a projection from the per-core rate: the runs of
different replicas share no state, see docs/scaling.md).

The ratio is HTTP's calls/s over stdio's, over all rounds (goal: at least
0.9), with the lowest and highest of the rounds' own ratios beside it.
Every call that is not ok is counted by its error code: there must be none.
The servers run with max_concurrent_runs = the largest k (every call in
flight has a sandbox) and the one principal's share set to the whole
server, so that what is measured is the transport.

usage: bench/streamable_http.py [--bin target/release/nix-sandbox-mcp] [--seconds 2] [--runs 4]
                                [--idle-connections 1000] [--balanced]
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import http.client
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time

from bench import Table, parse_args, report, workdir
from sustained import SANDBOX_MEMORY_MB, Pipelined

PROTOCOL = "2026-07-28"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
HAPROXY_CONFIG = pathlib.Path(__file__).resolve().parent.parent / "deploy" / "haproxy" / "haproxy.cfg"
BALANCED = "2 replicas behind haproxy"
META = {"io.modelcontextprotocol/protocolVersion": PROTOCOL, "io.modelcontextprotocol/clientCapabilities": {}}


class HttpServer:
    """`serve --http` on a loopback port with one principal's token."""

    def __init__(self, binary: str, env: dict, config: pathlib.Path, work: pathlib.Path, token: str | None = None,
                 replica: str = "") -> None:
        """`token`: the principal's, when another replica's is to be shared;
        `replica`: the name it gives itself among replicas."""
        self.token = token or "nsm_" + secrets.token_urlsafe(32)
        tokens = work / f"tokens{replica}"
        tokens.write_text(f"bench sha256:{hashlib.sha256(self.token.encode()).hexdigest()}\n")
        tokens.chmod(0o600)
        shares = "".join(f"{k} = 100000\n" for k in ("max_connections", "max_streams", "max_runs", "max_jobs"))
        http_config = work / f"http{replica}.toml"
        http_config.write_text(f'[http]\ntokens_file = "{tokens}"\nmax_connections = 4096\n'
                               + (f'replica = "{replica}"\n' if replica else "")
                               + f"[http.per_principal]\n{shares}\n" + config.read_text())
        self.port = free_port()
        self.log = work / f"http{replica}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([binary, "--config", str(http_config), "serve", "--http",
                                          f"127.0.0.1:{self.port}"], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **env})
        deadline = time.monotonic() + 60
        while b"listening on" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve --http did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def call(self, conn: http.client.HTTPConnection, env: str, code: str) -> dict:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "run", "arguments": {"env": env, "code": code}, "_meta": META}}
        conn.request("POST", "/mcp", body=json.dumps(body), headers={
            "authorization": f"Bearer {self.token}", "content-type": "application/json",
            "accept": "application/json, text/event-stream", "mcp-protocol-version": PROTOCOL,
            "mcp-method": "tools/call", "mcp-name": "run"})
        r = conn.getresponse()
        text = r.read().decode()
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
            return next((e for e in events if e.get("id") == 1), {"error": "no answer"})
        return json.loads(text)

    def sustain(self, env: str, code: str, k: int, seconds: float) -> tuple[int, collections.Counter]:
        failures: collections.Counter = collections.Counter()
        done = [0] * k
        deadline = time.monotonic() + seconds

        def worker(i: int) -> None:
            conn = self.connect()
            while time.monotonic() < deadline:
                reply = self.call(conn, env, code)
                content = (reply.get("result") or {}).get("structuredContent") or {}
                if content.get("ok"):
                    done[i] += 1
                else:
                    failures[(content.get("error") or {}).get("code") or json.dumps(reply)[:200]] += 1
            conn.close()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(done), failures

    def rss_kib(self) -> int:
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def idle_connections(self, n: int) -> list[socket.socket]:
        """`n` connections, each authenticated by one request (tools/list)
        and then left open, idle."""
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}).encode()
        head = (f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\nauthorization: Bearer {self.token}\r\n"
                "content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
                f"mcp-protocol-version: {PROTOCOL}\r\nmcp-method: tools/list\r\ncontent-length: {len(body)}\r\n\r\n")
        socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", self.port))
            s.sendall(head.encode() + body)
            socks.append(s)
        for s in socks:  # each answered: the whole response read
            s.settimeout(30)
            got = b""
            while b"\r\n0\r\n\r\n" not in got and not (b"content-length" in got.lower() and got.endswith(b"}")):
                chunk = s.recv(65536)
                if not chunk:
                    raise SystemExit("a connection closed before its answer")
                got += chunk
                if b"\n\n" in got and b"data:" in got and b'"id":1' in got:
                    break
        return socks

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


class Balanced(HttpServer):
    """Replicas a and b, one principal's token on both, and haproxy with
    deploy/haproxy/haproxy.cfg in front of them: calls go to its port."""

    def __init__(self, binary: str, env: dict, config: pathlib.Path, work: pathlib.Path) -> None:
        self.replicas = [HttpServer(binary, env, config, work, replica="a")]
        self.replicas.append(HttpServer(binary, env, config, work, token=self.replicas[0].token, replica="b"))
        self.token = self.replicas[0].token
        self.port = free_port()
        self.log = work / "haproxy.log"
        lb_env = {**os.environ, "NSM_LB_BIND": f"127.0.0.1:{self.port}",
                  "NSM_REPLICA_A": f"127.0.0.1:{self.replicas[0].port}",
                  "NSM_REPLICA_B": f"127.0.0.1:{self.replicas[1].port}"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(HAPROXY_CONFIG)], env=lb_env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        # Until calls through haproxy run (round robin: on both replicas).
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = self.connect()
                ok = all(self.call(conn, "bash", ":")["result"]["structuredContent"]["ok"] for _ in range(4))
                conn.close()
                if ok:
                    break
            except (OSError, KeyError, TypeError, ValueError, http.client.HTTPException):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = self.log.read_text()[-2000:]
                self.close()
                raise SystemExit(f"haproxy did not reach both replicas: {why}")
            time.sleep(0.2)

    def close(self) -> None:
        super().close()
        for r in self.replicas:
            r.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(binary: str, ks: list[int], seconds: float, rounds: int, idle: int, balanced: bool = False) -> dict:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, idle + 1024)), hard))
    work, env = workdir()
    work = pathlib.Path(work)
    config = work / "config.toml"
    config.write_text(f"[server]\nmax_concurrent_runs = {max(ks)}\nmax_queued_runs = {4 * max(ks)}\n"
                      f"memory_budget_mb = {2 * max(ks) * SANDBOX_MEMORY_MB}\n")
    # Every server started is stopped, whatever fails (closing twice is
    # harmless).
    with contextlib.ExitStack() as started:
        stdio = Pipelined(binary, env, ["--config", str(config)])
        started.callback(stdio.close)
        web = HttpServer(binary, env, config, work)
        started.callback(web.close)
        code = ":\n"
        rows = {"stdio": lambda k: stdio.sustain("bash", code, k, seconds),
                "HTTP": lambda k: web.sustain("bash", code, k, seconds)}
        fleet = Balanced(binary, env, config, work) if balanced and shutil.which(HAPROXY) else None
        if fleet:
            started.callback(fleet.close)
            rows[BALANCED] = lambda k: fleet.sustain("bash", code, k, seconds)
        for run in rows.values():  # warm caches, the pool and the cgroups
            run(max(ks))
        done: dict = collections.Counter()
        failures: dict = collections.defaultdict(collections.Counter)
        ratios: dict = collections.defaultdict(list)
        for n in range(rounds):
            order = list(rows) if n % 2 == 0 else list(reversed(rows))
            for k in ks:
                this = {}
                for label in order:
                    ok, failed = rows[label](k)
                    done[(k, label)] += ok
                    failures[(k, label)].update(failed)
                    this[label] = ok
                ratios[k].append(this["HTTP"] / max(this["stdio"], 1))
        stdio.close()
        if fleet:
            fleet.close()

        time.sleep(1)
        before = web.rss_kib()
        socks = web.idle_connections(idle)
        time.sleep(1)
        after = web.rss_kib()
        for s in socks:
            s.close()
        web.close()
        shutil.rmtree(work, ignore_errors=True)

    total = seconds * rounds
    table = Table("http", ["k", "path", "calls/s", "÷ stdio", "rounds (HTTP ÷ stdio)", "failed"])
    metrics = {}
    for k in ks:
        base = done[(k, "stdio")] / total
        for label in rows:
            rate = done[(k, label)] / total
            failed = ", ".join(f"{c} x{n}" for c, n in failures[(k, label)].items()) or "-"
            spread = f"{min(ratios[k]):.2f}-{max(ratios[k]):.2f}" if label == "HTTP" else "-"
            table.add([k, label, rate, rate / max(base, 1e-9) if label != "stdio" else 1.0, spread, failed])
        metrics[f"http.k{k}.http_over_stdio"] = done[(k, "HTTP")] / max(done[(k, "stdio")], 1)
        metrics[f"http.k{k}.failed"] = float(sum(sum(failures[(k, label)].values()) for label in rows if label != "stdio"))
    # Per replica and per core, at the k that keeps the cores busiest.
    cores = os.cpu_count() or 1
    k = max(ks, key=lambda k: done[(k, "HTTP")])
    per_replica = done[(k, "HTTP")] / total
    scaling = Table("http_scaling", ["what", "calls/s", "measured"])
    scaling.add([f"one replica, {cores} cores, {k} calls in flight", per_replica, "yes"])
    scaling.add(["the same, per core", per_replica / cores, "yes"])
    if fleet:
        scaling.add([f"two replicas behind haproxy on the same {cores} cores", done[(k, BALANCED)] / total, "yes"])
        metrics[f"http.k{k}.balanced_over_http"] = done[(k, BALANCED)] / max(done[(k, "HTTP")], 1)
    for n, m in ((2, 8), (4, 16), (8, 32)):
        scaling.add([f"{n} replicas of {m} cores", per_replica / cores * n * m, "no: per-core rate x cores"])
    metrics["http.calls_per_core"] = per_replica / cores
    memory = Table("http_idle_connections", ["what", "MiB"])
    memory.add(["server idle (after the calls above)", before / 1024])
    memory.add([f"with {idle} idle authenticated connections", after / 1024])
    memory.add(["difference (goal: at most 64)", (after - before) / 1024])
    metrics["http.idle_connections_mib"] = (after - before) / 1024
    return {"tables": [table, memory, scaling], "metrics": metrics,
            "title": f"bash, {rounds} x {seconds:g} s per row, uid {os.getuid()}"}


def main() -> None:
    a = parse_args(__doc__, runs=4, seconds=2, idle_connections=1000, balanced=False)
    result = measure(a.bin, [1, 8, 32], a.seconds, a.runs, a.idle_connections, a.balanced)
    report(a, result)


if __name__ == "__main__":
    main()
