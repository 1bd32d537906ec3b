# The systemd service `serve --http` runs as, shared by the NixOS module
# (replicas of a system service) and home-manager (one user service), and
# rendered for the VM tier's check of it (tests/vm/service-checks.sh).
#
# Hardening that keeps sandboxes working. Each sandbox is bubblewrap making
# new user, mount, PID, network, IPC and UTS namespaces, mounting a fresh
# /proc, and the daemon writing its cgroups; options that forbid any of that
# are left out, each for the reason given:
# - RestrictNamespaces: every sandbox creates those namespaces.
# - ProtectKernelTunables, ProtectKernelLogs, ProtectProc=invisible,
#   ProcSubset=pid: they cover parts of /proc, and the kernel lets a user
#   namespace mount a new /proc only where the existing one is fully visible,
#   so bubblewrap's /proc would be refused.
# - ProtectControlGroups: /sys/fs/cgroup read-only, so the daemon could not
#   make each sandbox's group in the subtree `Delegate=yes` gives it.
# - MemoryDenyWriteExecute, SystemCallFilter: a filter the service gets is
#   inherited by every sandbox (a JIT such as node's needs writable code
#   pages; bubblewrap needs mount, pivot_root and unshare). Each sandbox gets
#   the daemon's own seccomp filter instead.
# - ProtectHostname: its seccomp filter, inherited by every sandbox, refuses
#   sethostname(), which bubblewrap calls in the sandbox's own UTS namespace.
# - PrivateNetwork, IPAddressDeny: the network proxy reaches the hosts an
#   environment allows.
# - PrivateUsers: the delegated cgroup and the project's files are owned by
#   the service's user as the host sees it; they are kept as they are.
{ lib }:
rec {
  # How any unit of the server starts and stops, a system's or a user's.
  lifecycle = {
    Type = "exec";
    Restart = "on-failure";
    RestartSec = 2;
    # Calls in flight have --grace-seconds (10) to end, then their runs are
    # killed; systemd waits a little longer before it kills the daemon.
    TimeoutStopSec = 30;
    KillMode = "mixed";
    # The service's own cgroup subtree: each sandbox's memory, process and
    # CPU limits are a group in it.
    Delegate = "yes";
    NoNewPrivileges = true;
    UMask = "0077";
  };

  # [Service] settings every replica of the system service has.
  # `instance`: the directory name under /run, /var/lib and /var/cache
  # ("%i" for a template, a name for a single unit).
  serviceConfig = instance: lifecycle // {
    RuntimeDirectory = "nix-sandbox-mcp/${instance}";
    RuntimeDirectoryMode = "0700";
    StateDirectory = "nix-sandbox-mcp/${instance}";
    StateDirectoryMode = "0700";
    CacheDirectory = "nix-sandbox-mcp/${instance}";
    CacheDirectoryMode = "0700";
    PrivateTmp = true;
    PrivateDevices = true;
    ProtectSystem = "strict";
    ProtectHome = "read-only";
    ProtectKernelModules = true;
    ProtectClock = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    LockPersonality = true;
    SystemCallArchitectures = "native";
    # Netlink: bubblewrap brings up each sandbox's loopback interface.
    RestrictAddressFamilies = [
      "AF_UNIX"
      "AF_INET"
      "AF_INET6"
      "AF_NETLINK"
    ];
    CapabilityBoundingSet = "";
    AmbientCapabilities = "";
  };

  # Where an instance keeps its files: its own, under the directories
  # systemd made for it (the proxy's certificate authority in its state).
  environment = instance: {
    HOME = "/var/lib/nix-sandbox-mcp/${instance}";
    XDG_STATE_HOME = "/var/lib/nix-sandbox-mcp/${instance}";
    XDG_CACHE_HOME = "/var/cache/nix-sandbox-mcp/${instance}";
    XDG_RUNTIME_DIR = "/run/nix-sandbox-mcp/${instance}";
  };

  # The options the NixOS and home-manager services share: credentials and
  # more arguments.
  options = {
    tokensFile = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "/etc/nix-sandbox-mcp/tokens";
      description = ''
        The bearer tokens file (`[http] tokens_file`): lines
        `NAME sha256:HEX` that `nix-sandbox-mcp token add NAME --file FILE`
        appends. A path outside the Nix store, readable by the service's
        user and writable by no one else; after editing it, send SIGHUP
        (`systemctl kill -s HUP UNIT`).
      '';
    };
    oauth = {
      issuer = lib.mkOption {
        type = lib.types.nullOr lib.types.str;
        default = null;
        example = "https://auth.example.com";
        description = "The OAuth authorization server whose JWT access tokens are accepted (`[http.oauth] issuer`).";
      };
      audience = lib.mkOption {
        type = lib.types.nullOr lib.types.str;
        default = null;
        example = "https://sandbox.example.com/mcp";
        description = "The audience the tokens must name (`[http.oauth] audience`); by default the server's resource URL.";
      };
    };
    extraArgs = lib.mkOption {
      type = lib.types.listOf lib.types.str;
      default = [ ];
      example = [
        "--grace-seconds"
        "30"
      ];
      description = "More arguments to `serve --http` (see `nix-sandbox-mcp serve --help`); systemd expands `%` and `$` in them.";
    };
  };

  # A tokens file in the store would be readable by every user.
  tokensFileAssertion = option: tokensFile: {
    assertion = tokensFile == null || !lib.hasPrefix builtins.storeDir tokensFile;
    message = "${option}.tokensFile is in the Nix store, which every user can read; keep it outside, such as /etc/nix-sandbox-mcp/tokens.";
  };

  # The `[http]` table the credentials options make.
  httpSettings =
    { tokensFile, oauth }:
    lib.optionalAttrs (tokensFile != null) { tokens_file = toString tokensFile; }
    // lib.optionalAttrs (oauth.issuer != null) {
      oauth = {
        inherit (oauth) issuer;
      }
      // lib.optionalAttrs (oauth.audience != null) { inherit (oauth) audience; };
    };

  # The unit's ExecStart=: `serve --http LISTEN`, named `replica` when not
  # null. `extraArgs` are quoted as systemd unquotes them.
  execStart =
    {
      server,
      listen,
      replica ? null,
      extraArgs ? [ ],
    }:
    lib.concatStringsSep " " (
      [
        (lib.getExe server)
        "serve"
        "--http"
        listen
      ]
      ++ lib.optionals (replica != null) [
        "--replica"
        replica
      ]
      ++ map builtins.toJSON extraArgs
    );

  # A `HOST:PORT` or `unix:PATH` as systemd's ListenStream= takes it.
  listenStream =
    address:
    if lib.hasPrefix "unix:" address then
      lib.removePrefix "unix:" address
    else if lib.hasPrefix "localhost:" address then
      "127.0.0.1:${lib.removePrefix "localhost:" address}"
    else
      address;

  # `HOST:PORT` with the port moved up by `offset`.
  addressPlus =
    address: offset:
    let
      parts = builtins.match "(.*):([0-9]+)" address;
      port = lib.toInt (builtins.elemAt parts 1);
    in
    if offset == 0 then address else "${builtins.elemAt parts 0}:${toString (port + offset)}";

  isTcpAddress = address: builtins.match ".*:[0-9]+" address != null && !lib.hasPrefix "unix:" address;
}
