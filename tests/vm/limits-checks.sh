#!/usr/bin/env bash
# Runs inside the nsm-vm (started by run-tier.sh as dev or as root): the real
# daemon, started each way a user may start it, must get a delegated cgroup v2
# on its own (no manual systemd-run) and enforce memory, process and CPU
# limits with it. Exits non-zero when a check fails.
# As root, also the NixOS module's replica unit (service_checks).
# Usage: limits-checks.sh PATH-TO-nix-sandbox-mcp [service]
#   service: only the replica unit's checks
set -uo pipefail
bin=$(realpath "${1:?usage: limits-checks.sh PATH-TO-nix-sandbox-mcp [service]}")
only=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
user=(); [ "$(id -u)" = 0 ] || user=(--user)
failures=0
work=$(mktemp -d)
cd "$work" || exit 1
section() { printf '\n=== %s\n' "$*"; }
check() { # check DESCRIPTION COMMAND...: runs the command, reports
  if "${@:2}"; then echo "ok    $1"; else echo "FAIL  $1"; failures=$((failures + 1)); fi
}

# A quarter of a core under software emulation starts python in seconds, and
# node in more than 20 when the host is busy: the time limit only stops a
# check that hangs.
printf '[defaults]\nmemory_mb = 64\npids = 24\ntimeout_ms = 45000\ncpus = 0.25\n' > limits.toml

cgroup_checks() { # cgroup_checks LAUNCHER...: the daemon, started through LAUNCHER, gets a
  # cgroup v2 of its own and limits memory and processes with it
  local launch=("$@")
  mechanism=$("${launch[@]}" "$bin" --config limits.toml envs --json | python3 -c 'import json, sys
v = json.load(sys.stdin)
print(v["limits_mechanism"] + ("" if v["cgroup_v2_missing"] is None else " with a step to cgroup v2: " + v["cgroup_v2_missing"]["step"]))')
  check "limits are enforced with cgroup v2, and no step to it is offered (got: $mechanism)" test "$mechanism" = "cgroup v2"

  "${launch[@]}" "$bin" --config limits.toml run -e python 'x = []
while True: x.append(bytearray(16 << 20))' >out 2>err
  rc=$?
  check "a memory bomb ends with the memory limit (exit $rc: $(tail -n1 err))" \
    sh -c "[ $rc = 125 ] && grep -q 'memory limit' err"

  "${launch[@]}" "$bin" --config limits.toml run -e python 'import os, time
n = 0
try:
    while n < 100:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
os._exit(0)' >out 2>err
  check "the process limit holds (started $(cat out) of 100)" sh -c '[ "$(cat out)" -lt 24 ]'
}

enforcement_checks() { # enforcement_checks LAUNCHER...: what the cgroup enforces beyond that,
  # and a pre-started interpreter in it
  local launch=("$@")

  "${launch[@]}" "$bin" --config limits.toml doctor --json >out 2>err
  probed=$(python3 -c 'import json, sys
checks = {c["name"]: c for c in json.load(open("out"))["checks"]}
print("; ".join(n + ": " + checks.get(n, {}).get("status", "absent") + " (" + checks.get(n, {}).get("detail", "") + ")" for n in ("seccomp calls", "processes", "memory")))')
  check "doctor tries the filter and the limits in a sandbox ($probed)" \
    python3 -c 'import json, sys
checks = {c["name"]: c for c in json.load(open("out"))["checks"]}
ok = all(checks.get(n, {}).get("status") == "ok" for n in ("seccomp calls", "processes", "memory"))
sys.exit(0 if ok and all("cgroup v2" in checks[n]["detail"] for n in ("processes", "memory")) else 1)'

  "${launch[@]}" "$bin" --config limits.toml run -e python 'import time
wall, cpu = time.time(), time.process_time()
while time.time() - wall < 2:
    pass
print(round(time.process_time() - cpu, 2))' >out 2>err
  check "a quarter of a core gives a busy loop about a quarter of its time (cpu $(cat out) s in 2 s)" \
    python3 -c "import sys; sys.exit(0 if float(open('out').read()) < 1.2 else 1)"

  python3 "$here/warm-check.py" "${launch[@]}" "$bin" limits.toml >out 2>err
  rc=$?
  check "over MCP, a pre-started python shows the code what a cold one does ($(tail -n1 out))" test "$rc" = 0
}

closure_check() { # a closure of 200 store paths, mounted as a store view: exactly it is seen, read-only
  local lister=$here/../../target/vm-store-lister
  if [ ! -x "$lister" ]; then
    echo "skip  a sandbox sees exactly its Nix closure (no target/vm-store-lister: no cc on the host)"
    return
  fi
  # Under /var/tmp, as a real store is under /nix: a store under /tmp
  # would have its parent in the sandbox's own writable /tmp.
  local top store closure=() i
  top=$(mktemp -d /var/tmp/nsm-vm-store.XXXXXX) && chmod 755 "$top" || return
  store=$top/store
  mkdir -p "$store/00000000000000000000000000000000-lister/bin" "$work/artifacts/listed"
  cp "$lister" "$store/00000000000000000000000000000000-lister/bin/lister"
  closure+=("$store/00000000000000000000000000000000-lister")
  for i in $(seq 1 200); do
    mkdir -p "$store/$(printf '%032d' "$i")-padding-$i/lib"
    closure+=("$store/$(printf '%032d' "$i")-padding-$i")
  done
  mkdir "$store/99999999999999999999999999999999-not-in-the-closure"
  chmod -R a+rX "$work" "$top"
  python3 -c 'import json, sys
closure = sys.argv[2:]
json.dump({"version": 1, "name": "listed", "description": "a static lister",
           "interpreter": {"argv": [closure[0] + "/bin/lister", "{file}"], "file_name": ".main"},
           "closure": closure, "links": {}, "limits": {}, "network": False}, open(sys.argv[1], "w"))' \
    "$work/artifacts/listed/manifest.json" "${closure[@]}"
  NIX_STORE_DIR=$store NIX_SANDBOX_DIR=$work/artifacts NIX_SANDBOX_BUILTIN='' \
    "$bin" run -e listed unread >listed 2>err
  printf '%s\n' "${closure[@]}" | xargs -n1 basename | sort >expected
  grep -v ':' listed | sort >seen
  check "a sandbox sees exactly its closure of 201 store paths ($(wc -l <seen) entries)" \
    cmp -s expected seen
  # A store view is one mount over the store; the path-by-path fallback
  # (when a view cannot be made) is a directory of binds.
  check "the store is one mount, a store view ($(grep 'a mount' listed))" grep -qx 'store is a mount: 1' listed
  local place
  for place in store path parent root; do
    check "the sandbox cannot write in the $place ($(grep "^$place writable" listed))" \
      grep -qx "$place writable: 0" listed
  done
  rm -rf "$top"
}

section "$(id -un) (uid $(id -u)): $(systemctl --version | head -n1), kernel $(uname -r)"
echo "login cgroup: $(cat /proc/self/cgroup)"

if [ "$only" != service ]; then

section "a Nix closure"
closure_check

section "started from the login session (the daemon asks systemd for a delegated scope)"
cgroup_checks env
enforcement_checks env

# Once the daemon has its cgroup, what it enforces does not depend on how
# it got it: here only that it uses the delegated scope as it is. As root,
# the replica unit's checks below do the same for a service's delegated
# cgroup (Delegate=yes).
if [ "$(id -u)" != 0 ]; then
  section "started in a delegated scope (systemd-run ${user[*]} --scope -p Delegate=yes)"
  cgroup_checks systemd-run "${user[@]}" --quiet --scope -p Delegate=yes
fi
fi

service_checks() { # as root: the replicas' unit (target/vm-units, rendered by run-tier.sh from
  # the NixOS module's hardening), socket-activated, runs sandboxes with its delegated cgroup
  local unit=$here/../../target/vm-units/nsm-replica@.service name=nsm-replica@r1 address=127.0.0.1:8799
  if [ ! -f "$unit" ]; then
    echo "skip  the replicas' unit: not rendered (run-tier.sh renders it where nix-instantiate exists)"
    return
  fi
  id nsm-svc >/dev/null 2>&1 || useradd --system --user-group --no-create-home nsm-svc
  mkdir -p /etc/nsm-vm && cp limits.toml /etc/nsm-vm/config.toml && chmod 644 /etc/nsm-vm/config.toml
  cp "$unit" /etc/systemd/system/
  printf '[Socket]\nListenStream=%s\n' "$address" > /etc/systemd/system/nsm-replica@.socket
  systemctl daemon-reload
  check "the socket unit starts" systemctl start "$name.socket"
  python3 "$here/http-call.py" "$address" bash 'echo $((6 * 7)); cat /proc/self/cgroup' >out 2>err
  rc=$?
  check "a run through the socket-activated, hardened replica succeeds (exit $rc: $(head -c 300 out) $(tail -n1 err))" \
    sh -c "[ $rc = 0 ] && grep -q '\"42' out"
  journalctl -q -u "$name.service" --no-pager >journal 2>&1
  [ $rc = 0 ] || { echo "--- the replica's journal:"; tail -n 30 journal; systemctl status --no-pager "$name.service" | tail -n 15; }
  check "the replica limits sandboxes with cgroup v2 in its own subtree ($(grep -o 'limits: [^;]*' journal | head -n1))" \
    grep -q 'limits: cgroup v2' journal
  python3 "$here/http-call.py" "$address" python 'x = []
while True: x.append(bytearray(16 << 20))' >out 2>err
  check "a memory bomb in the replica ends with the memory limit ($(grep -o '"limits_reached": [^]]*]' out))" \
    grep -q '"limits_reached": \[[^]]*memory' out
  check "the replica's directories are its own (/run, /var/lib, /var/cache)" \
    sh -c "[ -d /run/nix-sandbox-mcp/r1 ] && [ -d /var/lib/nix-sandbox-mcp/r1 ] && [ -d /var/cache/nix-sandbox-mcp/r1 ]"
  systemctl stop "$name.service" "$name.socket"
  check "stopped, the replica leaves no process of its user" sh -c '! pgrep -u nsm-svc >/dev/null'
  check "stopped, the replica leaves no cgroup (its service's nor a sandbox's)" \
    sh -c "! find /sys/fs/cgroup -path '*/$name.service*' -type d | grep -q ."
  systemctl stop "system-nsm\\x2dreplica.slice"
}

if [ "$(id -u)" = 0 ]; then
  section "the NixOS module's replica unit: hardened, Delegate=yes, socket-activated"
  service_checks
fi

rm -rf "$work"
[ "$failures" = 0 ] || { echo "$failures check(s) failed"; exit 1; }
