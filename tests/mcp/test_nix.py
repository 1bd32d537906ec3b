"""Environments Nix builds when the server starts (NIX_SANDBOX_ENVS, config
`flake` entries), offline: a throw-away local flake without inputs builds an
artifact with the real mkSandbox from the host-package set. Runs in the Nix
tier of test-local.sh (NSM_MODE=closure)."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time

import anyio
import pytest
from mcp import ClientSession, types
from mcp.client.stdio import stdio_client

from harness import (BIN, MODE, ROOT, RootsClient, call, dump, legacy_only, roots_session, run_async, server_params, session,
                     write_config)

pytestmark = pytest.mark.skipif(MODE != "closure" or shutil.which("nix") is None, reason="the Nix tier runs these")


def local_flake() -> str:
    """A flake (no inputs) whose `extra` output is a bash artifact."""
    d = tempfile.mkdtemp(prefix="nsm-flake-")
    shutil.copytree(ROOT / "nix", os.path.join(d, "nix"))
    system = {"x86_64": "x86_64-linux", "aarch64": "aarch64-linux"}[platform.machine()]
    with open(os.path.join(d, "flake.nix"), "w") as f:
        f.write(
            "{ outputs = { self }: { packages.%s.extra =\n"
            "  (import ./nix/tests/e2e-artifacts.nix { system = \"%s\"; daemonBinary = \"%s\"; }).bash.override { name = \"extra\"; };\n"
            "}; }\n" % (system, system, BIN)
        )
    return f"path:{d}"


async def offered(s: ClientSession, name: str, also: str = "") -> str:
    """The run tool's description once it lists `name` (and says `also`):
    start-up builds end after the handshake, each in its own time, and the
    tool list changes when they do."""
    with anyio.fail_after(240):
        while True:
            description = (await s.list_tools()).tools[0].description or ""
            if f"- {name}: " in description and also in description:
                return description
            await anyio.sleep(0.2)


def envs_json(env: dict[str, str], config: str | None = None) -> dict:
    p = server_params(env=env, config=config)
    args = [BIN] + (["--config", config] if config else []) + ["envs", "--json"]
    out = subprocess.run(args, env={**os.environ, **(p.env or {})}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_nix_sandbox_envs_are_built_at_start_and_a_bad_one_is_only_a_warning():
    flake = local_flake()
    env = {"NIX_SANDBOX_ENVS": f"{flake}#extra, path:/nonexistent/flake#nothing"}
    t0 = time.monotonic()
    listing = envs_json(env)
    names = [e["name"] for e in listing["environments"]]
    assert "extra" in names, dump(listing)
    assert any("path:/nonexistent/flake#nothing" in w for w in listing["warnings"]), listing["warnings"]
    assert time.monotonic() - t0 < 120

    async def t():
        async with session(env=env) as s:
            failed = "Could not be built (the server's log says why): path:/nonexistent/flake#nothing."
            description = await offered(s, "extra", also=failed)
            assert failed in description, description
            sc, _, err = await call(s, "extra", "echo built by nix; ls /usr/bin")
            assert not err and sc["stdout"] == "built by nix\nenv\n", dump(sc)
    run_async(t)


def test_the_server_answers_at_once_and_offers_a_build_when_it_ends():
    """A slow Nix (a wrapper that waits 10 s before building) does not hold up
    the handshake: the first tool list says what is being built, a call to it
    says to wait, and when the build ends the client is told the tools
    changed and the environment runs."""
    flake = local_flake()
    slow = tempfile.mkdtemp(prefix="nsm-slow-nix-")
    nix = shutil.which("nix")
    with open(os.path.join(slow, "nix"), "w") as f:
        f.write(f"#!/bin/sh\nsleep 10\nexec {nix} \"$@\"\n")
    os.chmod(os.path.join(slow, "nix"), 0o755)
    config = write_config(f'[environments.bash]\npreset = "bash"\n[environments.tools]\nflake = "{flake}#extra"\n')
    env = {"PATH": f"{slow}:{os.environ['PATH']}", "NIX_SANDBOX_FLAKE": ""}
    changed: list[object] = []

    async def on_message(message: object) -> None:
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            changed.append(message)

    async def t():
        async with stdio_client(server_params(env=env, config=config)) as (r, w):
            async with ClientSession(r, w, message_handler=on_message) as s:
                init = await s.initialize()
                assert init.capabilities.tools and init.capabilities.tools.list_changed
                run = (await s.list_tools()).tools[0]
                assert "- bash: " in run.description and "- tools: " not in run.description, run.description
                assert "Being built by Nix, offered when ready (the tool list changes): tools." in run.description
                sc, _, err = await call(s, "tools", "echo too early")
                assert err and sc["error"]["code"] == "sandbox_unavailable" and "still being built" in sc["error"]["message"], dump(sc)
                sc, _, err = await call(s, "bash", "echo meanwhile")
                assert not err and sc["stdout"] == "meanwhile\n", dump(sc)
                with anyio.fail_after(240):
                    while not changed:
                        await anyio.sleep(0.2)
                run = (await s.list_tools()).tools[0]
                assert "- tools: " in run.description and "Being built" not in run.description, run.description
                sc, _, err = await call(s, "tools", "echo built meanwhile")
                assert not err and sc["stdout"] == "built meanwhile\n", dump(sc)
    run_async(t)


def test_a_failed_build_is_said_in_the_description_and_to_a_call():
    config = write_config('[environments.bash]\npreset = "bash"\n[environments.gone]\nflake = "path:/nonexistent/flake#x"\n')

    async def t():
        async with session(config=config, env={"NIX_SANDBOX_FLAKE": ""}) as s:
            with anyio.fail_after(240):
                while "Could not be built" not in (description := (await s.list_tools()).tools[0].description or ""):
                    await anyio.sleep(0.2)
            assert "Could not be built (the server's log says why): gone." in description, description
            sc, _, err = await call(s, "gone", "echo x")
            assert err and sc["error"]["code"] == "sandbox_unavailable", dump(sc)
            assert sc["error"]["message"].startswith('the environment "gone" could not be built: '), dump(sc)
    run_async(t)


def test_a_second_start_offers_what_the_first_built_without_nix():
    """A flake in a git repository built once is offered at the next start
    without running Nix (a `nix` that only fails stands in), until a tracked
    file changes."""
    repo = local_flake().removeprefix("path:")
    git = ["git", "-C", repo, "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "flake"], check=True)
    cache = tempfile.mkdtemp(prefix="nsm-cache-")
    broken = tempfile.mkdtemp(prefix="nsm-no-nix-")
    with open(os.path.join(broken, "nix"), "w") as f:
        f.write("#!/bin/sh\necho 'error: this nix only fails' >&2\nexit 1\n")
    os.chmod(os.path.join(broken, "nix"), 0o755)
    env = {"NIX_SANDBOX_ENVS": f"git+file://{repo}#extra", "XDG_CACHE_HOME": cache}
    without_nix = {**env, "PATH": f"{broken}:{os.environ['PATH']}"}

    assert "extra" in [e["name"] for e in envs_json(env)["environments"]]
    assert os.listdir(os.path.join(cache, "nix-sandbox-mcp", "builds"))
    again = envs_json(without_nix)
    assert "extra" in [e["name"] for e in again["environments"]], again["warnings"]
    assert not [w for w in again["warnings"] if "extra" in w], again["warnings"]

    with open(os.path.join(repo, "flake.nix"), "a") as f:
        f.write("# edited\n")
    edited = envs_json(without_nix)
    assert "extra" not in [e["name"] for e in edited["environments"]], dump(edited)
    assert any("this nix only fails" in w for w in edited["warnings"]), edited["warnings"]


def test_an_artifact_whose_interpreter_cannot_start_is_not_offered():
    """Every environment of a known language is started once in the jail at
    start-up; one that cannot start (here: a copy of the bash artifact
    without the dynamic loader its bash needs) is dropped with the reason,
    not offered to fail at the agent's first call."""
    artifacts = os.environ["NIX_SANDBOX_DIR"].split(":")[0]
    with open(os.path.join(artifacts, "bash", "manifest.json")) as f:
        manifest = json.load(f)
    manifest["name"] = "broken"
    manifest["links"] = {k: v for k, v in manifest["links"].items() if "ld-linux" not in k}
    broken = tempfile.mkdtemp(prefix="nsm-broken-")
    os.makedirs(os.path.join(broken, "broken"))
    with open(os.path.join(broken, "broken", "manifest.json"), "w") as f:
        json.dump(manifest, f)
    env = {"NIX_SANDBOX_DIR": f"{os.environ['NIX_SANDBOX_DIR']}:{broken}"}
    listing = envs_json(env)
    assert "broken" not in [e["name"] for e in listing["environments"]], dump(listing)
    assert "bash" in [e["name"] for e in listing["environments"]]
    assert any(w.startswith("environment broken (artifact ") and "does not work in the sandbox" in w for w in listing["warnings"]), listing["warnings"]

    async def t():
        async with session(env=env) as s:
            run = (await s.list_tools()).tools[0]
            assert "- bash: " in run.description and "- broken: " not in run.description, run.description
    run_async(t)


def test_a_config_flake_entry_is_built_and_served_under_its_name():
    flake = local_flake()
    config = write_config(f'[environments.tools]\nflake = "{flake}#extra"\n')
    listing = envs_json({"NIX_SANDBOX_FLAKE": ""}, config=config)
    names = [e["name"] for e in listing["environments"]]
    # NIX_SANDBOX_DIR's artifacts are offered beside the configured ones.
    assert "tools" in names and "extra" not in names, dump(listing)

    async def t():
        async with session(config=config) as s:
            await offered(s, "tools")
            sc, _, err = await call(s, "tools", "echo from the tools entry")
            assert not err and sc["stdout"] == "from the tools entry\n", dump(sc)
    run_async(t)


def test_use_flake_without_the_nix_package_says_what_is_missing():
    config = write_config("[project]\nuse_flake = true\n")
    listing = envs_json({"NIX_SANDBOX_FLAKE": ""}, config=config)
    assert any("use_flake" in w for w in listing["warnings"]), listing["warnings"]



@legacy_only("roots/list is a server-to-client request, which the stateless revision has not")
def test_use_flake_builds_the_devshell_of_the_clients_root():
    """The project of `[project] use_flake` follows the client's roots: the
    working directory has no flake, the root's is built (and here refused
    by Nix, being outside git, which the call reports naming the root)."""
    cwd = tempfile.mkdtemp(prefix="nsm-cwd-")
    root = tempfile.mkdtemp(prefix="nsm-root-")
    for d in (cwd, root):
        os.chmod(d, 0o755)
    with open(os.path.join(root, "flake.nix"), "w") as f:
        f.write("{ outputs = { self }: { }; }\n")
    config = write_config('[project]\nuse_flake = true\n[environments.bash]\npreset = "bash"\n')
    client = RootsClient([f"file://{root}"])

    async def t():
        async with roots_session(client, pathlib.Path(cwd), config=config, env={"NIX_SANDBOX_FLAKE": str(ROOT)}) as s:
            with anyio.fail_after(240):
                while "Could not be built" not in (description := (await s.list_tools()).tools[0].description or ""):
                    await anyio.sleep(0.2)
            assert "Could not be built (the server's log says why): project." in description, description
            sc, _, err = await call(s, "project", "true")
            assert err and sc["error"]["code"] == "sandbox_unavailable", dump(sc)
            assert f"{root} is not in a git repository" in sc["error"]["message"], dump(sc)
    run_async(t)
