# The bundled presets: sandbox artifacts baked into the nix-sandbox-mcp package
# and served when the config names no [environments]. Their names match the
# daemon's host-mode presets (bash, python, node), so a config works the same
# with or without Nix.
{
  pkgs,
  # mkSandbox with pkgs and the daemon already applied.
  mkSandbox,
}:
let
  util = import ../lib/util.nix;

  # "requests 2.32": the version tells the model which API it can use.
  versioned = package: "${package.pname} ${util.majorMinor package.version}";

  # The bash preset's tools, by the names its description gives them.
  shellTools = {
    inherit (pkgs)
      coreutils
      gawk
      findutils
      jq
      diffutils
      file
      bc
      ripgrep
      fd
      tree
      ;
    grep = pkgs.gnugrep;
    sed = pkgs.gnused;
  };

  python = pkgs.python3;
  # A few common pure-Python libraries (no compiled extensions, so they add
  # little to the closure).
  pythonLibraries = ps: [
    ps.requests
    ps.python-dateutil
    ps.tabulate
    ps.attrs
  ];
in
{
  bash = mkSandbox {
    name = "bash";
    packages = [ pkgs.bash ] ++ builtins.attrValues shellTools;
    interpreter = "bash";
    # Tool names without versions: the description is sent with every
    # conversation, and the manifest's `tools` lists every executable anyway.
    description = "Bash ${pkgs.bash.version} with ${builtins.concatStringsSep ", " (builtins.attrNames shellTools)}";
  };

  python = mkSandbox {
    name = "python";
    packages = [ (python.withPackages pythonLibraries) ];
    interpreter = "python";
    description = "Python ${python.version} with ${
      builtins.concatStringsSep ", " (map versioned (pythonLibraries python.pkgs))
    }";
    # Python's ssl module finds no CA bundle in the sandbox's closure without
    # it; needed when the config gives the environment network access.
    env.SSL_CERT_FILE = "${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt";
  };

  node = mkSandbox {
    name = "node";
    packages = [ pkgs.nodejs ];
    interpreter = "node";
    description = "Node.js ${pkgs.nodejs.version}";
  };
}
