# Servers: the daemon wrapped with the sandbox artifacts it serves
# (NIX_SANDBOX_BUILTIN), bubblewrap on PATH and, for mkServer, its config file.
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
          --set NIX_SANDBOX_FLAKE "${flakeSource}" ${
            if configFile == null then "" else "--add-flags '--config ${configFile}'"
          }
      '';

  # The `project` environment: bash in the project flake's development shell.
  projectSandbox =
    {
      pkgs,
      daemon,
      project,
    }:
    let
      system = pkgs.stdenv.hostPlatform.system;
      shell =
        project.devShells.${system}.default or project.devShell.${system}
          or (fail "project" "the project flake has no devShells.${system}.default to build the project environment from");
    in
    mkSandbox {
      inherit pkgs daemon;
      name = "project";
      interpreter = "bash";
      description = "Bash in the project's development shell (${shell.name})";
      shellEnvironment = captureShellEnvironment {
        inherit (pkgs) jq;
        inherit shell;
      };
    };

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
  # daemon matches flake entries to baked-in artifacts by name.
  artifactFromFlakeOutput =
    {
      pkgs,
      daemon,
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
      if value.sandboxName == entry.name && entry.interpreter == null then value else value.override renamed
    else if entry.interpreter == null then
      fail "environments.${entry.name}" "${entry.ref} is a package, not a sandbox artifact: build it with lib.mkSandbox, or set interpreter to run it"
    else
      mkSandbox {
        inherit pkgs daemon;
        inherit (entry) name interpreter;
        packages = if builtins.isList value then value else [ value ];
      };

    # The artifact for one `flake = "ref#attr"` config entry, named after the
  # entry. The daemon builds it at start-up when no server was built from the
  # config (e.g. `nix run` with ~/.config/nix-sandbox-mcp/config.toml):
  #   nix build --impure --expr 'let s = builtins.getFlake "path:<NIX_SANDBOX_FLAKE>";
  #     in s.lib.flakeSandbox { system = builtins.currentSystem; name = "ruby";
  #                             flake = "github:me/envs#ruby"; interpreter = null; }'
  flakeSandbox =
    {
      pkgs,
      daemon,
      name,
      flake,
      # The entry's `interpreter` as a list, or null.
      interpreter ? null,
    }:
    let
      entry = configLib.parseFlakeOutput "environments.${name}.flake" flake // {
        inherit name interpreter;
      };
    in
    artifactFromFlakeOutput {
      inherit pkgs daemon entry;
      value = flakeOutput {
        system = pkgs.stdenv.hostPlatform.system;
        inherit entry;
        outputs = (builtins.getFlake entry.ref).outputs;
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
    }:
    let
      system = pkgs.stdenv.hostPlatform.system;
      settings = if builtins.isAttrs config then config else builtins.fromTOML (builtins.readFile config);
      plan = configLib.planServer settings;

      flakeArtifact =
        entry:
        artifactFromFlakeOutput {
          inherit pkgs daemon entry;
          value = flakeOutput {
            inherit system entry;
            outputs = (builtins.getFlake entry.ref).outputs;
          };
        };

      artifacts =
        map (name: presets.${name}) plan.presets
        ++ map flakeArtifact plan.flakes
        ++ util.optional (plan.projectShell && project != null) (projectSandbox {
          inherit pkgs daemon project;
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
    flakeSandbox
    flakeOutput
    artifactFromFlakeOutput
    mkServer
    ;
}
