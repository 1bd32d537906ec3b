"""The `run` tool through a real MCP client: discovery, results, errors,
isolation and bounded output. Runs against host mode and, with NSM_MODE=closure,
against Nix-built artifacts."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from harness import (BIN, HostListeners, MODE, PROTOCOL, RawServer, STATELESS, call, dump, fixture_project, limits_mechanism,
                     processes_with, run_async, server_params, session, var_tmpdir, write_config)

ENVS = ("bash", "node", "python")


@pytest.mark.parametrize("mode,revision", [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
def test_the_sdk_s_own_client_gets_the_revision_it_asks_for(mode, revision):
    """The Python SDK's high-level client: by default it asks server/discover
    and speaks 2026-07-28; forced to the handshake, 2025-11-25. Either way
    the tools are listed and a run works."""
    from mcp.client.client import Client

    async def t():
        async with Client(server_params(), mode=mode) as c:
            assert c.protocol_version == revision, c.protocol_version
            tools = [t.name for t in (await c.list_tools()).tools]
            assert tools[:2] == ["run", "job"], tools
            res = await c.call_tool("run", {"env": "bash", "code": "echo $((6 * 7))"})
            assert not res.is_error and res.structured_content["stdout"] == "42\n", res
    run_async(t)


def test_every_result_says_what_produced_it():
    """structuredContent.ran and _meta name the environment (where it comes
    from, with its versions) and the server; under 2026-07-28, _meta names
    the server as the revision asks, on list results too."""
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    envs = {e["name"]: e for e in json.loads(subprocess.run([BIN, "envs", "--json"], capture_output=True, text=True,
                                                               env={**os.environ, **(server_params().env or {})},
                                                               check=True).stdout)["environments"]}

    async def t():
        async with session() as s:
            res = await s.call_tool("run", {"env": "python", "code": "print(1)"})
            ran = res.structured_content["ran"]
            assert ran["server"] == version and ran["environment"] == "python", ran
            assert ran["source"] == ("host" if MODE == "host" else "nix"), ran
            assert ran["path"] in envs["python"]["source"] and ran["description"] == envs["python"]["description"], (ran, envs)
            assert res.meta["nix-sandbox-mcp/ran"] == ran, res.meta
            # Before an environment was chosen: the server alone.
            res = await s.call_tool("run", {"env": "no-such-env", "code": "1"})
            assert res.is_error and res.structured_content["ran"] == {"server": version}, res
            listed = await s.list_tools()
            info = (listed.meta or {}).get("io.modelcontextprotocol/serverInfo")
            if STATELESS:
                assert res.meta["io.modelcontextprotocol/serverInfo"]["name"] == "nix-sandbox-mcp", res.meta
                assert info and info["version"] == version.split()[1], listed.meta
            else:
                assert info is None and "io.modelcontextprotocol/serverInfo" not in res.meta, res.meta
    run_async(t)


def test_the_revision_the_client_speaks_is_served_and_lists_every_env():
    async def t():
        async with session() as s:
            assert s.protocol_version == PROTOCOL
            # The tasks extension is 2026-07-28's: a handshake client is not told of it.
            extensions = s.server_capabilities.extensions or {}
            assert ("io.modelcontextprotocol/tasks" in extensions) == STATELESS, s.server_capabilities
            assert "env" in (s.instructions or "")
            tools = (await s.list_tools()).tools
            assert [t.name for t in tools][0] == "run"
            run = tools[0]
            for env in ENVS:
                assert f"- {env}: " in run.description, run.description
            assert sorted(run.input_schema["properties"]["env"]["enum"]) == sorted(ENVS)
            assert run.input_schema["required"] == ["code", "env"]
            assert "/project" in run.description and "/workspace" in run.description
            assert run.annotations.destructive_hint is False
            assert run.annotations.open_world_hint is False
            assert "No network." in run.description, run.description
            assert run.output_schema["required"] == ["ok"]
            assert "network" not in run.output_schema["properties"]
    run_async(t)


def test_a_networked_environment_is_marked_and_makes_the_tool_open_world():
    config = write_config('[environments.bash]\npreset = "bash"\n[environments.web]\npreset = "python"\nnetwork = true\n')

    async def t():
        async with session(config=config) as s:
            run = (await s.list_tools()).tools[0]
            assert run.annotations.open_world_hint is True
            assert "- web: " in run.description and "network" in run.description.split("- web: ")[1].splitlines()[0], run.description
            assert "No network unless marked" in run.description, run.description
            assert "network" in run.output_schema["properties"]
    run_async(t)



def test_the_description_says_which_protections_this_host_lacks():
    async def description(env: dict[str, str]) -> str:
        async with session(env=env) as s:
            return (await s.list_tools()).tools[0].description

    weaker = run_async(description, {"NIX_SANDBOX_LIMITS": "rlimits", "NIX_SANDBOX_NEST": "off"})
    assert "Weaker on this host: " in weaker, weaker
    assert "memory limited per process and not for shared memory" in weaker, weaker
    assert "no bound on the number of files written" in weaker, weaker
    # Without those settings, each weakness is named exactly when this host
    # has it (doctor's checks, each name's every finding), and only then.
    doctor = subprocess.run([BIN, "doctor", "--json"], capture_output=True, text=True)
    statuses: dict[str, set[str]] = {}
    for c in json.loads(doctor.stdout)["checks"]:
        statuses.setdefault(c["name"], set()).add(c["status"])
    lacks = {
        "no cgroup: memory limited per process": limits_mechanism() == "rlimits",
        "no bound on the number of files written": statuses["nest"] != {"ok"},
        "nested user namespaces not fully blocked": statuses["bubblewrap"] != {"ok"},
    }
    full = run_async(description, {})
    for weakness, lacking in lacks.items():
        assert (weakness in full) == lacking, (weakness, lacking, statuses, full)
    assert ("Weaker on this host: " in full) == any(lacks.values()), (lacks, full)


def test_description_and_instructions_fit_the_context_budget():
    """The run tool plus the server instructions stay under 450 tokens with
    three environments; with the job tool, the whole surface under 560 (the
    results' CPU, memory and network-refusal fields cost about ten). A host
    that lacks a protection (a user without a cgroup of their own) adds one
    sentence naming it, bounded on its own: it is what the agent must know."""
    from anthropic._tokenizers import sync_get_tokenizer

    tokenizer = sync_get_tokenizer()

    def count(text: str) -> int:
        return len(tokenizer.encode(text).ids)

    async def t():
        async with session() as s:
            listed = (await s.list_tools()).tools
            weaker = re.search(r" Weaker on this host: [^\n]*", listed[0].description)
            weaker = weaker.group(0) if weaker else ""
            tools = {t.name: json.dumps(t.model_dump(by_alias=True, exclude_none=True), separators=(",", ":")) for t in listed}
            tools["run"] = tools["run"].replace(json.dumps(weaker)[1:-1], "")
            instructions = count(s.instructions or "")
            return instructions + count(tools["run"]), instructions + sum(count(t) for t in tools.values()), count(weaker)

    run_only, everything, weaker = run_async(t)
    print(f"run + instructions: {run_only} tokens; every tool + instructions: {everything} tokens; this host's weaknesses: {weaker}")
    assert run_only <= 450, run_only
    assert everything <= 560, everything
    assert weaker <= 40, weaker


@pytest.mark.parametrize(
    "env,code,expected",
    [
        ("python", "import sys\nprint(sum(range(10)), sys.version_info[0])", "45 3\n"),
        ("bash", "x=$((6*7)); echo \"answer $x\"", "answer 42\n"),
        ("node", "console.log(JSON.stringify({a: [1, 2]}))", '{"a":[1,2]}\n'),
    ],
)
def test_each_environment_runs_code(env, code, expected):
    async def t():
        async with session() as s:
            sc, text, err = await call(s, env, code)
            assert not err, dump(sc)
            assert sc["ok"] is True and sc["exit_code"] == 0 and sc["stdout"] == expected
            assert sc["env"] == env and sc["timed_out"] is False and "limit" not in sc and "signal" not in sc
            assert text.startswith(f"[{env}] exit 0 in ") and expected.strip() in text
    run_async(t)


def test_stderr_and_nonzero_exit_are_an_error_result_with_code():
    async def t():
        async with session() as s:
            sc, text, err = await call(s, "python", "import sys\nprint('partial')\nsys.stderr.write('bad thing\\n')\nsys.exit(4)")
            assert err
            assert sc["exit_code"] == 4 and sc["stdout"] == "partial\n" and sc["stderr"] == "bad thing\n"
            assert sc["error"]["code"] == "exit_nonzero" and sc["error"]["suggestion"]
            assert "error[exit_nonzero]" in text and "bad thing" in text and "next:" in text
            sc, _, err = await call(s, "node", "throw new Error('kaput')")
            assert err and sc["exit_code"] == 1 and "kaput" in sc["stderr"]
    run_async(t)


def test_unknown_or_empty_env_lists_the_environments():
    async def t():
        async with session() as s:
            for name in ("cobol", ""):
                sc, text, err = await call(s, name, "x")
                assert err and sc["ok"] is False
                assert sc["error"]["code"] == "unknown_env"
                for env in ENVS:
                    assert env in sc["error"]["suggestion"] and env in text
            # the reference implementation's name for bash keeps working
            sc, _, err = await call(s, "shell", "echo via-alias")
            assert not err and sc["stdout"] == "via-alias\n"
    run_async(t)


def test_bad_arguments_are_invalid_input_errors():
    async def t():
        async with session() as s:
            cases = [
                {"env": "bash"},
                {"code": "echo"},
                {"env": "bash", "code": 42},
                {"env": ["bash"], "code": "echo"},
                {"env": "bash", "code": "   \n"},
                {"env": "bash", "code": "echo", "language": "sh"},
            ]
            for args in cases:
                res = await s.call_tool("run", args)
                assert res.is_error, args
                assert res.structured_content["error"]["code"] == "invalid_input", (args, res.structured_content)
            # the server keeps answering normally
            sc, _, err = await call(s, "bash", "echo fine")
            assert not err and sc["stdout"] == "fine\n"
    run_async(t)


def test_timeout_kills_the_whole_sandbox_and_leaves_nothing():
    marker = str(uuid.uuid4().int % 10**8)
    config = write_config("[defaults]\ntimeout_ms = 1500\n")

    async def t():
        async with session(config=config) as s:
            code = f"trap '' TERM\nsetsid sleep {marker}.1 &\n( ( sleep {marker}.2 & ) & )\necho started\nsleep 60\n"
            t0 = time.monotonic()
            sc, text, err = await call(s, "bash", code)
            elapsed = time.monotonic() - t0
            assert err and sc["timed_out"] is True and sc["limit"] == "timeout"
            assert sc["error"]["code"] == "timeout" and "1500 ms" in sc["error"]["message"]
            assert sc["stdout"] == "started\n"
            assert elapsed < 6, elapsed
            assert processes_with(marker) == [], processes_with(marker)
            sc, _, err = await call(s, "bash", "echo alive")
            assert not err
    run_async(t)


def test_project_is_readable_and_the_host_copy_never_written():
    """The sandbox writes the project's files as their owner could, into
    the copy (a root server's sandbox, another uid, through a copy of the
    project that shows it as their owner: test_root_project.py), never the
    host's files, and never through a link out of the project."""

    async def t():
        async with session() as s:
            code = (
                "cat /project/data.txt\n"
                "echo hacked > /project/data.txt 2>/dev/null && echo WROTE || echo denied\n"
                "touch /project/new 2>/dev/null && echo CREATED || echo denied\n"
                "echo hacked > /project/outside-link 2>/dev/null && echo ESCAPED || echo denied\n"
            )
            sc, _, _ = await call(s, "bash", code)
            assert sc["stdout"] == "project data\nWROTE\nCREATED\ndenied\n", dump(sc)
            assert sc.get("changes", {}).get("modified") == 1, dump(sc)
    run_async(t)
    proj = fixture_project()
    assert (proj / "data.txt").read_text() == "project data\n"
    assert not (proj / "new").exists()
    assert (proj.parent / "outside.txt").read_text() == "outside\n"


def test_network_is_unreachable():
    """A probe that reaches listeners on every address of this machine when
    run on the host itself (the control: it can tell open from closed)
    reaches none from a sandbox, whether its environment has no network or
    network through the proxy (which is the only way out)."""
    config = write_config('[environments.python]\npreset = "python"\n[environments.netpython]\npreset = "python"\nnetwork = true\n')
    closed, proxied, opened = HostListeners(), HostListeners(), HostListeners()

    async def t():
        async with session(config=config) as s:
            for env, listeners in (("python", closed), ("netpython", proxied)):
                sc, _, err = await call(s, env, listeners.python_probe())
                tcp = [l for l in sc["stdout"].splitlines() if l.startswith("tcp ")]
                assert not err and len(tcp) == len(listeners.targets), dump(sc)
                assert all(" failed " in l for l in tcp), dump(sc)
    try:
        run_async(t)
        assert closed.reached() == [], "the host saw traffic from a sandbox without network"
        assert proxied.reached() == [], "the host saw traffic that went around the proxy"
        host = subprocess.run([sys.executable, "-c", opened.python_probe()], capture_output=True, text=True, timeout=60)
        assert "failed" not in host.stdout, host.stdout
        assert opened.reached() == opened.expected()
    finally:
        closed.close()
        proxied.close()
        opened.close()


def test_output_flood_returns_capped_head_and_tail_with_marker():
    async def t():
        async with session() as s:
            code = "import sys\nprint('HEAD-LINE')\nfor i in range(200000): print('line', i)\nprint('TAIL-LINE')\n"
            sc, text, err = await call(s, "python", code)
            assert not err
            out = sc["stdout"]
            assert out.startswith("HEAD-LINE\n") and out.endswith("TAIL-LINE\n")
            assert sc["stdout_dropped_bytes"] > 2_000_000
            assert f"[... {sc['stdout_dropped_bytes']} bytes omitted ...]" in out
            assert len(out) < 20_000
            assert "bytes omitted" in text
    run_async(t)


def test_filesystem_view_matches_the_mode():
    async def t():
        async with session() as s:
            sc, _, _ = await call(s, "bash", "for d in /home /root; do test -e $d && echo $d; done; ls -A /usr | tr '\\n' ' '; echo; ls -A /usr/bin | wc -l")
            usr, count = sc["stdout"].splitlines()[-2:]
            assert "/home" not in sc["stdout"] and "/root" not in sc["stdout"], dump(sc)
            if MODE == "closure":
                # Only the closure: /usr holds nothing but the /usr/bin/env link,
                # and the store holds exactly the paths the manifest lists.
                assert (usr, count) == ("bin ", "1"), dump(sc)
                sc, _, _ = await call(s, "bash", "ls /usr/bin")
                assert sc["stdout"] == "env\n", dump(sc)
                for env, code in STORE_LISTING.items():
                    closure = artifact_closure(env)
                    store = {os.path.dirname(p) for p in closure}
                    assert len(store) == 1, closure
                    sc, _, err = await call(s, env, code.replace("STORE", store.pop()))
                    assert not err, dump(sc)
                    assert sorted(sc["stdout"].split()) == sorted(os.path.basename(p) for p in closure), (env, dump(sc))
            else:
                assert "lib" in usr and int(count) > 50, dump(sc)
    run_async(t)


# Each environment lists its store directory with its own interpreter.
STORE_LISTING = {
    "bash": "ls -A STORE",
    "python": "import os\nprint('\\n'.join(os.listdir('STORE')))",
    "node": "console.log(require('fs').readdirSync('STORE').join('\\n'))",
}


def artifact_closure(env: str) -> list[str]:
    """The closure in the manifest of the artifact named `env` that the server
    loads from NIX_SANDBOX_DIR (a later directory's artifact replaces an
    earlier one's)."""
    closure = None
    for d in os.environ["NIX_SANDBOX_DIR"].split(":"):
        for manifest in sorted(pathlib.Path(d).glob("*/manifest.json")) if d else []:
            m = json.loads(manifest.read_text())
            if m["name"] == env:
                closure = m["closure"]
    assert closure, f"no artifact {env} in NIX_SANDBOX_DIR"
    return closure


def test_results_say_what_a_run_used():
    """Every result reports CPU time and peak memory (from the cgroup, or
    from the kernel's accounting without one): a run that touches 64 MiB
    and spends 200 ms of CPU in a busy loop is reported as having done so."""
    code = ("import time\nx = bytearray(64 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n"
            "t = time.process_time()\nwhile time.process_time() - t < 0.2:\n    pass\nprint('done')")

    async def t():
        async with session() as s:
            sc, text, err = await call(s, "python", code)
            assert not err, text
            assert sc["peak_memory_bytes"] >= 64 << 20, dump(sc)
            assert sc["cpu_ms"] >= 150, dump(sc)
            assert "peak memory" in text and "cpu " in text, text
    run_async(t)


@pytest.mark.skipif(MODE != "host" or shutil.which("cc") is None, reason="a host interpreter, built with cc")
def test_the_handshake_does_not_wait_for_the_start_checks_and_the_tool_list_does():
    """Each environment is started once in the jail before it is offered, off
    the handshake: initialize is answered at once, tools/list (and a call)
    when the checks end, with only the environments that started."""
    # Install prefixes outside /tmp (every sandbox has its own /tmp).
    top = var_tmpdir()
    d = top / "prefix" / "bin"
    d.mkdir(parents=True)
    for p in (top, top / "prefix", d):
        p.chmod(0o755)
    # A bash that takes 3 s to start (an interpreter must be a program, not a script).
    source = top / "slow.c"
    source.write_text(
        "#include <unistd.h>\n"
        "int main(int c, char **v) { sleep(3); v[0] = \"/bin/bash\"; execv(\"/bin/bash\", v); return 127; }\n"
    )
    subprocess.run(["cc", "-o", str(d / "bash"), str(source)], check=True)
    shutil.copy("/bin/false", d / "python3")
    for p in (d / "bash", d / "python3"):
        p.chmod(0o755)
    config = write_config(
        f'[environments.slow]\ninterpreter = ["{d / "bash"}", "{{file}}"]\n'
        f'[environments.broken]\ninterpreter = ["{d / "python3"}", "{{file}}"]\n'
        '[environments.bash]\npreset = "bash"\n'
    )

    async def t():
        # The server starts its checks as it starts; the slow one takes 3 s.
        # (Over HTTP the session lists the tools itself as it begins.)
        started = time.monotonic()
        async with session(config=config) as s:
            tools = (await s.list_tools()).tools
            assert time.monotonic() - started > 2, "tools/list did not wait for the start checks"
            d = tools[0].description
            assert "- slow: " in d and "- bash: " in d and "- broken" not in d, d
            sc, _, err = await call(s, "broken", "print(1)")
            assert err and sc["error"]["code"] == "unknown_env", dump(sc)

    run_async(t)



def test_bubblewrap_sees_only_the_host_mounts_the_sandbox_needs():
    """bubblewrap reads the whole mount table for each bind it makes; in the
    nest it works in a root of its own holding only what the sandbox needs
    of the host's (none of /sys and its cgroup mounts), so the host's
    mounts do not make every sandbox slower. Checked on the bubblewrap of a
    sandbox the server keeps ready."""
    doctor = subprocess.run([BIN, "doctor", "--json"], capture_output=True, text=True)
    checks = {c["name"]: c["status"] for c in json.loads(doctor.stdout)["checks"]}
    if checks.get("nest") != "ok":
        pytest.skip("sandboxes start without the nest here")
    server = RawServer()
    try:
        tables: list[str] = []
        deadline = time.monotonic() + 15
        while not tables and time.monotonic() < deadline:
            for p in pathlib.Path("/proc").iterdir():
                try:
                    stat = (p / "stat").read_text()
                    parent = stat.rsplit(")", 1)[1].split()[1]
                    if (p / "comm").read_text().strip() == "bwrap" and parent == str(server.proc.pid):
                        tables.append((p / "mountinfo").read_text())
                except (OSError, IndexError):
                    continue
            time.sleep(0.05)
        assert tables, "no sandbox kept ready"
        host = pathlib.Path("/proc/self/mountinfo").read_text().splitlines()
        points = [line.split()[4] for line in tables[0].splitlines()]
        assert not [m for m in points if m == "/sys" or m.startswith("/sys/")], points
        # The sandbox's own staged mounts (its /dev, the project's overlay)
        # lie under the stage root; the rest come from the host.
        staged = re.compile(r"/nix-sandbox-mcp-[^/]+/stage/")
        from_host = [m for m in points if not staged.search(m)]
        assert len(from_host) < len(host), (from_host, host)
    finally:
        server.close()
