# The daemon alone, built from this repository's Cargo workspace (the crate in
# daemon/, binary nix-sandbox-mcp). lib.wrapServer turns it into the package
# users run: bubblewrap on PATH and the sandbox artifacts baked in.
{ lib, rustPlatform }:
let
  crate = (lib.importTOML ../daemon/Cargo.toml).package;
  workspace = (lib.importTOML ../Cargo.toml).workspace.package;

  # The crate is edition 2024, which rustc reads from 1.85 on; an older one
  # would fail deep in the build with an unhelpful message.
  minimumRust = "1.85";
  rustVersion = rustPlatform.rust.rustc.version or null;
in
if rustVersion != null && !(lib.versionAtLeast rustVersion minimumRust) then
  throw "nix-sandbox-mcp: building the daemon needs rustc ${minimumRust} or later (the crate is Rust edition 2024), and this nixpkgs has rustc ${rustVersion}; use a newer nixpkgs, or the flake's own build (nix-sandbox-mcp.packages.<system>.nix-sandbox-mcp)"
else
  rustPlatform.buildRustPackage {
    pname = crate.name;
    inherit (crate) version;

    # Only what cargo reads, so that editing docs or Nix files rebuilds nothing.
    src = lib.fileset.toSource {
      root = ../.;
      fileset = lib.fileset.unions [
        ../Cargo.toml
        ../Cargo.lock
        ../daemon
        # The unit tests check that it documents every key.
        ../config.example.toml
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
