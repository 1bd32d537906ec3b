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

  # mkSandbox's daemon and, when the caller gave one, bubblewrap.
  runtimeOf =
    args: daemon:
    {
      inherit daemon;
    }
    // builtins.intersectAttrs { bubblewrap = null; } args;

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
      sandboxes ? { },
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
      inherit config project sandboxes;
    };

  # What the daemon builds at start-up for [project] use_flake = true (the
  # expression is in daemon/src/registry/flakes.rs): the project's devShell
  # captured with the project's own nixpkgs (its `nixpkgs` input; this
  # flake's only when it has none), and bin/run calling the running daemon
  # (`daemon`, a store path, or null for the nix-sandbox-mcp on PATH) with its
  # bubblewrap (a store path, or null to leave PATH alone). Nothing of this
  # flake is evaluated that would fetch its nixpkgs or build its daemon,
  # unless `daemon` is left out.
  projectSandbox =
    {
      system,
      project,
      daemon ? daemonFor system,
      # Default: the project's nixpkgs' bubblewrap.
      bubblewrap ? null,
    }@args:
    lib'.projectSandbox {
      pkgs = lib'.packagesOf {
        inherit system;
        flake = project;
        fallback = pkgsFor system;
      };
      runtime = runtimeOf args daemon;
      inherit project;
    };

  # What the daemon builds at start-up for a `flake` entry of the config when
  # the server was not built from that config (see lib/server.nix), with the
  # same `daemon` and `bubblewrap` as projectSandbox.
  flakeSandbox =
    {
      system,
      name,
      flake,
      interpreter ? null,
      daemon ? daemonFor system,
      bubblewrap ? null,
    }@args:
    lib'.flakeSandbox {
      inherit
        system
        name
        flake
        interpreter
        ;
      fallbackPkgs = pkgsFor system;
      runtime = runtimeOf args daemon;
    };

  inherit (lib') captureShellEnvironment;
}
