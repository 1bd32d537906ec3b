# The handful of list, string and attrset helpers the library needs, written
# with builtins only: nix/lib must evaluate without nixpkgs (nix/tests/eval.sh).
rec {
  # Every error the Nix side raises names the key or argument at fault, in the
  # same words as the daemon's own configuration errors.
  fail = key: message: throw "nix-sandbox-mcp: ${key}: ${message}";

  hasPrefix = prefix: s: builtins.substring 0 (builtins.stringLength prefix) s == prefix;

  optional = cond: x: if cond then [ x ] else [ ];
  optionals = cond: xs: if cond then xs else [ ];
  optionalAttrs = cond: attrs: if cond then attrs else { };

  unique = builtins.foldl' (acc: x: if builtins.elem x acc then acc else acc ++ [ x ]) [ ];

  filterAttrs =
    pred: attrs:
    builtins.removeAttrs attrs (
      builtins.filter (name: !(pred name attrs.${name})) (builtins.attrNames attrs)
    );

  mapAttrsToList = f: attrs: map (name: f name attrs.${name}) (builtins.attrNames attrs);

  hasAttrByPath =
    path: value:
    path == [ ]
    || (
      builtins.isAttrs value
      && value ? ${builtins.head path}
      && hasAttrByPath (builtins.tail path) value.${builtins.head path}
    );

  getAttrByPath = path: value: builtins.foldl' (v: name: v.${name}) value path;

  # Splits on runs of whitespace, like Rust's `split_whitespace`, which is how
  # the daemon reads `interpreter = "ruby {file}"`.
  words =
    s:
    builtins.filter (w: builtins.isString w && w != "") (builtins.split "[[:space:]]+" s);

  # A short, unambiguous rendering of a value for error messages.
  show =
    v:
    if builtins.isString v then
      builtins.toJSON v
    else if builtins.isFunction v then
      "a function"
    else if builtins.isAttrs v && v ? outPath then
      "the derivation ${v.name or "?"}"
    else
      builtins.toJSON v;

  # "3.12.4" -> "3.12"; versions with fewer parts are returned whole.
  majorMinor =
    version:
    let
      parts = builtins.filter builtins.isString (builtins.split "\\." version);
    in
    if builtins.length parts < 2 then
      version
    else
      "${builtins.elemAt parts 0}.${builtins.elemAt parts 1}";
}
