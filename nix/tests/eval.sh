#!/usr/bin/env bash
# Pure evaluation tests of nix/lib, without nixpkgs (eval.nix). One summary
# line; exits non-zero on any failure.
cd "$(dirname "$0")" && exec ./run-tests.sh "nix eval tests" eval.nix
