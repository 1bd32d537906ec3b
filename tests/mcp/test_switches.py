"""The kill switches change how a sandbox is made, never what it is: with
each of NIX_SANDBOX_OWN_ROOT, _STORE_VIEW, _WARM_START and _POOL off, a
run sees the same filesystem, identity and environment as with none off,
and still cannot write outside its scratch space. (NIX_SANDBOX_NEST=off
changes the project's mode, and has tests of its own: test_project.py,
test_lifetime.py.)"""

from __future__ import annotations

import pytest

from harness import call, dump, run_async, session

PROBE = (
    "set -e\n"
    "ls / | tr '\\n' ' '; echo\n"
    "ls /etc | tr '\\n' ' '; echo\n"
    "id; hostname; pwd; echo \"$HOME $TMPDIR\"\n"
    "awk '{print $5}' /proc/self/mountinfo | sort | tr '\\n' ' '; echo\n"
    "for d in / /usr /etc /proc; do touch $d/.nsm-probe 2>/dev/null && echo \"wrote $d\" || true; done\n"
    "echo ok > /workspace/w && cat /workspace/w\n"
)


async def probe(env: dict[str, str]) -> str:
    async with session(env=env) as s:
        sc, text, err = await call(s, "bash", PROBE)
        assert not err, text
        return sc["stdout"]


@pytest.mark.parametrize("switch", ["NIX_SANDBOX_OWN_ROOT", "NIX_SANDBOX_STORE_VIEW", "NIX_SANDBOX_WARM_START",
                                    "NIX_SANDBOX_POOL"])
def test_a_switch_turned_off_changes_nothing_the_sandbox_sees(switch: str):
    default = run_async(probe, {})
    off = run_async(probe, {switch: "off"})
    assert "wrote" not in off, off
    assert off == default, f"{switch}=off:\n{off}\ndefault:\n{default}"
