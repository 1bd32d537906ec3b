#!/usr/bin/env bash
# Builds the offline end-to-end test's sandbox artifacts (bash, python, node:
# the real mkSandbox with host programs standing in for nixpkgs, see
# e2e-artifacts.nix) and links each into OUTDIR/<name>, ready for
# NIX_SANDBOX_DIR=OUTDIR. The links are GC roots, so the closures stay in the
# store while the tests run. NSM_BIN names the daemon that each artifact's
# bin/run calls (default: target/debug/nix-sandbox-mcp).
set -euo pipefail
out=${1:?usage: build-e2e-artifacts.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
daemon=$(realpath "${NSM_BIN:-$here/../../target/debug/nix-sandbox-mcp}")
[ -x "$daemon" ] || { echo "build-e2e-artifacts.sh: $daemon is missing; run cargo build first" >&2; exit 1; }

mkdir -p "$out"
for artifact in $(nix-build --no-out-link "$here/e2e-artifacts.nix" --argstr daemonBinary "$daemon"); do
  name=${artifact##*-sandbox-}
  rm -f "$out/$name"
  nix-store --realise "$artifact" --add-root "$out/$name" --indirect >/dev/null
  echo "$out/$name -> $artifact"
done
