#!/usr/bin/env bash
# The project's single test command. Builds the daemon, runs the cargo tests
# (unit and real-bubblewrap integration), drives the real binary over MCP stdio
# with the official Python SDK, and runs the Nix tier when Nix is installed.
set -euo pipefail
cd "$(dirname "$0")"
root=$PWD
start=$SECONDS

step() { printf '\n==> %s (at %ss)\n' "$*" "$((SECONDS - start))"; }

# A full run writes about 5 GiB (the debug build and its tests); say so up
# front rather than fail halfway with "No space left on device".
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((5 * 1024 * 1024)) ]; then
  echo "warning: $((${free_kib:-0} / 1024)) MiB free under $root; a full run needs about 5 GiB" >&2
fi

step "format and lint"
cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings

step "build"
cargo build --quiet
bin=$root/target/debug/nix-sandbox-mcp

step "the README's first commands, as written (installed into a temporary root)"
tests/readme-commands.sh

step "cargo tests (unit + integration with real bubblewrap)"
cargo test --quiet

step "MCP client suite, host mode (official Python SDK over stdio)"
venv=$root/.venv
# The system's python, so that the non-root tier below can use the venv too
# (an interpreter under root's home, such as pyenv's, is not reachable).
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
if [ ! -x "$venv/bin/python" ] || ! grep -q "^home = $(dirname "$python")\$" "$venv/pyvenv.cfg"; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/mcp/requirements.txt
(cd tests/mcp && NSM_BIN=$bin NSM_MODE=host "$venv/bin/python" -m pytest)

# Most users run the server as themselves, without a cgroup of their own:
# limits then fall back to rlimits. Run the load, hostile and session suites
# that way too (as root, in a throwaway user).
if [ "$(id -u)" = 0 ]; then
  step "MCP client suite as a non-root user (basics, load, hostile code and projects, sessions, network, project, builds and caches, roots, closures, pre-started interpreters)"
  user=nsm-tester
  id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
  su "$user" -s /bin/bash -c "cd '$root/tests/mcp' && PYTHONDONTWRITEBYTECODE=1 NSM_BIN='$bin' NSM_MODE=host '$venv/bin/python' -m pytest test_basic.py test_load.py test_hostile.py test_hostile_project.py test_sessions.py test_network.py test_project.py test_project_builds.py test_roots.py test_closures.py test_warm.py"
else
  step "non-root tier: this run already is one (uid $(id -u))"
fi

if command -v nix-build >/dev/null 2>&1; then
  step "Nix tier: pure evaluation tests of nix/lib"
  nix/tests/eval.sh

  step "Nix tier: artifacts built by mkSandbox from host packages, served over MCP"
  artifacts=$(mktemp -d)
  trap 'rm -rf "$artifacts"' EXIT
  NSM_BIN=$bin nix/tests/build-e2e-artifacts.sh "$artifacts"
  (cd tests/mcp && NSM_BIN=$bin NSM_MODE=closure NIX_SANDBOX_DIR=$artifacts "$venv/bin/python" -m pytest test_basic.py test_nix.py test_sessions.py test_warm.py)

  step "Nix tier: a devShell captured into a sandbox"
  NSM_BIN=$bin nix/tests/shell-env.sh

  step "Nix tier: start-up builds of a git project with its own nixpkgs, no secrets in the store"
  NSM_BIN=$bin nix/tests/project-flake.sh

  if [ -n "${NIXPKGS_LIB:-}" ]; then
    step "Nix tier: the NixOS and home-manager modules and flake.nix, evaluated with nixpkgs' lib"
    nix/tests/modules.sh
  else
    step "Nix tier: module tests skipped (set NIXPKGS_LIB to a checkout of nix-community/nixpkgs.lib)"
  fi
else
  step "Nix tier skipped (nix is not installed; .ci/run installs it)"
fi

step "VM tier: the daemon as a user and as root under systemd with cgroup v2"
# Runs when the VM image of ../shared/vm exists (it prints SKIP otherwise).
tests/vm/run-tier.sh

step "speed: bench/speed.py --check against bench/limits.toml (release build)"
# The docs' tables are bench/speed.py's, never typed: every marked block
# must hold one, headed by the run that wrote it.
python3 - <<'PY'
import pathlib, re, sys
bad = []
for doc in ("docs/performance.md", "docs/sessions.md", "README.md"):
    for name, body in re.findall(r"<!-- speed:([a-z_]+) -->\n(.*?)<!-- /speed:\1 -->", pathlib.Path(doc).read_text(), re.S):
        if not body.startswith("Measured by `bench/speed.py` on ") or "\n| " not in body:
            bad.append(f"{doc}: {name}")
if bad:
    sys.exit("speed blocks not written by bench/speed.py --write-docs: " + ", ".join(bad))
PY
cargo build --release --quiet
python3 bench/speed.py --check

printf '\nall tests passed in %ss\n' "$((SECONDS - start))"
