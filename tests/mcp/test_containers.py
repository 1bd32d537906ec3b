"""Where user namespaces cannot be made, the server refuses to run code and
says what is in the way and the fix, never degrading to something weaker.
Two conditions a test can make here stand for the places users meet them:
a user namespace whose user.max_user_namespaces is 0 (a host or container
that switched them off), and a seccomp filter that refuses CLONE_NEWUSER
as Docker's default profile does (and clone3, which it answers ENOSYS)."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import struct
import subprocess

import pytest

from harness import BIN, fixture_project

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000


def no_user_namespaces() -> None:
    """In the child, before exec: a user namespace of its own (this uid
    seen as 1000 inside) where no further user namespace may be made."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"1000 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"1000 {gid} 1")
    with open("/proc/sys/user/max_user_namespaces", "w") as f:
        f.write("0")


# seccomp BPF, x86-64: unshare or clone with CLONE_NEWUSER -> EPERM,
# clone3 -> ENOSYS (so callers fall back to clone), everything else allowed.
SYS_CLONE, SYS_UNSHARE, SYS_CLONE3 = 56, 272, 435
AUDIT_ARCH_X86_64 = 0xC000003E
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38


def bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


FILTER = b"".join([
    bpf(0x20, 0, 0, 4),                            # ld arch
    bpf(0x15, 1, 0, AUDIT_ARCH_X86_64),            # jeq x86-64 -> next+1
    bpf(0x06, 0, 0, RET_ALLOW),
    bpf(0x20, 0, 0, 0),                            # ld nr
    bpf(0x15, 3, 0, SYS_CLONE3),                   # -> ENOSYS
    bpf(0x15, 3, 0, SYS_UNSHARE),                  # -> check flags
    bpf(0x15, 2, 0, SYS_CLONE),                    # -> check flags
    bpf(0x06, 0, 0, RET_ALLOW),
    bpf(0x06, 0, 0, RET_ERRNO | ENOSYS),
    bpf(0x20, 0, 0, 16),                           # ld args[0] (low 32 bits)
    bpf(0x45, 0, 1, CLONE_NEWUSER),                # jset CLONE_NEWUSER
    bpf(0x06, 0, 0, RET_ERRNO | EPERM),
    bpf(0x06, 0, 0, RET_ALLOW),
])


def docker_like_seccomp() -> None:
    """In the child, before exec: Docker's default profile's answer to
    user namespaces."""
    prog = ctypes.create_string_buffer(FILTER)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(FILTER) // 8, ctypes.addressof(prog))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl")
    if libc.syscall(317, 1, 0, ctypes.byref(fprog)) != 0:  # seccomp(SET_MODE_FILTER)
        raise OSError(ctypes.get_errno(), "seccomp")


def start(preexec) -> subprocess.CompletedProcess:
    """The server started over stdio under `preexec`'s condition, sent an
    initialize and a run."""
    requests = "".join(json.dumps(m) + "\n" for m in [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "run", "arguments": {"env": "bash", "code": "echo RAN-UNSANDBOXED"}}},
    ])
    env = {**os.environ, "PROJECT_DIR": str(fixture_project()), "RUST_LOG": "error"}
    return subprocess.run([BIN, "--stdio"], input=requests, capture_output=True, text=True, timeout=60,
                          env=env, preexec_fn=preexec)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the stand-in filter is written for x86-64")
@pytest.mark.parametrize("condition", ["max_user_namespaces=0", "seccomp refuses CLONE_NEWUSER"])
def test_without_user_namespaces_the_server_refuses_with_the_cause_and_the_fix(condition: str):
    preexec = no_user_namespaces if condition.startswith("max") else docker_like_seccomp
    done = start(preexec)
    assert done.returncode != 0, done.stdout
    assert "RAN-UNSANDBOXED" not in done.stdout
    message = done.stderr
    assert "the sandbox does not work on this machine" in message or "user namespace" in message, message
    if condition.startswith("max"):
        assert "user.max_user_namespaces = 0" in message and "sysctl -w user.max_user_namespaces" in message, message
    else:
        # In a container the runtime's flags, elsewhere what the filter must allow.
        assert "seccomp filter" in message, message
        assert "SystemCallFilter=" in message or "seccomp=unconfined" in message, message

    # doctor, under the same condition, fails and says the same.
    doctor = subprocess.run([BIN, "doctor", "--json"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PROJECT_DIR": str(fixture_project())}, preexec_fn=preexec)
    assert doctor.returncode != 0
    checks = json.loads(doctor.stdout)["checks"]
    failed = [c for c in checks if c["status"] == "fail"]
    assert failed, checks
    text = " ".join(f"{c['detail']} {c.get('fix') or ''}" for c in failed)
    assert ("max_user_namespaces" if condition.startswith("max") else "seccomp filter") in text, text
