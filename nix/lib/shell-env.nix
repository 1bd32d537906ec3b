# captureShellEnvironment: the environment `nix develop` would give for a
# development shell, captured at build time as
#
#   { "path": [ "/nix/store/…/bin", … ], "env": { "NAME": "value", … } }
#
# for mkSandbox's `shellEnvironment`. Like `nix develop`, it builds the shell's
# derivation with its builder replaced by a script that runs stdenv's setup
# (which runs the inputs' setup hooks) and records the exported variables.
# What is lost compared with an interactive `nix develop` is listed in
# docs/nix.md ("What a sandbox keeps from a devShell").
{
  # A jq package, run inside the shell's build.
  jq,
  # The devShell derivation (mkShell, or any stdenv derivation).
  shell,
}:
let
  # Variables dropped from the captured environment.
  # The jail sets the reserved ones for every run (PATH becomes the
  # manifest's `path`).
  dropped = (import ./schema.nix).reservedVariables ++ [
    # `nix develop` ignores these too: they describe the build, not the shell.
    "BASHOPTS"
    "NIX_BUILD_TOP"
    "NIX_ENFORCE_PURITY"
    "NIX_LOG_FD"
    "NIX_REMOTE"
    "PPID"
    "SHELLOPTS"
    "SSL_CERT_FILE"
    "TEMP"
    "TEMPDIR"
    "TERM"
    "TMP"
    "TZ"
    "UID"
    # Bash's own bookkeeping, and the capture's output rather than the shell's.
    "SHLVL"
    "OLDPWD"
    "_"
    "out"
    "outputs"
  ];

  # jq turns the exported environment into the JSON above: names a sandbox may
  # set (exported bash functions appear as BASH_FUNC_name%% and are skipped),
  # minus `dropped` and anything pointing into the build directory; PATH
  # entries that are directories in the store, in order, without repeats.
  filter = ''
    ($dropped | map({ (.): true }) | add) as $drop
    | env
    | {
        path: (
          (.PATH // "") | split(":")
          | map(select(startswith($store + "/")))
          | reduce .[] as $dir ([]; if index([$dir]) then . else . + [$dir] end)
        ),
        env: with_entries(select(
          (.key | test("^[A-Za-z_][A-Za-z0-9_]*$"))
          and ($drop[.key] | not)
          and (.value | contains($build) | not)
        ))
      }
  '';

  script = ''
    set -e
    # Structured-attrs derivations keep their attributes in .attrs.sh.
    if [ -e "''${NIX_ATTRS_SH_FILE:-}" ]; then . "$NIX_ATTRS_SH_FILE"; elif [ -e .attrs.sh ]; then . .attrs.sh; fi
    export IN_NIX_SHELL=impure
    if [ -n "''${stdenv:-}" ]; then . "$stdenv/setup"; fi
    # Keep only the PATH entries that exist, so that every one is in the closure.
    kept=
    IFS=: read -r -a entries <<< "''${PATH:-}"
    for dir in "''${entries[@]}"; do
      if [ -d "$dir" ]; then kept="''${kept:+$kept:}$dir"; fi
    done
    PATH=$kept ${jq}/bin/jq --null-input \
      --arg store ${builtins.storeDir} \
      --arg build "$NIX_BUILD_TOP" \
      --argjson dropped '${builtins.toJSON dropped}' \
      '${filter}' > "''${out:-''${outputs[out]}}"
  '';
in
derivation (
  builtins.removeAttrs shell.drvAttrs [
    # Reference checks are about the shell's outputs, not this capture.
    "allowedReferences"
    "allowedRequisites"
    "disallowedReferences"
    "disallowedRequisites"
    "outputChecks"
  ]
  // {
    name = "${shell.name}-sandbox-environment";
    args = [
      "-c"
      script
    ];
    outputs = [ "out" ];
  }
)
