# How nix/lib builds things: plain derivations whose builder is bash with
# coreutils on PATH, and nothing else from nixpkgs. A sandbox always contains
# bash and coreutils, so building it needs no package it does not already
# hold: when the daemon builds a project's environment at start-up with the
# project's own nixpkgs, no stdenv, jq or other tool is downloaded for it.
{
  # A derivation built by `script` (bash with -euo pipefail). `attrs` become
  # the derivation's attributes, except `passthru` (merged into the result,
  # like nixpkgs' runCommand) and `meta`. `pkgs` needs bash, coreutils and
  # stdenv.hostPlatform; tools run on the build platform (pkgs.buildPackages).
  runBash =
    pkgs: name: attrs: script:
    let
      tools = pkgs.buildPackages or pkgs;
      platform = pkgs.stdenv.buildPlatform or pkgs.stdenv.hostPlatform;
      drv = derivation (
        {
          inherit name;
          inherit (platform) system;
          builder = "${tools.bash}/bin/bash";
          # Without a build sandbox, Nix may kill a builder that has closed its
          # output but not yet exited, failing the build with signal 9
          # (NixOS/nix#2176); a short-lived child holding the output open past
          # the builder's exit avoids it.
          args = [
            "-euo"
            "pipefail"
            "-c"
            "${script}\nsleep 0.1 &"
          ];
          PATH = "${tools.coreutils}/bin";
        }
        // builtins.removeAttrs attrs [
          "passthru"
          "meta"
        ]
      );
    in
    drv
    // attrs.passthru or { }
    // {
      meta = attrs.meta or { };
    };

  # A bash function, `jsonString VALUE`, that prints VALUE as a JSON string:
  # what the builders use instead of jq. Bytes outside ASCII pass through
  # unchanged (JSON text is UTF-8).
  jsonString = ''
    jsonString() {
      local s=$1 code char
      s=''${s//\\/\\\\}
      s=''${s//\"/\\\"}
      s=''${s//$'\n'/\\n}
      s=''${s//$'\t'/\\t}
      s=''${s//$'\r'/\\r}
      if [[ $s == *[$'\001'-$'\037']* ]]; then
        for code in {1..31}; do
          printf -v char "\\$(printf %03o "$code")"
          s=''${s//"$char"/$(printf '\\u%04x' "$code")}
        done
      fi
      printf '"%s"' "$s"
    }
  '';
}
