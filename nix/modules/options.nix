# The options the NixOS and home-manager modules share, and the server they
# describe. `nixSandbox` is the flake-bound library (nix/default.nix).
{
  nixSandbox,
  config,
  lib,
  pkgs,
}:
let
  inherit (lib) mkOption types literalExpression;
  cfg = config.programs.nix-sandbox-mcp;
  tomlFormat = pkgs.formats.toml { };

  # The config file: `settings`, with `environments` as its [environments]
  # tables and, when `project` is given, [project] use_flake = true.
  serverConfig =
    cfg.settings
    // lib.optionalAttrs (cfg.environments != { } || cfg.settings ? environments) {
      environments = cfg.settings.environments or { } // cfg.environments;
    }
    // lib.optionalAttrs (cfg.project != null) {
      project = cfg.settings.project or { } // {
        use_flake = true;
      };
    };
in
{
  enable = lib.mkEnableOption "nix-sandbox-mcp, an MCP server that runs code from AI agents in bubblewrap sandboxes";

  package = mkOption {
    type = types.package;
    default = nixSandbox.daemonFor pkgs.stdenv.hostPlatform.system;
    defaultText = literalExpression "nix-sandbox-mcp.packages.\${pkgs.stdenv.hostPlatform.system}.nix-sandbox-mcp.unwrapped";
    example = literalExpression "pkgs.callPackage ./my-nix-sandbox-mcp-fork.nix { }";
    description = ''
      The nix-sandbox-mcp daemon, without sandboxes or configuration.
      {option}`finalPackage` wraps it with bubblewrap, the sandbox artifacts
      the configuration needs (built from this system's `pkgs`) and the
      configuration file.
    '';
  };

  settings = mkOption {
    type = tomlFormat.type;
    default = { };
    example = literalExpression ''
      {
        defaults = { timeout_ms = 60000; memory_mb = 2048; };
        project = { mode = "readonly"; inherit_env.vars = [ "DATABASE_URL" ]; };
      }
    '';
    description = ''
      The server's configuration, written to a TOML file passed with
      `--config`: the `[server]`, `[defaults]` and `[project]` tables of
      `config.example.toml`. Put environments in
      {option}`programs.nix-sandbox-mcp.environments`. It is checked when the
      system is built: an unknown key or a bad value fails the build with the
      key named. Values end up in the Nix store: never put secrets here (list
      their variable names in `project.inherit_env.vars`; the server reads the
      values when it runs).
    '';
  };

  environments = mkOption {
    type = types.attrsOf tomlFormat.type;
    default = { };
    example = literalExpression ''
      {
        python = { preset = "python"; timeout_ms = 60000; };
        shell.preset = "bash";
        ruby = { flake = "github:me/sandboxes/0123abc#ruby"; description = "Ruby 3.4 with rake"; };
      }
    '';
    description = ''
      The `[environments.NAME]` tables: the environments the server offers.
      Each sets one of `preset` (`bash`, `python` or `node`), `flake` (a
      locked flake output built with `lib.mkSandbox`, or a package with
      `interpreter`) or `interpreter` (a host program), plus optional limits,
      `description`, `file_name`, `network` and `seccomp_allow`. Sandboxes for
      presets and flakes are built with the system. When empty, the server
      offers the bundled presets bash, python and node.
    '';
  };

  project = mkOption {
    type = types.nullOr types.raw;
    default = null;
    example = literalExpression "inputs.my-project";
    description = ''
      A flake whose `devShells.<system>.default` becomes an environment named
      `project`: bash with the development shell's packages and variables
      (see docs/nix.md for what a sandbox keeps from a devShell). Setting it
      sets `project.use_flake = true` in the configuration.
    '';
  };

  finalPackage = mkOption {
    type = types.package;
    readOnly = true;
    default = nixSandbox.mkServer {
      inherit pkgs;
      inherit (cfg) project;
      daemon = cfg.package;
      config = serverConfig;
    };
    defaultText = literalExpression "nix-sandbox-mcp.lib.mkServer { inherit pkgs; config = …; }";
    example = literalExpression "nix-sandbox-mcp.lib.mkServer { inherit pkgs; config = ./nix-sandbox-mcp.toml; }";
    description = ''
      The server built from {option}`package` and the options above:
      `nix-sandbox-mcp` with the configuration file and the sandboxes baked
      in. MCP clients start it as `nix-sandbox-mcp --stdio`.
    '';
  };
}
