#!/usr/bin/env python3
"""The docs name the tests that back their claims: every such name must be
a test that exists. A name counts as a test's when it is in backticks,
snake_case with at least three underscores (test names are sentences),
and not a system call, a configuration key or a metric the docs also quote."""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Quoted in the docs, not tests: system calls and configuration keys.
NOT_TESTS = {"name_to_handle_at", "open_by_handle_at", "set_mempolicy", "get_mempolicy", "clock_settime",
             "session_max_lifetime_seconds", "bearer_token_env_var"}


def main() -> None:
    sources = "\n".join(p.read_text(errors="replace") for pattern in
                        ("daemon/src/**/*.rs", "daemon/tests/**/*.rs", "tests/**/*.py", "tests/**/*.sh", "nix/tests/*")
                        for p in ROOT.glob(pattern) if p.is_file())
    defined = set(re.findall(r"\bfn ([a-z0-9_]+)\b", sources)) | set(re.findall(r"\bdef ([a-z0-9_]+)\b", sources))
    missing = []
    for doc in sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"]):
        for name in sorted(set(re.findall(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+){3,})`", doc.read_text()))):
            # The server's metrics are named nix_sandbox_mcp_*.
            if name not in NOT_TESTS and name not in defined and not name.startswith("nix_sandbox_mcp_"):
                missing.append(f"{doc.relative_to(ROOT)}: `{name}` names no test")
    if missing:
        sys.exit("\n".join(missing))
    print("every test the docs name exists")


if __name__ == "__main__":
    main()
