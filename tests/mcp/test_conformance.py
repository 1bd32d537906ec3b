"""The official MCP conformance suite (@modelcontextprotocol/conformance,
installed in tests/conformance by test-local.sh with the node 22 it
needs) against `serve --http`: every server scenario passes except the
checks the suite itself marks untestable here, and the scenarios that
exercise its own reference server's tools, resources and prompts (named
below, each with why), which this server does not have."""

from __future__ import annotations

import glob
import json
import os
import pathlib
import subprocess

import pytest

from harness import BIN, ROOT
from http_transport import HttpServer
from test_http import env, scratch

SUITE = ROOT / "tests" / "conformance"
NODE = SUITE / "node_modules" / ".bin" / "node"
CONFORMANCE = SUITE / "node_modules" / ".bin" / "conformance"

# Scenarios that call the reference server's fixtures by name (tools such as
# `test_simple_text`, `greet`, `slow_compute`, resources such as
# `test://static-text`, prompts such as `test_simple_prompt`) or need what
# the server does not offer (logging/setLevel, resource subscriptions, the
# completion of a prompt argument, a tool that asks for elicitation,
# sampling or roots in rounds).
REFERENCE_ONLY = {
    "logging-set-level": "needs logging/setLevel, which the server does not offer (it logs to stderr)",
    "json-schema-2020-12": "calls the reference tool json_schema_2020_12_tool",
    "resources-read-text": "reads the reference resource test://static-text",
    "resources-read-binary": "reads the reference resource test://static-binary",
    "resources-templates-read": "reads the reference template test://template/{id}/data",
    "resources-subscribe": "subscribes to a reference resource (the server offers no subscriptions)",
    "resources-unsubscribe": "unsubscribes from a reference resource",
    "elicitation-sep1034-defaults": "calls the reference tool test_elicitation_sep1034_defaults",
    "elicitation-sep1330-enums": "calls the reference tool test_elicitation_sep1330_enums",
}
REFERENCE_PREFIXES = {
    "tools-call-": "calls the reference tools (test_simple_text, test_image_content, ...)",
    "prompts-": "gets the reference prompts (test_simple_prompt, ...); the server offers none",
    "tasks-": "calls the reference tools greet and slow_compute",
    "input-required-result-": "calls the reference tools that ask for input in rounds",
}
# Of those, the ones whose checks pass here anyway are run too.
PASS_ANYWAY = {"input-required-result-missing-input-response", "input-required-result-unsupported-methods",
               "input-required-result-ignore-extra-params", "input-required-result-validate-input"}


def node_major() -> int:
    out = subprocess.run([str(NODE), "--version"], capture_output=True, text=True)
    return int(out.stdout.strip().lstrip("v").split(".")[0])


def scenarios() -> list[str]:
    out = subprocess.run([str(NODE), str(CONFORMANCE), "list", "--server"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{NODE.parent}:{os.environ['PATH']}"})
    return [line.strip()[2:].split()[0] for line in out.stdout.splitlines() if line.strip().startswith("- ")]


def why_skipped(scenario: str) -> str | None:
    if scenario in PASS_ANYWAY:
        return None
    if scenario in REFERENCE_ONLY:
        return REFERENCE_ONLY[scenario]
    for prefix, why in REFERENCE_PREFIXES.items():
        if scenario.startswith(prefix):
            return why
    return None


def test_the_official_conformance_suite_passes():
    if not CONFORMANCE.exists() or not NODE.exists():
        pytest.skip("the conformance suite is not installed (test-local.sh runs `npm ci` in tests/conformance)")
    if node_major() < 22:
        pytest.skip(f"the conformance suite needs node >= 22, and {NODE} is older")
    out_dir = scratch() / "results"
    s = HttpServer(BIN, scratch(), env=env(), principals=())
    failures: dict[str, list] = {}
    skipped: dict[str, str] = {}
    ran: list[str] = []
    try:
        for scenario in scenarios():
            why = why_skipped(scenario)
            if why:
                skipped[scenario] = why
                continue
            subprocess.run([str(NODE), str(CONFORMANCE), "server", "--url", s.url, "--scenario", scenario,
                            "-o", str(out_dir)], capture_output=True, text=True, timeout=180,
                           env={**os.environ, "PATH": f"{NODE.parent}:{os.environ['PATH']}"})
            found = sorted(glob.glob(str(out_dir / f"server-{scenario}-*" / "checks.json")))
            assert found, f"{scenario}: the suite wrote no results"
            checks = json.loads(pathlib.Path(found[-1]).read_text())
            ran.append(scenario)
            for c in checks:
                untestable = (c.get("details") or {}).get("untestable")
                if c["status"] == "FAILURE" and not untestable:
                    failures.setdefault(scenario, []).append((c["id"], c.get("errorMessage")))
    finally:
        assert s.stop() == 0, s.log_tail()
    for required in ("server-initialize", "ping", "tools-list", "dns-rebinding-protection", "server-sse-polling",
                     "server-sse-multiple-streams"):
        assert required in ran, (required, ran)
    print(f"conformance: ran {len(ran)} scenarios; not run (they need the suite's reference server): "
          + "; ".join(f"{k}: {v}" for k, v in sorted(skipped.items())))
    assert not failures, json.dumps(failures, indent=1)
