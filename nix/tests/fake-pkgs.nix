# Just enough of nixpkgs' shape for evaluation tests: derivations are plain
# attrsets that remember how they were made, with made-up store paths; nothing
# is ever built.
let
  storePath = name: "${builtins.storeDir}/00000000000000000000000000000000-${name}";
  package = pname: version: {
    type = "derivation";
    inherit pname version;
    name = "${pname}-${version}";
    outPath = storePath "${pname}-${version}";
  };
in
rec {
  stdenv.hostPlatform.system = "x86_64-linux";

  runCommand =
    name: env: script:
    {
      type = "derivation";
      inherit name env script;
      meta = env.meta or { };
      outPath = storePath name;
    }
    // env.passthru or { };

  formats.toml = _: {
    generate = name: value: {
      inherit name value;
      outPath = storePath name;
    };
  };

  runtimeShell = "${bash}/bin/bash";
  bash = package "bash" "5.3p3";
  coreutils = package "coreutils" "9.7";
  jq = package "jq" "1.8.1";
  bubblewrap = package "bubblewrap" "0.11.0";
  makeBinaryWrapper = package "make-binary-wrapper-hook" "0";
  gnugrep = package "gnugrep" "3.12";
  gnused = package "gnused" "4.9";
  gawk = package "gawk" "5.3.2";
  findutils = package "findutils" "4.10.0";
  diffutils = package "diffutils" "3.12";
  file = package "file" "5.46";
  bc = package "bc" "1.08.2";
  ripgrep = package "ripgrep" "14.1.1";
  fd = package "fd" "10.2.0";
  tree = package "tree" "2.2.1";
  cacert = package "nss-cacert" "3.115";
  nodejs = package "nodejs" "22.17.0";
  python3 = package "python3" "3.13.5" // {
    interpreter = "${storePath "python3-3.13.5"}/bin/python3";
    pkgs = {
      requests = package "requests" "2.32.4";
      python-dateutil = package "python-dateutil" "2.9.0.post0";
      tabulate = package "tabulate" "0.9.0";
      attrs = package "attrs" "25.3.0";
    };
    withPackages =
      select:
      package "python3-env" "3.13.5"
      // {
        libraries = select python3.pkgs;
      };
  };

  # A stand-in for the nix-sandbox-mcp daemon package.
  daemon = package "nix-sandbox-mcp" "0.1.0" // {
    meta.description = "fake daemon";
  };

  # A package with a separate `bin` output, like many in nixpkgs.
  multiOutput = package "multi" "1.0" // {
    bin = package "multi-bin" "1.0";
  };
}
