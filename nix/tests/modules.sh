#!/usr/bin/env bash
# The NixOS and home-manager modules evaluated with nixpkgs' module system
# (modules.nix). Needs nixpkgs' lib, which is published on its own: set
# NIXPKGS_LIB to a checkout of nix-community/nixpkgs.lib (or of nixpkgs), or to
# its lib directory. Skipped, successfully, when NIXPKGS_LIB is unset.
set -euo pipefail
cd "$(dirname "$0")"
if [ -z "${NIXPKGS_LIB:-}" ]; then
  echo "module tests skipped: set NIXPKGS_LIB to a checkout of nix-community/nixpkgs.lib"
  exit 0
fi
lib=$(realpath "$NIXPKGS_LIB")
[ -e "$lib/lib/default.nix" ] && lib=$lib/lib
[ -e "$lib/default.nix" ] || { echo "modules.sh: no nixpkgs lib at $NIXPKGS_LIB" >&2; exit 1; }
exec ./run-tests.sh "module tests" modules.nix --arg nixpkgsLib "$lib"
