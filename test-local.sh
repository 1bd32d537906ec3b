#!/usr/bin/env bash
# The project's single test command. Builds the daemon, runs the cargo tests
# (unit and real-bubblewrap integration), drives the real binary over MCP stdio
# with the official Python SDK (as root and as a non-root user), runs the Nix
# tier when Nix is installed and the VM tier when its image exists, runs the
# suite over Streamable HTTP and the official conformance suite, and gates
# speed with bench/speed.py --check. It ends with a summary: the tiers run,
# the tiers skipped and why, and every test that skipped itself and why.
#
# NSM_REQUIRE=vm,nix,modules (any of them, comma-separated) turns skipping
# that tier into a failure, for a run that must not skip it.
set -euo pipefail
cd "$(dirname "$0")"
root=$PWD
start=$SECONDS

ran=()
skipped_tiers=()
# Tests that skip at run time append a line here (daemon/tests/common/skip.rs,
# daemon/src/skip.rs); the pytest runs add their SKIPPED lines.
skip_log=$(mktemp)
export NSM_SKIP_LOG=$skip_log
cleanup=("$skip_log")
trap 'rm -rf "${cleanup[@]}"' EXIT

step() { printf '\n==> %s (at %ss)\n' "$*" "$((SECONDS - start))"; }
tier_ran() { ran+=("$1"); }
# tier_skipped NAME KEY WHY: KEY is what NSM_REQUIRE names it by.
tier_skipped() {
  step "$1 skipped: $3"
  if [[ ",${NSM_REQUIRE:-}," == *",$2,"* ]]; then
    echo "the $1 was skipped, and NSM_REQUIRE names it ($2)" >&2
    exit 1
  fi
  skipped_tiers+=("$1: $3")
}
# pytest with its skip reasons kept for the summary.
pytest_run() {
  local log rc
  log=$(mktemp)
  set +e
  "$@" -rs 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  grep -E '^SKIPPED ' "$log" | sed "s|^|tests/mcp ($(id -un), ${NSM_TRANSPORT:-stdio}${NSM_AUTH:+ $NSM_AUTH}, protocol ${NSM_PROTOCOL:-2025-11-25}): |" >>"$skip_log" || true
  rm -f "$log"
  return "$rc"
}

# A full run writes about 4 GiB (the debug and release builds and their
# tests; 3 GiB with CARGO_INCREMENTAL=0, as .ci/run sets); say so up front
# rather than fail halfway with "No space left on device".
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ "${free_kib:-0}" -lt $((4 * 1024 * 1024)) ]; then
  echo "warning: $((${free_kib:-0} / 1024)) MiB free under $root; a full run needs about 4 GiB" >&2
fi

# The test suites turn knobs a release build does not have (the
# `test-knobs` feature: daemon/src/config/knobs.rs); everything here but
# the speed gate builds and tests with it.
features=(--features test-knobs)

step "format and lint"
cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
cargo clippy --all-targets --quiet "${features[@]}" -- -D warnings
python3 tests/docs-check.py
tier_ran "format, lint, the docs' test names"

step "build"
cargo build --quiet "${features[@]}"
bin=$root/target/debug/nix-sandbox-mcp

step "the README's first commands, as written (installed into a temporary root)"
tests/readme-commands.sh
tier_ran "README first commands"

step "cargo tests (unit + integration with real bubblewrap)"
cargo test --quiet "${features[@]}"
tier_ran "cargo tests"

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
# Once per protocol revision: a client with the `initialize` handshake
# (2025-11-25), then a stateless one (2026-07-28). The files that exercise
# only the jail (closures, containers, credentials, lifetime, load, network,
# builds, a root's project, switches), which the revision does not change,
# run in the first pass only; every file that speaks of the MCP surface runs
# in both.
jail_only_files=(test_closures.py test_containers.py test_credentials.py test_lifetime.py test_load.py test_network.py test_project_builds.py test_root_project.py test_switches.py)
for protocol in 2025-11-25 2026-07-28; do
  step "MCP client suite, protocol $protocol"
  ignored=(--ignore=test_conformance.py)
  if [ "$protocol" = 2026-07-28 ]; then
    for f in "${jail_only_files[@]}"; do ignored+=("--ignore=$f"); done
  fi
  (cd tests/mcp && NSM_PROTOCOL=$protocol NSM_BIN=$bin NSM_MODE=host pytest_run "$venv/bin/python" -m pytest "${ignored[@]}")
  scope=""
  [ "$protocol" = 2026-07-28 ] && scope=" (without the jail-only files: ${jail_only_files[*]})"
  tier_ran "MCP suite as $(id -un), protocol $protocol$scope"
done

# The same suite over Streamable HTTP (`serve --http`): the files that
# drive the MCP surface (the sandbox's own suites, hostile code, load and
# lifetime, run above over stdio: the transport changes nothing of them),
# with bearer tokens in both revisions and with OAuth access tokens of a
# test issuer. (test_http*.py and test_fleet.py, which always speak HTTP,
# ran above.)
http_files=(test_basic.py test_sessions.py test_commands.py test_project.py test_error_codes.py)
step "MCP client suite over HTTP with bearer tokens, protocol 2026-07-28"
(cd tests/mcp && NSM_TRANSPORT=http NSM_PROTOCOL=2026-07-28 NSM_BIN=$bin NSM_MODE=host pytest_run "$venv/bin/python" -m pytest "${http_files[@]}")
step "MCP client suite over HTTP with bearer tokens, protocol 2025-11-25"
(cd tests/mcp && NSM_TRANSPORT=http NSM_PROTOCOL=2025-11-25 NSM_BIN=$bin NSM_MODE=host pytest_run "$venv/bin/python" -m pytest test_basic.py test_commands.py)
step "MCP client suite over HTTP with OAuth access tokens, protocol 2026-07-28"
(cd tests/mcp && NSM_TRANSPORT=http NSM_AUTH=oauth NSM_PROTOCOL=2026-07-28 NSM_BIN=$bin NSM_MODE=host pytest_run "$venv/bin/python" -m pytest test_basic.py)
tier_ran "MCP suite over HTTP as $(id -un) (tokens in both revisions, OAuth)"

step "the official MCP conformance suite against serve --http (node 22 from the npm package node@22)"
(cd tests/conformance && npm ci --silent --no-audit --no-fund)
conformance_log=$(mktemp)
cleanup+=("$conformance_log")
(cd tests/mcp && NSM_BIN=$bin pytest_run "$venv/bin/python" -m pytest -s test_conformance.py) | tee "$conformance_log"
grep -E '^conformance: ' "$conformance_log" | sed 's/^/tests\/mcp\/test_conformance.py: /' >>"$skip_log" || true
tier_ran "MCP conformance suite (server scenarios)"

step "MCP client: the official TypeScript SDK (2025-11-25)"
(cd tests/ts && npm ci --silent --no-audit --no-fund && NSM_BIN=$bin node client.mjs)
tier_ran "TypeScript SDK client"

# Most users run the server as themselves, without a cgroup of their own:
# limits then fall back to rlimits. Run the load, hostile and session suites
# that way too (as root, in a throwaway user).
if [ "$(id -u)" = 0 ]; then
  step "MCP client suite as a non-root user (basics, load, hostile code and projects, lifetime, sessions, network, project, builds and caches, roots, closures, pre-started interpreters, credentials)"
  user=nsm-tester
  id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
  user_log=$(mktemp)
  chmod 666 "$user_log"
  cleanup+=("$user_log")
  # A cargo the user can run (rustup's is under root's home), for the
  # private-registry test of test_credentials.py.
  user_cargo=""
  if real_cargo=$(rustup which cargo 2>/dev/null); then
    user_cargo=$(mktemp)
    install -m 0755 "$real_cargo" "$user_cargo"
    cleanup+=("$user_cargo")
  fi
  # Every file under 2025-11-25; under 2026-07-28 only those whose tests
  # differ by revision (roots, sessions, confirmations, the raw frames of
  # hostile clients): the others exercise the jail, which the revision
  # does not change, and ran that way as root above.
  user_files="test_basic.py test_load.py test_hostile.py test_hostile_project.py test_lifetime.py test_switches.py test_containers.py test_root_project.py test_sessions.py test_network.py test_project.py test_project_builds.py test_roots.py test_closures.py test_warm.py test_commands.py"
  user_revision_files="test_hostile.py test_hostile_project.py test_sessions.py test_project.py test_roots.py test_warm.py test_commands.py"
  for protocol in 2025-11-25 2026-07-28; do
    files=$user_files
    [ "$protocol" = 2026-07-28 ] && files=$user_revision_files
    su "$user" -s /bin/bash -c "cd '$root/tests/mcp' && PYTHONDONTWRITEBYTECODE=1 NSM_PROTOCOL=$protocol NSM_BIN='$bin' NSM_MODE=host '$venv/bin/python' -m pytest -rs $files 2>&1 | tee '$user_log'; exit \${PIPESTATUS[0]}"
    grep -E '^SKIPPED ' "$user_log" | sed "s|^|tests/mcp ($user, $protocol): |" >>"$skip_log" || true
    scope=""
    [ "$protocol" = 2026-07-28 ] && scope=" (the files whose tests differ by revision: $files)"
    tier_ran "MCP suite as $user (rlimits), protocol $protocol$scope"
  done
  su "$user" -s /bin/bash -c "cd '$root/tests/mcp' && PYTHONDONTWRITEBYTECODE=1 NSM_CARGO='$user_cargo' NSM_PROTOCOL=2026-07-28 NSM_BIN='$bin' NSM_MODE=host '$venv/bin/python' -m pytest -rs test_credentials.py 2>&1 | tee '$user_log'; exit \${PIPESTATUS[0]}"
  grep -E '^SKIPPED ' "$user_log" | sed "s|^|tests/mcp ($user, credentials): |" >>"$skip_log" || true
  tier_ran "credentials through the proxy as $user"
  su "$user" -s /bin/bash -c "cd '$root/tests/mcp' && PYTHONDONTWRITEBYTECODE=1 NSM_TRANSPORT=http NSM_PROTOCOL=2026-07-28 NSM_BIN='$bin' NSM_MODE=host '$venv/bin/python' -m pytest -rs test_basic.py test_http.py test_http_principals.py test_http_oauth.py test_fleet.py 2>&1 | tee '$user_log'; exit \${PIPESTATUS[0]}"
  grep -E '^SKIPPED ' "$user_log" | sed "s|^|tests/mcp ($user, http, 2026-07-28): |" >>"$skip_log" || true
  su "$user" -s /bin/bash -c "cd '$root/tests/mcp' && PYTHONDONTWRITEBYTECODE=1 NSM_TRANSPORT=http NSM_AUTH=oauth NSM_PROTOCOL=2026-07-28 NSM_BIN='$bin' NSM_MODE=host '$venv/bin/python' -m pytest -rs test_basic.py 2>&1 | tee '$user_log'; exit \${PIPESTATUS[0]}"
  grep -E '^SKIPPED ' "$user_log" | sed "s|^|tests/mcp ($user, http oauth, 2026-07-28): |" >>"$skip_log" || true
  tier_ran "MCP suite over HTTP as $user (tokens, OAuth), protocol 2026-07-28"
else
  tier_skipped "non-root tier" nonroot "this run already is one (uid $(id -u))"
fi

if command -v nix-build >/dev/null 2>&1; then
  step "Nix tier: pure evaluation tests of nix/lib"
  nix/tests/eval.sh

  step "Nix tier: artifacts built by mkSandbox from host packages, served over MCP"
  artifacts=$(mktemp -d)
  cleanup+=("$artifacts")
  NSM_BIN=$bin nix/tests/build-e2e-artifacts.sh "$artifacts"
  (cd tests/mcp && NSM_BIN=$bin NSM_MODE=closure NIX_SANDBOX_DIR=$artifacts pytest_run "$venv/bin/python" -m pytest test_basic.py test_nix.py test_sessions.py test_warm.py)

  step "Nix tier: a devShell captured into a sandbox"
  NSM_BIN=$bin nix/tests/shell-env.sh

  step "Nix tier: start-up builds of a git project with its own nixpkgs, no secrets in the store"
  NSM_BIN=$bin nix/tests/project-flake.sh
  step "Nix tier: a replica gets its environments from the team's binary cache without building"
  NSM_BIN=$bin nix/tests/binary-cache.sh
  tier_ran "Nix tier (eval, artifacts, devShell, project flake, binary cache)"

  if [ -n "${NIXPKGS_LIB:-}" ]; then
    step "Nix tier: the NixOS and home-manager modules and flake.nix, evaluated with nixpkgs' lib"
    nix/tests/modules.sh
    tier_ran "Nix module tests"
  else
    tier_skipped "Nix module tests" modules "NIXPKGS_LIB is not set (a checkout of nix-community/nixpkgs.lib)"
  fi
else
  tier_skipped "Nix tier" nix "nix is not installed (.ci/run installs it)"
fi

# The speed gate's release build, started here as the CPU's idle work
# (SCHED_IDLE: whatever else wakes takes the CPU from it at once) beside
# the VM tier, whose emulated machine leaves the host's cores mostly idle.
# Measured: the VM tier took 359 s beside it against 354 s alone, and the
# build (~215 s alone) was done with it. Beside the MCP suites it slows
# them by a quarter or more (the root suite 276 s against 205), which
# takes back most of what it saves, so it waits until here.
# Its output is shown only if it fails.
release_log=$(mktemp)
cleanup+=("$release_log")
idle=(chrt --idle 0)
"${idle[@]}" true 2>/dev/null || idle=(nice -n 19)
# In a process group of its own, so that a run ending early stops its
# compilers too.
setsid "${idle[@]}" cargo build --release --quiet >"$release_log" 2>&1 &
release_pid=$!
trap '[ -z "$release_pid" ] || kill -- -"$release_pid" 2>/dev/null; rm -rf "${cleanup[@]}"' EXIT

step "VM tier: the daemon as a user and as root under systemd with cgroup v2"
vm_rc=0
tests/vm/run-tier.sh || vm_rc=$?
case $vm_rc in
  0) tier_ran "VM tier (systemd, cgroup v2, as dev and as root)" ;;
  77) tier_skipped "VM tier" vm "no VM image (../shared/vm/build.sh makes one; .ci/run does)" ;;
  *) exit "$vm_rc" ;;
esac

step "speed: bench/speed.py --check against bench/limits.toml (release build)"
# The docs' tables are bench/speed.py's, never typed: every marked block
# must hold one, headed by the run that wrote it.
python3 - <<'PY'
import pathlib, re, sys
bad = []
for doc in ("docs/performance.md", "docs/sessions.md", "docs/scaling.md", "README.md"):
    for name, body in re.findall(r"<!-- speed:([a-z_]+) -->\n(.*?)<!-- /speed:\1 -->", pathlib.Path(doc).read_text(), re.S):
        if not body.startswith("Measured by `bench/speed.py` on ") or "\n| " not in body:
            bad.append(f"{doc}: {name}")
if bad:
    sys.exit("speed blocks not written by bench/speed.py --write-docs: " + ", ".join(bad))
PY
release_rc=0
wait "$release_pid" || release_rc=$?
release_pid=""
if [ "$release_rc" != 0 ]; then
  cat "$release_log" >&2
  echo "the release build failed" >&2
  exit 1
fi
# A release has no test knobs: their names are not in the binary, and a
# malformed value of one changes nothing (a test build refuses to start).
release=$root/target/release/nix-sandbox-mcp
if grep -q -a 'NIX_SANDBOX_TEST_' "$release"; then
  echo "the release binary holds a test knob's name" >&2
  exit 1
fi
NIX_SANDBOX_TEST_CONFIRM_TTL_MS=never NIX_SANDBOX_TEST_RESOLVE=never "$release" envs >/dev/null
if NIX_SANDBOX_TEST_CONFIRM_TTL_MS=never "$bin" envs >/dev/null 2>&1; then
  echo "the test build ignored a malformed NIX_SANDBOX_TEST_CONFIRM_TTL_MS" >&2
  exit 1
fi
"$venv/bin/python" bench/speed.py --check
tier_ran "speed gate (and no test knobs in the release)"

printf '\n==> summary (%ss)\n' "$((SECONDS - start))"
printf 'tiers run:\n'
printf '  %s\n' "${ran[@]}"
if [ ${#skipped_tiers[@]} -gt 0 ]; then
  printf 'tiers skipped:\n'
  printf '  %s\n' "${skipped_tiers[@]}"
else
  printf 'tiers skipped: none\n'
fi
if [ -s "$skip_log" ]; then
  printf 'tests skipped (%s):\n' "$(wc -l <"$skip_log")"
  sed 's/^/  /' "$skip_log"
else
  printf 'tests skipped: none\n'
fi
printf '\nall tests passed in %ss\n' "$((SECONDS - start))"
