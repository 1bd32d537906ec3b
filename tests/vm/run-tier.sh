#!/usr/bin/env bash
# VM tier: runs a command in the nsm-vm (a throwaway Debian 12 VM with systemd,
# cgroup v2 and a logged-in user `dev`, see ../shared/vm/README.md) as dev and
# as root, with the daemon freshly built into target/. The
# repository is shared into the VM at the same path. Without the VM image it
# prints SKIP and exits 77 (test-local.sh reports the tier as skipped).
# Usage: tests/vm/run-tier.sh [--user dev|root|both] [-- COMMAND...]
#   COMMAND runs in the repository root inside the VM; the default is
#   tests/vm/limits-checks.sh with the daemon.
# Environment: NSM_VM_DIR (image, default /var/cache/nsm-vm), NSM_VM_ACCEL
# (tcg where /dev/kvm cannot boot the image), NSM_VM_TIMEOUT (s per boot, 600).
# A boot that gives no exit code at all (qemu stopped by the timeout, rc 124)
# is tried once more: under software emulation a boot now and then never
# reaches the command; a second timeout fails the tier.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
run_vm=$root/../shared/vm/run.sh
image=${NSM_VM_DIR:-/var/cache/nsm-vm}/disk.raw

users=(dev root)
while [ $# -gt 0 ]; do case $1 in
  --user) case $2 in both) users=(dev root);; *) users=("$2");; esac; shift 2;;
  --) shift; break;;
  *) sed -n '7,11p' "$0" >&2; exit 2;;
esac; done

if [ ! -f "$image" ]; then
  echo "SKIP vm tier: no VM image at $image (build it with ../shared/vm/build.sh)"
  exit 77
fi
if [ ! -x "$run_vm" ]; then
  echo "SKIP vm tier: no $run_vm"
  exit 77
fi

# Software emulation where KVM cannot boot the image (no /dev/kvm, or a PVM
# host, see ../shared/vm/README.md).
if [ -z "${NSM_VM_ACCEL:-}" ] && { [ ! -w /dev/kvm ] || [ -d /sys/module/kvm_pvm ]; }; then
  export NSM_VM_ACCEL=tcg
fi

cargo build --quiet --features test-knobs --bin nix-sandbox-mcp
# A static program for the closure check (the VM has no compiler).
if command -v cc >/dev/null 2>&1; then
  cc -static -O2 -o target/vm-store-lister tests/vm/store-lister.c
fi
# The NixOS module's replica unit, rendered for the VM (which has no Nix).
rm -rf target/vm-units
if command -v nix-instantiate >/dev/null 2>&1; then
  mkdir -p target/vm-units
  nix-instantiate --eval --strict --json --argstr bin "$root/target/debug/nix-sandbox-mcp" \
    --argstr config /etc/nsm-vm/config.toml --argstr user nsm-svc tests/vm/units.nix \
    | python3 -c 'import json, sys; sys.stdout.write(json.load(sys.stdin))' > 'target/vm-units/nsm-replica@.service'
fi
[ $# -gt 0 ] || set -- bash tests/vm/limits-checks.sh target/debug/nix-sandbox-mcp

failed=()
for user in "${users[@]}"; do
  printf '\n##### as %s: %s\n' "$user" "$*"
  start=$SECONDS
  rc=0
  "$run_vm" --user "$user" --share "$root" --timeout "${NSM_VM_TIMEOUT:-600}" -- "$@" || rc=$?
  if [ "$rc" = 124 ]; then
    printf '##### as %s: no exit code from the VM after %ss; booting it once more\n' "$user" $((SECONDS - start))
    rc=0
    "$run_vm" --user "$user" --share "$root" --timeout "${NSM_VM_TIMEOUT:-600}" -- "$@" || rc=$?
  fi
  printf '##### as %s: exit %s after %ss\n' "$user" "$rc" $((SECONDS - start))
  [ "$rc" = 0 ] || failed+=("$user")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "vm tier: FAILED as ${failed[*]}"
  exit 1
fi
echo "vm tier: passed as ${users[*]}"
