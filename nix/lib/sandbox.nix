# mkSandbox: packages + an interpreter -> a sandbox artifact (docs/manifest.md),
#
#   <artifact>/manifest.json   what the daemon loads
#   <artifact>/bin/run         runs code once in this sandbox from a terminal
#
# From nixpkgs it needs only bash and coreutils (which every sandbox contains
# anyway, see build.nix) and, for bin/run, bubblewrap; so
# nix/tests/host-pkgs.nix can stand in for nixpkgs offline and the end-to-end
# test builds artifacts with exactly this code.
let
  util = import ./util.nix;
  schema = import ./schema.nix;
  interpreters = import ./interpreter.nix;
  build = import ./build.nix;
  inherit (util) fail show;

  # The `bin` output when a package has one (nixpkgs puts executables there
  # for multi-output packages), like nixpkgs' lib.getBin.
  binOutput = p: p.bin or p.out or p;
  packageName = p: p.name or (baseNameOf (toString p));

  checkEnv =
    where: env:
    builtins.mapAttrs (
      name: value:
      if !(schema.isVariableName name) || builtins.elem name schema.reservedVariables then
        fail "${where}.${name}" "not a variable a sandbox may set (the jail sets ${builtins.concatStringsSep ", " schema.reservedVariables} itself)"
      else if !(builtins.isString value) then
        fail "${where}.${name}" "expected a string, got ${show value}"
      else
        value
    ) env;

  lines = builtins.concatStringsSep "\n";

  mkSandbox =
    {
      # nixpkgs, or anything with bash, coreutils, bubblewrap and
      # stdenv.hostPlatform.
      pkgs,
      # The nix-sandbox-mcp package whose `run` command bin/run calls; null
      # makes bin/run call the nix-sandbox-mcp found on PATH.
      daemon,
      # The bubblewrap package bin/run puts first on PATH; null leaves PATH
      # as the caller has it.
      bubblewrap ? pkgs.bubblewrap,
      # The environment name the agent uses.
      name,
      # Packages whose executables are on PATH (in this order), and whose
      # runtime closure is all the sandbox can see.
      packages ? [ ],
      # See nix/lib/interpreter.nix: "bash" | "python" | "node" | [ argv ] |
      # { argv; fileName; kind; }.
      interpreter,
      # One line for the agent; defaults to the packages' names and versions.
      description ? null,
      # The config's [defaults] keys, e.g. { timeout_ms = 60000; }.
      limits ? { },
      network ? false,
      # Extra environment variables (stored in the Nix store: no secrets).
      env ? { },
      # Extra symlinks, link -> target inside the closure.
      links ? { },
      # A file from lib.captureShellEnvironment: PATH entries and variables
      # captured from a development shell.
      shellEnvironment ? null,
    }@args:
    let
      where = "mkSandbox ${toString name}";
      interp = interpreters.normalize "${where}: interpreter" interpreter;
      runBash = build.runBash pkgs;

      # Every sandbox also gets a shell and coreutils, after the requested
      # packages, so that /bin/sh, /usr/bin/env, system() and subprocess work.
      allPackages = packages ++ [
        pkgs.bash
        pkgs.coreutils
      ];

      # One bin directory holding every executable of the packages: the
      # sandbox's PATH, where relative interpreter names are resolved, and the
      # root whose runtime closure becomes the sandbox's filesystem.
      tools = runBash "sandbox-${name}-path" { packages = map binOutput allPackages; } ''
        mkdir -p "$out/bin"
        for package in $packages; do
          [ -d "$package/bin" ] || continue
          for program in "$package"/bin/*; do
            [ -f "$program" ] && [ -x "$program" ] || continue
            link="$out/bin/''${program##*/}"
            # The first package providing a name wins, as on a PATH.
            [ -e "$link" ] || [ -L "$link" ] || ln -s "$program" "$link"
          done
        done
        # Scripts and system() expect /bin/sh; bash serves when nothing else does.
        [ -e "$out/bin/sh" ] || ln -s "$(readlink "$out/bin/bash")" "$out/bin/sh"
      '';

      program = builtins.head interp.argv;
      argv = [
        (if util.hasPrefix "/" program then program else "${tools}/bin/${program}")
      ]
      ++ builtins.tail interp.argv;

      # Everything known at evaluation time; the closure and the tool list are
      # added when the artifact is built.
      manifestTemplate = {
        version = 1;
        inherit name;
        description =
          if description != null then
            description
          else if packages != [ ] then
            "${name}: ${builtins.concatStringsSep ", " (map packageName packages)}"
          else
            name;
        interpreter = {
          inherit argv;
          file_name = interp.fileName;
        }
        // util.optionalAttrs (interp.kind != null) { inherit (interp) kind; };
        path = [ "${tools}/bin" ];
        env = interp.env // checkEnv "${where}: env" env;
        links = {
          "/bin/sh" = "${tools}/bin/sh";
          "/usr/bin/env" = "${tools}/bin/env";
        }
        // links;
        limits = schema.checkLimits "${where}: limits" limits;
        network = schema.checkNetwork "${where}: network" network;
      };

      # A file holding every store path the manifest names (the tools, the
      # interpreter, link targets, and paths in variables such as
      # SSL_CERT_FILE). Its runtime closure is the sandbox's filesystem, so
      # everything the manifest points to is visible inside.
      roots = runBash "sandbox-${name}-roots" {
        template = builtins.toJSON manifestTemplate;
        passAsFile = [ "template" ];
      } ''cp "$templatePath" "$out"'';

      daemonProgram = if daemon == null then "nix-sandbox-mcp" else "${daemon}/bin/nix-sandbox-mcp";

      # The manifest is the template plus what only the build knows. The
      # builder splices JSON text: the fields that do not change as Nix wrote
      # them, and `path` and `env` as one item per line so that a captured
      # shell's items (in the same layout, see shell-env.nix) can go first.
      manifestHead = builtins.toJSON (
        builtins.removeAttrs manifestTemplate [
          "path"
          "env"
        ]
      );
      templateEnvNames = builtins.attrNames manifestTemplate.env;
    in
    if !(schema.isValidName name) then
      fail "mkSandbox: name" "${show name} is not a valid environment name (${schema.nameRule})"
    else
      runBash "sandbox-${name}"
        {
          # Nix writes the runtime closure of each root to a file in the build
          # directory: see closureFromGraphs below.
          exportReferencesGraph = [
            "graph-roots"
            roots
          ]
          ++ util.optionals (shellEnvironment != null) [
            "graph-shell"
            shellEnvironment
          ];
          inherit manifestHead;
          templatePath = lines (map builtins.toJSON manifestTemplate.path);
          templateEnv = lines (
            map (n: "${builtins.toJSON n}:${builtins.toJSON manifestTemplate.env.${n}}") templateEnvNames
          );
          templateEnvNames = map (n: "\"${n}\"") templateEnvNames;
          # What must exist inside the closure: the interpreter, the PATH
          # entries and the link targets.
          interpreterProgram = builtins.head argv;
          needed = lines ([ (builtins.head argv) ] ++ manifestTemplate.path ++ builtins.attrValues manifestTemplate.links);
          shellEnvironment = if shellEnvironment == null then "" else shellEnvironment;
          inherit tools;
          passthru = {
            inherit manifestTemplate tools;
            sandboxName = name;
            # mkServer renames artifacts from flakes to their config entry.
            override = newArgs: mkSandbox (args // newArgs);
          };
          meta = {
            description = "nix-sandbox-mcp sandbox ${name}: ${manifestTemplate.description}";
            mainProgram = "run";
          };
        }
        ''
          fail() { echo "${where}: $*" >&2; exit 1; }
          ${build.jsonString}

          # exportReferencesGraph files list each path of the closure, its
          # deriver (empty here), the number of references, then the references.
          closureFromGraphs() {
            local graph path deriver count i reference
            for graph in graph-*; do
              while read -r path; do
                read -r deriver
                read -r count
                for ((i = 0; i < count; i++)); do read -r reference; done
                printf '%s\n' "$path"
              done < "$graph"
            done | sort -u
          }
          closureFromGraphs > closure

          insideClosure() {
            local root
            while read -r root; do
              case "$1" in "$root" | "$root"/*) return 0 ;; esac
            done < closure
            return 1
          }
          [ -x "$interpreterProgram" ] || fail "interpreter $interpreterProgram not found; the packages provide: $(ls "$tools/bin" | tr '\n' ' ')"
          while read -r path; do
            insideClosure "$path" || fail "$path is outside the sandbox's closure; add its package to packages"
            [ -e "$path" ] || fail "$path does not exist"
          done <<< "$needed"

          # The captured shell's items: its PATH entries go first, as in
          # `nix develop`; variables given to mkSandbox win over captured ones.
          shellPath=() shellEnv=()
          if [ -n "$shellEnvironment" ]; then
            section=
            while IFS= read -r line; do
              case $line in
                '{"path":[') section=path ;;
                '],"env":{') section=env ;;
                '}}') section= ;;
                *)
                  item=''${line#,}
                  case $section in
                    path) shellPath+=("$item") ;;
                    env)
                      key=''${item%%:*}
                      case " $templateEnvNames " in *" $key "*) ;; *) shellEnv+=("$item") ;; esac
                      ;;
                    *) fail "$shellEnvironment is not a captured shell environment" ;;
                  esac
                  ;;
              esac
            done < "$shellEnvironment"
          fi

          # Prints its arguments, then the lines of its standard input, as the
          # items of a JSON array or object, separated by commas.
          items() {
            local item separator=
            for item in "$@"; do printf '%s%s' "$separator" "$item"; separator=,; done
            while IFS= read -r item; do
              [ -n "$item" ] || continue
              printf '%s%s' "$separator" "$item"
              separator=,
            done
          }

          {
            printf '%s' "''${manifestHead%\}}"
            printf ',"closure":['
            while read -r path; do printf '"%s"\n' "$path"; done < closure | items
            printf '],"tools":['
            for program in "$tools"/bin/*; do jsonString "''${program##*/}"; echo; done | items
            printf '],"path":['
            items "''${shellPath[@]}" <<< "$templatePath"
            printf '],"env":{'
            items "''${shellEnv[@]}" <<< "$templateEnv"
            printf '}}\n'
          } > manifest.json

          mkdir -p "$out/bin"
          mv manifest.json "$out/manifest.json"
          cat > "$out/bin/run" <<EOF
          #!${pkgs.bash}/bin/bash
          # Runs code once in this sandbox: run CODE | run -f FILE | run - (stdin).
          ${
            if bubblewrap == null then "" else "PATH=${bubblewrap}/bin\\\${PATH:+:\\$PATH} "
          }exec ${daemonProgram} run --artifact $out "\$@"
          EOF
          chmod +x "$out/bin/run"
        '';
in
mkSandbox
