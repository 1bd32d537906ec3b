"""Environments Nix builds when the server starts (NIX_SANDBOX_ENVS, config
`flake` entries), offline: a throw-away local flake without inputs builds an
artifact with the real mkSandbox from the host-package set. Runs in the Nix
tier of test-local.sh (NSM_MODE=closure)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time

import pytest

from harness import BIN, MODE, ROOT, call, dump, run_async, server_params, session, write_config

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
            tools = (await s.list_tools()).tools
            assert "- extra: " in tools[0].description
            sc, _, err = await call(s, "extra", "echo built by nix; ls /usr/bin")
            assert not err and sc["stdout"] == "built by nix\nenv\n", dump(sc)
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
            sc, _, err = await call(s, "tools", "echo from the tools entry")
            assert not err and sc["stdout"] == "from the tools entry\n", dump(sc)
    run_async(t)


def test_use_flake_without_the_nix_package_says_what_is_missing():
    config = write_config("[project]\nuse_flake = true\n")
    listing = envs_json({"NIX_SANDBOX_FLAKE": ""}, config=config)
    assert any("use_flake" in w for w in listing["warnings"]), listing["warnings"]
