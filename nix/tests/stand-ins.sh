# Sourced by the Nix tier's end-to-end tests (project-flake.sh,
# binary-cache.sh): the pieces that stand in for what users have, which
# cannot be downloaded here. Needs $here (this directory) and $root (the
# repository).

# in_store NAME PROGRAM FILE DIR: a store path NAME holding bin/PROGRAM, a
# copy of FILE (as the Nix package has the daemon and bubblewrap); DIR is
# scratch space. Prints the store path.
in_store() {
  mkdir -p "$4/$1/bin"
  cp "$3" "$4/$1/bin/$2"
  nix-store --add "$4/$1"
  rm -rf "${4:?}/$1"
}

# stand_in_nixpkgs DIR SYSTEM: a flake at DIR/nixpkgs whose legacyPackages
# are host programs (host-pkgs.nix), standing in for nixpkgs.
stand_in_nixpkgs() {
  mkdir -p "$1/nixpkgs/tests" "$1/nixpkgs/lib"
  cp "$here/host-pkgs.nix" "$1/nixpkgs/tests/"
  cp "$root/nix/lib/util.nix" "$1/nixpkgs/lib/"
  cat > "$1/nixpkgs/flake.nix" <<NIX
{
  outputs = { self }: {
    legacyPackages.$2 = import ./tests/host-pkgs.nix { system = "$2"; };
  };
}
NIX
}

# This flake's source in the store (its tracked files), as
# NIX_SANDBOX_FLAKE names it to the daemon.
own_flake() {
  nix eval --raw --impure --expr "(builtins.getFlake \"git+file://$root\").outPath"
}
