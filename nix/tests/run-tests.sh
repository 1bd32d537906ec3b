#!/usr/bin/env bash
# Runs a file of evaluation tests (eval.nix, modules.nix): every test's value,
# then the message of every test that must fail, which has to contain the
# expected text (the key at fault). Prints the failures and a one-line summary;
# exits non-zero when anything failed.
#
#   run-tests.sh LABEL FILE [nix-instantiate arguments, e.g. --arg name value]
set -euo pipefail
label=$1 file=$2
shift 2

summary=$(nix-instantiate --eval --strict --json -A summary "$@" "$file")
# "name<TAB>expected message" for every test that must fail.
readarray -t errorTests < <(nix-instantiate --eval --strict --json -A errorMessages "$@" "$file" \
  | python3 -c 'import json, sys; print("\n".join(f"{n}\t{m}" for n, m in json.load(sys.stdin).items()))')

# Each throwing test on its own, to see its message.
failedMessages=0
for test in "${errorTests[@]}"; do
  name=${test%%$'\t'*}
  expected=${test#*$'\t'}
  if message=$(nix-instantiate --eval --strict "$@" --argstr testName "$name" --argstr testFile "$(realpath "$file")" \
    --expr '{ testName, testFile, ... }@args:
      let tests = import testFile; in
      (if builtins.isFunction tests then tests (builtins.removeAttrs args [ "testName" "testFile" ]) else tests)
        .tests.${testName}.expr' 2>&1); then
    continue # reported by the summary as "no error"
  fi
  if [[ $message != *"$expected"* ]]; then
    printf 'FAIL %s\n  expected an error containing: %s\n  got: %s\n' "$name" "$expected" "$message"
    failedMessages=$((failedMessages + 1))
  fi
done

python3 - "$label" "$summary" "${#errorTests[@]}" "$failedMessages" <<'PY'
import json, sys

label, summary = sys.argv[1], json.loads(sys.argv[2])
messages, failed_messages = int(sys.argv[3]), int(sys.argv[4])
for f in summary["failed"]:
    print(f"FAIL {f['name']}\n  expected: {json.dumps(f['expected'])}\n  actual:   {json.dumps(f['actual'])}")
failed = len(summary["failed"]) + failed_messages
print(f"{label}: {summary['passed']} of {summary['passed'] + len(summary['failed'])} passed, "
      f"{messages - failed_messages} of {messages} error messages checked"
      + (f", {failed} FAILED" if failed else ""))
sys.exit(1 if failed else 0)
PY
