# A flake check from a file of evaluation tests (eval.nix, modules.nix): the
# tests run while `nix flake check` evaluates, and a failure stops it with the
# failing tests named. (run-tests.sh also checks the error messages.)
{
  pkgs,
  name,
  summary,
}:
if summary.failed == [ ] then
  pkgs.runCommand "nix-sandbox-mcp-${name}" { } ''
    echo "${toString summary.passed} passed" > "$out"
  ''
else
  throw "nix-sandbox-mcp ${name} failed:\n${
    builtins.concatStringsSep "\n" (map (f: "- ${f.name}") summary.failed)
  }"
