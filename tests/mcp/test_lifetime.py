"""Nothing a server started outlives it, however it ends: a running call, a
background job, a session (paused between calls) and the sandboxes kept
ready all go when the server is killed outright, with the nest (whose pid
namespace the kernel tears down) and without it (bubblewrap's parent-death
signal)."""

from __future__ import annotations

import time
import uuid

import pytest

from harness import RawServer, processes_with


@pytest.mark.parametrize("nest", ["on", "off"])
def test_a_server_killed_outright_leaves_no_sandbox_process(nest: str):
    m = f"nsm-{uuid.uuid4().hex[:10]}"
    env = {} if nest == "on" else {"NIX_SANDBOX_NEST": "off"}
    srv = RawServer(env=env)
    try:
        def call(rid: int, args: dict) -> None:
            srv.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": "run", "arguments": args}})

        # The call waits until the background process runs its program: the
        # session is paused when the call returns, which could catch it
        # between fork and exec (and so before it has its name).
        call(1, {"env": "bash", "session": "kept", "code": f"(exec -a {m}-session sleep 300) & "
                 f"until tr '\\0' ' ' </proc/$!/cmdline | grep -q {m}-session; do sleep 0.01; done"})
        assert srv.recv()["result"]["structuredContent"]["ok"]
        call(2, {"env": "bash", "background": True, "code": f"exec -a {m}-job sleep 300"})
        assert "job" in srv.recv()["result"]["structuredContent"]
        call(3, {"env": "python", "code": f"import os; os.execvp('sleep', ['{m}-run', '300'])"})
        deadline = time.monotonic() + 10
        while len(processes_with(m)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(processes_with(m)) == 3, processes_with(m)
    finally:
        srv.close()  # SIGKILL
    deadline = time.monotonic() + 10
    while processes_with(m) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(m) == [], f"left behind by a killed server (nest {nest})"
