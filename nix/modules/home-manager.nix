# home-manager: programs.nix-sandbox-mcp installs the server for the user and
# registers it in home-manager's shared MCP server list, programs.mcp.servers,
# whenever that option exists. Each client's module copies that list into its
# own configuration when programs.mcp.enable and the client's
# enableMcpIntegration are on (docs/nix.md lists them). On home-manager
# releases without programs.mcp it registers the server with Claude Code's
# module directly.
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

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
      {
        home.packages = [ cfg.finalPackage ];
        inherit (shared) assertions;
      }
      (lib.optionalAttrs hasSharedServerList {
        programs.mcp.servers = lib.mkIf registered { ${cfg.mcpServerName} = server; };
        warnings = lib.optional (
          registered && !config.programs.mcp.enable
        ) "programs.nix-sandbox-mcp: the server is registered as programs.mcp.servers.${cfg.mcpServerName}, but programs.mcp.enable is false, so no MCP client reads it; set programs.mcp.enable = true and your client's enableMcpIntegration (e.g. programs.claude-code.enableMcpIntegration = true), or programs.nix-sandbox-mcp.mcpServerName = null to register nothing.";
      })
      (lib.optionalAttrs (!hasSharedServerList && hasClaudeCodeServers) {
        programs.claude-code.mcpServers = lib.mkIf registered {
          ${cfg.mcpServerName} = server // {
            type = "stdio";
          };
        };
      })
    ]
  );
}
