#!/usr/bin/env bash
# Runs inside the nsm-vm (started by run-tier.sh as dev or as root): the scope
# probe in each way the server may be started, so each way of obtaining a
# delegated cgroup is tried against a real systemd. Exits non-zero when a way
# that should work does not.
# Usage: scope-checks.sh PATH-TO-scope_probe
set -uo pipefail
probe=$(realpath "${1:?usage: scope-checks.sh PATH-TO-scope_probe}")
user=(); [ "$(id -u)" = 0 ] || user=(--user)
rc=0
section() { printf '\n=== %s\n' "$*"; }

section "$(id -un) (uid $(id -u)): $(systemctl --version | head -n1), kernel $(uname -r)"
echo "login cgroup: $(cat /proc/self/cgroup)"
if [ ${#user[@]} = 1 ]; then
  mgr=/sys/fs/cgroup/user.slice/user-$(id -u).slice/user@$(id -u).service
  echo "controllers delegated to the user's manager: $(cat "$mgr/cgroup.controllers")"
fi

section "from the login session: the probe asks systemd over D-Bus"
"$probe" || rc=1

section "under systemd-run ${user[*]} --scope -p Delegate=yes: already delegated"
systemd-run "${user[@]}" --quiet --scope -p Delegate=yes "$probe" || rc=1

section "under systemd-run ${user[*]} --scope, no Delegate (observed, not judged)"
systemd-run "${user[@]}" --quiet --scope "$probe" || true

if [ ${#user[@]} = 1 ]; then
  section "DBUS_SESSION_BUS_ADDRESS unset: the bus found in XDG_RUNTIME_DIR"
  alt=$(mktemp -d)
  ln -s "$XDG_RUNTIME_DIR/bus" "$alt/bus"
  env -u DBUS_SESSION_BUS_ADDRESS XDG_RUNTIME_DIR="$alt" "$probe" || rc=1
  rm -rf "$alt"
fi
exit $rc
