# The configuration file as a build plan: which sandbox artifacts a server
# built from it needs baked in. Pure, so nix/tests/eval.nix covers every rule.
let
  util = import ./util.nix;
  schema = import ./schema.nix;
  interpreters = import ./interpreter.nix;
  inherit (util) fail;

  # "github:org/repo#sandboxes.ruby" -> { ref = "github:org/repo"; attrPath = [ "sandboxes" "ruby" ]; }
  # Without a fragment the attribute path is null: the flake's default package.
  parseFlakeOutput =
    key: output:
    let
      m = builtins.match "([^#]+)(#(.*))?" output;
      fragment = builtins.elemAt m 2;
    in
    if m == null then
      fail key "${builtins.toJSON output} is not a flake reference such as \"github:org/repo#sandbox\""
    else
      {
        ref = builtins.head m;
        attrPath =
          if fragment == null || fragment == "" then
            null
          else
            builtins.filter builtins.isString (builtins.split "\\." fragment);
      };
in
{
  inherit parseFlakeOutput;

  # Validates `settings` (the parsed TOML, or an attrset of the same shape) and
  # returns what a server built from it bakes in:
  #   presets       bundled presets the config uses (all of them without
  #                 [environments]), by canonical name
  #   flakes        [ { name; ref; attrPath; interpreter; } ] for `flake` entries
  #   projectShell  whether [project] use_flake asks for the devShell environment
  planServer =
    settings:
    let
      checked = schema.checkConfig settings;
      environments = checked.environments or null;
      entries = if environments == null then { } else environments;
      projectShell = checked.project.use_flake or false;
      canonicalPreset = entry: schema.presetAliases.${entry.preset};
      presetEntries = util.filterAttrs (_: entry: entry ? preset) entries;
      presets =
        if environments == null then
          schema.presetNames
        else
          util.unique (map canonicalPreset (builtins.attrValues presetEntries));
      flakes = util.mapAttrsToList (
        name: entry:
        let
          key = "environments.${name}";
          # The daemon gives a preset entry the baked-in artifact of the
          # preset's name; a flake artifact of that name would replace it.
          shadowed = util.filterAttrs (_: e: canonicalPreset e == name) presetEntries;
        in
        if shadowed != { } then
          fail key "a flake environment may not be named ${name} while ${builtins.concatStringsSep ", " (map (n: "environments.${n}") (builtins.attrNames shadowed))} uses the ${name} preset; rename one of them"
        else
          parseFlakeOutput "${key}.flake" entry.flake
          // {
            inherit name;
            interpreter = if entry ? interpreter then interpreters.fromConfig entry.interpreter else null;
          }
      ) (util.filterAttrs (_: entry: entry ? flake) entries);
    in
    if projectShell && entries ? project then
      fail "environments.project" "the name project belongs to the devShell environment that [project] use_flake = true creates; rename this entry"
    else
      builtins.deepSeq checked {
        inherit presets flakes projectShell;
      };
}
