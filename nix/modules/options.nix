# What the NixOS and home-manager modules share: the options, the assertions
# on them, and the server they describe. `nixSandbox` is the flake-bound
# library (nix/default.nix).
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
  schema = import ../lib/schema.nix;
  interpreters = import ../lib/interpreter.nix;
  option = "programs.nix-sandbox-mcp";

  isArtifact = v: lib.isDerivation v && v ? sandboxName;

  # One [environments.NAME] table, plus what only Nix can say: a sandbox
  # artifact, or packages to build one from. The table's own keys (preset,
  # flake, interpreter, limits, …) are checked against the daemon's schema
  # when the server is built.
  environmentModule =
    { name, ... }:
    {
      freeformType = tomlFormat.type;
      options = {
        sandbox = mkOption {
          type = types.nullOr types.package;
          default = null;
          example = literalExpression ''
            nix-sandbox-mcp.lib.mkSandbox {
              inherit pkgs;
              name = "ruby";
              packages = [ pkgs.ruby ];
              interpreter = [ "ruby" "{file}" ];
            }
          '';
          description = ''
            A sandbox artifact (the result of `nix-sandbox-mcp.lib.mkSandbox`),
            served under this environment's name. Writing the artifact
            itself as the environment (`environments.${name} = mkSandbox { … }`)
            sets this.
          '';
        };
        packages = mkOption {
          type = types.listOf types.package;
          default = [ ];
          example = literalExpression "[ (pkgs.python3.withPackages (ps: [ ps.pandas ])) ]";
          description = ''
            Packages to build a sandbox from, with this system's `pkgs`: their
            executables are on `PATH` and their closure is all the sandbox
            sees. Code runs with `interpreter`: `"bash"` (the default),
            `"python"`, `"node"`, or a command such as `[ "ruby" "{file}" ]`.
            Writing a list or a single package as the environment
            (`environments.${name} = [ pkgs.jq ]`) sets this.
          '';
        };
      };
    };

  # A package list or a derivation stands for the table it sets.
  environmentType =
    types.coercedTo (types.either types.package (types.listOf types.package))
      (
        value:
        if builtins.isList value then
          { packages = value; }
        else if isArtifact value then
          { sandbox = value; }
        else
          { packages = [ value ]; }
      )
      (types.submodule environmentModule);

  # One [commands.NAME] table: the keys every command needs are typed here,
  # so a missing one is named by the module system; the rest (params,
  # danger, confirm, …) are checked against the daemon's schema when the
  # server is built.
  commandModule = {
    freeformType = tomlFormat.type;
    options = {
      description = mkOption {
        type = types.str;
        description = "What the command does: the description of its MCP tool.";
      };
      env = mkOption {
        type = types.str;
        description = "The environment the command runs in: its toolchain, jail and limits.";
      };
      argv = mkOption {
        type = types.nonEmptyListOf types.str;
        description = ''
          The program and its arguments, never run through a shell: argv[0]
          is literal, `{{param}}` in an argument is a parameter's value.
        '';
      };
    };
  };

  # The environments a command may name: those declared, the project's, or
  # the bundled presets when none are declared.
  environmentNames =
    (if cfg.environments == { } then schema.presetNames else builtins.attrNames cfg.environments)
    ++ lib.optional (cfg.project != null) "project";

  commandAssertions =
    name: command:
    let
      at = "${option}.commands.${name}";
    in
    [
      {
        assertion = schema.isValidCommandName name;
        message = "${at}: ${builtins.toJSON name} is not a valid command name (${schema.commandNameRule}); rename it.";
      }
      {
        assertion = builtins.elem command.env environmentNames;
        message = "${at}.env = ${builtins.toJSON command.env} names no environment; use one of ${lib.concatStringsSep ", " environmentNames}, or declare it in ${option}.environments.";
      }
    ];

  isNixBuilt = entry: entry.sandbox != null || entry.packages != [ ];

  # mkSandbox's interpreter from the table's `interpreter`: a kind by name, a
  # command as a string or a list; bash when unset.
  sandboxInterpreter =
    value:
    if value == null then
      "bash"
    else if builtins.isString value && builtins.elem value [ "bash" "python" "node" ] then
      value
    else
      interpreters.fromConfig value;

  artifactOf =
    name: entry:
    if entry.sandbox != null then
      if entry.sandbox.sandboxName == name then entry.sandbox else entry.sandbox.override { inherit name; }
    else
      nixSandbox.mkSandbox {
        inherit pkgs name;
        inherit (entry) packages;
        daemon = cfg.package;
        interpreter = sandboxInterpreter (entry.interpreter or null);
      };

  nixBuilt = lib.filterAttrs (_: isNixBuilt) cfg.environments;
  sandboxes = lib.mapAttrs artifactOf nixBuilt;

  # The table written to the config file. A Nix-built environment names its
  # artifact as its flake: mkServer bakes the artifact in under the
  # environment's name, which is how the daemon finds it.
  tableOf =
    name: entry:
    let
      table = builtins.removeAttrs entry [
        "sandbox"
        "packages"
        "_module"
      ];
    in
    if isNixBuilt entry then
      builtins.removeAttrs table [ "interpreter" ] // { flake = "${sandboxes.${name}}"; }
    else
      table;

  # The config file: `settings`, with `environments` as its [environments]
  # tables and, when `project` is given, [project] use_flake = true.
  serverConfig =
    cfg.settings
    // lib.optionalAttrs (cfg.environments != { }) {
      environments = lib.mapAttrs tableOf cfg.environments;
    }
    // lib.optionalAttrs (cfg.commands != { }) {
      commands = lib.mapAttrs (_: command: builtins.removeAttrs command [ "_module" ]) cfg.commands;
    }
    // lib.optionalAttrs (cfg.project != null) {
      project = cfg.settings.project or { } // {
        use_flake = true;
      };
    };

  entryAssertions =
    name: entry:
    let
      at = "${option}.environments.${name}";
      given = lib.filter (key: key != null) [
        (if entry.sandbox != null then "sandbox" else null)
        (if entry.packages != [ ] then "packages" else null)
        (if entry ? preset then "preset" else null)
        (if entry ? flake then "flake" else null)
      ];
      hostInterpreter = entry ? interpreter && given == [ ];
      withInterpreter = entry ? interpreter && (entry.sandbox != null || entry ? preset);
    in
    [
      {
        assertion = schema.isValidName name;
        message = "${at}: ${builtins.toJSON name} is not a valid environment name (${schema.nameRule}); rename it.";
      }
      {
        assertion = given != [ ] || hostInterpreter;
        message = "${at} says nothing to run: write a list of packages (${at} = [ pkgs.jq ]), a sandbox (nix-sandbox-mcp.lib.mkSandbox { … }), or set preset, flake or interpreter.";
      }
      {
        assertion = builtins.length given <= 1 && !withInterpreter;
        message = "${at} sets ${lib.concatStringsSep " and " (given ++ lib.optional withInterpreter "interpreter")}: set only one of sandbox, packages, preset, flake or interpreter (interpreter may accompany packages or flake).";
      }
      {
        assertion = entry.sandbox == null || isArtifact entry.sandbox;
        message = "${at}.sandbox is ${entry.sandbox.name or "a package"}, not a sandbox artifact: put it in ${at}.packages (with an interpreter if it is not bash), or build it with nix-sandbox-mcp.lib.mkSandbox.";
      }
      {
        assertion =
          !(isArtifact entry.sandbox) || entry.sandbox.sandboxName == name || entry.sandbox ? override;
        message = "${at}.sandbox is named ${entry.sandbox.sandboxName or "?"} and cannot be renamed; build it with nix-sandbox-mcp.lib.mkSandbox { name = \"${name}\"; … }.";
      }
    ];
in
{
  options = {
    enable = lib.mkEnableOption "nix-sandbox-mcp, an MCP server that runs code from AI agents in bubblewrap sandboxes";

    package = mkOption {
      type = types.package;
      default = nixSandbox.daemonFor pkgs.stdenv.hostPlatform.system;
      defaultText = literalExpression "nix-sandbox-mcp.packages.\${pkgs.stdenv.hostPlatform.system}.nix-sandbox-mcp.unwrapped";
      example = literalExpression "pkgs.nix-sandbox-mcp.unwrapped  # from nix-sandbox-mcp.overlays.default";
      description = ''
        The nix-sandbox-mcp daemon, without sandboxes or configuration.
        {option}`finalPackage` wraps it with bubblewrap, the sandbox artifacts
        the configuration needs (built from this system's `pkgs`) and the
        configuration file. The default is built with the flake's own nixpkgs;
        the overlay's `pkgs.nix-sandbox-mcp.unwrapped` is built with yours
        (rustc 1.89 or later).
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
      type = types.attrsOf environmentType;
      default = { };
      example = literalExpression ''
        {
          python = { preset = "python"; timeout_ms = 60000; };
          data = {
            packages = [ (pkgs.python3.withPackages (ps: [ ps.pandas ps.pyarrow ])) ];
            interpreter = "python";
            memory_mb = 4096;
          };
          tools = [ pkgs.jq pkgs.ripgrep ];
          ruby = nix-sandbox-mcp.lib.mkSandbox {
            inherit pkgs;
            name = "ruby";
            packages = [ pkgs.ruby ];
            interpreter = [ "ruby" "{file}" ];
          };
          remote.flake = "github:me/sandboxes/0123abc#ruby";
        }
      '';
      description = ''
        The environments the server offers, by name. Each is one of
        - a list of packages, or a single package: a sandbox of this
          system's `pkgs` running bash with them on `PATH`;
        - a sandbox artifact from `nix-sandbox-mcp.lib.mkSandbox`;
        - an `[environments.NAME]` table of the configuration file, with
          one of `preset` (`bash`, `python` or `node`), `flake` (a locked
          flake output) or `interpreter` (a host program), or with
          `packages` (and optionally `interpreter`) to build a sandbox;
          plus optional limits, `description`, `file_name`, `network` and
          `seccomp_allow`.
        Sandboxes are built with the system. When empty, the server offers
        the bundled presets bash, python and node.
      '';
    };

    commands = mkOption {
      type = types.attrsOf (types.submodule commandModule);
      default = { };
      example = literalExpression ''
        {
          test = {
            description = "Run the tests, or those whose name contains filter";
            env = "rust";
            argv = [ "cargo" "test" "{{filter}}" ];
            danger = "safe";
            separator = true;
            params.filter = { type = "string"; pattern = "[A-Za-z0-9_:]+"; };
          };
        }
      '';
      description = ''
        Declared commands, by name: each is an MCP tool of its own whose
        typed parameters the agent fills in, run in `env`'s sandbox without
        a shell. Each is a `[commands.NAME]` table of the configuration file
        (docs/commands.md): `description`, `env` and `argv`, plus optional
        `params`, `workdir`, `timeout_ms`, `output_bytes`, `danger`,
        `confirm`, `disabled`, `separator`, `network` and `vars`, checked
        when the system is built. `env` must name one of
        {option}`programs.nix-sandbox-mcp.environments` (or a bundled
        preset when there are none, or `project`).
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
        inherit pkgs sandboxes;
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
  };

  assertions =
    lib.concatLists (lib.mapAttrsToList entryAssertions cfg.environments)
    ++ lib.concatLists (lib.mapAttrsToList commandAssertions cfg.commands)
    ++ [
      {
        assertion = !(cfg.settings ? commands);
        message = "${option}.settings.commands: set commands in ${option}.commands instead, where their environments are checked.";
      }
      {
        assertion = !(cfg.settings ? environments);
        message = "${option}.settings.environments: set environments in ${option}.environments instead, where they may also be packages and sandboxes.";
      }
      {
        assertion = cfg.project == null || !(cfg.environments ? project);
        message = "${option}.environments.project: the name project belongs to the environment ${option}.project creates; rename this entry.";
      }
    ];
}
