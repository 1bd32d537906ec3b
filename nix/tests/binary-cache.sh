#!/usr/bin/env bash
# Offline end-to-end test of builds shared by Nix across replicas: one
# replica builds an environment (a `flake` entry, built by the daemon's own
# `nix build` at start-up), the team copies it to a binary cache (a signed
# `file://` cache standing in for the team's), and a second replica whose
# Nix points at that cache (`substituters`, `trusted-public-keys`) gets the
# same environment without building anything: it runs with `max-jobs = 0`,
# under which Nix may only substitute. Each replica keeps its own build
# records ($XDG_CACHE_HOME). A control run with `max-jobs = 0` and no cache
# shows the environment cannot come from anywhere else.
# NSM_BIN names the daemon (default: target/debug/nix-sandbox-mcp).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
daemonBinary=$(realpath "${NSM_BIN:-$root/target/debug/nix-sandbox-mcp}")
[ -x "$daemonBinary" ] || { echo "binary-cache.sh: $daemonBinary is missing; run cargo build first" >&2; exit 1; }

work=$(mktemp -d)
chmod o+rx "$work"
trap 'rm -rf "$work"' EXIT
checks=0
fail() {
  [ -e "$work/daemon.log" ] && tail -n 40 "$work/daemon.log" >&2
  echo "binary-cache test: FAILED: $*" >&2
  exit 1
}
pass() { checks=$((checks + 1)); }

system=$(nix-instantiate --eval --expr builtins.currentSystem | tr -d '"')
# Unique per run, so that nothing an earlier run left in the store counts.
run=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')

# shellcheck source=stand-ins.sh
. "$here/stand-ins.sh"
# The daemon as a store path, as the Nix package has it; the stand-in
# nixpkgs; a project whose flake has the environment, unique to this run.
daemon=$(in_store nix-sandbox-mcp nix-sandbox-mcp "$daemonBinary" "$work")
ownFlake=$(own_flake)
stand_in_nixpkgs "$work" "$system"
project=$work/project
mkdir -p "$project"
cat > "$project/flake.nix" <<NIX
{
  inputs.nixpkgs.url = "path:$work/nixpkgs";
  outputs = { self, nixpkgs }: {
    packages.$system.tools = with nixpkgs.legacyPackages.$system;
      runCommand "tools-$run" { } "mkdir -p \$out/bin && cp \${textTools}/bin/sed \$out/bin/";
  };
}
NIX
(
  cd "$project"
  git init -q
  git add flake.nix
  nix flake lock 2>/dev/null
  git add flake.lock
  git -c user.name=test -c user.email=test@localhost commit -q -m project
)
cat > "$work/config.toml" <<TOML
[environments.tools]
flake = "$project#tools"
interpreter = ["bash", "{file}"]

[environments.sh]
preset = "bash"
TOML

# One replica: its own build records, and Nix settings of its own.
replica() { # replica NAME NIX_CONFIG: `envs --json` of a replica
  XDG_CACHE_HOME=$work/$1 NIX_CONFIG=$2 NIX_SANDBOX_FLAKE=$ownFlake NIX_SANDBOX_DIR=$work/none \
    "$daemon/bin/nix-sandbox-mcp" --config "$work/config.toml" envs --json 2>>"$work/daemon.log"
}
artifactOf() { # the tools environment's artifact, from an `envs --json`; empty when it was not built
  python3 -c 'import json, sys
w = [w for w in json.loads(sys.argv[1])["warnings"] if w.split()[1] == "tools" and " (artifact " in w]
print(w[0].split(" (artifact ", 1)[1].split(")", 1)[0] if w else "")' "$1"
}
# The stand-in's programs need the host's loader, so the start check in the
# jail refuses the environment (as in project-flake.sh) and names its
# artifact: built is what this test is about.

# Replica a builds the environment.
envs=$(replica a "")
artifact=$(artifactOf "$envs")
[ -n "$artifact" ] && [ -e "$artifact" ] || fail "replica a did not build the environment: $envs"
[ -n "$(ls -A "$work/a/nix-sandbox-mcp" 2>/dev/null)" ] || fail "replica a kept no build records in its XDG_CACHE_HOME"
pass

# The team's cache: a signed file:// binary cache holding the closure.
nix-store --generate-binary-cache-key "team-$run" "$work/secret.key" "$work/public.key"
cache="file://$work/cache"
nix copy --to "$cache?compression=none&secret-key=$work/secret.key" "$artifact" 2>>"$work/daemon.log"
pass

# The environment leaves this store: what replica a keeps of it (its GC
# roots among its build records) goes too.
rm -rf "$work/a"
nix-store --delete "$artifact" >/dev/null 2>&1 || fail "the artifact could not be removed from the store: $(nix-store --query --roots "$artifact")"
[ ! -e "$artifact" ] || fail "the artifact is still in the store"

# Control: may not build, and no cache: the environment is not to be had.
envs=$(replica control "max-jobs = 0")
[ -z "$(artifactOf "$envs")" ] && [ ! -e "$artifact" ] || fail "with max-jobs = 0 and no cache the environment was still built: $envs"
pass

# Replica b may not build either, and substitutes from the team's cache.
envs=$(replica b "max-jobs = 0
substituters = $cache
trusted-public-keys = $(cat "$work/public.key")")
[ "$(artifactOf "$envs")" = "$artifact" ] && [ -e "$artifact" ] || fail "replica b did not get the environment from the cache: $envs"
[ -n "$(ls -A "$work/b/nix-sandbox-mcp" 2>/dev/null)" ] || fail "replica b kept no build records of its own"
pass

# An unsigned copy is not taken: the cache's key is what is trusted.
rm -rf "$work/b"
nix-store --delete "$artifact" >/dev/null 2>&1 || true
envs=$(replica unsigned "max-jobs = 0
substituters = $cache
trusted-public-keys = other-key:$(head -c 32 /dev/zero | base64)")
[ -z "$(artifactOf "$envs")" ] || fail "a cache signed with a key the replica does not trust was used: $envs"
pass

echo "binary-cache test: a replica pointed at the team's cache gets its environments without building ($checks checks)"
