# The daemon alone, built from this repository's Cargo workspace (the crate in
# daemon/, binary nix-sandbox-mcp). lib.wrapServer turns it into the package
# users run: bubblewrap on PATH and the sandbox artifacts baked in.
{ lib, rustPlatform }:
let
  crate = (lib.importTOML ../daemon/Cargo.toml).package;
  workspace = (lib.importTOML ../Cargo.toml).workspace.package;

  # Cargo.toml's rust-version: what the code (edition 2024, let chains) and
  # its locked dependencies need. An older rustc would fail deep in the
  # build with an unhelpful message.
  minimumRust = workspace.rust-version;
  rustVersion = rustPlatform.rust.rustc.version or null;
in
if rustVersion != null && !(lib.versionAtLeast rustVersion minimumRust) then
  throw "nix-sandbox-mcp: building the daemon needs rustc ${minimumRust} or later (its rust-version: Rust edition 2024 and its dependencies), and this nixpkgs has rustc ${rustVersion}; use a newer nixpkgs, or the flake's own build (nix-sandbox-mcp.packages.<system>.nix-sandbox-mcp)"
else
  rustPlatform.buildRustPackage {
    pname = crate.name;
    inherit (crate) version;

    # Only what cargo and the unit tests read (daemon/tests/source_tree.rs
    # checks the list), so that editing other docs or Nix files rebuilds nothing.
    src = lib.fileset.toSource {
      root = ../.;
      fileset = lib.fileset.unions [
        ../Cargo.toml
        ../Cargo.lock
        ../daemon
        # The unit tests check that it documents every key.
        ../config.example.toml
        # The unit tests check that its client block is what `client-config` prints.
        ../README.md
        # The unit tests check that it is the schema the code generates.
        ../nix/lib/config-schema.json
        # The unit tests check that these say what doctor says (userns.rs).
        ../docs/security.md
        ../deploy/apparmor/nix-sandbox-mcp
      ];
    };
    cargoLock.lockFile = ../Cargo.lock;

    # The integration tests start real sandboxes, which need user namespaces
    # that the Nix build sandbox does not offer; the flake's checks run the unit
    # tests (checks.cargo-unit-tests) and a NixOS VM test runs the rest.
    doCheck = false;

    meta = {
      inherit (crate) description;
      homepage = workspace.repository;
      license = lib.licenses.mit;
      mainProgram = crate.name;
      platforms = lib.platforms.linux;
    };
  }
