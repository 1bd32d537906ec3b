# A stand-in for the few nixpkgs attributes mkSandbox uses, made of this
# machine's own programs copied into the Nix store together with the shared
# libraries they load. It lets the offline end-to-end test build real sandbox
# artifacts, with real store closures, with the real mkSandbox where nixpkgs
# cannot be downloaded. The builders are host programs (/bin/bash, /usr/bin/*),
# so it needs `sandbox = false` in nix.conf.
{
  system ? builtins.currentSystem,
  # The daemon under test, e.g. target/debug/nix-sandbox-mcp. A string, so it
  # is linked to rather than copied into the store; null for none.
  daemonBinary ? null,
}:
let
  # Host programs are linked against the host's dynamic loader at this fixed
  # path; inside the sandbox it must be a link into the closure.
  loader =
    {
      x86_64-linux = "/lib64/ld-linux-x86-64.so.2";
      aarch64-linux = "/lib/ld-linux-aarch64.so.1";
    }
    .${system} or (throw "host-pkgs.nix: no dynamic loader known for ${system}");

  # Like nixpkgs' runCommand: `env` becomes the derivation's attributes, its
  # nativeBuildInputs' bin directories go first on PATH, passthru is merged
  # into the result.
  runCommand =
    name: env: script:
    derivation (
      {
        inherit name system;
        builder = "/bin/bash";
        # Without a build sandbox, Nix takes the end of the builder's output as
        # the end of the build and kills the build user's processes, sometimes
        # before the exiting builder is reaped, failing the build with signal
        # 9 (NixOS/nix#2176). A short-lived child holding the output open
        # past the builder's exit avoids that race.
        args = [
          "-euo"
          "pipefail"
          "-c"
          "${script}\nsleep 0.1 &"
        ];
        PATH = builtins.concatStringsSep ":" (
          map (p: "${p}/bin") (env.nativeBuildInputs or [ ]) ++ [
            "/usr/bin"
            "/bin"
          ]
        );
      }
      // builtins.removeAttrs env [
        "nativeBuildInputs"
        "passthru"
        "meta"
      ]
    )
    // env.passthru or { };

  # A package that is a link to a host program, for tools that run outside the
  # sandbox only (at build time, or to start it).
  hostLink =
    name: program:
    runCommand name { } ''
      mkdir -p "$out/bin"
      ln -s ${program} "$out/bin/${baseNameOf program}"
    '';

  python = "/usr/bin/python3";
  # Where the host's Python keeps its standard library (and compiled modules).
  pythonDirs = "${python} -c \"import sysconfig; print(sysconfig.get_path('stdlib'), sysconfig.get_path('platstdlib'))\"";

  # The shared libraries of every program below, and the loader, in one store
  # path. Every copied package refers to it, so it lands in each closure.
  libraries = runCommand "host-libraries" { } ''
    mkdir -p "$out/lib"
    read -r stdlib platstdlib < <(${pythonDirs})
    objects=$(for f in ${builtins.concatStringsSep " " allPrograms} "$stdlib"/lib-dynload/*.so "$platstdlib"/lib-dynload/*.so; do
      if [ -e "$f" ]; then echo "$f"; fi
    done)
    # ldd prints "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)" and the
    # loader as "/lib64/ld-linux-x86-64.so.2 (0x…)".
    for f in $objects; do ldd "$f" 2>/dev/null || true; done \
      | sed -n -e 's|.*=> \(/[^ ]*\) .*|\1|p' -e 's|^[[:space:]]*\(/[^ ]*\) .*|\1|p' \
      | sort -u \
      | while read -r library; do cp -L "$library" "$out/lib/"; done
    [ -e "$out/lib/${baseNameOf loader}" ] || cp -L ${loader} "$out/lib/"
  '';

  # Copies host programs into $out/bin; `extra` runs afterwards.
  hostPackage =
    name: programs: extra:
    runCommand "host-${name}" { } ''
      mkdir -p "$out/bin" "$out/nix-support"
      for program in ${builtins.concatStringsSep " " programs}; do
        if [ -e "$program" ]; then cp -L "$program" "$out/bin/"; fi
      done
      echo ${libraries} > "$out/nix-support/host-libraries"
      ${extra}
    '';

  coreutilsPrograms = map (p: "/usr/bin/${p}") (
    (import ../lib/util.nix).words ''
      basename cat chmod cp cut date dirname echo env expr false head id ln ls
      mkdir mktemp mv printf pwd readlink realpath rm seq sleep sort tail tee
      test touch tr true uname uniq wc yes
    ''
  );
  allPrograms = [
    "/usr/bin/bash"
    "/usr/bin/node"
    "/usr/bin/grep"
    "/usr/bin/sed"
    "/usr/bin/jq"
    "$(readlink -f ${python})"
  ]
  ++ coreutilsPrograms;
in
rec {
  inherit runCommand libraries;

  stdenv.hostPlatform.system = system;
  runtimeShell = "${bash}/bin/bash";
  jq = hostLink "jq" "/usr/bin/jq";
  bubblewrap = hostLink "bubblewrap" "/usr/bin/bwrap";
  daemon = if daemonBinary == null then null else hostLink "nix-sandbox-mcp" daemonBinary;

  bash = hostPackage "bash" [ "/usr/bin/bash" ] "";
  coreutils = hostPackage "coreutils" coreutilsPrograms "";
  textTools = hostPackage "text-tools" [
    "/usr/bin/grep"
    "/usr/bin/sed"
    "/usr/bin/jq"
  ] "";
  nodejs = hostPackage "nodejs" [ "/usr/bin/node" ] "";
  # Python finds its standard library next to its executable
  # (<prefix>/bin/python3.X -> <prefix>/lib/python3.X), so the copy is a
  # self-contained prefix.
  python3 = hostPackage "python3" [ ] ''
    real=$(readlink -f ${python})
    cp "$real" "$out/bin/"
    ln -s "''${real##*/}" "$out/bin/python3"
    read -r stdlib platstdlib < <(${pythonDirs})
    mkdir -p "$out/lib"
    cp -r "$stdlib" "$out/lib/"
    [ "$platstdlib" = "$stdlib" ] || cp -rn "$platstdlib"/. "$out/lib/''${stdlib##*/}/"
    rm -rf "$out/lib/''${stdlib##*/}/test"
    find "$out/lib" -name __pycache__ -prune -exec rm -rf {} +
  '';

  # What every sandbox made of host programs needs besides its packages: the
  # loader at the path the programs name, and the libraries on the search path.
  sandboxRuntime = {
    env.LD_LIBRARY_PATH = "${libraries}/lib";
    links.${loader} = "${libraries}/lib/${baseNameOf loader}";
  };

  # What nixpkgs' stdenv setup does to a shell's environment, in miniature:
  # the inputs' bin directories go on PATH and setup hooks export variables.
  shellStdenv = runCommand "fake-stdenv" { } ''
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

  # A development shell like nixpkgs' mkShell makes (only for `nix develop`:
  # building it fails), with the stand-in stdenv above. Other attributes
  # become the shell's variables.
  mkShell =
    {
      name ? "dev-shell",
      packages ? [ ],
      ...
    }@attrs:
    derivation (
      builtins.removeAttrs attrs [ "packages" ]
      // {
        inherit name system;
        stdenv = shellStdenv;
        builder = "/bin/bash";
        args = [
          "-c"
          "echo this shell is for nix develop only; exit 1"
        ];
        nativeBuildInputs = packages;
      }
    );
}
