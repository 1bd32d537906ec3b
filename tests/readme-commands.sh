#!/usr/bin/env bash
# Runs the README's first commands as written: each line of the fenced
# blocks that follow a `<!-- first-commands` marker in README.md, in a
# fresh shell, from the repository's root, stopping at the first failure.
# Two changes keep it self-contained: `cargo install` gets `--root` (a
# temporary directory whose bin/ is first on PATH for the lines after it)
# and `--debug` (so it reuses this run's build instead of a release
# build); `nix run` lines run only when the flake's nixpkgs is in the store
# (an offline machine cannot fetch it), and are skipped otherwise, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
export PATH="$root/bin:$PATH"

commands=$(awk '
  /^<!-- first-commands/ { marked = 1; next }
  marked && /^```/ { if (inside) { inside = 0; marked = 0 } else { inside = 1 }; next }
  inside && !/^[[:space:]]*(#|$)/ { print }
' README.md)
if [ -z "$commands" ]; then
  echo "README.md has no first-commands block" >&2
  exit 1
fi

# The store path of the flake's nixpkgs input, when Nix can name it offline.
nixpkgs_available() {
  command -v nix >/dev/null 2>&1 || return 1
  local path
  path=$(nix --extra-experimental-features 'nix-command flakes' --offline \
    flake archive --dry-run --json . 2>/dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["inputs"]["nixpkgs"]["path"])' 2>/dev/null) || return 1
  [ -e "$path" ]
}

ran=0
while IFS= read -r line; do
  case "$line" in
    "cargo install "*) cmd="cargo install --root '$root' --debug ${line#cargo install }" ;;
    "nix run "*)
      if ! nixpkgs_available; then
        echo "skipped, the flake's nixpkgs is not available offline: $line"
        continue
      fi
      cmd=$line
      ;;
    *) cmd=$line ;;
  esac
  echo "\$ $line"
  if ! bash -c "$cmd" </dev/null; then
    echo "README command failed: $line" >&2
    exit 1
  fi
  ran=$((ran + 1))
done <<<"$commands"
echo "ran $ran of the README's first commands"
