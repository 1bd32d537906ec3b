# NixOS: programs.nix-sandbox-mcp installs the server for every user;
# services.nix-sandbox-mcp.http serves it over Streamable HTTP as replicas of
# a templated system service (nix-sandbox-mcp@NAME), with the environments,
# commands and settings of programs.nix-sandbox-mcp. Every sandbox is a new
# user namespace created by an unprivileged user, which a hardened system may
# forbid: the module says so rather than overriding it.
nixSandbox:
{
  config,
  lib,
  options,
  pkgs,
  ...
}:
let
  cfg = config.programs.nix-sandbox-mcp;
  http = config.services.nix-sandbox-mcp.http;
  service = import ./service.nix { inherit lib; };
  inherit (lib) mkOption types literalExpression;
  # Replica NAME: rNUMBER, the address it serves at.
  replicaNames = map (i: "r${toString i}") (lib.range 1 http.replicas);
  addresses = lib.listToAttrs (
    lib.imap0 (i: name: {
      inherit name;
      value = if i == 0 then http.listen else service.addressPlus http.listen i;
    }) replicaNames
  );
  unit = name: "nix-sandbox-mcp@${name}";
  shared = import ./options.nix {
    inherit
      nixSandbox
      config
      lib
      pkgs
      ;
  };
  # Only NixOS releases that manage the kernel.unprivileged_userns_clone
  # switch (which linux_hardened and the hardened profile turn off) have it.
  hasUsernsClone = options.security ? unprivilegedUsernsClone;
in
{
  _file = ./nixos.nix;

  options.programs.nix-sandbox-mcp = shared.options;

  options.services.nix-sandbox-mcp.http = service.options // {
    enable = lib.mkEnableOption ''
      `nix-sandbox-mcp serve --http`: the server of
      {option}`programs.nix-sandbox-mcp` (its environments, commands and
      settings) for a team over Streamable HTTP, as {option}`replicas`
      instances of the templated unit `nix-sandbox-mcp@.service`
      (`nix-sandbox-mcp@r1`, `@r2`, …), each with its own runtime, state and
      cache directories and its own cgroup subtree (`Delegate=yes`)'';

    listen = mkOption {
      type = types.str;
      default = "127.0.0.1:8765";
      example = "0.0.0.0:8443";
      description = ''
        Where the first replica listens: `HOST:PORT` or `unix:PATH`; replica
        N listens on the port N - 1 above it ({option}`addresses` lists
        them). An address other than a loopback one needs credentials
        ({option}`tokensFile` or {option}`oauth`).
      '';
    };

    replicas = mkOption {
      type = types.ints.between 1 64;
      default = 1;
      example = 4;
      description = ''
        How many instances to run. Each names itself (`r1`, `r2`, …) in the
        handles of its sessions and tasks, so that a load balancer in front
        of them (deploy/haproxy/haproxy.cfg in the source) routes a handle
        back to the replica that holds it.
      '';
    };

    addresses = mkOption {
      type = types.attrsOf types.str;
      readOnly = true;
      default = addresses;
      defaultText = literalExpression ''{ r1 = listen; r2 = listen's port + 1; … }'';
      example = literalExpression ''{ r1 = "127.0.0.1:8765"; r2 = "127.0.0.1:8766"; }'';
      description = "Each replica's name and the address it serves at: what a load balancer's servers are.";
    };

    socketActivation = mkOption {
      type = types.bool;
      default = false;
      example = true;
      description = ''
        Listen with systemd socket units (`nix-sandbox-mcp@NAME.socket`,
        `serve --http systemd`): systemd holds each address from boot, and
        a replica starts at its first connection. A Unix socket is made
        with mode 0600 for {option}`user`, as the server makes its own.
      '';
    };

    user = mkOption {
      type = types.str;
      default = "nix-sandbox-mcp";
      example = "sandbox";
      description = "The user the replicas run as; `nix-sandbox-mcp` is created when it is the default.";
    };

    group = mkOption {
      type = types.str;
      default = "nix-sandbox-mcp";
      example = "sandbox";
      description = "The group the replicas run as; `nix-sandbox-mcp` is created when it is the default.";
    };
  };

  config = lib.mkIf (cfg.enable || http.enable) (
    lib.mkMerge [
      {
        assertions = shared.assertions ++ [
          {
            assertion = config.security.allowUserNamespaces;
            message = "programs.nix-sandbox-mcp: security.allowUserNamespaces = false sets user.max_user_namespaces to 0, and every sandbox is a new user namespace, so no code could run; set security.allowUserNamespaces = true, or disable programs.nix-sandbox-mcp.";
          }
        ];
      }
      (lib.mkIf cfg.enable { environment.systemPackages = [ cfg.finalPackage ]; })
      (lib.mkIf http.enable {
        assertions = [
          {
            assertion = http.replicas == 1 || service.isTcpAddress http.listen;
            message = "services.nix-sandbox-mcp.http.listen = ${builtins.toJSON http.listen}: ${toString http.replicas} replicas need a HOST:PORT to count ports up from; use one replica on a Unix socket, or a TCP address.";
          }
          {
            assertion = service.isTcpAddress http.listen || lib.hasPrefix "unix:/" http.listen;
            message = "services.nix-sandbox-mcp.http.listen = ${builtins.toJSON http.listen}: expected HOST:PORT (such as 127.0.0.1:8765) or unix:PATH with an absolute path.";
          }
          (service.tokensFileAssertion "services.nix-sandbox-mcp.http" http.tokensFile)
        ];
        programs.nix-sandbox-mcp.settings.http = service.httpSettings { inherit (http) tokensFile oauth; };

        users.users = lib.mkIf (http.user == "nix-sandbox-mcp") {
          nix-sandbox-mcp = {
            isSystemUser = true;
            inherit (http) group;
            description = "nix-sandbox-mcp replicas";
          };
        };
        users.groups = lib.mkIf (http.group == "nix-sandbox-mcp") { nix-sandbox-mcp = { }; };

        systemd.services = {
          # The template: one replica, named by its instance (%i).
          "nix-sandbox-mcp@" = {
            description = "nix-sandbox-mcp replica %i: MCP over Streamable HTTP";
            documentation = [ "https://github.com/nix-sandbox-mcp/nix-sandbox-mcp/blob/main/docs/http.md" ];
            after = [ "network.target" ];
            # Environments the server builds (a project's flake) are built by
            # `nix build`, through the Nix daemon.
            path = [ config.nix.package ];
            environment = service.environment "%i";
            serviceConfig = service.serviceConfig "%i" // {
              User = http.user;
              Group = http.group;
              ExecStart = service.execStart {
                server = cfg.finalPackage;
                listen = "\${NIX_SANDBOX_MCP_LISTEN}";
                replica = "%i";
                inherit (http) extraArgs;
              };
            };
          };
        }
        // lib.mapAttrs' (
          name: address:
          lib.nameValuePair (unit name) {
            overrideStrategy = "asDropin";
            # NixOS writes a PATH into every unit, drop-ins too: the same.
            path = [ config.nix.package ];
            environment.NIX_SANDBOX_MCP_LISTEN = if http.socketActivation then "systemd" else address;
            wantedBy = lib.optional (!http.socketActivation) "multi-user.target";
          }
        ) addresses;

        systemd.sockets = lib.mkIf http.socketActivation (
          lib.mapAttrs' (
            name: address:
            lib.nameValuePair (unit name) {
              description = "nix-sandbox-mcp replica ${name}'s socket";
              wantedBy = [ "sockets.target" ];
              listenStreams = [ (service.listenStream address) ];
              socketConfig = {
                SocketUser = http.user;
                SocketGroup = http.group;
                SocketMode = "0600";
              };
            }
          ) addresses
        );
      })

      (lib.optionalAttrs hasUsernsClone {
        # Weaker than lib.mkDefault, so that a profile's own default (the
        # hardened profile sets this one with mkDefault) wins instead of
        # conflicting with it, and the warning below says what that costs.
        security.unprivilegedUsernsClone = lib.mkOverride 1100 true;
        warnings = lib.optional (!config.security.unprivilegedUsernsClone) "programs.nix-sandbox-mcp: security.unprivilegedUsernsClone is false, so on a kernel with the kernel.unprivileged_userns_clone switch (linux_hardened, which the hardened profile uses) a user other than root cannot create the user namespace every sandbox needs, and each run fails with \"No permissions to create new namespace\"; set security.unprivilegedUsernsClone = true to run sandboxes as a normal user.";
      })
    ]
  );
}
