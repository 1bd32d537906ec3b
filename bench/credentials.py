#!/usr/bin/env python3
"""A large download through the proxy, to a host with a credential (the
proxy ends TLS, adds the header and makes its own TLS connection) against
the same download through a plain tunnel (the proxy copies bytes), in one
interleaved run, over HTTP/2 (curl's default) and HTTP/1.1: each side of
the proxy speaks what the sandbox chose. The upstream is tests/mcp's TLS
server on loopback, named `localhost` (a certificate of a test authority
the server trusts through SSL_CERT_FILE), so a release build needs no test
knob.

  tunnel        curl in the sandbox, CONNECT to a host without credentials
  intercepted   the same host with a credential for it

usage: bench/credentials.py [--bin target/release/nix-sandbox-mcp] [--runs 5] [--mib 100] [--json FILE]
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

from bench import ROOT, Server, Table, parse_args, stats, workdir, write_json

sys.path.insert(0, str(ROOT / "tests" / "mcp"))
from stand_ins import ApiUpstream, TestCA  # noqa: E402

CONFIG = """
[environments.tunnel]
preset = "bash"
timeout_ms = 120000
network = {{ allow = ["localhost", "127.0.0.1"], transfer_mb = 4096 }}

[environments.intercepted]
preset = "bash"
timeout_ms = 120000
[environments.intercepted.network]
allow = ["localhost", "127.0.0.1"]
transfer_mb = 4096
[[environments.intercepted.network.credentials]]
host = "localhost"
scheme = "Bearer"
value_from = {{ file = "{secret}" }}
"""


# Each protocol: curl's option for it, its name in the metrics.
PROTOCOLS = {"HTTP/2": ("--http2", "http2"), "HTTP/1.1": ("--http1.1", "http1")}


def download(server: Server, env: str, protocol: str, url: str, size: int) -> float:
    """Seconds curl in the sandbox took to fetch `url` (its own clock)."""
    # -k: the sandbox cannot read the test authority; a tunnel's TLS is
    # curl's own, whose check of the certificate costs the same either way.
    code = (f"curl -sS -k {PROTOCOLS[protocol][0]} --noproxy '' -o /dev/null "
            f"-w '%{{size_download}} %{{time_total}}' '{url}'")
    r = server.request("tools/call", {"name": "run", "arguments": {"env": env, "code": code}})
    out = r["result"]["structuredContent"]
    got, seconds = out["stdout"].split()
    assert out["ok"] and int(got) == size, out
    return float(seconds)


def measure(binary: str, runs: int, mib: int) -> dict:
    work, env = workdir()
    ca = TestCA()
    upstream = None
    try:
        upstream = ApiUpstream(*ca.issue(["localhost"]))
        secret = pathlib.Path(work) / "token"
        secret.write_text("bench-token\n")
        config = pathlib.Path(work) / "config.toml"
        config.write_text(CONFIG.format(secret=secret))
        env = {**env, "SSL_CERT_FILE": str(ca.ca_pem), "SSL_CERT_DIR": "/nonexistent",
               "XDG_STATE_HOME": str(pathlib.Path(work) / "state")}
        size = mib << 20
        url = f"https://localhost:{upstream.port}/bytes?n={size}"
        rows = {(p, e): [] for p in PROTOCOLS for e in ("tunnel", "intercepted")}
        server = Server(binary, env, ["--config", str(config)])
        try:
            for _ in range(runs):
                for (protocol, env_name), times in rows.items():
                    times.append(download(server, env_name, protocol, url, size))
        finally:
            server.close()
    finally:
        if upstream:
            upstream.close()
        ca.close()
        shutil.rmtree(work, ignore_errors=True)
    table = Table("credentials", ["path", f"median s ({mib} MiB)", "MiB/s", "speed ÷ tunnel"])
    metrics = {}
    for protocol, (_, key) in PROTOCOLS.items():
        tunnel = stats(rows[(protocol, "tunnel")])[0]
        for env_name in ("tunnel", "intercepted"):
            med = stats(rows[(protocol, env_name)])[0]
            table.add([f"{env_name}, {protocol}", med, mib / med, tunnel / med])
        metrics[f"credentials.{key}.intercepted_over_tunnel"] = tunnel / stats(rows[(protocol, "intercepted")])[0]
    return {"tables": [table], "metrics": metrics}


def main() -> None:
    a = parse_args(__doc__, runs=5, mib=100)
    result = measure(a.bin, a.runs, a.mib)
    for t in result["tables"]:
        print(t.text())
    write_json(a, result)


if __name__ == "__main__":
    os.environ.setdefault("RUST_LOG", "error")
    main()
