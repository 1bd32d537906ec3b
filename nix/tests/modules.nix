# The NixOS and home-manager modules evaluated with nixpkgs' module system
# (lib.evalModules from a nixpkgs `lib` directory) against stub declarations of
# the few NixOS and home-manager options they set, declared as nixpkgs and
# home-manager declare them. No nixpkgs packages: the server is built from
# fake-pkgs.nix by the real mkServer. Also the parts of flake.nix and
# nix/daemon.nix that need nixpkgs' lib. Run by modules.sh.
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
  mkSandbox =
    args:
    lib'.mkSandbox (
      {
        inherit pkgs;
        inherit (fake) daemon;
      }
      // args
    );
  # The flake-bound library (nix/default.nix), bound to the fake packages.
  nixSandbox = {
    daemonFor = _: fake.daemon;
    inherit mkSandbox;
    mkServer =
      {
        pkgs,
        config,
        project,
        daemon,
        sandboxes,
      }:
      lib'.mkServer {
        inherit
          pkgs
          config
          project
          daemon
          sandboxes
          ;
        flakeSource = "/nix/store/00000000000000000000000000000000-source";
        presets = import ../presets {
          inherit pkgs;
          mkSandbox = args: lib'.mkSandbox ({ inherit pkgs daemon; } // args);
        };
      };
  };

  stub = type: default: mkOption { inherit type default; };
  nixPackage = fake.runCommand "nix-2.28.4" { } "";
  # As nixos/modules/misc/assertions.nix (home-manager uses the same).
  checks = {
    options.assertions = stub (types.listOf types.unspecified) [ ];
    options.warnings = stub (types.listOf types.str) [ ];
  };
  # As nixos/modules/security/misc.nix.
  nixosStubs = withUsernsClone: [
    checks
    {
      options.environment.systemPackages = stub (types.listOf types.package) [ ];
      options.security.allowUserNamespaces = stub types.bool true;
    }
    # As nixos/modules/system/boot/systemd.nix, config/users-groups.nix and
    # services/system/nix-daemon.nix declare them, with the units' own
    # options left free.
    {
      options.systemd.services = stub (types.attrsOf (types.attrsOf types.anything)) { };
      options.systemd.sockets = stub (types.attrsOf (types.attrsOf types.anything)) { };
      options.users.users = stub (types.attrsOf (types.attrsOf types.anything)) { };
      options.users.groups = stub (types.attrsOf (types.attrsOf types.anything)) { };
      options.nix.package = stub types.package nixPackage;
    }
    (lib.optionalAttrs withUsernsClone {
      options.security.unprivilegedUsernsClone = stub types.bool false;
    })
  ];
  # As home-manager's modules/programs/mcp.nix: a typed server list.
  mcpServer = types.submodule {
    options = {
      command = stub (types.nullOr types.str) null;
      args = stub (types.listOf types.str) [ ];
      env = stub (types.attrsOf types.str) { };
      url = stub (types.nullOr types.str) null;
    };
  };
  homeStubs =
    {
      sharedList,
      claudeCode,
    }:
    [
      checks
      { options.home.packages = stub (types.listOf types.package) [ ]; }
      # As home-manager's modules/systemd.nix: units as INI sections.
      { options.systemd.user.services = stub (types.attrsOf (types.attrsOf types.anything)) { }; }
      (lib.optionalAttrs sharedList {
        options.programs.mcp = {
          enable = lib.mkEnableOption "mcp";
          servers = stub (types.attrsOf mcpServer) { };
        };
      })
      (lib.optionalAttrs claudeCode {
        options.programs.claude-code.mcpServers = stub (types.attrsOf (types.attrsOf types.anything)) { };
      })
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
  failedAssertions =
    config: map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);

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
  with' = extra: lib.recursiveUpdate enabled { programs.nix-sandbox-mcp = extra; };
  finalPackage = settings: (nixos { inherit settings; }).config.programs.nix-sandbox-mcp.finalPackage;
  # fake-pkgs' formats.toml.generate keeps the value it was given.
  configOf = settings: (finalPackage settings).configFile.value;
  configOfConfig = c: c.programs.nix-sandbox-mcp.finalPackage.configFile.value;
  # The HTTP service alone, three replicas, both kinds of credentials.
  httpService =
    extra:
    {
      services.nix-sandbox-mcp.http = {
        enable = true;
        listen = "127.0.0.1:9000";
        replicas = 3;
        tokensFile = "/etc/nix-sandbox-mcp/tokens";
        oauth = {
          issuer = "https://auth.example.com";
          audience = "https://sandbox.example.com/mcp";
        };
        extraArgs = [
          "--grace-seconds"
          "30"
        ];
      }
      // extra;
    };
  projectShell = derivation {
    name = "project-shell";
    system = "x86_64-linux";
    builder = "/bin/sh";
  };
  serverCommand = "${fake.runCommand "nix-sandbox-mcp-0.1.0" { } ""}/bin/nix-sandbox-mcp";

  # What the server bakes in and writes for Nix-built environments.
  ruby = mkSandbox {
    name = "ruby";
    packages = [ fake.multiOutput ];
    interpreter = [
      "ruby"
      "{file}"
    ];
  };
  nixBuilt = with' {
    environments = {
      tools = [
        fake.jq
        fake.ripgrep
      ];
      one = fake.jq;
      data = {
        packages = [ fake.python3 ];
        interpreter = "python";
        memory_mb = 2048;
      };
      rb = ruby;
    };
  };
  nixBuiltServer = finalPackage nixBuilt;

  # A declared command, as the module takes it and the config file holds it.
  testCommand = {
    description = "Run the tests";
    env = "py";
    argv = [
      "pytest"
      "{{filter}}"
    ];
    danger = "safe";
    params.filter.type = "string";
  };
  nixBuiltConfig = configOf nixBuilt;

  options = (nixos { settings = { }; }).options.programs.nix-sandbox-mcp;
  homeOptions = (home { settings = { }; }).options.programs.nix-sandbox-mcp;
  undocumented =
    opts:
    builtins.filter (name: !(opts.${name} ? description && opts.${name} ? default && opts.${name} ? example)) (
      builtins.attrNames opts
    );

  # flake.nix's outputs with a stand-in nixpkgs: nixpkgs' lib and the fake
  # packages, enough to evaluate (not build) the checks.
  flake = (import ../../flake.nix).outputs {
    self = flake // {
      outPath = "/nix/store/00000000000000000000000000000000-source";
    };
    nixpkgs = {
      inherit lib;
      outPath = "/nix/store/00000000000000000000000000000000-nixpkgs";
      legacyPackages.x86_64-linux = fake // {
        inherit lib;
        callPackage =
          fn: args:
          import fn (
            {
              inherit lib;
              rustPlatform = rustPlatformOf "1.89.0";
            }
            // args
          );
        linkFarm = name: entries: { inherit name entries; };
      };
    };
  };
  rustPlatformOf = version: {
    rust.rustc = { inherit version; };
    buildRustPackage = attrs: attrs // { overrideAttrs = f: attrs // f attrs; };
  };
  daemonWith = version: import ../daemon.nix {
    inherit lib;
    rustPlatform = rustPlatformOf version;
  };

  tests = {
    "every NixOS option has a description, a default and an example" = {
      expr = undocumented options;
      expected = [ ];
    };
    "every home-manager option has a description, a default and an example" = {
      expr = undocumented homeOptions;
      expected = [ ];
    };
    "the NixOS module installs the server and allows unprivileged user namespaces by default" = {
      expr =
        let
          c = (nixos { settings = enabled; }).config;
        in
        {
          packages = map (p: p.name) c.environment.systemPackages;
          inherit (c.security) unprivilegedUsernsClone;
          failed = failedAssertions c;
          inherit (c) warnings;
        };
      expected = {
        packages = [ "nix-sandbox-mcp-0.1.0" ];
        unprivilegedUsernsClone = true;
        failed = [ ];
        warnings = [ ];
      };
    };
    "services.nix-sandbox-mcp.http runs N hardened replicas of one template, each with its own directories and cgroup" = {
      expr =
        let
          c = (nixos { settings = httpService { }; }).config;
          template = c.systemd.services."nix-sandbox-mcp@";
        in
        {
          units = builtins.attrNames c.systemd.services;
          instances = lib.mapAttrs (_: u: {
            inherit (u) overrideStrategy wantedBy;
            listen = u.environment.NIX_SANDBOX_MCP_LISTEN;
          }) (builtins.removeAttrs c.systemd.services [ "nix-sandbox-mcp@" ]);
          inherit (c.services.nix-sandbox-mcp.http) addresses;
          exec = template.serviceConfig.ExecStart;
          inherit (template) environment path;
          service = lib.getAttrs [
            "User"
            "Group"
            "Delegate"
            "RuntimeDirectory"
            "StateDirectory"
            "CacheDirectory"
            "KillMode"
          ] template.serviceConfig;
          user = c.users.users.nix-sandbox-mcp.isSystemUser;
          sockets = c.systemd.sockets;
          http = (configOfConfig c).http;
          packages = c.environment.systemPackages;
          failed = failedAssertions c;
        };
      expected = {
        units = [
          "nix-sandbox-mcp@"
          "nix-sandbox-mcp@r1"
          "nix-sandbox-mcp@r2"
          "nix-sandbox-mcp@r3"
        ];
        instances = lib.genAttrs [ "nix-sandbox-mcp@r1" "nix-sandbox-mcp@r2" "nix-sandbox-mcp@r3" ] (name: {
          overrideStrategy = "asDropin";
          wantedBy = [ "multi-user.target" ];
          listen =
            {
              "nix-sandbox-mcp@r1" = "127.0.0.1:9000";
              "nix-sandbox-mcp@r2" = "127.0.0.1:9001";
              "nix-sandbox-mcp@r3" = "127.0.0.1:9002";
            }
            .${name};
        });
        addresses = {
          r1 = "127.0.0.1:9000";
          r2 = "127.0.0.1:9001";
          r3 = "127.0.0.1:9002";
        };
        exec = "${serverCommand} serve --http \${NIX_SANDBOX_MCP_LISTEN} --replica %i \"--grace-seconds\" \"30\"";
        environment = {
          HOME = "/var/lib/nix-sandbox-mcp/%i";
          XDG_CACHE_HOME = "/var/cache/nix-sandbox-mcp/%i";
          XDG_RUNTIME_DIR = "/run/nix-sandbox-mcp/%i";
          XDG_STATE_HOME = "/var/lib/nix-sandbox-mcp/%i";
        };
        path = [ nixPackage ];
        service = {
          User = "nix-sandbox-mcp";
          Group = "nix-sandbox-mcp";
          Delegate = "yes";
          RuntimeDirectory = "nix-sandbox-mcp/%i";
          StateDirectory = "nix-sandbox-mcp/%i";
          CacheDirectory = "nix-sandbox-mcp/%i";
          KillMode = "mixed";
        };
        user = true;
        sockets = { };
        http = {
          tokens_file = "/etc/nix-sandbox-mcp/tokens";
          oauth = {
            issuer = "https://auth.example.com";
            audience = "https://sandbox.example.com/mcp";
          };
        };
        # The HTTP service alone installs nothing for users.
        packages = [ ];
        failed = [ ];
      };
    };
    "the replicas' hardening leaves out what would stop a sandbox" = {
      expr =
        let
          hardening = (nixos { settings = httpService { }; }).config.systemd.services."nix-sandbox-mcp@".serviceConfig;
        in
        {
          forbidden = builtins.filter (o: hardening ? ${o}) [
            "RestrictNamespaces"
            "ProtectKernelTunables"
            "ProtectKernelLogs"
            "ProtectProc"
            "ProcSubset"
            "ProtectControlGroups"
            "MemoryDenyWriteExecute"
            "SystemCallFilter"
            "ProtectHostname"
            "PrivateNetwork"
            "PrivateUsers"
            "DynamicUser"
          ];
          kept = lib.getAttrs [
            "NoNewPrivileges"
            "ProtectSystem"
            "PrivateTmp"
            "PrivateDevices"
            "CapabilityBoundingSet"
          ] hardening;
        };
      expected = {
        forbidden = [ ];
        kept = {
          NoNewPrivileges = true;
          ProtectSystem = "strict";
          PrivateTmp = true;
          PrivateDevices = true;
          CapabilityBoundingSet = "";
        };
      };
    };
    "with socket activation each replica is a socket unit that starts it" = {
      expr =
        let
          c = (nixos {
            settings = httpService {
              socketActivation = true;
              replicas = 2;
              listen = "localhost:9000";
            };
          }).config;
        in
        {
          sockets = lib.mapAttrs (_: u: {
            inherit (u) wantedBy listenStreams;
            inherit (u.socketConfig) SocketMode SocketUser;
          }) c.systemd.sockets;
          instances = lib.mapAttrs (_: u: {
            inherit (u) wantedBy;
            listen = u.environment.NIX_SANDBOX_MCP_LISTEN;
          }) (builtins.removeAttrs c.systemd.services [ "nix-sandbox-mcp@" ]);
        };
      expected = {
        sockets = {
          "nix-sandbox-mcp@r1" = {
            wantedBy = [ "sockets.target" ];
            listenStreams = [ "127.0.0.1:9000" ];
            SocketMode = "0600";
            SocketUser = "nix-sandbox-mcp";
          };
          "nix-sandbox-mcp@r2" = {
            wantedBy = [ "sockets.target" ];
            listenStreams = [ "127.0.0.1:9001" ];
            SocketMode = "0600";
            SocketUser = "nix-sandbox-mcp";
          };
        };
        instances = {
          "nix-sandbox-mcp@r1" = {
            wantedBy = [ ];
            listen = "systemd";
          };
          "nix-sandbox-mcp@r2" = {
            wantedBy = [ ];
            listen = "systemd";
          };
        };
      };
    };
    "a Unix socket is one replica's, and bad addresses and a tokens file in the store are named" = {
      expr = map (extra: failedAssertions (nixos { settings = httpService extra; }).config) [
        {
          listen = "unix:/run/nix-sandbox-mcp/mcp.sock";
          replicas = 1;
        }
        {
          listen = "unix:/run/nix-sandbox-mcp/mcp.sock";
          replicas = 2;
        }
        { listen = "8765"; }
        { tokensFile = "${builtins.storeDir}/00000000000000000000000000000000-tokens"; }
      ];
      expected = [
        [ ]
        [
          "services.nix-sandbox-mcp.http.listen = \"unix:/run/nix-sandbox-mcp/mcp.sock\": 2 replicas need a HOST:PORT to count ports up from; use one replica on a Unix socket, or a TCP address."
        ]
        [
          "services.nix-sandbox-mcp.http.listen = \"8765\": 3 replicas need a HOST:PORT to count ports up from; use one replica on a Unix socket, or a TCP address."
          "services.nix-sandbox-mcp.http.listen = \"8765\": expected HOST:PORT (such as 127.0.0.1:8765) or unix:PATH with an absolute path."
        ]
        [
          "services.nix-sandbox-mcp.http.tokensFile is in the Nix store, which every user can read; keep it outside, such as /etc/nix-sandbox-mcp/tokens."
        ]
      ];
    };
    "home-manager runs one replica as a user service, and registers no stdio server for it alone" = {
      expr =
        let
          c = (home {
            settings = {
              services.nix-sandbox-mcp.http = {
                enable = true;
                listen = "unix:%t/nix-sandbox-mcp.sock";
              };
            };
          }).config;
          unit = c.systemd.user.services.nix-sandbox-mcp;
        in
        {
          exec = unit.Service.ExecStart;
          inherit (unit.Service) Delegate KillMode;
          inherit (unit) Install;
          servers = c.programs.mcp.servers;
          packages = c.home.packages;
        };
      expected = {
        exec = "${serverCommand} serve --http unix:%t/nix-sandbox-mcp.sock";
        Delegate = "yes";
        KillMode = "mixed";
        Install.WantedBy = [ "default.target" ];
        servers = { };
        packages = [ ];
      };
    };
    "a hardened profile's default wins over the module's, with a warning saying what breaks" = {
      expr =
        let
          c = (nixos {
            settings = {
              imports = [ enabled ];
              # As nixos/modules/profiles/hardened.nix sets it.
              security.unprivilegedUsernsClone = lib.mkDefault false;
            };
          }).config;
        in
        {
          inherit (c.security) unprivilegedUsernsClone;
          warned = map (w: lib.hasInfix "set security.unprivilegedUsernsClone = true" w && lib.hasInfix "No permissions to create new namespace" w) c.warnings;
        };
      expected = {
        unprivilegedUsernsClone = false;
        warned = [ true ];
      };
    };
    "an explicit choice wins too, and is warned about" = {
      expr =
        let
          c = (nixos {
            settings = {
              imports = [ enabled ];
              security.unprivilegedUsernsClone = false;
            };
          }).config;
        in
        [
          c.security.unprivilegedUsernsClone
          (builtins.length c.warnings)
        ];
      expected = [
        false
        1
      ];
    };
    "forbidding user namespaces fails an assertion that names the option and the fix" = {
      expr =
        failedAssertions
          (nixos {
            settings = {
              imports = [ enabled ];
              security.allowUserNamespaces = false;
            };
          }).config;
      expected = [
        "programs.nix-sandbox-mcp: security.allowUserNamespaces = false sets user.max_user_namespaces to 0, and every sandbox is a new user namespace, so no code could run; set security.allowUserNamespaces = true, or disable programs.nix-sandbox-mcp."
      ];
    };
    "the NixOS module evaluates where unprivilegedUsernsClone does not exist" = {
      expr =
        (nixos {
          withUsernsClone = false;
          settings = enabled;
        }).config.warnings;
      expected = [ ];
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
    "commands become [commands.NAME] tables of the config file, their environments checked" = {
      expr =
        let
          settings = with' { commands.test = testCommand; };
        in
        {
          commands = (configOf settings).commands;
          failed = failedAssertions (nixos { inherit settings; }).config;
          # Built: the table passed the daemon's schema.
          sandboxes = builtins.attrNames (finalPackage settings).sandboxes;
        };
      expected = {
        commands.test = testCommand;
        failed = [ ];
        sandboxes = [
          "bash"
          "python"
        ];
      };
    };
    "a command's environment, name and place are asserted with the fix" = {
      expr = failedAssertions
        (nixos {
          settings = with' {
            settings.commands.old = {
              description = "d";
              env = "py";
              argv = [ "true" ];
            };
            commands."bad name" = {
              description = "d";
              env = "ruby";
              argv = [ "true" ];
            };
          };
        }).config;
      expected = [
        "programs.nix-sandbox-mcp.commands.bad name: \"bad name\" is not a valid command name (1 to 60 letters, digits, '_' or '-'); rename it."
        "programs.nix-sandbox-mcp.commands.bad name.env = \"ruby\" names no environment; use one of py, sh, or declare it in programs.nix-sandbox-mcp.environments."
        "programs.nix-sandbox-mcp.settings.commands: set commands in programs.nix-sandbox-mcp.commands instead, where their environments are checked."
      ];
    };
    "without environments, a command may use a bundled preset; argv may not be empty" = {
      expr =
        let
          command = argv: {
            programs.nix-sandbox-mcp = {
              enable = true;
              commands.t = {
                description = "d";
                env = "python";
                inherit argv;
              };
            };
          };
        in
        {
          failed = failedAssertions (nixos { settings = command [ "true" ]; }).config;
          empty = (builtins.tryEval (builtins.deepSeq (configOf (command [ ])).commands true)).success;
        };
      expected = {
        failed = [ ];
        empty = false;
      };
    };
    "environments may be package lists, packages, tables with packages and sandboxes" = {
      expr = builtins.mapAttrs (_: a: {
        inherit (a.manifestTemplate) name;
        kind = a.manifestTemplate.interpreter.kind or null;
        packages = map toString a.tools.drvAttrs.packages;
      }) (builtins.removeAttrs nixBuiltServer.sandboxes [ "bash" "python" ]);
      expected = builtins.mapAttrs (name: v: { inherit name; } // v) {
        tools = {
          kind = "bash";
          packages = map toString [
            fake.jq
            fake.ripgrep
            fake.bash
            fake.coreutils
          ];
        };
        one = {
          kind = "bash";
          packages = map toString [
            fake.jq
            fake.bash
            fake.coreutils
          ];
        };
        data = {
          kind = "python";
          packages = map toString [
            fake.python3
            fake.bash
            fake.coreutils
          ];
        };
        rb = {
          kind = null;
          packages = map toString [
            fake.multiOutput.bin
            fake.bash
            fake.coreutils
          ];
        };
      };
    };
    "a Nix-built environment's table names its artifact, which the server bakes in" = {
      expr = builtins.mapAttrs (_: table: table) (
        builtins.removeAttrs nixBuiltConfig.environments [
          "py"
          "sh"
        ]
      );
      expected = builtins.mapAttrs (name: table: { flake = "${nixBuiltServer.sandboxes.${name}}"; } // table) {
        tools = { };
        one = { };
        data.memory_mb = 2048;
        rb = { };
      };
    };
    "a project flake turns use_flake on and adds the project environment" = {
      expr =
        let
          settings = with' {
            settings.project.mode = "readonly";
            project.devShells.x86_64-linux.default = projectShell;
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
      expr = (finalPackage (with' { settings.defaults.pids = 0; })).sandboxes;
      throws = "defaults.pids: expected an integer of at least 1, got 0";
    };
    "environments that are wrong fail assertions that name the option and the fix" = {
      expr =
        failedAssertions
          (nixos {
            settings = with' {
              environments = {
                empty.description = "nothing to run";
                two = {
                  preset = "bash";
                  packages = [ fake.jq ];
                };
                notArtifact.sandbox = fake.jq;
                "a b".preset = "bash";
                project.preset = "bash";
              };
              project.devShells.x86_64-linux.default = projectShell;
              settings.environments.x.preset = "bash";
            };
          }).config;
      expected = [
        "programs.nix-sandbox-mcp.environments.a b: \"a b\" is not a valid environment name (letters, digits, '-', '_' or '.', starting with a letter or digit, at most 64 characters); rename it."
        "programs.nix-sandbox-mcp.environments.empty says nothing to run: write a list of packages (programs.nix-sandbox-mcp.environments.empty = [ pkgs.jq ]), a sandbox (nix-sandbox-mcp.lib.mkSandbox { … }), or set preset, flake or interpreter."
        "programs.nix-sandbox-mcp.environments.notArtifact.sandbox is jq-1.8.1, not a sandbox artifact: put it in programs.nix-sandbox-mcp.environments.notArtifact.packages (with an interpreter if it is not bash), or build it with nix-sandbox-mcp.lib.mkSandbox."
        "programs.nix-sandbox-mcp.environments.two sets packages and preset: set only one of sandbox, packages, preset, flake or interpreter (interpreter may accompany packages or flake)."
        "programs.nix-sandbox-mcp.settings.environments: set environments in programs.nix-sandbox-mcp.environments instead, where they may also be packages and sandboxes."
        "programs.nix-sandbox-mcp.environments.project: the name project belongs to the environment programs.nix-sandbox-mcp.project creates; rename this entry."
      ];
    };
    "home-manager fails the same assertions" = {
      expr = failedAssertions (home { settings = with' { environments.empty.description = "x"; }; }).config;
      expected = [
        "programs.nix-sandbox-mcp.environments.empty says nothing to run: write a list of packages (programs.nix-sandbox-mcp.environments.empty = [ pkgs.jq ]), a sandbox (nix-sandbox-mcp.lib.mkSandbox { … }), or set preset, flake or interpreter."
      ];
    };
    "home-manager registers the server in programs.mcp.servers, and warns while programs.mcp is off" = {
      expr =
        let
          c = (home { settings = enabled; }).config;
        in
        {
          packages = map (p: p.name) c.home.packages;
          shared = c.programs.mcp.servers;
          claudeCode = c.programs.claude-code.mcpServers;
          warned = map (lib.hasInfix "set programs.mcp.enable = true") c.warnings;
        };
      expected = {
        packages = [ "nix-sandbox-mcp-0.1.0" ];
        shared.sandbox = {
          command = serverCommand;
          args = [ "--stdio" ];
          env = { };
          url = null;
        };
        claudeCode = { };
        warned = [ true ];
      };
    };
    "with programs.mcp on, the registration is silent" = {
      expr =
        let
          c =
            (home {
              settings = {
                imports = [ enabled ];
                programs.mcp.enable = true;
              };
            }).config;
        in
        [
          (builtins.attrNames c.programs.mcp.servers)
          c.warnings
          (failedAssertions c)
        ];
      expected = [
        [ "sandbox" ]
        [ ]
        [ ]
      ];
    };
    "without programs.mcp, home-manager registers the server with Claude Code" = {
      expr =
        (home {
          sharedList = false;
          settings = with' { mcpServerName = "nix-sandbox"; };
        }).config.programs.claude-code.mcpServers;
      expected.nix-sandbox = {
        type = "stdio";
        command = serverCommand;
        args = [ "--stdio" ];
      };
    };
    "home-manager evaluates without any MCP client module" = {
      expr =
        map (p: p.name)
          (home {
            sharedList = false;
            claudeCode = false;
            settings = enabled;
          }).config.home.packages;
      expected = [ "nix-sandbox-mcp-0.1.0" ];
    };
    "a null server name registers nowhere and warns about nothing" = {
      expr =
        let
          c = (home { settings = with' { mcpServerName = null; }; }).config;
        in
        [
          c.programs.mcp.servers
          c.warnings
        ];
      expected = [
        { }
        [ ]
      ];
    };

    # nix/daemon.nix and flake.nix
    "the daemon refuses a rustc older than its rust-version, saying so" = {
      expr = (daemonWith "1.88.0").pname;
      throws = "building the daemon needs rustc 1.89 or later (its rust-version: Rust edition 2024 and its dependencies), and this nixpkgs has rustc 1.88.0";
    };
    "the daemon builds with rustc 1.89" = {
      expr = (daemonWith "1.89.0").pname;
      expected = "nix-sandbox-mcp";
    };
    "checks-without-vm holds every flake check but the VM test" = {
      expr = {
        checks = builtins.attrNames flake.checks.x86_64-linux;
        withoutVm = map (e: e.name) flake.legacyPackages.x86_64-linux.checks-without-vm.entries;
      };
      expected = {
        checks = [
          "cargo-unit-tests"
          "eval-tests"
          "module-tests"
          "package"
          "vm"
        ];
        withoutVm = [
          "cargo-unit-tests"
          "eval-tests"
          "module-tests"
          "package"
        ];
      };
    };
  };

in
import ./harness.nix tests
