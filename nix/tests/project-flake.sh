#!/usr/bin/env bash
# Offline end-to-end test of the environments the daemon builds at start-up,
# run as users run them: the daemon and bubblewrap in the Nix store (as the
# Nix package has them), NIX_SANDBOX_FLAKE pointing at this flake's source in
# the store, and a project that is a git repository whose flake follows its
# own nixpkgs (host-pkgs.nix behind a flake, standing in for nixpkgs, which
# cannot be downloaded here). It checks that
#   - the project's devShell ([project] use_flake) and a `flake` entry naming
#     a local directory are built and run code;
#   - they are built with the project's nixpkgs and the running daemon: this
#     flake's nixpkgs is never fetched (there is no network) and its daemon
#     never built; bin/run calls the store copies of the daemon and bwrap;
#   - no file git does not track (an untracked .env, git-ignored files)
#     reaches the Nix store, while a tracked one, uncommitted edit included,
#     does;
#   - a project that is not a git repository, or whose flake.nix git does not
#     track, is refused with a warning saying why, and copies nothing.
# NSM_BIN names the daemon to copy into the store (default:
# target/debug/nix-sandbox-mcp).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
daemonBinary=$(realpath "${NSM_BIN:-$root/target/debug/nix-sandbox-mcp}")
[ -x "$daemonBinary" ] || { echo "project-flake.sh: $daemonBinary is missing; run cargo build first" >&2; exit 1; }

work=$(mktemp -d)
# Sandboxes of a server run as root run as another user, who must read the project.
chmod o+rx "$work"
trap 'rm -rf "$work"' EXIT
checks=0
fail() {
  [ -e "$work/daemon.log" ] && cat "$work/daemon.log" >&2
  echo "project-flake test: FAILED: $*" >&2
  exit 1
}
pass() { checks=$((checks + 1)); }

system=$(nix-instantiate --eval --expr builtins.currentSystem | tr -d '"')
# Unique per run, so that what earlier runs left in the store cannot count.
run=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
tracked=TRACKED_$run
edited=EDITED_$run
envSecret=ENV_SECRET_$run
ignoredSecret=IGNORED_SECRET_$run
plainSecret=PLAIN_SECRET_$run

# shellcheck source=stand-ins.sh
. "$here/stand-ins.sh"
# The daemon and bubblewrap as store paths, like the Nix package's.
daemon=$(in_store nix-sandbox-mcp nix-sandbox-mcp "$daemonBinary" "$work")
bubblewrap=$(in_store bubblewrap bwrap "$(realpath "$(command -v bwrap)")" "$work")
ownFlake=$(own_flake)
# The stand-in nixpkgs: host programs behind a flake.
stand_in_nixpkgs "$work" "$system"

# A project: a git repository whose flake follows that nixpkgs.
project=$work/project
mkdir -p "$project/target"
cat > "$project/flake.nix" <<EOF
{
  inputs.nixpkgs.url = "path:$work/nixpkgs";
  outputs = { self, nixpkgs }:
    let pkgs = nixpkgs.legacyPackages.$system; in
    {
      devShells.$system.default = pkgs.mkShell {
        packages = [ pkgs.python3 ];
        PROJECT_GREETING = "hello from the project";
        # The project's source, referred to by the shell, reaches the store.
        PROJECT_SOURCE = "\${self}";
      };
      packages.$system.tools = pkgs.textTools;
    };
}
EOF
printf 'target/\nsecret.txt\n' > "$project/.gitignore"
echo "$tracked" > "$project/README"
echo "API_KEY=$envSecret" > "$project/.env"
echo "$ignoredSecret" > "$project/secret.txt"
echo "$ignoredSecret" > "$project/target/build.log"
(
  cd "$project"
  git init -q
  git add flake.nix
  nix flake lock 2>/dev/null
  git add flake.lock .gitignore README
  git -c user.name=test -c user.email=test@localhost commit -q -m project
  # An uncommitted edit of a tracked file: Nix takes the working tree's copy.
  echo "$edited" >> README
)

cat > "$work/config.toml" <<EOF
[project]
path = "$project"
use_flake = true

[environments.tools]
flake = "$project#tools"
interpreter = ["bash", "{file}"]

# So that the server starts when the others are refused.
[environments.sh]
preset = "bash"
EOF

# The daemon's log goes to daemon.log, shown when the test fails.
nsm() {
  XDG_CACHE_HOME=$work/cache NIX_SANDBOX_FLAKE=$ownFlake NIX_SANDBOX_DIR=$work/none PATH=$bubblewrap/bin:$PATH \
    "$daemon/bin/nix-sandbox-mcp" --config "$1" "${@:2}" 2>>"$work/daemon.log"
}

envs=$(nsm "$work/config.toml" envs --json)
# Both are built; neither starts in the jail (see runManifest below: the
# stand-in's programs need the host's loader), so the server's start check
# refuses both, naming each one's artifact, and says nothing else.
python3 - "$envs" <<'PY' || fail "the project and tools environments were not built: $envs"
import json, sys
out = json.loads(sys.argv[1])
refused = [w for w in out["warnings"] if "does not work in the sandbox" in w]
assert sorted(w.split()[1] for w in refused) == ["project", "tools"], out["warnings"]
assert len(refused) == len(out["warnings"]), out["warnings"]
PY
pass

artifactOf() {
  python3 -c 'import json, sys; print([w.split(" (artifact ", 1)[1].split(")", 1)[0] for w in json.loads(sys.argv[1])["warnings"] if w.split()[1] == sys.argv[2]][0])' "$envs" "$1"
}
projectArtifact=$(artifactOf project)
toolsArtifact=$(artifactOf tools)

# The host programs standing in for nixpkgs need the host's dynamic loader,
# which only e2e-artifacts.nix adds to a jail (shell-env.sh runs a captured
# devShell in one); so the manifests' programs run here outside the jail,
# with the manifests' PATH and variables, as the jail would run them.
runManifest() {
  python3 - "$1/manifest.json" "$2" <<'PY'
import json, os, subprocess, sys
manifest = json.load(open(sys.argv[1]))
env = dict(manifest["env"], PATH=":".join(manifest["path"]), HOME="/tmp")
argv = [manifest["interpreter"]["argv"][0], "-c", sys.argv[2]]
sys.stdout.write(subprocess.run(argv, env=env, cwd="/tmp", check=True, capture_output=True, text=True).stdout)
PY
}

# The project environment is the devShell, with the project's tracked files
# (and only those) in its source.
actual=$(runManifest "$projectArtifact" '
  echo "$PROJECT_GREETING"
  python3 -c "print(6 * 7)"
  cat "$PROJECT_SOURCE/README"
  ls -A "$PROJECT_SOURCE"
')
expected="hello from the project
42
$tracked
$edited
.gitignore
README
flake.lock
flake.nix"
[ "$actual" = "$expected" ] || { diff <(echo "$expected") <(echo "$actual") || true; fail "the project environment"; }
pass
actual=$(runManifest "$toolsArtifact" 'echo flake entry | sed s/entry/works/')
[ "$actual" = "flake works" ] || fail "the tools environment printed: $actual"
pass

# Both were built with the running daemon and its bubblewrap.
for artifact in "$projectArtifact" "$toolsArtifact"; do
  grep -q "exec $daemon/bin/nix-sandbox-mcp run --artifact $artifact " "$artifact/bin/run" || fail "$artifact/bin/run does not call the running daemon: $(cat "$artifact/bin/run")"
  grep -q "^PATH=$bubblewrap/bin" "$artifact/bin/run" || fail "$artifact/bin/run does not use the daemon's bubblewrap"
  if nix-store -qR "$artifact" | grep -- '-nix-sandbox-mcp-[0-9]'; then
    fail "$artifact's closure holds a daemon built from source"
  fi
  pass
done

# What git does not track never reaches the store; what it tracks does.
closure=$(nix-store -qR "$projectArtifact")
# shellcheck disable=SC2086
grep -rlF -e "$tracked" $closure >/dev/null || fail "the project's tracked files are not in the environment's closure"
grep -rlF -e "$envSecret" -e "$ignoredSecret" /nix/store && fail "a file git does not track reached the Nix store"
grep -rlF -e "$tracked" /nix/store >/dev/null || fail "the store scan finds nothing, not even the tracked file"
pass

# A directory that is not a git repository is refused and copied nowhere.
cp -r "$project" "$work/plain"
rm -rf "$work/plain/.git"
echo "API_KEY=$plainSecret" > "$work/plain/.env"
sed "s|$project|$work/plain|" "$work/config.toml" > "$work/plain.toml"
envs=$(nsm "$work/plain.toml" envs --json)
python3 - "$envs" <<'PY' || fail "a project outside git was not refused as expected: $envs"
import json, sys
out = json.loads(sys.argv[1])
names = {e["name"] for e in out["environments"]}
assert "project" not in names and "tools" not in names, names
warnings = " ".join(out["warnings"])
assert "[project] use_flake" in warnings and "environments.tools.flake" in warnings, warnings
assert warnings.count("is not in a git repository") == 2 and ".env" in warnings, warnings
PY
grep -rlF -e "$plainSecret" /nix/store && fail "a project outside git reached the Nix store"
pass

# A flake.nix git does not track is reported as such, for the project and
# for a flake entry.
git -C "$project" rm -q --cached flake.nix
envs=$(nsm "$work/config.toml" envs --json)
python3 - "$envs" <<'PY' || fail "an untracked flake.nix was not reported: $envs"
import json, sys
warnings = " ".join(json.loads(sys.argv[1])["warnings"])
assert warnings.count("git does not track flake.nix") == 2 and "git add flake.nix" in warnings, warnings
PY
pass

echo "project-flake test: start-up builds from git, with the project's nixpkgs and the running daemon ($checks checks)"
