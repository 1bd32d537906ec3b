#!/usr/bin/env bash
# Offline test of the devShell path ([project] use_flake): builds shell-env.nix
# (a development shell captured by captureShellEnvironment, made into an
# artifact by mkSandbox, with host programs standing in for nixpkgs) and runs
# code in it through the daemon. NSM_BIN names the daemon (default:
# target/debug/nix-sandbox-mcp).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
daemon=$(realpath "${NSM_BIN:-$here/../../target/debug/nix-sandbox-mcp}")
[ -x "$daemon" ] || { echo "shell-env.sh: $daemon is missing; run cargo build first" >&2; exit 1; }

artifact=$(nix-build --no-out-link "$here/shell-env.nix" --argstr daemonBinary "$daemon")

# What the code sees, one fact per line, checked against what `nix develop`
# would give (see docs/nix.md, "What a sandbox keeps from a devShell").
actual=$(cd /tmp && "$daemon" run --artifact "$artifact" '
  echo "variable: $PROJECT_GREETING"
  echo "setup hook variable: ${PYTHON_TOOLS##*-}"
  echo "shellHook kept as a variable: $shellHook"
  echo "IN_NIX_SHELL: $IN_NIX_SHELL"
  echo "build directory variable: ${SCRATCH-dropped}"
  echo "HOME: $HOME"
  echo "exported function: $(type -t runHook || echo dropped)"
  python=$(command -v python3)
  echo "first on PATH: ${python##*-}"
  echo "program from the shell: $(python3 -c "print(6 * 7)")"
  echo "escaped variable: $(python3 -c "import os; print(ascii(os.environ[\"TRICKY\"]))")"
')
expected='variable: hello from the devShell
setup hook variable: python3/lib
shellHook kept as a variable: echo entering the shell
IN_NIX_SHELL: impure
build directory variable: dropped
HOME: /workspace
exported function: dropped
first on PATH: python3/bin/python3
program from the shell: 42
escaped variable: '"'"'quote " backslash \\ tab \t newline \n dollar $ brace ${x} control \x01 \xe9'"'"''
if [ "$actual" != "$expected" ]; then
  diff <(echo "$expected") <(echo "$actual") || true
  echo "shell-env test: FAILED" >&2
  exit 1
fi
echo "shell-env test: devShell environment captured and served (10 checks)"
