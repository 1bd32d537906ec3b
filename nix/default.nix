# The library in ./lib bound to this flake: its pinned nixpkgs, the daemon
# built from this repository, and the flake's own source, which the daemon
# evaluates at run time to build a project's devShell environment
# (NIX_SANDBOX_FLAKE).
{ self, nixpkgs }:
let
  lib' = import ./lib;

  pkgsFor = system: nixpkgs.legacyPackages.${system};
  systemOf = pkgs: pkgs.stdenv.hostPlatform.system;

  # Built with this flake's nixpkgs whatever `pkgs` a caller passes: the crate
  # needs a recent Rust, and bin/run only execs it.
  daemonFor = system: (pkgsFor system).callPackage ./daemon.nix { };

  presetsFor =
    { pkgs, daemon }:
    import ./presets {
      inherit pkgs;
      mkSandbox = args: lib'.mkSandbox ({ inherit pkgs daemon; } // args);
    };

  # The server with every preset and no config file of its own: it reads the
  # user's ~/.config/nix-sandbox-mcp/config.toml like the plain daemon.
  defaultServer =
    { pkgs, daemon }:
    lib'.wrapServer {
      inherit pkgs daemon;
      artifacts = builtins.attrValues (presetsFor { inherit pkgs daemon; });
      flakeSource = self;
    };
in
{
  inherit
    pkgsFor
    daemonFor
    presetsFor
    defaultServer
    ;

  # See docs/nix.md. `daemon` defaults to this flake's build for pkgs' system.
  mkSandbox =
    {
      pkgs,
      daemon ? daemonFor (systemOf pkgs),
      ...
    }@args:
    lib'.mkSandbox (args // { inherit daemon; });

  mkServer =
    {
      pkgs ? null,
      system ? null,
      config,
      project ? null,
      daemon ? null,
    }:
    let
      pkgs' =
        if pkgs != null then
          pkgs
        else if system != null then
          pkgsFor system
        else
          throw "nix-sandbox-mcp: mkServer: give pkgs or system";
      daemon' = if daemon != null then daemon else daemonFor (systemOf pkgs');
    in
    lib'.mkServer {
      pkgs = pkgs';
      daemon = daemon';
      flakeSource = self;
      presets = presetsFor {
        pkgs = pkgs';
        daemon = daemon';
      };
      inherit config project;
    };

  # What the daemon builds at run time for [project] use_flake = true:
  #   nix build --impure --expr 'let s = builtins.getFlake "path:<NIX_SANDBOX_FLAKE>";
  #     in s.lib.projectSandbox { system = builtins.currentSystem;
  #                               project = builtins.getFlake "path:<project>"; }'
  projectSandbox =
    { system, project }:
    lib'.projectSandbox {
      pkgs = pkgsFor system;
      daemon = daemonFor system;
      inherit project;
    };

    # What the daemon builds at run time for a `flake` entry of the config when
  # the server was not built from that config (see lib/server.nix).
  flakeSandbox =
    {
      system,
      name,
      flake,
      interpreter ? null,
    }:
    lib'.flakeSandbox {
      pkgs = pkgsFor system;
      daemon = daemonFor system;
      inherit name flake interpreter;
    };

  inherit (lib') captureShellEnvironment;
}
