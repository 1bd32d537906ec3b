# home-manager: programs.nix-sandbox-mcp installs the server for the user and
# registers it in home-manager's shared MCP server list, programs.mcp.servers,
# whenever that option exists. Each client's module copies that list into its
# own configuration when programs.mcp.enable and the client's
# enableMcpIntegration are on (docs/nix.md lists them). On home-manager
# releases without programs.mcp it registers the server with Claude Code's
# module directly. services.nix-sandbox-mcp.http runs one replica of
# `serve --http` as a user service, for clients that reach it by URL.
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
  shared = import ./options.nix {
    inherit
      nixSandbox
      config
      lib
      pkgs
      ;
  };
  server = {
    command = lib.getExe cfg.finalPackage;
    args = [ "--stdio" ];
  };
  registered = cfg.mcpServerName != null;
  http = config.services.nix-sandbox-mcp.http;
  service = import ./service.nix { inherit lib; };
  inherit (lib) mkOption types;
  hasSharedServerList = options ? programs.mcp.servers;
  hasClaudeCodeServers = options ? programs.claude-code.mcpServers;
in
{
  _file = ./home-manager.nix;

  options.programs.nix-sandbox-mcp = shared.options // {
    mcpServerName = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = "sandbox";
      example = "nix-sandbox";
      description = ''
        The name under which the server is registered in
        {option}`programs.mcp.servers`, which MCP clients managed by
        home-manager read when {option}`programs.mcp.enable` and their own
        `enableMcpIntegration` are on (for example
        {option}`programs.claude-code.enableMcpIntegration`); on home-manager
        releases without `programs.mcp`, in
        {option}`programs.claude-code.mcpServers`. `null` registers it
        nowhere.
      '';
    };
  };

  options.services.nix-sandbox-mcp.http = service.options // {
    enable = lib.mkEnableOption ''
      `nix-sandbox-mcp serve --http` as a user service (`nix-sandbox-mcp`):
      the server of {option}`programs.nix-sandbox-mcp` over Streamable HTTP,
      in its own delegated cgroup (`Delegate=yes`), started with the user's
      systemd manager'';

    listen = mkOption {
      type = types.str;
      default = "127.0.0.1:8765";
      example = "unix:%t/nix-sandbox-mcp.sock";
      description = ''
        Where it listens: `HOST:PORT` or `unix:PATH` (systemd expands `%t`
        to the user's runtime directory). An address other than a loopback
        one needs credentials ({option}`tokensFile` or {option}`oauth`).
      '';
    };
  };

  config = lib.mkIf (cfg.enable || http.enable) (
    lib.mkMerge [
      (lib.mkIf http.enable {
        assertions = [
          (service.tokensFileAssertion "services.nix-sandbox-mcp.http" http.tokensFile)
        ];
        programs.nix-sandbox-mcp.settings.http = service.httpSettings { inherit (http) tokensFile oauth; };
        systemd.user.services.nix-sandbox-mcp = {
          Unit = {
            Description = "nix-sandbox-mcp: MCP over Streamable HTTP";
            After = [ "network.target" ];
          };
          Service = service.lifecycle // {
            ExecStart = service.execStart {
              server = cfg.finalPackage;
              inherit (http) listen extraArgs;
            };
          };
          Install.WantedBy = [ "default.target" ];
        };
      })
      (lib.mkIf cfg.enable { home.packages = [ cfg.finalPackage ]; })
      { inherit (shared) assertions; }
      (lib.optionalAttrs hasSharedServerList {
        programs.mcp.servers = lib.mkIf (cfg.enable && registered) { ${cfg.mcpServerName} = server; };
        warnings = lib.optional (
          cfg.enable && registered && !config.programs.mcp.enable
        ) "programs.nix-sandbox-mcp: the server is registered as programs.mcp.servers.${cfg.mcpServerName}, but programs.mcp.enable is false, so no MCP client reads it; set programs.mcp.enable = true and your client's enableMcpIntegration (e.g. programs.claude-code.enableMcpIntegration = true), or programs.nix-sandbox-mcp.mcpServerName = null to register nothing.";
      })
      (lib.optionalAttrs (!hasSharedServerList && hasClaudeCodeServers) {
        programs.claude-code.mcpServers = lib.mkIf (cfg.enable && registered) {
          ${cfg.mcpServerName} = server // {
            type = "stdio";
          };
        };
      })
    ]
  );
}
