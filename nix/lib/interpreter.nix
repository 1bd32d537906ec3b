# What mkSandbox's `interpreter` argument may be, normalised to the manifest's
# `interpreter` object (docs/manifest.md) plus the environment variables that
# go with the interpreter's kind.
let
  util = import ./util.nix;
  schema = import ./schema.nix;
  inherit (util) fail show;

  # The kinds the daemon knows (sessions need one of them). Program names and
  # code file names match the daemon's host-mode presets, so an environment
  # behaves the same whether it comes from Nix or from the host.
  kinds = {
    bash = {
      program = "bash";
      fileName = ".main.sh";
      env = { };
    };
    python = {
      program = "python3";
      fileName = ".main.py";
      # Output streams as it is produced, and the read-only closure never
      # gets .pyc files written next to the sources.
      env = {
        PYTHONUNBUFFERED = "1";
        PYTHONDONTWRITEBYTECODE = "1";
      };
    };
    node = {
      program = "node";
      fileName = ".main.js";
      env = { };
    };
  };
  kindNames = builtins.attrNames kinds;

  # "python3.12" -> "python", the way the daemon recognises host interpreters.
  kindOfProgram =
    program:
    let
      m = builtins.match "([a-z]+)[0-9.]*" (baseNameOf program);
    in
    if m != null && kinds ? ${builtins.head m} then builtins.head m else null;

  fromAttrs =
    where: spec:
    let
      unknown = builtins.filter (k: !(builtins.elem k [ "argv" "fileName" "kind" ])) (builtins.attrNames spec);
      argv = spec.argv or (fail "${where}.argv" "missing: give the command, e.g. [ \"ruby\" \"{file}\" ]");
      kind = if spec ? kind then spec.kind else kindOfProgram (builtins.head argv);
    in
    if unknown != [ ] then
      fail "${where}.${builtins.head unknown}" "unknown key (known keys: argv, fileName, kind)"
    else if !(builtins.isList argv && argv != [ ] && builtins.all builtins.isString argv) then
      fail "${where}.argv" "expected a non-empty list of strings, got ${show argv}"
    else if builtins.head argv == "" || builtins.match ".*[{].*" (builtins.head argv) != null then
      fail "${where}.argv" "${show (builtins.head argv)} is not a program"
    else if kind != null && !(builtins.elem kind kindNames) then
      fail "${where}.kind" "expected null or one of ${builtins.concatStringsSep ", " kindNames}, got ${show kind}"
    else
      let
        fileName = spec.fileName or (if kind == null then ".main" else kinds.${kind}.fileName);
      in
      if !(schema.fileName.check fileName) then
        fail "${where}.fileName" "expected ${schema.fileName.description}, got ${show fileName}"
      else
        {
          inherit argv fileName kind;
          env = if kind == null then { } else kinds.${kind}.env;
        };
in
{
  # `spec` is one of:
  #   "bash" | "python" | "node"            a known interpreter, found in the packages
  #   [ "ruby" "{file}" ]                   a command; `{file}` is the code file
  #   { argv = [ … ]; fileName = "main.rb"; kind = null; }
  # A relative program name (argv[0]) is looked up in the packages' bin
  # directories when the artifact is built. `kind` defaults to the kind the
  # program's name suggests (python3.12 -> python).
  normalize =
    where: spec:
    if builtins.isString spec then
      if kinds ? ${spec} then
        {
          argv = [
            kinds.${spec}.program
            "{file}"
          ];
          inherit (kinds.${spec}) fileName env;
          kind = spec;
        }
      else
        fail where "${show spec} is not one of ${builtins.concatStringsSep ", " kindNames}; for another interpreter give its command, e.g. [ \"ruby\" \"{file}\" ]"
    else if builtins.isList spec then
      fromAttrs where { argv = spec; }
    else if builtins.isAttrs spec then
      fromAttrs where spec
    else
      fail where "expected a string, a list or an attrset, got ${show spec}";

  # The config file's `interpreter` (a string split on whitespace, or a list)
  # as mkSandbox's list form.
  fromConfig = value: if builtins.isString value then util.words value else value;
}
