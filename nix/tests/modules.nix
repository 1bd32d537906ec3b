# The NixOS and home-manager modules evaluated with nixpkgs' module system
# (lib.evalModules from a nixpkgs `lib` directory) against stub declarations of
# the few NixOS and home-manager options they set. No nixpkgs packages: the
# server is built from fake-pkgs.nix by the real mkServer. Run by modules.sh.
{ nixpkgsLib }:
let
  lib = import nixpkgsLib;
  inherit (lib) mkOption types;

  fake = import ./fake-pkgs.nix;
  lib' = import ../lib;
  # nixpkgs' pkgs.formats.toml, approximately: a value type and a generator.
  pkgs = fake // {
    formats.toml = _: {
      type = types.attrsOf types.anything;
      inherit (fake.formats.toml { }) generate;
    };
  };
  # The flake-bound library (nix/default.nix), bound to the fake packages.
  nixSandbox = {
    daemonFor = _: fake.daemon;
    mkServer =
      {
        pkgs,
        config,
        project,
        daemon,
      }:
      lib'.mkServer {
        inherit pkgs config project daemon;
        flakeSource = "/nix/store/00000000000000000000000000000000-source";
        presets = import ../presets {
          inherit pkgs;
          mkSandbox = args: lib'.mkSandbox ({ inherit pkgs daemon; } // args);
        };
      };
  };

  stub = type: mkOption { inherit type; };
  servers = stub (types.attrsOf (types.attrsOf types.anything));
  nixosStubs = withUsernsClone: [
    {
      options.environment.systemPackages = stub (types.listOf types.package);
      options.security.allowUserNamespaces = stub types.bool;
    }
    (lib.optionalAttrs withUsernsClone { options.security.unprivilegedUsernsClone = stub types.bool; })
  ];
  homeStubs =
    {
      sharedList,
      claudeCode,
    }:
    [
      { options.home.packages = stub (types.listOf types.package); }
      (lib.optionalAttrs sharedList { options.programs.mcp.servers = servers; })
      (lib.optionalAttrs claudeCode { options.programs.claude-code.mcpServers = servers; })
    ];

  evaluate =
    modules:
    lib.evalModules {
      modules = modules ++ [ { _module.args.pkgs = pkgs; } ];
    };
  nixos =
    {
      withUsernsClone ? true,
      settings,
    }:
    evaluate (
      [
        (import ../modules/nixos.nix nixSandbox)
        settings
      ]
      ++ nixosStubs withUsernsClone
    );
  home =
    {
      sharedList ? true,
      claudeCode ? true,
      settings,
    }:
    evaluate (
      [
        (import ../modules/home-manager.nix nixSandbox)
        settings
      ]
      ++ homeStubs { inherit sharedList claudeCode; }
    );

  enabled = {
    programs.nix-sandbox-mcp = {
      enable = true;
      settings.defaults.timeout_ms = 60000;
      environments = {
        py.preset = "python";
        sh.preset = "shell";
      };
    };
  };
  finalPackage = settings: (nixos { inherit settings; }).config.programs.nix-sandbox-mcp.finalPackage;
  # fake-pkgs' formats.toml.generate keeps the value it was given.
  configOf = settings: (finalPackage settings).configFile.value;
  projectShell = derivation {
    name = "project-shell";
    system = "x86_64-linux";
    builder = "/bin/sh";
  };

  options = (nixos { settings = { }; }).options.programs.nix-sandbox-mcp;
  homeOptions = (home { settings = { }; }).options.programs.nix-sandbox-mcp;
  undocumented =
    opts:
    builtins.filter (name: !(opts.${name} ? description && opts.${name} ? default && opts.${name} ? example)) (
      builtins.attrNames opts
    );

  tests = {
    "every NixOS option has a description, a default and an example" = {
      expr = undocumented options;
      expected = [ ];
    };
    "every home-manager option has a description, a default and an example" = {
      expr = undocumented homeOptions;
      expected = [ ];
    };
    "the NixOS module installs the server and allows user namespaces" = {
      expr =
        let
          c = (nixos { settings = enabled; }).config;
        in
        {
          packages = map (p: p.name) c.environment.systemPackages;
          inherit (c.security) allowUserNamespaces unprivilegedUsernsClone;
        };
      expected = {
        packages = [ "nix-sandbox-mcp-0.1.0" ];
        allowUserNamespaces = true;
        unprivilegedUsernsClone = true;
      };
    };
    "the NixOS module evaluates where unprivilegedUsernsClone does not exist" = {
      expr = (nixos {
        withUsernsClone = false;
        settings = enabled;
      }).config.security.allowUserNamespaces;
      expected = true;
    };
    "a disabled module sets nothing" = {
      expr = (nixos { settings = { }; }).config.environment.systemPackages;
      expected = [ ];
    };
    "the server bakes in the presets its environments use" = {
      expr = builtins.attrNames (finalPackage enabled).sandboxes;
      expected = [
        "bash"
        "python"
      ];
    };
    "the config file holds the settings and the environments" = {
      expr = configOf enabled;
      expected = {
        defaults.timeout_ms = 60000;
        environments = {
          py.preset = "python";
          sh.preset = "shell";
        };
      };
    };
    "a project flake turns use_flake on and adds the project environment" = {
      expr =
        let
          settings = lib.recursiveUpdate enabled {
            programs.nix-sandbox-mcp = {
              settings.project.mode = "readonly";
              project.devShells.x86_64-linux.default = projectShell;
            };
          };
        in
        {
          project = (configOf settings).project;
          sandboxes = builtins.attrNames (finalPackage settings).sandboxes;
        };
      expected = {
        project = {
          mode = "readonly";
          use_flake = true;
        };
        sandboxes = [
          "bash"
          "project"
          "python"
        ];
      };
    };
    "bad settings fail with the key named" = {
      expr = (finalPackage (lib.recursiveUpdate enabled { programs.nix-sandbox-mcp.settings.defaults.pids = 0; })).sandboxes;
      throws = "defaults.pids: expected an integer of at least 1, got 0";
    };
    "home-manager installs the server and registers it in programs.mcp.servers" = {
      expr =
        let
          c = (home { settings = enabled; }).config;
        in
        {
          packages = map (p: p.name) c.home.packages;
          shared = c.programs.mcp.servers;
          claudeCode = c.programs.claude-code.mcpServers;
        };
      expected = {
        packages = [ "nix-sandbox-mcp-0.1.0" ];
        shared.sandbox = {
          command = "${fake.runCommand "nix-sandbox-mcp-0.1.0" { } ""}/bin/nix-sandbox-mcp";
          args = [ "--stdio" ];
        };
        claudeCode = { };
      };
    };
    "without programs.mcp, home-manager registers the server with Claude Code" = {
      expr = (home {
        sharedList = false;
        settings = lib.recursiveUpdate enabled { programs.nix-sandbox-mcp.mcpServerName = "nix-sandbox"; };
      }).config.programs.claude-code.mcpServers;
      expected.nix-sandbox = {
        type = "stdio";
        command = "${fake.runCommand "nix-sandbox-mcp-0.1.0" { } ""}/bin/nix-sandbox-mcp";
        args = [ "--stdio" ];
      };
    };
    "home-manager evaluates without any MCP client module" = {
      expr = map (p: p.name) (home {
        sharedList = false;
        claudeCode = false;
        settings = enabled;
      }).config.home.packages;
      expected = [ "nix-sandbox-mcp-0.1.0" ];
    };
    "a null server name registers nowhere" = {
      expr = (home {
        settings = lib.recursiveUpdate enabled { programs.nix-sandbox-mcp.mcpServerName = null; };
      }).config.programs.mcp.servers;
      expected = { };
    };
  };

  in
import ./harness.nix tests
