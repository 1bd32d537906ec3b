# The configuration file's keys and value types, as the daemon reads them
# (daemon/src/config.rs). The same TOML drives the Nix build, so mkServer checks
# it here: a typo or a bad value fails `nix build` / `nixos-rebuild` with the key
# named, instead of failing later when an MCP client starts the server.
let
  util = import ./util.nix;
  inherit (util) fail show;

  # A leaf type: a predicate and the words used when it fails.
  leaf = description: check: { inherit description check; };

  bool = leaf "true or false" builtins.isBool;
  string = leaf "a string" builtins.isString;
  positive = leaf "an integer of at least 1" (v: builtins.isInt v && v >= 1);
  nonNegative = leaf "an integer of at least 0" (v: builtins.isInt v && v >= 0);
  between =
    low: high:
    leaf "an integer between ${toString low} and ${toString high}" (
      v: builtins.isInt v && v >= low && v <= high
    );
  absolutePath = leaf "an absolute path" (v: builtins.isString v && util.hasPrefix "/" v);
  oneOf =
    values:
    leaf "one of ${builtins.concatStringsSep ", " (map builtins.toJSON values)}" (
      v: builtins.elem v values
    );
  listOf =
    t:
    leaf "a list, each item ${t.description}" (v: builtins.isList v && builtins.all t.check v);

  isValidName = name: builtins.isString name && builtins.match nameRegex name != null;
  nameRegex = "[A-Za-z0-9][A-Za-z0-9._-]{0,63}";
  nameRule = "letters, digits, '-', '_' or '.', starting with a letter or digit, at most 64 characters";

  # Variables the jail sets itself; an artifact or inherit_env may not touch them.
  reservedVariables = [
    "PATH"
    "HOME"
    "TMPDIR"
    "PWD"
    "USER"
    "LOGNAME"
  ];
  isVariableName = v: builtins.isString v && builtins.match "[A-Za-z_][A-Za-z0-9_]*" v != null;
  variableName = leaf "a variable name such as DATABASE_URL, other than ${builtins.concatStringsSep ", " reservedVariables}" (
    v: isVariableName v && !(builtins.elem v reservedVariables)
  );

  fileName = leaf "a plain file name such as main.py" (
    v:
    builtins.isString v
    && v != ""
    && v != "."
    && v != ".."
    && builtins.stringLength v <= 128
    && builtins.match ".*/.*" v == null
  );

  interpreter = leaf "a command such as \"ruby {file}\" or a list such as [\"ruby\", \"{file}\"]" (
    v:
    (builtins.isString v && util.words v != [ ])
    || (builtins.isList v && v != [ ] && builtins.all builtins.isString v)
  );

  # Preset names an operator may write, and the bundled preset each one means.
  presetAliases = {
    bash = "bash";
    shell = "bash";
    python = "python";
    python3 = "python";
    node = "node";
    nodejs = "node";
  };
  presetNames = [
    "bash"
    "python"
    "node"
  ];

  limits = {
    timeout_ms = between 1 86400000;
    memory_mb = positive;
    pids = positive;
    cpu_seconds = positive;
    file_size_mb = positive;
    open_files = between 16 1048576;
    workspace_mb = positive;
    output_bytes = between 256 16777216;
    output_limit_mb = positive;
  };

  config = {
    server = {
      max_concurrent_runs = positive;
      max_queued_runs = nonNegative;
      nix_build_timeout_seconds = positive;
      audit_log = absolutePath;
      audit_log_code = bool;
      audit_log_output = bool;
      max_jobs = positive;
      job_timeout_seconds = positive;
      job_retention_seconds = positive;
      job_output_bytes = positive;
      max_sessions = positive;
      session_idle_seconds = positive;
      session_max_lifetime_seconds = positive;
    };
    defaults = limits;
    project = {
      # The daemon resolves a relative path against the config file's directory,
      # which for a Nix-built server is the store.
      path = leaf "an absolute path (a relative one would point into the Nix store, where the built config file lives)" (
        absolutePath.check
      );
      mount_point = absolutePath;
      mode = oneOf [
        "readonly"
        "readwrite"
      ];
      use_flake = bool;
      inherit_env.vars = listOf variableName;
    };
    environments = {
      preset = oneOf (builtins.attrNames presetAliases);
      interpreter = interpreter;
      flake = string;
      description = string;
      file_name = fileName;
      network = bool;
      seccomp_allow = listOf string;
    }
    // limits;
  };

  isLeaf = t: t ? check;

  # Checks `value` against `table` (an attrset of leaf types and nested tables),
  # returning it unchanged or throwing with the full key of the first problem.
  checkTable =
    key: table: value:
    if !builtins.isAttrs value then
      fail key "expected a table, got ${show value}"
    else
      builtins.mapAttrs (
        name: v:
        let
          full = "${key}.${name}";
          t = table.${name};
        in
        if !(table ? ${name}) then
          fail full "unknown key (known keys: ${builtins.concatStringsSep ", " (builtins.attrNames table)})"
        else if isLeaf t then
          (if t.check v then v else fail full "expected ${t.description}, got ${show v}")
        else
          checkTable full t v
      ) value;

  checkEnvironments =
    environments:
    if !builtins.isAttrs environments then
      fail "environments" "expected a table of environments, got ${show environments}"
    else
      builtins.mapAttrs (
        name: entry:
        let
          key = "environments.${name}";
          checked = checkTable key config.environments entry;
          sources = builtins.filter (s: entry ? ${s}) [
            "preset"
            "interpreter"
            "flake"
          ];
        in
        if !(isValidName name) then
          fail key "${builtins.toJSON name} is not a valid environment name (${nameRule})"
        else if !(builtins.length sources == 1 || sources == [ "interpreter" "flake" ]) then
          fail key "set exactly one of preset, interpreter or flake (interpreter may accompany flake)"
        else
          checked
      ) environments;
in
{
  inherit
    isValidName
    nameRule
    isVariableName
    reservedVariables
    presetAliases
    presetNames
    fileName
    ;

  # Checks a whole configuration (the parsed TOML); returns it unchanged.
  # Validation is lazy like everything in Nix: force the result (deepSeq) to
  # run every check.
  checkConfig =
    settings:
    if !builtins.isAttrs settings then
      fail "config" "expected a table, got ${show settings}"
    else
      builtins.mapAttrs (
        name: value:
        if name == "environments" then
          checkEnvironments value
        else if config ? ${name} then
          checkTable name config.${name} value
        else
          fail name "unknown table (known: server, defaults, project, environments)"
      ) settings;

  # Every key name the schema knows, in any table (for the test that holds it
  # to config.example.toml).
  keyNames =
    let
      names =
        table:
        builtins.concatLists (
          util.mapAttrsToList (name: t: if isLeaf t then [ name ] else names t) table
        );
    in
    util.unique (names config);

  # Checks a mkSandbox `limits` argument, which uses the `[defaults]` keys.
  checkLimits = key: value: checkTable key limits value;
}
