# The configuration file's keys and value rules, read from config-schema.json,
# which the daemon generates from the very types that read config.toml
# (`nix-sandbox-mcp schema`; a cargo test keeps the committed copy current).
# The same TOML drives the Nix build, so mkServer checks it here: a typo or a
# bad value fails `nix build` / `nixos-rebuild` with the key named, instead of
# failing later when an MCP client starts the server. Only the subset of JSON
# Schema that file uses is understood.
let
  util = import ./util.nix;
  inherit (util) fail show;

  json = builtins.fromJSON (builtins.readFile ./config-schema.json);
  extras = json."x-nix-sandbox-mcp";

  # A JSON Schema pattern matches anywhere unless anchored; builtins.match
  # must match the whole string.
  matches =
    pattern: s:
    let
      len = builtins.stringLength pattern;
      starts = builtins.substring 0 1 pattern == "^";
      ends = len > 0 && builtins.substring (len - 1) 1 pattern == "$";
      body = builtins.substring (if starts then 1 else 0) (
        len - (if starts then 1 else 0) - (if ends then 1 else 0)
      ) pattern;
      whole = (if starts then "" else ".*") + "(${body})" + (if ends then "" else ".*");
    in
    builtins.match whole s != null;

  isNumber = v: builtins.isInt v || builtins.isFloat v;

  types = s: if s ? type then (if builtins.isList s.type then s.type else [ s.type ]) else [ ];

  hasType =
    ty: v:
    {
      integer = builtins.isInt v;
      number = builtins.isInt v || builtins.isFloat v;
      boolean = builtins.isBool v;
      string = builtins.isString v;
      array = builtins.isList v;
      object = builtins.isAttrs v;
      # TOML has no null, and neither does a configuration written in Nix.
      null = false;
    }
    .${ty};

  # Whether `v` satisfies the leaf schema `s`.
  valid =
    s: v:
    (!(s ? anyOf) || builtins.any (sub: valid sub v) s.anyOf)
    && (!(s ? oneOf) || builtins.length (builtins.filter (sub: valid sub v) s.oneOf) == 1)
    && (!(s ? const) || v == s.const)
    && (types s == [ ] || builtins.any (ty: hasType ty v) (types s))
    && (!(s ? minimum) || !(isNumber v) || v >= s.minimum)
    && (!(s ? maximum) || !(isNumber v) || v <= s.maximum)
    && (!(s ? pattern) || !(builtins.isString v) || matches s.pattern v)
    && (!(s ? enum) || builtins.elem v s.enum)
    && (!(s ? not) || !(valid s.not v))
    && (!(s ? minItems) || !(builtins.isList v) || builtins.length v >= s.minItems)
    && (!(s ? items) || !(builtins.isList v) || builtins.all (valid s.items) v)
    && (!(builtins.isAttrs v) || validTable s v);

  # The schema of the key `name` of the table schema `s`: its property, the
  # first of its patternProperties that matches, or its additionalProperties
  # when that is a schema; null when `s` allows no such key.
  keySchema =
    s: name:
    let
      patterns = builtins.filter (p: matches p name) (builtins.attrNames (s.patternProperties or { }));
      additional = s.additionalProperties or true;
    in
    if s.properties or { } ? ${name} then
      s.properties.${name}
    else if patterns != [ ] then
      s.patternProperties.${builtins.head patterns}
    else if builtins.isAttrs additional then
      additional
    else if additional == false then
      null
    else
      { };

  # Whether the table `v` has only keys `s` allows, each valid, and all required.
  validTable =
    s: v:
    builtins.all (
      name:
      let
        sub = keySchema s name;
      in
      sub != null && valid sub v.${name}
    ) (builtins.attrNames v)
    && builtins.all (name: v ? ${name}) (s.required or [ ]);

  # The rule of a leaf schema in words, for error messages.
  describe =
    s:
    let
      nonNull = builtins.filter (sub: types sub != [ "null" ]) (s.anyOf or [ ]);
      showEnum = builtins.concatStringsSep ", " (map builtins.toJSON s.enum);
    in
    if s ? enum then
      "one of ${showEnum}"
    else if s ? const then
      builtins.toJSON s.const
    else if s ? oneOf then
      builtins.concatStringsSep " or " (map describe s.oneOf)
    else if builtins.elem "integer" (types s) && s ? minimum && s ? maximum then
      "an integer between ${toString s.minimum} and ${toString s.maximum}"
    else if builtins.elem "integer" (types s) && s ? minimum then
      "an integer of at least ${toString s.minimum}"
    else if s ? "x-expected" then
      s."x-expected"
    else if builtins.elem "boolean" (types s) then
      "true or false"
    else if builtins.elem "array" (types s) && s ? items then
      "a list, each item ${describe s.items}"
    else if builtins.elem "string" (types s) then
      "a string"
    else if builtins.length nonNull == 1 then
      describe (builtins.head nonNull)
    else
      "a valid value";

  isTable = s: builtins.elem "object" (types s);

  # Checks `value` against the table schema `s`, returning it unchanged or
  # throwing with the full key of the first problem. `what` names unknown
  # keys ("table" at the top, "key" below).
  checkTable =
    what: key: s: value:
    let
      known = builtins.attrNames (s.properties or { });
      prefix = if key == "" then "" else "${key}.";
    in
    if !builtins.isAttrs value then
      fail key "expected a table, got ${show value}"
    else if builtins.any (name: !(value ? ${name})) (s.required or [ ]) then
      fail key "missing ${builtins.head (builtins.filter (name: !(value ? ${name})) s.required)}"
    else
      builtins.mapAttrs (
        name: v:
        let
          full = "${prefix}${name}";
          sub = keySchema s name;
        in
        if sub != null then
          checkValue full sub v
        else if s ? patternProperties then
          fail full "not a valid name here (expected a match of ${builtins.concatStringsSep " or " (builtins.attrNames s.patternProperties)})"
        else
          fail full "unknown ${what} (known: ${builtins.concatStringsSep ", " known})"
      ) value;

  # A table whose keys are checked one by one (so an error names the key).
  isKeyedTable =
    s: isTable s && (s ? properties || s ? patternProperties || builtins.isAttrs (s.additionalProperties or null));

  checkValue =
    key: s: v:
    if isKeyedTable s then
      checkTable "key" key s v
    else if valid s v then
      v
    else
      fail key "expected ${describe s}, got ${show v}";

  tables = json.properties;
  environmentSchema = builtins.head (builtins.attrValues tables.environments.patternProperties);

  presetAliases = extras.presetAliases;
  presetNames = extras.presets;
  reservedVariables = extras.reservedVariables;
  nameRule = extras.environmentName.expected;
  isValidName = name: builtins.isString name && matches extras.environmentName.pattern name;
  commandNameRule = extras.commandName.expected;
  isValidCommandName = name: builtins.isString name && matches extras.commandName.pattern name;

  variableName = tables.project.properties.inherit_env.properties.vars.items;
  isVariableName = v: builtins.isString v && matches variableName.pattern v;

  fileSchema = environmentSchema.properties.file_name;
  fileName = {
    description = describe fileSchema;
    check = valid fileSchema;
  };

  checkEnvironments =
    environments:
    if !builtins.isAttrs environments then
      fail "environments" "expected a table of environments, got ${show environments}"
    else
      builtins.mapAttrs (
        name: entry:
        let
          key = "environments.${name}";
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
          checkTable "key" key environmentSchema entry
      ) environments;

  # The daemon resolves a relative project path against the directory it
  # starts in; for a Nix-built server the path must be absolute to mean
  # anything.
  checkProjectPath =
    project:
    if project ? path && !(builtins.isString project.path && util.hasPrefix "/" project.path) then
      fail "project.path" "expected an absolute path (a relative one would point into the Nix store, where the built config file lives), got ${show project.path}"
    else
      project;
in
{
  inherit
    isValidName
    nameRule
    isValidCommandName
    commandNameRule
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
        else if name == "project" then
          checkProjectPath (checkValue name tables.project value)
        else if tables ? ${name} then
          checkValue name tables.${name} value
        else
          fail name "unknown table (known: ${builtins.concatStringsSep ", " (builtins.attrNames tables)})"
      ) settings;

  # Every key name the schema knows, in any table (for the test that holds it
  # to config.example.toml).
  keyNames =
    let
      names =
        s:
        builtins.concatLists (
          util.mapAttrsToList (name: sub: [ name ] ++ names sub) (s.properties or { })
          ++ map names (builtins.attrValues (s.patternProperties or { }))
          ++ map names (s.anyOf or [ ] ++ s.oneOf or [ ])
          ++ (if s ? items then [ (names s.items) ] else [ ])
          ++ (if builtins.isAttrs (s.additionalProperties or null) then [ (names s.additionalProperties) ] else [ ])
        );
      tableNames = builtins.attrNames tables ++ [
        "inherit_env"
        "grants"
        "params"
        "oauth"
        "per_principal"
        "principals"
      ];
    in
    builtins.filter (n: !(builtins.elem n tableNames)) (util.unique (names json));

  # Checks a mkSandbox `network` argument: false, true, or { allow = [...]; }.
  # Credentials and request rules are the server configuration's alone (an
  # artifact may come from a project's flake); the daemon refuses them too.
  checkNetwork =
    key: value:
    if builtins.isAttrs value && (value ? credentials || value ? requests) then
      fail key "an artifact cannot hold credentials or request rules; the server's configuration sets them ([environments.NAME.network])"
    else
      checkValue key environmentSchema.properties.network value;

  # Checks a mkSandbox `limits` argument, which uses the `[defaults]` keys.
  checkLimits = key: value: checkTable "key" key tables.defaults value;
}
