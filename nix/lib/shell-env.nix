# captureShellEnvironment: the environment `nix develop` would give for a
# development shell, captured at build time as
#
#   { "path": [ "/nix/store/…/bin", … ], "env": { "NAME": "value", … } }
#
# (in the line layout described below) for mkSandbox's `shellEnvironment`. Like `nix develop`, it builds the shell's
# derivation with its builder replaced by a script that runs stdenv's setup
# (which runs the inputs' setup hooks) and records the exported variables.
# What is lost compared with an interactive `nix develop` is listed in
# docs/nix.md ("What a sandbox keeps from a devShell").
{
  # The devShell derivation (mkShell, or any stdenv derivation).
  shell,
}:
let
  build = import ./build.nix;

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

  # The exported variables as the JSON above, written by bash alone (no jq: a
  # start-up build must not fetch anything the shell does not use), one item
  # per line so that mkSandbox's builder can splice the items:
  #
  #   {"path":[
  #   "/nix/store/…/bin"
  #   ,"/nix/store/…/bin"
  #   ],"env":{
  #   "NAME":"value"
  #   }}
  #
  # Kept: names a sandbox may set, minus `dropped` and values pointing into
  # the build directory; PATH entries that are directories in the store, in
  # order, without repeats. Bash lists variable names by their first
  # character (${!A*}); exported ones have the `x` attribute.
  firstCharacters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_";
  allNames = builtins.concatStringsSep " " (
    builtins.genList (i: "\${!${builtins.substring i 1 firstCharacters}*}") (
      builtins.stringLength firstCharacters
    )
  );

  script = ''
    set -e
    # Structured-attrs derivations keep their attributes in .attrs.sh.
    if [ -e "''${NIX_ATTRS_SH_FILE:-}" ]; then . "$NIX_ATTRS_SH_FILE"; elif [ -e .attrs.sh ]; then . .attrs.sh; fi
    export IN_NIX_SHELL=impure
    if [ -n "''${stdenv:-}" ]; then . "$stdenv/setup"; fi
    ${build.jsonString}
    captureEnvironment() {
      local __dir __name __value __separator=
      local -a __entries
      local __seen=:
      printf '{"path":[\n'
      IFS=: read -r -a __entries <<< "''${PATH:-}"
      for __dir in "''${__entries[@]}"; do
        case $__dir in ${builtins.storeDir}/*) ;; *) continue ;; esac
        [ -d "$__dir" ] || continue
        case $__seen in *":$__dir:"*) continue ;; esac
        __seen=$__seen$__dir:
        printf '%s' "$__separator"; jsonString "$__dir"; printf '\n'
        __separator=,
      done
      printf '],"env":{\n'
      __separator=
      for __name in ${allNames}; do
        [[ ''${!__name@a} == *x* ]] || continue
        case " ${builtins.concatStringsSep " " dropped} " in *" $__name "*) continue ;; esac
        __value=''${!__name}
        if [ -n "''${NIX_BUILD_TOP:-}" ]; then
          case $__value in *"$NIX_BUILD_TOP"*) continue ;; esac
        fi
        printf '%s"%s":' "$__separator" "$__name"; jsonString "$__value"; printf '\n'
        __separator=,
      done
      printf '}}\n'
    }
    captureEnvironment > "''${out:-''${outputs[out]}}"
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
