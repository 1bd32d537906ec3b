# Pure evaluation tests of nix/lib, no nixpkgs needed: run nix/tests/eval.sh.
#
# Each test is { expr; expected; } (expr must equal expected) or
# { expr; throws = "text"; } (evaluating expr fully must fail; eval.sh also
# checks that the error message contains the text, e.g. the key at fault).
let
  lib' = import ../lib;
  pkgs = import ./fake-pkgs.nix;
  inherit (pkgs) daemon;

  mkSandbox = args: lib'.mkSandbox ({ inherit pkgs daemon; } // args);
  presets = import ../presets { inherit pkgs mkSandbox; };
  mkServer =
    args:
    lib'.mkServer (
      {
        inherit pkgs daemon presets;
        flakeSource = "/nix/store/00000000000000000000000000000000-source";
      }
      // args
    );

  python = mkSandbox {
    name = "python";
    packages = [ pkgs.python3 ];
    interpreter = "python";
    env.EXTRA = "1";
    limits.timeout_ms = 60000;
  };
  pythonRoots = python.drvAttrs.exportReferencesGraph;
  toolsPath = "${python.tools}";

  ruby = mkSandbox {
    name = "ruby";
    packages = [ pkgs.multiOutput ];
    interpreter = {
      argv = [
        "/nix/store/00000000000000000000000000000000-ruby/bin/ruby"
        "-w"
      ];
      fileName = "main.rb";
    };
    description = "Ruby";
    network = true;
  };

  # A development shell as `derivation` makes it; never built here.
  shell = derivation {
    name = "project-shell";
    system = "x86_64-linux";
    builder = "/bin/sh";
    args = [ "-e" "never-run" ];
    GREETING = "hello";
    allowedReferences = [ ];
  };
  projectFlake.devShells.x86_64-linux.default = shell;
  project = lib'.projectSandbox {
    inherit pkgs;
    runtime = { inherit daemon; };
    project = projectFlake;
  };
  capture = builtins.elemAt project.drvAttrs.exportReferencesGraph 3;

  entry = name: ref: attrPath: interpreter: { inherit name ref attrPath interpreter; };
  flakeOutputs = {
    packages.x86_64-linux = {
      default = "packages default";
      tool = "packages tool";
    };
    legacyPackages.x86_64-linux.tool = "legacy tool";
    legacyPackages.x86_64-linux.only = "legacy only";
    sandboxes.ruby = "top-level";
  };
  lookup = e: lib'.flakeOutput {
    system = "x86_64-linux";
    entry = e;
    outputs = flakeOutputs;
  };
  fromFlake = e: value: lib'.artifactFromFlakeOutput {
    inherit pkgs value;
    runtime = { inherit daemon; };
    entry = e;
  };

  serverWith = config: mkServer { inherit config; };
  # nix/default.nix bound to a nixpkgs that fails when used: start-up builds
  # must not touch it.
  startup = import ../default.nix {
    self = "/nix/store/00000000000000000000000000000000-source";
    nixpkgs = throw "this flake's nixpkgs was used";
  };
  runningDaemon = "/nix/store/11111111111111111111111111111111-nix-sandbox-mcp-0.1.0";
  # The project's own nixpkgs: the fake one with another bash.
  projectPkgs = pkgs // {
    bash = pkgs.bash // {
      outPath = "/nix/store/22222222222222222222222222222222-bash-5.2p37";
    };
  };

  # JSON that names store paths (fromJSON refuses strings with a context).
  decode = s: builtins.fromJSON (builtins.unsafeDiscardStringContext s);
  # The builder's script, which writes bin/run.
  runScript = artifact: builtins.elemAt artifact.drvAttrs.args 3;
  builtinOf = server: builtins.attrNames server.sandboxes;

  throwsTests = {
    "a grant to a project file's command names its key when wrong" = {
      expr = (import ../lib/schema.nix).checkConfig {
        project.grants.deploy.danger = "harmless";
      };
      throws = "project.grants.deploy.danger";
    };
    # Names
    "mkSandbox rejects a name with a space" = {
      expr = (mkSandbox { name = "a b"; interpreter = "bash"; }).manifestTemplate;
      throws = "mkSandbox: name: \"a b\" is not a valid environment name";
    };
    "mkSandbox rejects a name starting with a dash" = {
      expr = (mkSandbox { name = "-x"; interpreter = "bash"; }).manifestTemplate;
      throws = "is not a valid environment name";
    };

    # Interpreters
    "an unknown interpreter name is refused with a hint" = {
      expr = lib'.normalizeInterpreter "interpreter" "ruby";
      throws = "interpreter: \"ruby\" is not one of bash, node, python; for another interpreter give its command";
    };
    "an empty argv is refused" = {
      expr = lib'.normalizeInterpreter "interpreter" [ ];
      throws = "interpreter.argv: expected a non-empty list of strings";
    };
    "a placeholder as program is refused" = {
      expr = lib'.normalizeInterpreter "interpreter" [ "{file}" ];
      throws = "interpreter.argv: \"{file}\" is not a program";
    };
    "an unknown kind is refused" = {
      expr = lib'.normalizeInterpreter "interpreter" {
        argv = [ "perl" ];
        kind = "perl";
      };
      throws = "interpreter.kind: expected null or one of bash, node, python";
    };
    "a file name with a slash is refused" = {
      expr = lib'.normalizeInterpreter "interpreter" {
        argv = [ "ruby" ];
        fileName = "a/b.rb";
      };
      throws = "interpreter.fileName: expected a plain file name";
    };
    "an unknown interpreter key is refused" = {
      expr = lib'.normalizeInterpreter "interpreter" {
        argv = [ "ruby" ];
        filename = "x.rb";
      };
      throws = "interpreter.filename: unknown key";
    };
    "an interpreter of the wrong type is refused" = {
      expr = lib'.normalizeInterpreter "interpreter" 42;
      throws = "interpreter: expected a string, a list or an attrset";
    };

    # mkSandbox arguments
    "mkSandbox refuses a reserved variable" = {
      expr = (mkSandbox { name = "x"; interpreter = "bash"; env.HOME = "/root"; }).manifestTemplate;
      throws = "mkSandbox x: env.HOME: not a variable a sandbox may set";
    };
    "mkSandbox refuses a variable that is not a string" = {
      expr = (mkSandbox { name = "x"; interpreter = "bash"; env.N = 1; }).manifestTemplate;
      throws = "mkSandbox x: env.N: expected a string, got 1";
    };
    "mkSandbox refuses an unknown limit" = {
      expr = (mkSandbox { name = "x"; interpreter = "bash"; limits.timeout = 5; }).manifestTemplate;
      throws = "mkSandbox x: limits.timeout: unknown key";
    };
    "mkSandbox refuses a limit out of range" = {
      expr = (mkSandbox { name = "x"; interpreter = "bash"; limits.output_bytes = 10; }).manifestTemplate;
      throws = "mkSandbox x: limits.output_bytes: expected an integer between 256 and 16777216, got 10";
    };
    "mkSandbox refuses credentials, which only the server's configuration may hold" = {
      expr = (mkSandbox {
        name = "x";
        interpreter = "bash";
        network = {
          allow = [ "api.github.com" ];
          credentials = [ { host = "api.github.com"; value_from.file = "/home/u/.ssh/id_ed25519"; } ];
        };
      }).manifestTemplate;
      throws = "mkSandbox x: network: an artifact cannot hold credentials or request rules";
    };
    "a server configuration's credentials pass the schema" = {
      expr = builtins.isAttrs (lib'.planServer {
        environments.gh = {
          preset = "bash";
          network = {
            allow = [ "api.github.com" ];
            credentials = [ { host = "api.github.com"; scheme = "Bearer"; value_from.env = "GH_TOKEN"; methods = [ "GET" ]; } ];
            requests = [ { host = "api.github.com"; paths = [ "/repos/" ]; action = "allow"; } ];
          };
        };
      });
      expected = true;
    };
    "a credential with an unknown source is refused with the key" = {
      expr = lib'.planServer {
        environments.gh = {
          preset = "bash";
          network = {
            allow = [ "api.github.com" ];
            credentials = [ { host = "api.github.com"; value_from.url = "https://x"; } ];
          };
        };
      };
      throws = "environments.gh.network";
    };
    "mkSandbox refuses a network that is neither a switch nor an allowlist" = {
      expr = (mkSandbox { name = "x"; interpreter = "bash"; network = "yes"; }).manifestTemplate;
      throws = "mkSandbox x: network: expected false, true, or a table such as { allow";
    };

    # Configuration
    "an environment without a source is refused" = {
      expr = lib'.planServer { environments.foo.description = "nothing"; };
      throws = "environments.foo: set exactly one of preset, interpreter or flake";
    };
    "an environment with two sources is refused" = {
      expr = lib'.planServer {
        environments.foo = {
          preset = "bash";
          interpreter = "sh";
        };
      };
      throws = "environments.foo: set exactly one of preset, interpreter or flake";
    };
    "an unknown preset is refused" = {
      expr = lib'.planServer { environments.foo.preset = "ruby"; };
      throws = "environments.foo.preset: expected one of \"bash\"";
    };
    "an invalid environment name is refused" = {
      expr = lib'.planServer { environments."a b".preset = "bash"; };
      throws = "environments.a b: \"a b\" is not a valid environment name";
    };
    "a command as docs/commands.md writes it passes the check" = {
      expr =
        (builtins.tryEval (
          builtins.deepSeq (lib'.planServer {
            commands.test = {
              description = "Run the tests";
              env = "bash";
              argv = [ "cargo" "test" "{{filter}}" ];
              workdir = "crates/core";
              timeout_ms = 600000;
              output_bytes = 65536;
              danger = "safe";
              separator = true;
              vars.RUST_BACKTRACE = "1";
              network.allow = [ "crates.io" ];
              params.filter = {
                type = "string";
                description = "Part of a test name";
                pattern = "[A-Za-z0-9_:]+";
              };
              params.count = {
                type = "integer";
                min = 1;
                max = 200;
                default = 20;
              };
            };
          }) true
        )).success;
      expected = true;
    };
    "a command's value out of its set is refused, named" = {
      expr = lib'.planServer {
        commands.test = {
          description = "d";
          env = "bash";
          argv = [ "true" ];
          danger = "low";
        };
      };
      throws = "commands.test.danger: expected \"safe\" or \"moderate\" or \"high\", got \"low\"";
    };
    "a command's parameter of an unknown type is refused, named" = {
      expr = lib'.planServer {
        commands.test = {
          description = "d";
          env = "bash";
          argv = [ "true" "{{x}}" ];
          params.x.type = "strin";
        };
      };
      throws = "commands.test.params.x.type: expected one of \"string\", \"integer\", \"number\", \"boolean\", \"enum\" or \"path\", got \"strin\"";
    };
    "a command without argv is refused" = {
      expr = lib'.planServer {
        commands.test = {
          description = "d";
          env = "bash";
        };
      };
      throws = "commands.test: missing argv";
    };
    "an invalid command name is refused" = {
      expr = lib'.planServer { commands."a b" = { description = "d"; env = "bash"; argv = [ "true" ]; }; };
      throws = "commands.a b: not a valid name here";
    };
    "an unknown table is refused" = {
      expr = lib'.planServer { enviroments = { }; };
      throws = "enviroments: unknown table";
    };
    "an unknown key is refused" = {
      expr = lib'.planServer { server.max_runs = 2; };
      throws = "server.max_runs: unknown key";
    };
    "an unknown environment key is refused" = {
      expr = lib'.planServer {
        environments.py = {
          preset = "python";
          timeout = 5;
        };
      };
      throws = "environments.py.timeout: unknown key";
    };
    "a zero limit is refused" = {
      expr = lib'.planServer { defaults.memory_mb = 0; };
      throws = "defaults.memory_mb: expected an integer of at least 1, got 0";
    };
    "a limit of the wrong type is refused" = {
      expr = lib'.planServer { defaults.timeout_ms = "soon"; };
      throws = "defaults.timeout_ms: expected an integer between 1 and 86400000, got \"soon\"";
    };
    "a relative project path is refused" = {
      expr = lib'.planServer { project.path = "src"; };
      throws = "project.path: expected an absolute path";
    };
    "a mount point the sandbox provides is refused, as the daemon refuses it" = {
      expr = lib'.planServer { project.mount_point = "/usr/src/p"; };
      throws = "project.mount_point: expected an absolute path such as /project, not / or /workspace";
    };
    "a mount point with .. is refused" = {
      expr = lib'.planServer { project.mount_point = "/srv/../etc"; };
      throws = "project.mount_point: expected an absolute path";
    };
    "a network allowlist with a URL in it is refused, as the daemon refuses it" = {
      expr = lib'.planServer { environments.py = { preset = "python"; network.allow = [ "https://pypi.org" ]; }; };
      throws = "environments.py.network: expected false, true, or a table";
    };
    "a CPU quota of no cores is refused" = {
      expr = lib'.planServer { defaults.cpus = 0; };
      throws = "defaults.cpus: expected a number of CPU cores between 0.01 and 1024";
    };
    "a bad project mode is refused" = {
      expr = lib'.planServer { project.mode = "rw"; };
      throws = "project.mode: expected one of \"overlay\", \"readonly\", \"readwrite\"";
    };
    "inheriting a reserved variable is refused" = {
      expr = lib'.planServer { project.inherit_env.vars = [ "PATH" ]; };
      throws = "project.inherit_env.vars: expected a list, each item a variable name";
    };
    "a bad file name is refused" = {
      expr = lib'.planServer {
        environments.rb = {
          interpreter = "ruby";
          file_name = "../x.rb";
        };
      };
      throws = "environments.rb.file_name: expected a plain file name";
    };
    "an empty interpreter is refused" = {
      expr = lib'.planServer { environments.rb.interpreter = " "; };
      throws = "environments.rb.interpreter: expected a command";
    };
    "a table that is not a table is refused" = {
      expr = lib'.planServer { defaults = 5; };
      throws = "defaults: expected a table, got 5";
    };
    "a flake environment may not shadow a used preset" = {
      expr = lib'.planServer {
        environments.python.flake = "github:o/r#x";
        environments.py.preset = "python";
      };
      throws = "environments.python: a flake environment may not be named python while environments.py uses the python preset";
    };
    "the project name is reserved with use_flake" = {
      expr = lib'.planServer {
        project.use_flake = true;
        environments.project.preset = "bash";
      };
      throws = "environments.project: the name project belongs to the devShell environment";
    };
    "a malformed flake reference is refused" = {
      expr = lib'.planServer { environments.x.flake = "#attr"; };
      throws = "environments.x.flake: \"#attr\" is not a flake reference";
    };

    # Servers and flakes
    "a flake without the named output is reported" = {
      expr = lookup (entry "x" "github:o/r" [ "missing" ] null);
      throws = "environments.x.flake: github:o/r has none of packages.x86_64-linux.missing, legacyPackages.x86_64-linux.missing, missing";
    };
    "a package from a flake needs an interpreter" = {
      expr = fromFlake (entry "tool" "github:o/r" [ "tool" ] null) pkgs.jq;
      throws = "environments.tool: github:o/r is a package, not a sandbox artifact";
    };
    "mkServer validates its config" = {
      expr = (serverWith { defaults.pids = -1; }).sandboxes;
      throws = "defaults.pids: expected an integer of at least 1, got -1";
    };
    "a project flake without a devShell is reported" = {
      expr = (lib'.projectSandbox { inherit pkgs; runtime = { inherit daemon; }; project = { }; }).manifestTemplate;
      throws = "project: the project flake has no devShells.x86_64-linux.default";
    };
  };

  # The flake's VM test, with runNixOSTest standing in as the identity:
  # its machine's configuration and its script, evaluated.
  vmTest = import ./vm.nix {
    pkgs = pkgs // {
      testers.runNixOSTest = test: test;
    };
    nixosModule = ../modules/nixos.nix;
  };
  vmMachine = vmTest.nodes.machine { inherit pkgs; };

  valueTests = {
    "grants to a project file's commands pass the schema" = {
      expr = builtins.deepSeq ((import ../lib/schema.nix).checkConfig {
        project.grants.deploy = {
          network.allow = [ "staging.example.com" ];
          danger = "safe";
          timeout_ms = 600000;
        };
      }) true;
      expected = true;
    };
    "the VM test's script checks what the module gives: an overlay project, not a read-only one, and two replicas over HTTP" = {
      expr = {
        overlay = builtins.match ".*copy-on-write overlay.*changes.*test -e /srv/project/new.*" vmTest.testScript != null;
        readOnly = builtins.match ".*Read-only file system.*" vmTest.testScript != null;
        subtests = builtins.length (builtins.filter builtins.isList (builtins.split "with subtest" vmTest.testScript));
        projectPath = vmMachine.programs.nix-sandbox-mcp.settings.project.path;
        # The module's default mode is the daemon's: overlay.
        modeSet = vmMachine.programs.nix-sandbox-mcp.settings.project ? mode;
        replicas = builtins.match ".*8765, \"r1\"[)], [(]8766, \"r2\".*" vmTest.testScript != null;
        http = vmMachine.services.nix-sandbox-mcp.http;
      };
      expected = {
        overlay = true;
        readOnly = false;
        subtests = 8;
        replicas = true;
        http = {
          enable = true;
          listen = "127.0.0.1:8765";
          replicas = 2;
          socketActivation = true;
        };
        projectPath = "/srv/project";
        modeSet = false;
      };
    };

    "the reserved variables and presets are the daemon's, from its generated schema" = {
      expr = {
        inherit (import ../lib/schema.nix) reservedVariables presetNames;
      };
      expected = {
        reservedVariables = generatedSchema."x-nix-sandbox-mcp".reservedVariables;
        presetNames = [
          "bash"
          "python"
          "node"
        ];
      };
    };
    "config.example.toml documents exactly the keys the schema checks" = {
      expr = {
        undocumented = builtins.filter (k: !(builtins.elem k exampleKeyNames)) schemaKeyNames;
        unchecked = builtins.filter (k: !(builtins.elem k schemaKeyNames)) exampleKeyNames;
      };
      expected = {
        undocumented = [ ];
        unchecked = [ ];
      };
    };

    "docs quote the daemon's nix build commands, flag for flag" = {
      expr = {
        inherit nixBuild;
        nix = buildLines ../../docs/nix.md;
        manifest = map (line: builtins.match ".*`(nix build [^`]*)`.*" line) (buildLines ../../docs/manifest.md);
      };
      expected = {
        nixBuild = [ "--extra-experimental-features" "nix-command flakes" "build" "--no-link" "--json" ];
        nix = [ referenceCommand expressionCommand ];
        manifest = [ [ "nix build --no-link --json REF" ] ];
      };
    };

    # Names
    "valid names are accepted" = {
      expr = map lib'.isValidName [ "python" "a.b-c_d" "0x" "A" ];
      expected = [ true true true true ];
    };
    "invalid names are rejected" = {
      expr = map lib'.isValidName [ "" "-a" ".a" "a b" "é" "a/b" (builtins.concatStringsSep "" (builtins.genList (_: "a") 65)) ];
      expected = [ false false false false false false false ];
    };
    "a 64-character name is accepted" = {
      expr = lib'.isValidName (builtins.concatStringsSep "" (builtins.genList (_: "a") 64));
      expected = true;
    };

    # Interpreters
    "a known interpreter name gives its program, file name, kind and variables" = {
      expr = lib'.normalizeInterpreter "i" "python";
      expected = {
        argv = [ "python3" "{file}" ];
        fileName = ".main.py";
        kind = "python";
        env = {
          PYTHONUNBUFFERED = "1";
          PYTHONDONTWRITEBYTECODE = "1";
        };
      };
    };
    "bash and node use the daemon's file names" = {
      expr = map (k: (lib'.normalizeInterpreter "i" k).fileName) [ "bash" "node" ];
      expected = [ ".main.sh" ".main.js" ];
    };
    "a command's kind follows its program name" = {
      expr = map (argv: (lib'.normalizeInterpreter "i" argv).kind) [
        [ "python3.12" "-X" "dev" ]
        [ "/nix/store/x-bash/bin/bash" ]
        [ "node22" ]
        [ "ruby" "{file}" ]
      ];
      expected = [ "python" "bash" "node" null ];
    };
    "a command without a kind uses .main" = {
      expr = (lib'.normalizeInterpreter "i" [ "ruby" ]).fileName;
      expected = ".main";
    };
    "an explicit null kind turns the guess off" = {
      expr = lib'.normalizeInterpreter "i" {
        argv = [ "python3" ];
        kind = null;
        fileName = "x.py";
      };
      expected = {
        argv = [ "python3" ];
        fileName = "x.py";
        kind = null;
        env = { };
      };
    };

    # mkSandbox
    "the manifest template follows docs/manifest.md" = {
      expr = python.manifestTemplate;
      expected = {
        version = 1;
        name = "python";
        description = "python: python3-3.13.5";
        interpreter = {
          argv = [ "${toolsPath}/bin/python3" "{file}" ];
          file_name = ".main.py";
          kind = "python";
        };
        path = [ "${toolsPath}/bin" ];
        env = {
          EXTRA = "1";
          PYTHONUNBUFFERED = "1";
          PYTHONDONTWRITEBYTECODE = "1";
        };
        links = {
          "/bin/sh" = "${toolsPath}/bin/sh";
          "/usr/bin/env" = "${toolsPath}/bin/env";
        };
        limits.timeout_ms = 60000;
        network = false;
      };
    };
    "the builder gets the manifest template as JSON text, path and env one item per line" = {
      expr = {
        head = decode python.drvAttrs.manifestHead;
        path = python.drvAttrs.templatePath;
        env = decode "{${builtins.replaceStrings [ "\n" ] [ "," ] python.drvAttrs.templateEnv}}";
        names = python.drvAttrs.templateEnvNames;
      };
      expected = {
        head = builtins.removeAttrs python.manifestTemplate [ "path" "env" ];
        path = builtins.toJSON "${toolsPath}/bin";
        env = python.manifestTemplate.env;
        names = [ "\"EXTRA\"" "\"PYTHONDONTWRITEBYTECODE\"" "\"PYTHONUNBUFFERED\"" ];
      };
    };
    "every derivation mkSandbox makes is built by bash with coreutils, nothing else from nixpkgs" = {
      expr = map (d: { inherit (d.drvAttrs) builder PATH; }) [
        python
        python.tools
        (builtins.elemAt pythonRoots 1)
      ];
      expected = builtins.genList (_: {
        builder = "${pkgs.bash}/bin/bash";
        PATH = "${pkgs.coreutils}/bin";
      }) 3;
    };
        "the closure root names the manifest's paths; the tools hold every package's bin output, bash and coreutils last" = {
      expr = {
        graph = builtins.head pythonRoots;
        name = (builtins.elemAt pythonRoots 1).name;
        root = decode (builtins.elemAt pythonRoots 1).drvAttrs.template;
        packages = map toString python.tools.drvAttrs.packages;
        rubyPackages = map toString ruby.tools.drvAttrs.packages;
      };
      expected = {
        graph = "graph-roots";
        name = "sandbox-python-roots";
        root = python.manifestTemplate;
        packages = map toString [ pkgs.python3 pkgs.bash pkgs.coreutils ];
        rubyPackages = map toString [ pkgs.multiOutput.bin pkgs.bash pkgs.coreutils ];
      };
    };
    "an absolute program is kept, and arguments, description and network are passed through" = {
      expr = {
        inherit (ruby.manifestTemplate) interpreter description network;
      };
      expected = {
        interpreter = {
          argv = [ "/nix/store/00000000000000000000000000000000-ruby/bin/ruby" "-w" ];
          file_name = "main.rb";
        };
        description = "Ruby";
        network = true;
      };
    };
    "without packages the description is the name" = {
      expr = (mkSandbox { name = "plain"; interpreter = "bash"; }).manifestTemplate.description;
      expected = "plain";
    };
    "extra links are added to /bin/sh and /usr/bin/env" = {
      expr = builtins.attrNames (mkSandbox {
        name = "x";
        interpreter = "bash";
        links."/lib64/ld-linux-x86-64.so.2" = "/nix/store/00000000000000000000000000000000-glibc/lib/ld.so";
      }).manifestTemplate.links;
      expected = [ "/bin/sh" "/lib64/ld-linux-x86-64.so.2" "/usr/bin/env" ];
    };
    "bin/run calls the daemon's run command with bubblewrap on PATH" = {
      expr = map (s: builtins.match ".*${s}.*" (runScript python) != null) [
        "#!${pkgs.bash}/bin/bash"
        "PATH=${pkgs.bubblewrap}/bin"
        "exec ${daemon}/bin/nix-sandbox-mcp run --artifact \\$out \"\\\\\\$@\""
      ];
      expected = [ true true true ];
    };
    "without a daemon or bubblewrap bin/run uses the caller's PATH" = {
      expr =
        let
          script = runScript (python.override {
            daemon = null;
            bubblewrap = null;
          });
        in
        {
          daemonFromPath = builtins.match ".*\nexec nix-sandbox-mcp run --artifact .*" script != null;
          setsPath = builtins.match ".*PATH=.*exec.*" script != null;
        };
      expected = {
        daemonFromPath = true;
        setsPath = false;
      };
    };
    "override renames an artifact" = {
      expr = (python.override { name = "py"; }).manifestTemplate.name;
      expected = "py";
    };
    "artifacts remember their name" = {
      expr = python.sandboxName;
      expected = "python";
    };

    # Presets
    "the presets are bash, node and python" = {
      expr = builtins.attrNames presets;
      expected = [ "bash" "node" "python" ];
    };
    "preset descriptions carry versions" = {
      expr = builtins.mapAttrs (_: p: p.manifestTemplate.description) presets;
      expected = {
        bash = "Bash 5.3p3 with bc, coreutils, diffutils, fd, file, findutils, gawk, grep, jq, ripgrep, sed, tree";
        python = "Python 3.13.5 with requests 2.32, python-dateutil 2.9, tabulate 0.9, attrs 25.3";
        node = "Node.js 22.17.0";
      };
    };
    "preset interpreters have their kinds" = {
      expr = builtins.mapAttrs (_: p: p.manifestTemplate.interpreter.kind) presets;
      expected = {
        bash = "bash";
        python = "python";
        node = "node";
      };
    };
        "the python preset's CA bundle is a closure root, so it is visible inside" = {
      expr =
        let
          roots = builtins.elemAt presets.python.drvAttrs.exportReferencesGraph 1;
        in
        {
          manifest = presets.python.manifestTemplate.env.SSL_CERT_FILE;
          root = (decode roots.drvAttrs.template).env.SSL_CERT_FILE;
        };
      expected = {
        manifest = "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt";
        root = "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt";
      };
    };

    # Configuration -> plan
    "without environments every preset is baked in" = {
      expr = lib'.planServer { };
      expected = {
        presets = [ "bash" "python" "node" ];
        flakes = [ ];
        projectShell = false;
      };
    };
    "presets are baked in once, by canonical name" = {
      expr = (lib'.planServer {
        environments = {
          a.preset = "shell";
          b.preset = "bash";
          c.preset = "python3";
          d.interpreter = "ruby {file}";
        };
      }).presets;
      expected = [ "bash" "python" ];
    };
    "flake entries are parsed" = {
      expr = (lib'.planServer {
        environments = {
          rb = {
            flake = "github:org/repo#sandboxes.ruby";
            interpreter = "ruby  -w {file}";
          };
          tool.flake = "path:/srv/tool";
        };
      }).flakes;
      expected = [
        {
          name = "rb";
          ref = "github:org/repo";
          attrPath = [ "sandboxes" "ruby" ];
          interpreter = [ "ruby" "-w" "{file}" ];
        }
        {
          name = "tool";
          ref = "path:/srv/tool";
          attrPath = null;
          interpreter = null;
        }
      ];
    };
    "use_flake asks for the project environment" = {
      expr = (lib'.planServer { project.use_flake = true; }).projectShell;
      expected = true;
    };
    "a full configuration passes" = {
      expr = (lib'.planServer {
        server = {
          max_concurrent_runs = 4;
          max_queued_runs = 0;
          audit_log = "/var/log/sandbox.jsonl";
          audit_log_code = true;
        };
        defaults = {
          timeout_ms = 5000;
          open_files = 64;
        };
        project = {
          path = "/srv/project";
          mount_point = "/code";
          mode = "readwrite";
          inherit_env.vars = [ "DATABASE_URL" ];
        };
        environments.py = {
          preset = "python";
          network = true;
          seccomp_allow = [ "ptrace" ];
          file_name = "main.py";
          memory_mb = 2048;
        };
      }).presets;
      expected = [ "python" ];
    };

    # Flakes and servers
    "flake outputs are looked up like nix build does" = {
      expr = map lookup [
        (entry "a" "r" [ "tool" ] null)
        (entry "b" "r" [ "only" ] null)
        (entry "c" "r" [ "sandboxes" "ruby" ] null)
        (entry "d" "r" null null)
      ];
      expected = [ "packages tool" "legacy only" "top-level" "packages default" ];
    };
    "an artifact of the entry's name is used as it is" = {
      expr = (fromFlake (entry "python" "r" null null) python).outPath;
      expected = python.outPath;
    };
    "an artifact is renamed to its entry" = {
      expr = (fromFlake (entry "py3" "r" null null) python).manifestTemplate.name;
      expected = "py3";
    };
    "an interpreter on an artifact replaces its own" = {
      expr = (fromFlake (entry "python" "r" null [ "python3" "-I" ]) python).manifestTemplate.interpreter.argv;
      expected = [ "${toolsPath}/bin/python3" "-I" ];
    };
    "a package with an interpreter becomes a sandbox" = {
      expr = (fromFlake (entry "query" "r" null [ "jq" "-f" "{file}" ]) pkgs.jq).manifestTemplate.interpreter;
      expected = {
        argv = [ "${(fromFlake (entry "query" "r" null [ "jq" ]) pkgs.jq).tools}/bin/jq" "-f" "{file}" ];
        file_name = ".main";
      };
    };
    "a server without environments serves every preset and reads the user's config" = {
      expr = {
        builtin = builtinOf (lib'.wrapServer {
          inherit pkgs daemon;
          artifacts = builtins.attrValues presets;
          flakeSource = "/src";
        });
        hasConfig = builtins.match ".*--config.*" (lib'.wrapServer {
          inherit pkgs daemon;
          artifacts = [ ];
          flakeSource = "/src";
        }).script != null;
      };
      expected = {
        builtin = [ "bash" "node" "python" ];
        hasConfig = false;
      };
    };
    "mkServer bakes in the presets its config uses and passes the config" = {
      expr =
        let
          server = serverWith {
            environments.sh.preset = "shell";
            environments.ruby.interpreter = "ruby";
          };
        in
        {
          builtin = builtinOf server;
          config = builtins.match ".*--add-flags '--config ([^']*)'.*" server.script;
          artifacts = builtins.match ".*--set NIX_SANDBOX_BUILTIN \"([^\"]*)\".*" server.script;
          flake = builtins.match ".*--set NIX_SANDBOX_FLAKE \"([^\"]*)\".*" server.script;
          # client-config names the wrapper, not the daemon behind it.
          command = builtins.match ".*--set NIX_SANDBOX_MCP_COMMAND \"([^\"]*)\".*" server.script;
        };
      expected = {
        builtin = [ "bash" ];
        config = [ "${builtins.storeDir}/00000000000000000000000000000000-nix-sandbox-mcp.toml" ];
        artifacts = [ presets.bash.outPath ];
        flake = [ "/nix/store/00000000000000000000000000000000-source" ];
        command = [ "$out/bin/nix-sandbox-mcp" ];
      };
    };
    "a server of host interpreters only bakes in nothing" = {
      expr = builtins.match ".*--set NIX_SANDBOX_BUILTIN \"\".*" (serverWith { environments.rb.interpreter = "ruby"; }).script != null;
      expected = true;
    };
    "mkServer reads a TOML file" = {
      expr = builtinOf (serverWith ./server-config.toml);
      expected = [ "node" ];
    };
    "mkServer bakes in the project environment when given the project's flake" = {
      expr = builtinOf (mkServer {
        config.project.use_flake = true;
        project = projectFlake;
      });
      expected = [ "bash" "node" "project" "python" ];
    };
    "without the project's flake the daemon builds the project environment itself" = {
      expr = builtinOf (serverWith { project.use_flake = true; });
      expected = [ "bash" "node" "python" ];
    };

    # Start-up builds (the expressions in daemon/src/registry/flakes.rs)
    "a start-up build of the project uses the project's nixpkgs and the running daemon, never this flake's" = {
      expr =
        let
          artifact = startup.projectSandbox {
            system = "x86_64-linux";
            project = projectFlake // {
              inputs.nixpkgs.legacyPackages.x86_64-linux = projectPkgs;
            };
            daemon = runningDaemon;
            bubblewrap = null;
          };
        in
        {
          inherit (artifact.manifestTemplate) name;
          builder = artifact.drvAttrs.builder;
          runsTheRunningDaemon = builtins.match ".*\nexec ${runningDaemon}/bin/nix-sandbox-mcp run .*" (runScript artifact) != null;
          setsPath = builtins.match ".*PATH=.*exec.*" (runScript artifact) != null;
        };
      expected = {
        name = "project";
        builder = "${projectPkgs.bash}/bin/bash";
        runsTheRunningDaemon = true;
        setsPath = false;
      };
    };
    "a project flake without a nixpkgs input falls back to this flake's nixpkgs" = {
      expr = (startup.projectSandbox {
        system = "x86_64-linux";
        project = projectFlake;
        daemon = runningDaemon;
      }).drvPath;
      throws = "this flake's nixpkgs";
    };
    "packagesOf takes a flake's nixpkgs input for the system" = {
      expr = map (flake: (lib'.packagesOf {
        system = "x86_64-linux";
        inherit flake;
        fallback = "fallback";
      }).name or "fallback") [
        { inputs.nixpkgs.legacyPackages.x86_64-linux = { name = "input"; }; }
        { inputs.nixpkgs.legacyPackages.aarch64-linux = { name = "other system"; }; }
        { inputs = { }; }
        { }
      ];
      expected = [ "input" "fallback" "fallback" "fallback" ];
    };
    "an artifact from a flake is rebuilt with the running daemon" = {
      expr = builtins.match ".*exec ${runningDaemon}/bin/nix-sandbox-mcp run .*" (runScript (lib'.artifactFromFlakeOutput {
        inherit pkgs;
        runtime.daemon = runningDaemon;
        entry = entry "python" "r" null null;
        value = python;
      })) != null;
      expected = true;
    };

    # The project's devShell
    "the project environment is bash in the captured shell" = {
      expr = {
        inherit (project.manifestTemplate) name description;
        kind = project.manifestTemplate.interpreter.kind;
        graphs = [ (builtins.head project.drvAttrs.exportReferencesGraph) (builtins.elemAt project.drvAttrs.exportReferencesGraph 2) ];
      };
      expected = {
        name = "project";
        description = "Bash in the project's development shell (project-shell)";
        kind = "bash";
        graphs = [ "graph-roots" "graph-shell" ];
      };
    };
    "the capture is the shell's derivation with its builder's script replaced" = {
      expr = {
        inherit (capture) name;
        inherit (capture.drvAttrs) GREETING builder outputs;
        keepsReferenceChecks = capture.drvAttrs ? allowedReferences;
        runsSetup = builtins.match ".*[.] \"[$]stdenv/setup\".*" (builtins.elemAt capture.drvAttrs.args 1) != null;
        usesJq = builtins.match ".*jq.*" (builtins.elemAt capture.drvAttrs.args 1) != null;
      };
      expected = {
        name = "project-shell-sandbox-environment";
        GREETING = "hello";
        builder = "/bin/sh";
        outputs = [ "out" ];
        keepsReferenceChecks = false;
        runsSetup = true;
        usesJq = false;
      };
    };
  };

  # The daemon's start-up `nix build` commands, from the constants in
  # flakes.rs, written as a shell command line.
  flakesRs = builtins.readFile ../../daemon/src/registry/flakes.rs;
  rustArray =
    name:
    let
      after = builtins.elemAt (builtins.split "const ${name}: &[[]&str] = &[[]" flakesRs) 2;
      body = builtins.head (builtins.split "];" after);
    in
    map builtins.head (builtins.filter builtins.isList (builtins.split "\"([^\"]*)\"" body));
  shellWords = words: builtins.concatStringsSep " " (map (w: if builtins.match ".* .*" w != null then "'${w}'" else w) words);
  nixBuild = rustArray "NIX_BUILD";
  referenceCommand = "nix ${shellWords nixBuild} REF";
  expressionCommand = "nix ${shellWords (nixBuild ++ rustArray "NIX_BUILD_EXPRESSION")} 'EXPRESSION'";
  # The lines of a document that show a `nix build` command.
  buildLines =
    file:
    builtins.filter (line: builtins.isString line && builtins.match ".*build --no-link.*" line != null) (
      builtins.split "\n" (builtins.readFile file)
    );

  # Every key config.example.toml documents (set or commented out, in any
  # table), by name.
  exampleKeyNames =
    let
      lines = builtins.filter builtins.isString (
        builtins.split "\n" (builtins.readFile ../../config.example.toml)
      );
      keyOf = line: builtins.match "#? *([a-z_]+) *=.*" line;
    in
    (import ../lib/util.nix).unique (
      map builtins.head (builtins.filter (k: k != null) (map keyOf lines))
    );
  schemaKeyNames = (import ../lib/schema.nix).keyNames;
  generatedSchema = builtins.fromJSON (builtins.readFile ../lib/config-schema.json);

  in
import ./harness.nix (throwsTests // valueTests)
