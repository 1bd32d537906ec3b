# The Nix side of nix-sandbox-mcp without nixpkgs: everything here evaluates
# with plain `nix-instantiate --eval` (nix/tests/eval.nix). Functions that
# build take the nixpkgs attributes they use as arguments; flake.nix binds
# them to the flake's own nixpkgs and daemon (nix/default.nix).
let
  server = import ./server.nix;
in
{
  mkSandbox = import ./sandbox.nix;
  captureShellEnvironment = import ./shell-env.nix;
  inherit (server)
    wrapServer
    projectSandbox
    packagesOf
    flakeSandbox
    flakeOutput
    artifactFromFlakeOutput
    mkServer
    ;
  inherit (import ./config.nix) planServer;
  inherit (import ./schema.nix) isValidName;
  normalizeInterpreter = (import ./interpreter.nix).normalize;
}
