# Servers: the daemon wrapped with the sandbox artifacts it serves
# (NIX_SANDBOX_BUILTIN), bubblewrap on PATH and, for mkServer, its config file.
# The wrapper names itself (NIX_SANDBOX_MCP_COMMAND) so that `client-config`
# tells clients to start it, not the bare daemon behind it.
let
  util = import ./util.nix;
  configLib = import ./config.nix;
  mkSandbox = import ./sandbox.nix;
  captureShellEnvironment = import ./shell-env.nix;
  inherit (util) fail;

  # The daemon with the artifacts it serves baked in.
  wrapServer =
    {
      pkgs,
      daemon,
      # Sandbox artifacts (mkSandbox results), loaded at start-up.
      artifacts,
      # A config file to pass with --config, or null to read the user's own
      # (~/.config/nix-sandbox-mcp/config.toml) as the plain daemon does.
      configFile ? null,
      # The nix-sandbox-mcp flake's source. The daemon evaluates its
      # lib.projectSandbox at run time to build a project's devShell
      # environment ([project] use_flake = true).
      flakeSource,
    }:
    pkgs.runCommand "nix-sandbox-mcp-${daemon.version}"
      {
        nativeBuildInputs = [ pkgs.makeBinaryWrapper ];
        passthru = {
          unwrapped = daemon;
          inherit configFile;
          sandboxes = builtins.listToAttrs (
            map (a: {
              name = a.sandboxName;
              value = a;
            }) artifacts
          );
        };
        meta = daemon.meta // {
          mainProgram = "nix-sandbox-mcp";
        };
      }
      ''
        makeBinaryWrapper ${daemon}/bin/nix-sandbox-mcp "$out/bin/nix-sandbox-mcp" \
          --prefix PATH : "${pkgs.bubblewrap}/bin" \
          --set NIX_SANDBOX_BUILTIN "${builtins.concatStringsSep ":" (map toString artifacts)}" \
          --set NIX_SANDBOX_FLAKE "${flakeSource}" \
          --set NIX_SANDBOX_MCP_COMMAND "$out/bin/nix-sandbox-mcp" ${
            if configFile == null then "" else "--add-flags '--config ${configFile}'"
          }
      '';

  # The `project` environment: bash in the project flake's development shell.
  # `runtime` holds mkSandbox's daemon and, optionally, bubblewrap.
  projectSandbox =
    {
      pkgs,
      runtime,
      project,
    }:
    let
      system = pkgs.stdenv.hostPlatform.system;
      shell =
        project.devShells.${system}.default or project.devShell.${system}
          or (fail "project" "the project flake has no devShells.${system}.default to build the project environment from");
    in
    mkSandbox (
      {
        inherit pkgs;
        name = "project";
        interpreter = "bash";
        description = "Bash in the project's development shell (${shell.name})";
        shellEnvironment = captureShellEnvironment { inherit shell; };
      }
      // runtime
    );

  # The nixpkgs a flake builds with: its `nixpkgs` input's packages for the
  # system, or `fallback` (which is then evaluated) when it has none.
  packagesOf =
    {
      system,
      flake,
      fallback,
    }:
    let
      input = flake.inputs.nixpkgs or { };
    in
    if input ? legacyPackages.${system} then input.legacyPackages.${system} else fallback;

  # The output a `flake = "ref#attr"` entry names, looked up the way
  # `nix build ref#attr` does.
  flakeOutput =
    {
      system,
      entry,
      outputs,
    }:
    let
      candidates =
        if entry.attrPath == null then
          [
            [ "packages" system "default" ]
            [ "defaultPackage" system ]
          ]
        else
          [
            ([ "packages" system ] ++ entry.attrPath)
            ([ "legacyPackages" system ] ++ entry.attrPath)
            entry.attrPath
          ];
      found = builtins.filter (path: util.hasAttrByPath path outputs) candidates;
    in
    if found == [ ] then
      fail "environments.${entry.name}.flake" "${entry.ref} has none of ${builtins.concatStringsSep ", " (map (builtins.concatStringsSep ".") candidates)}"
    else
      util.getAttrByPath (builtins.head found) outputs;

  # A flake output as the artifact for its entry, named after the entry: the
  # daemon matches flake entries to baked-in artifacts by name. An artifact
  # made by mkSandbox is rebuilt with `runtime` (the server's daemon), so that
  # the flake's own daemon is neither downloaded nor compiled.
  artifactFromFlakeOutput =
    {
      pkgs,
      runtime,
      entry,
      value,
    }:
    let
      renamed = {
        inherit (entry) name;
      }
      // util.optionalAttrs (entry.interpreter != null) { inherit (entry) interpreter; };
    in
    if value ? sandboxName then
      if value ? override then
        value.override (renamed // runtime)
      else if value.sandboxName == entry.name && entry.interpreter == null then
        value
      else
        fail "environments.${entry.name}" "${entry.ref} is a sandbox artifact named ${value.sandboxName} that cannot be renamed or given another interpreter: build it with lib.mkSandbox"
    else if entry.interpreter == null then
      fail "environments.${entry.name}" "${entry.ref} is a package, not a sandbox artifact: build it with lib.mkSandbox, or set interpreter to run it"
    else
      mkSandbox (
        {
          inherit pkgs;
          inherit (entry) name interpreter;
          packages = if builtins.isList value then value else [ value ];
        }
        // runtime
      );

  # The artifact for one `flake = "ref#attr"` config entry, named after the
  # entry. The daemon builds it at start-up when no server was built from the
  # config (e.g. `nix run` with ~/.config/nix-sandbox-mcp/config.toml), with
  # the nixpkgs of the flake it names (`fallbackPkgs` when that flake has no
  # nixpkgs input) and the running daemon; see flakes.rs for the expression.
  flakeSandbox =
    {
      system,
      fallbackPkgs,
      runtime,
      name,
      flake,
      # The entry's `interpreter` as a list, or null.
      interpreter ? null,
    }:
    let
      entry = configLib.parseFlakeOutput "environments.${name}.flake" flake // {
        inherit name interpreter;
      };
      target = builtins.getFlake entry.ref;
    in
    artifactFromFlakeOutput {
      inherit runtime entry;
      pkgs = packagesOf {
        inherit system;
        flake = target;
        fallback = fallbackPkgs;
      };
      value = flakeOutput {
        inherit system entry;
        inherit (target) outputs;
      };
    };

  mkServer =
    {
      pkgs,
      daemon,
      flakeSource,
      # The bundled presets, by name (nix/presets).
      presets,
      # A TOML file, or an attrset with the same keys.
      config,
      # The project's flake, for [project] use_flake = true; without it the
      # daemon builds the devShell environment when it starts.
      project ? null,
      # Sandbox artifacts by environment name, for the config's entries whose
      # `flake` is that artifact (the modules' Nix-built environments).
      sandboxes ? { },
    }:
    let
      system = pkgs.stdenv.hostPlatform.system;
      settings = if builtins.isAttrs config then config else builtins.fromTOML (builtins.readFile config);
      plan = configLib.planServer settings;

      runtime = { inherit daemon; };
      flakeArtifact =
        entry:
        artifactFromFlakeOutput {
          inherit pkgs runtime entry;
          value = flakeOutput {
            inherit system entry;
            outputs = (builtins.getFlake entry.ref).outputs;
          };
        };

      artifacts =
        map (name: presets.${name}) plan.presets
        ++ map flakeArtifact (builtins.filter (entry: !(sandboxes ? ${entry.name})) plan.flakes)
        ++ util.mapAttrsToList (
          name: artifact: if artifact.sandboxName == name then artifact else artifact.override { inherit name; }
        ) sandboxes
        ++ util.optional (plan.projectShell && project != null) (projectSandbox {
          inherit pkgs runtime project;
        });

      configFile =
        if builtins.isAttrs config then
          (pkgs.formats.toml { }).generate "nix-sandbox-mcp.toml" config
        else
          builtins.path {
            path = config;
            name = "nix-sandbox-mcp.toml";
          };
    in
    wrapServer {
      inherit
        pkgs
        daemon
        artifacts
        configFile
        flakeSource
        ;
    };
in
{
  inherit
    wrapServer
    projectSandbox
    packagesOf
    flakeSandbox
    flakeOutput
    artifactFromFlakeOutput
    mkServer
    ;
}
