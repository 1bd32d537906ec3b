# Turns a set of tests, each { expr; expected; } (expr must equal expected)
# or { expr; throws = "text"; } (evaluating expr fully must fail with a
# message containing the text), into what run-tests.sh and the flake's checks
# read: the tests, the messages of the throwing ones, and a summary.
tests:
let
  run =
    name: t:
    if t ? throws then
      {
        inherit name;
        ok = !(builtins.tryEval (builtins.deepSeq t.expr null)).success;
        expected = "an error containing: ${t.throws}";
        actual = "no error";
      }
    else
      {
        inherit name;
        ok = t.expr == t.expected;
        inherit (t) expected;
        actual = t.expr;
      };
  results = builtins.attrValues (builtins.mapAttrs run tests);
  throwing = builtins.filter (name: tests.${name} ? throws) (builtins.attrNames tests);
in
{
  inherit tests;
  errorMessages = builtins.listToAttrs (
    map (name: {
      inherit name;
      value = tests.${name}.throws;
    }) throwing
  );
  summary = {
    passed = builtins.length (builtins.filter (r: r.ok) results);
    failed = builtins.filter (r: !r.ok) results;
  };
}
