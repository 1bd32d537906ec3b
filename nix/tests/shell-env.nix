# The offline test of captureShellEnvironment (run by shell-env.sh): a
# development shell like mkShell makes, with a stand-in for stdenv's setup
# script, turned into a sandbox artifact by the real library.
{
  daemonBinary,
  system ? builtins.currentSystem,
}:
let
  pkgs = import ./host-pkgs.nix { inherit system daemonBinary; };
  lib' = import ../lib;

  shell = pkgs.mkShell {
    packages = [ pkgs.python3 ];
    PROJECT_GREETING = "hello from the devShell";
    # Every character JSON escapes, a control character and UTF-8.
    TRICKY = builtins.fromJSON ''"quote \" backslash \\ tab \t newline \n dollar $ brace ''${x} control \u0001 \u00e9"'';
    shellHook = "echo entering the shell";
  };
in
lib'.mkSandbox {
  inherit pkgs;
  inherit (pkgs) daemon;
  inherit (pkgs.sandboxRuntime) env links;
  name = "project";
  interpreter = "bash";
  shellEnvironment = lib'.captureShellEnvironment { inherit shell; };
}
