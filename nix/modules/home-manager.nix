# home-manager: programs.nix-sandbox-mcp installs the server for the user and
# registers it with MCP clients through home-manager's shared MCP server list
# (programs.mcp.servers, read by the clients' modules that set
# enableMcpIntegration), or with Claude Code directly on home-manager releases
# that predate programs.mcp.
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
  server = {
    command = lib.getExe cfg.finalPackage;
    args = [ "--stdio" ];
  };
  hasSharedServerList = options ? programs.mcp.servers;
  hasClaudeCodeServers = options ? programs.claude-code.mcpServers;
in
{
  _file = ./home-manager.nix;

  options.programs.nix-sandbox-mcp =
    import ./options.nix {
      inherit
        nixSandbox
        config
        lib
        pkgs
        ;
    }
    // {
      mcpServerName = lib.mkOption {
        type = lib.types.nullOr lib.types.str;
        default = "sandbox";
        example = "nix-sandbox";
        description = ''
          The name under which the server is registered with MCP clients, in
          {option}`programs.mcp.servers` (enable {option}`programs.mcp.enable`
          and each client's `enableMcpIntegration`, e.g.
          {option}`programs.claude-code.enableMcpIntegration`), or, where
          home-manager has no `programs.mcp`, in
          {option}`programs.claude-code.mcpServers`. `null` registers it
          nowhere.
        '';
      };
    };

  config = lib.mkIf cfg.enable (
    lib.mkMerge [
      { home.packages = [ cfg.finalPackage ]; }
      (lib.optionalAttrs hasSharedServerList {
        programs.mcp.servers = lib.mkIf (cfg.mcpServerName != null) {
          ${cfg.mcpServerName} = server;
        };
      })
      (lib.optionalAttrs (!hasSharedServerList && hasClaudeCodeServers) {
        programs.claude-code.mcpServers = lib.mkIf (cfg.mcpServerName != null) {
          ${cfg.mcpServerName} = server // {
            type = "stdio";
          };
        };
      })
    ]
  );
}
