# The sandbox artifacts of the offline end-to-end test: bash, python and node,
# built by the real mkSandbox from this machine's own programs (host-pkgs.nix)
# because nixpkgs cannot be downloaded here. nix/tests/build-e2e-artifacts.sh
# builds them; the MCP client suite then runs them through the daemon.
{
  # The daemon that bin/run calls, e.g. target/debug/nix-sandbox-mcp.
  daemonBinary,
  system ? builtins.currentSystem,
}:
let
  pkgs = import ./host-pkgs.nix { inherit system daemonBinary; };
  mkSandbox =
    args:
    (import ../lib).mkSandbox (
      {
        inherit pkgs;
        inherit (pkgs) daemon;
        inherit (pkgs.sandboxRuntime) env links;
      }
      // args
    );
in
{
  bash = mkSandbox {
    name = "bash";
    packages = [
      pkgs.bash
      pkgs.textTools
      pkgs.coreutils
    ];
    interpreter = "bash";
    description = "Bash (host programs copied into the store) with coreutils, grep, sed and jq";
  };
  python = mkSandbox {
    name = "python";
    packages = [ pkgs.python3 ];
    interpreter = "python";
    description = "Python 3 (host programs copied into the store)";
  };
  node = mkSandbox {
    name = "node";
    packages = [ pkgs.nodejs ];
    interpreter = "node";
    description = "Node.js (host programs copied into the store)";
  };
}
