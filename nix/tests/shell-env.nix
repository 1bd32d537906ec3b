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

  # What nixpkgs' stdenv setup does to the environment, in miniature: the
  # inputs' bin directories go on PATH and setup hooks export variables.
  stdenv = pkgs.runCommand "fake-stdenv" { } ''
    mkdir -p "$out"
    cat > "$out/setup" <<'SETUP'
    for input in $nativeBuildInputs; do PATH="$input/bin:$PATH"; done
    PATH="$PATH:$NIX_BUILD_TOP/bin:/nix/store/0000000000000000000000000000000-missing/bin"
    export PATH
    export PYTHON_TOOLS=$nativeBuildInputs/lib
    export SCRATCH=$NIX_BUILD_TOP/scratch
    runHook() { :; }
    export -f runHook
    SETUP
  '';

  shell = derivation {
    name = "dev-shell";
    inherit system stdenv;
    builder = "/bin/bash";
    args = [ "-c" "echo this shell is for nix develop only; exit 1" ];
    nativeBuildInputs = [ pkgs.python3 ];
    PROJECT_GREETING = "hello from the devShell";
    shellHook = "echo entering the shell";
  };
in
lib'.mkSandbox {
  inherit pkgs;
  inherit (pkgs) daemon;
  inherit (pkgs.sandboxRuntime) env links;
  name = "project";
  interpreter = "bash";
  shellEnvironment = lib'.captureShellEnvironment {
    inherit (pkgs) jq;
    inherit shell;
  };
}
