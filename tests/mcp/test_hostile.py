"""Hostile and broken input through the real binary: every case must be
contained, and the server must answer the next request normally. Processes
are counted before and after: none may be left over."""

from __future__ import annotations

import json
import os
import pathlib
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid

import anyio
import pytest

from harness import (BIN, STATELESS, STATELESS_META, HostListeners, RawServer, call, cpu_quota, dump, limits_mechanism,
                     processes_with, readable_tmpdir, run_async, session, var_tmpdir, write_config, zombie_children)

LIMITS = write_config(
    "[defaults]\ntimeout_ms = 4000\nmemory_mb = 128\npids = 64\nworkspace_mb = 16\noutput_limit_mb = 64\n"
    "[server]\nmax_concurrent_runs = 4\nmax_queued_runs = 200\n"
)


def sandbox_scripts() -> list[str]:
    """Sandboxes of the servers these tests started, running or prepared."""
    return processes_with("/workspace/.main.", ours=True)


async def still_serving(s) -> None:
    sc, _, err = await call(s, "bash", "echo still-serving")
    assert not err and sc["stdout"] == "still-serving\n", dump(sc)


def test_fork_bomb_is_contained():
    async def t():
        async with session(config=LIMITS) as s:
            # The bomb's first generation exits at once, which alone would end the
            # sandbox; the trailing sleep keeps it alive so the bomb meets the limits.
            t0 = time.monotonic()
            sc, _, err = await call(s, "bash", ":(){ :|:& };:\nsleep 30")
            assert err and sc["limit"] == "timeout", dump(sc)
            assert time.monotonic() - t0 < 10
            if limits_mechanism() != "rlimits":
                assert "processes" in sc["limits_reached"], dump(sc)
            await still_serving(s)
    run_async(t)
    assert sandbox_scripts() == []


def test_memory_bomb_is_killed_with_the_memory_code():
    async def t():
        async with session(config=LIMITS) as s:
            sc, text, err = await call(s, "python", "x = []\nwhile True: x.append(bytearray(8 << 20))")
            assert err
            if limits_mechanism() == "rlimits":
                assert sc["error"]["code"] == "exit_nonzero" and "MemoryError" in sc["stderr"], dump(sc)
            else:
                assert sc["error"]["code"] == "memory_limit" and sc["limit"] == "memory", dump(sc)
                assert "128 MiB" in sc["error"]["message"]
            await still_serving(s)
    run_async(t)


def test_filling_the_disk_stays_inside_the_sandbox():
    """Everything outside the writable mounts refuses writes; the writable
    mounts (the project's overlay included) together hold at most
    workspace_mb and workspace_files, in every limits mode."""
    config = write_config(
        "[defaults]\ntimeout_ms = 20000\nworkspace_mb = 16\nworkspace_files = 2000\n"
    )
    project = readable_tmpdir()

    async def t():
        async with session(config=config, project=str(project)) as s:
            code = (
                "for d in / /etc /usr /bin /proc /dev /run; do touch $d/.nsm-probe 2>/dev/null && echo \"WROTE $d\"; done\n"
                "for d in /workspace /tmp /dev/shm /project; do head -c 1G /dev/zero > $d/fill 2>/dev/null; echo \"$d rc=$?\"; done\n"
                "echo \"total $(du -cm /workspace/fill /tmp/fill /dev/shm/fill /project/fill | tail -1 | cut -f1)\"\n"
                "rm -f /workspace/fill /tmp/fill /dev/shm/fill /project/fill\n"
                "i=0; while [ $i -lt 5000 ] && : > /tmp/f$i 2>/dev/null; do i=$((i+1)); done; echo \"files $i\"\n"
            )
            sc, _, _ = await call(s, "bash", code)
            out = sc["stdout"]
            assert "WROTE" not in out, dump(sc)
            for d in ("/workspace", "/tmp", "/dev/shm", "/project"):
                assert f"{d} rc=1" in out, dump(sc)
            total = int(out.split("total ")[1].split()[0])
            files = int(out.split("files ")[1].split()[0])
            assert total <= 17 and files < 2000, dump(sc)
            await still_serving(s)
    run_async(t)
    assert list(project.iterdir()) == [], "the host's project is untouched"


def test_gigabyte_output_flood_is_cut_and_reported():
    async def t():
        async with session(config=LIMITS) as s:
            t0 = time.monotonic()
            sc, text, err = await call(s, "bash", "echo BEGIN; yes 0123456789abcdef | head -c 1G; echo END")
            assert err and sc["limit"] == "output" and sc["error"]["code"] == "output_limit", dump(sc)
            assert sc["stdout"].startswith("BEGIN\n") and "bytes omitted" in sc["stdout"]
            assert time.monotonic() - t0 < 15
            await still_serving(s)
    run_async(t)


def test_host_secrets_are_out_of_reach():
    """Secrets where a jail that exposed the host would show them: in the home
    directory of the user running the server, in the host's /tmp and /var/tmp
    (readable by everyone, so a leak could not hide behind permissions), and
    in the server's environment. In the sandbox those paths do not exist."""
    home = pathlib.Path(pwd.getpwuid(os.getuid()).pw_dir)
    tag = uuid.uuid4().hex[:12]
    dirs = [home / f".nsm-test-secret-{tag}", readable_tmpdir(), var_tmpdir()]
    keys = []
    for d in dirs:
        d.mkdir(exist_ok=True)
        d.chmod(0o755)
        key = d / "id_ed25519"
        key.write_text(f"PRIVATE-KEY-MATERIAL-{tag}\n")
        key.chmod(0o644)
        keys.append(key)
    env = {"HOME": str(home), "AWS_SECRET_ACCESS_KEY": f"AKIA-SECRET-{tag}"}

    async def t():
        async with session(env=env) as s:
            # The control: the secrets are there on the host while the sandbox looks.
            assert all(k.read_text() == f"PRIVATE-KEY-MATERIAL-{tag}\n" for k in keys)
            code = "".join(f"cat {k} 2>&1\n" for k in keys) + (
                "cat /etc/shadow 2>&1\n"
                "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'\n"
                "grep -r AKIA-SECRET /proc/*/environ /proc/*/cmdline 2>/dev/null\n"
            )
            sc, _, _ = await call(s, "bash", code)
            everything = sc["stdout"] + sc["stderr"]
            assert f"PRIVATE-KEY-MATERIAL-{tag}" not in everything and f"AKIA-SECRET-{tag}" not in everything, dump(sc)
            for k in keys + [pathlib.Path("/etc/shadow")]:
                assert f"cat: {k}: No such file or directory" in sc["stdout"], dump(sc)
    try:
        run_async(t)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_project_symlinks_that_point_outside_give_nothing():
    tmp_path = readable_tmpdir()
    proj = tmp_path / "proj"
    proj.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("OUTSIDE-SECRET\n")
    (proj / "to-outside-dir").symlink_to(outside)
    (proj / "to-outside-file").symlink_to(outside / "secret.txt")
    (proj / "to-etc").symlink_to("/etc")
    for p in (tmp_path, proj, outside):
        p.chmod(0o755)
    (outside / "secret.txt").chmod(0o644)

    async def t():
        async with session(project=str(proj)) as s:
            code = (
                "cat /project/to-outside-file 2>&1; ls /project/to-outside-dir/ 2>&1\n"
                "echo pwned > /project/to-outside-dir/new 2>&1; echo pwned > /project/to-outside-file 2>&1\n"
                "ls /project/to-etc/ | tr '\\n' ' '\n"
            )
            sc, _, _ = await call(s, "bash", code)
            assert "OUTSIDE-SECRET" not in sc["stdout"], dump(sc)
            assert "shadow" not in sc["stdout"]
    run_async(t)
    assert (outside / "secret.txt").read_text() == "OUTSIDE-SECRET\n"
    assert not (outside / "new").exists()


def bash_probe(listeners: HostListeners) -> str:
    """Bash's /dev/tcp and /dev/udp to every listener: `tcp <address> sent` or `tcp <address> failed`."""
    lines = []
    for _, host, tcp, udp in listeners.ports():
        for proto, port in (("tcp", tcp), ("udp", udp)):
            lines.append(f"if {{ printf %s {listeners.token} > /dev/{proto}/{host}/{port}; }} 2>/dev/null; "
                         f"then echo '{proto} {host} sent'; else echo '{proto} {host} failed'; fi")
    return "\n".join(lines) + "\n"


def node_probe(listeners: HostListeners) -> str:
    """Node's net and dgram modules to every listener, one after the other."""
    return (
        "const net = require('net'), dgram = require('dgram');\n"
        f"const token = {json.dumps(listeners.token)};\n"
        f"const targets = {json.dumps(listeners.ports())};\n"
        "(async () => {\n"
        "  for (const [family, host, tcp, udp] of targets) {\n"
        "    console.log('tcp', host, await new Promise((done) => {\n"
        "      const c = net.connect({ host, port: tcp, timeout: 3000 });\n"
        "      c.on('connect', () => { c.setTimeout(0); c.end(token, () => { c.destroy(); done('sent'); }); });\n"
        "      c.on('error', (e) => done('failed ' + e.code));\n"
        "      c.on('timeout', () => { c.destroy(); done('failed timeout'); });\n"
        "    }));\n"
        "    console.log('udp', host, await new Promise((done) => {\n"
        "      const u = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');\n"
        "      u.send(token, udp, host, (e) => { u.close(); done(e ? 'failed ' + e.code : 'sent'); });\n"
        "    }));\n"
        "  }\n"
        "})();\n"
    )


def test_host_addresses_are_unreachable_from_bash_and_node():
    """Bash and node probes that reach listeners on every address of this
    machine when run on the host itself (the control) reach none from a
    sandbox, with or without network (which goes only through the proxy)."""
    config = write_config(
        '[environments.bash]\npreset = "bash"\n[environments.node]\npreset = "node"\n'
        '[environments.netbash]\npreset = "bash"\nnetwork = true\n[environments.netnode]\npreset = "node"\nnetwork = true\n'
    )
    probes = {"bash": bash_probe, "node": node_probe}
    listeners = {(env, network): HostListeners() for env in probes for network in (False, True)}
    controls = {env: HostListeners() for env in probes}

    async def t():
        async with session(config=config) as s:
            for (env, network), l in listeners.items():
                sc, _, err = await call(s, f"net{env}" if network else env, probes[env](l))
                tcp = [line for line in sc["stdout"].splitlines() if line.startswith("tcp ")]
                assert not err and len(tcp) == len(l.targets), dump(sc)
                assert all(" failed" in line for line in tcp), dump(sc)
    try:
        run_async(t)
        for (env, network), l in listeners.items():
            assert l.reached() == [], (env, network)
        host = {"bash": ["bash", "-c"], "node": ["node", "-e"]}
        for env, l in controls.items():
            out = subprocess.run([*host[env], probes[env](l)], capture_output=True, text=True, timeout=60)
            assert " failed" not in out.stdout, (env, out.stdout)
            assert l.reached() == l.expected(), env
    finally:
        for l in [*listeners.values(), *controls.values()]:
            l.close()


LISTENING = """
import os, socket, sys, time
tcp = socket.socket()
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind(("127.0.0.1", 47011))
tcp.listen()
unix = socket.socket(socket.AF_UNIX)
unix.bind("\\0nsm-left-listening")
unix.listen()
"""

LEFT_LISTENING = LISTENING + """
if os.fork() == 0:  # detached: keeps both listening after the call's end
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(30)
    os._exit(0)
print("listening", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""

# Listens until told to stop: each TCP connection gets "up"; one that says
# "done" ends the run (at most a minute: a test that fails leaves nothing).
HELD_LISTENING = LISTENING + """
print("listening", flush=True)
tcp.settimeout(60)
while True:
    conn, _ = tcp.accept()
    word = conn.recv(16)
    conn.sendall(b"up")
    conn.close()
    if word == b"done":
        break
"""

# Run on the host in the listening sandbox's network namespace: what a
# connection from outside every other sandbox finds there.
FROM_THE_HOST = """
import socket, sys
unix = socket.socket(socket.AF_UNIX)
unix.settimeout(10)
unix.connect("\\0nsm-left-listening")
print("unix connected")
# Last: "done" ends the listening run, and its sockets with it.
tcp = socket.create_connection(("127.0.0.1", 47011), timeout=10)
tcp.sendall(sys.argv[1].encode())
tcp.settimeout(10)
print("tcp", tcp.recv(16).decode())
"""

LISTEN_47011 = "0100007F:B7A3"  # 127.0.0.1:47011 in /proc/net/tcp


async def listening_sandbox(seconds: float = 10) -> int:
    """The host pid of a process of ours whose network namespace has both
    listeners: TCP on 127.0.0.1:47011 and the abstract unix socket (each
    namespace has its own /proc/PID/net)."""
    deadline = time.monotonic() + seconds
    while True:
        for line in processes_with("/workspace/.main.", ours=True):
            pid = int(line.split(":", 1)[0])
            try:
                tcp = [row.split() for row in pathlib.Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]]
                unix = [row.split() for row in pathlib.Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]]
            except OSError:
                continue
            # TCP state 0A: LISTEN; unix flags 00010000: accepting connections.
            if (any(f[1] == LISTEN_47011 and f[3] == "0A" for f in tcp)
                    and any(len(f) > 7 and f[7] == "@nsm-left-listening" and f[3] == "00010000" for f in unix)):
                return pid
        assert time.monotonic() < deadline, "no sandbox listens on both 127.0.0.1:47011 and @nsm-left-listening"
        await anyio.sleep(0.02)


def from_the_host(pid: int, word: str) -> str:
    """FROM_THE_HOST, run in the network namespace of `pid` (a non-root
    user enters the sandbox's user namespace first, which it owns)."""
    enter = ["nsenter", f"--target={pid}", "--net"]
    if os.geteuid() != 0:
        enter[2:2] = ["--user", "--preserve-credentials"]
    out = subprocess.run([*enter, "/usr/bin/python3", "-c", FROM_THE_HOST, word],
                         capture_output=True, text=True, timeout=30)
    return out.stdout + out.stderr


REACH_LEFT = """
import socket
for family, address in ((socket.AF_INET, ("127.0.0.1", 47011)), (socket.AF_UNIX, "\\0nsm-left-listening")):
    s = socket.socket(family)
    try:
        s.connect(address)
        print("reached", address)
    except OSError:
        print("refused")
"""


def test_no_sandbox_reaches_what_another_left_listening():
    """Sandboxes without network may get a network namespace another had
    (one at a time, once all of its processes have ended): a TCP listener
    on the loopback and an abstract unix socket that one sandbox made, and
    left held by a detached process, are out of reach of every other
    sandbox, while it runs and after it."""

    async def t():
        async with session() as s:
            sc, _, err = await call(s, "python", LEFT_LISTENING)
            assert not err and sc["stdout"] == "listening\n", dump(sc)
            for _ in range(8):
                sc, _, err = await call(s, "python", REACH_LEFT)
                assert not err and sc["stdout"] == "refused\nrefused\n", dump(sc)
            # While one listens, others run beside it: the listener is
            # reached from the host in its own namespace before and after
            # them, so their "refused" is not for want of a listener.
            seen: list[dict] = []

            async def listen() -> None:
                seen.append((await call(s, "python", HELD_LISTENING))[0])

            async with anyio.create_task_group() as tg:
                tg.start_soon(listen)
                pid = await listening_sandbox()
                reached = await anyio.to_thread.run_sync(from_the_host, pid, "ping")
                assert reached == "unix connected\ntcp up\n", reached
                for _ in range(3):
                    sc, _, err = await call(s, "python", REACH_LEFT)
                    assert not err and sc["stdout"] == "refused\nrefused\n", dump(sc)
                reached = await anyio.to_thread.run_sync(from_the_host, pid, "done")
                assert reached == "unix connected\ntcp up\n", reached
            assert seen[0]["stdout"] == "listening\n", dump(seen[0])
    run_async(t)


def test_tiocsti_ptrace_and_proc_escapes_fail():
    async def t():
        async with session() as s:
            code = (
                "import ctypes, fcntl, os, pty, termios\n"
                "m, sl = pty.openpty()\n"
                "try:\n    fcntl.ioctl(sl, termios.TIOCSTI, b'x'); print('TIOCSTI worked')\n"
                "except OSError as e:\n    print('TIOCSTI', e.errno)\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "print('ptrace', libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n"
                "import platform, socket\n"
                "if platform.machine() == 'x86_64':\n"
                "    print('modify_ldt', libc.syscall(154, 0, 0, 0), ctypes.get_errno())\n"
                "else:\n    print('modify_ldt -1 1')\n"
                "try:\n    socket.socket(40, socket.SOCK_STREAM); print('vsock opened')\n"
                "except OSError as e:\n    print('vsock', e.errno)\n"
                "print('root', sorted(os.listdir('/proc/1/root')))\n"
                "for p in ['/proc/1/root/etc/shadow', '/proc/self/root/root', '/proc/1/cwd/../../home']:\n"
                "    print(p, os.path.exists(p))\n"
                "print('pids', len([d for d in os.listdir('/proc') if d.isdigit()]))\n"
            )
            sc, _, _ = await call(s, "python", code)
            out = sc["stdout"]
            assert "TIOCSTI 1\n" in out and "ptrace -1 1\n" in out, out
            assert "modify_ldt -1 1\n" in out and "vsock 1\n" in out, out
            assert "home" not in out.split("root ", 1)[1].split("\n")[0]
            assert "True" not in out, out
            assert int(out.rsplit("pids ", 1)[1]) < 10
    run_async(t)


HOST_PROC_FILES = ["/proc/cmdline", "/proc/config.gz", "/proc/sys/kernel/random/boot_id", "/proc/kcore", "/proc/keys",
                   "/proc/key-users", "/proc/kallsyms", "/proc/modules", "/proc/interrupts", "/proc/timer_list",
                   "/proc/sched_debug"]
HOST_PROC_DIRS = ["/proc/acpi", "/proc/asound", "/proc/scsi"]


def test_doctor_tries_the_filter_and_the_limits_in_a_sandbox():
    """doctor's findings on the filter and the limits come from a probe that
    tried to get past them inside a test sandbox, under whichever mechanism
    this user gets (a cgroup as root here, rlimits as a user)."""
    doctor = subprocess.run([BIN, "doctor", "--json"], capture_output=True, text=True, cwd=tempfile.gettempdir())
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    for name in ("seccomp calls", "processes", "memory", "store views"):
        assert checks.get(name, {}).get("status") == "ok", (name, doctor.stdout)
    assert "refused with EPERM" in checks["seccomp calls"]["detail"], checks["seccomp calls"]
    mechanism = limits_mechanism()
    assert ("RLIMIT_NPROC" in checks["processes"]["detail"]) == (mechanism == "rlimits"), (mechanism, checks["processes"])
    assert ("RLIMIT_DATA" in checks["memory"]["detail"]) == (mechanism == "rlimits"), (mechanism, checks["memory"])


def test_host_identifying_proc_files_are_masked():
    """Whatever of these the host's kernel has is readable on the host and
    empty, and unwritable, inside."""
    files = [f for f in HOST_PROC_FILES if os.path.exists(f)]
    dirs = [d for d in HOST_PROC_DIRS if os.path.isdir(d)]
    assert "/proc/cmdline" in files and open("/proc/cmdline").read(), "the host has a boot command line"

    async def t():
        async with session() as s:
            code = (
                f"for f in {' '.join(files)}; do printf '%s %s\\n' $f $(cat $f 2>/dev/null | wc -c); done\n"
                f"for d in {' '.join(dirs)}; do printf '%s %s\\n' $d $(ls -A $d | wc -l); done\n"
                "echo x > /proc/cmdline 2>/dev/null && echo WROTE\n"
                "touch /proc/acpi/x 2>/dev/null && echo WROTE\n"
                "true"
            )
            sc, _, err = await call(s, "bash", code)
            assert not err, dump(sc)
            lines = sc["stdout"].splitlines()
            assert lines == [f"{p} 0" for p in files + dirs], sc["stdout"]
    run_async(t)


def test_a_hundred_concurrent_calls_all_complete():
    async def t():
        async with session(config=LIMITS) as s:
            results: list = []

            async def one(i: int) -> None:
                results.append((i, await call(s, "bash", f"echo {i}")))

            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    tg.start_soon(one, i)
            assert len(results) == 100
            for i, (sc, _, err) in results:
                assert not err and sc["stdout"] == f"{i}\n", dump(sc)
            print(f"100 concurrent calls in {time.monotonic() - t0:.1f}s")
            await still_serving(s)
    run_async(t)


def test_overload_beyond_the_queue_is_an_immediate_busy_error():
    """With one run slot and two places in the queue, of eight calls five are
    answered busy while the other three are still held (they wait for a file
    the test creates only then, in a project mounted read-write so that the
    running sandboxes see it appear), and the three complete afterwards."""
    config = write_config("[server]\nmax_concurrent_runs = 1\nmax_queued_runs = 2\n[project]\nmode = \"readwrite\"\n")
    project = readable_tmpdir()
    code = "while [ ! -e /project/release ]; do sleep 0.05; done; echo done"

    async def t():
        async with session(config=config, project=str(project)) as s:
            results: list = []
            five_busy = anyio.Event()

            async def one() -> None:
                sc, _, _ = await call(s, "bash", code)
                results.append(sc)
                if sum(r.get("error", {}).get("code") == "busy" for r in results) == 5:
                    five_busy.set()

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one)
                with anyio.fail_after(30):
                    await five_busy.wait()
                assert len(results) == 5, [dump(r) for r in results]
                (project / "release").touch()
            busy = [r for r in results if r.get("error", {}).get("code") == "busy"]
            done = [r for r in results if r.get("stdout") == "done\n"]
            assert len(done) == 3 and len(busy) == 5, [dump(r) for r in results]
            assert "retry" in busy[0]["error"]["suggestion"].lower()
    try:
        run_async(t)
    finally:
        shutil.rmtree(project, ignore_errors=True)


def test_slow_run_does_not_block_other_requests():
    """While a run is in flight (its process seen on the host), the tool list
    and another run are answered; the slow run is still going afterwards."""
    m = str(uuid.uuid4().int % 10**8)

    async def t():
        async with session() as s:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, s, "bash", f"sleep {m}")
                with anyio.fail_after(30):
                    while not processes_with(m):
                        await anyio.sleep(0.02)
                    await s.list_tools()
                    sc, _, _ = await call(s, "python", "print('quick')")
                assert sc["stdout"] == "quick\n"
                assert processes_with(m), "the slow run ended first"
                tg.cancel_scope.cancel()
    run_async(t)


def test_ten_megabyte_payload():
    async def t():
        async with session() as s:
            code = "n = 0\n" + ("n += 1  # " + "x" * 90 + "\n") * (10 * 1024 * 1024 // 101) + "print(n)\n"
            assert len(code) > 10 * 1024 * 1024 - 200
            sc, _, err = await call(s, "python", code)
            assert not err and int(sc["stdout"]) > 100_000, dump(sc)
    run_async(t)


def test_malformed_json_rpc_unknown_methods_and_wrong_types_are_survived():
    srv = RawServer()
    try:
        srv.send(b"{this is not json")
        r = srv.recv()
        assert r["id"] is None and r["error"]["code"] == -32700 and "not valid JSON" in r["error"]["message"], r
        srv.send(b"\xff\xfe garbage")
        r = srv.recv()
        assert r["id"] is None and r["error"]["code"] == -32700, r
        srv.send({"jsonrpc": "2.0", "id": 1, "method": "no/such/method"})
        r = srv.recv()
        assert r["id"] == 1 and r["error"]["code"] == -32601, r
        srv.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "nope", "arguments": {}}})
        r = srv.recv()
        assert r["id"] == 2 and "error" in r and "run" in r["error"]["message"], r
        srv.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "run", "arguments": {"env": 5, "code": None}}})
        r = srv.recv()
        assert r["result"]["isError"] and r["result"]["structuredContent"]["error"]["code"] == "invalid_input", r
        srv.send({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "run", "arguments": {"env": "bash", "code": "echo ok"}}})
        r = srv.recv()
        assert r["result"]["structuredContent"]["stdout"] == "ok\n", r
    finally:
        srv.close()


def test_broken_and_oversized_requests_are_answered_with_their_ids():
    """Every request gets an answer the client can match to it, whatever its
    bytes; the server keeps serving after each."""
    srv = RawServer()
    try:
        def expect(line: bytes, id_, code: int, words: str) -> None:
            srv.send(line)
            r = srv.recv()
            assert r.get("id") == id_ and r["error"]["code"] == code and words in r["error"]["message"], r
        # Under the stateless revision a request carries its _meta (the
        # same bytes under 2025-11-25 are an empty one).
        meta = json.dumps(STATELESS_META if STATELESS else {}).encode()
        run = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"_meta":%s,"name":"run","arguments":{"env":"bash","code":"%s"}}}'
        expect(run % (11, meta, b"echo \\ud800"), 11, -32700, "not valid JSON")
        expect(run % (12, meta, b"echo \xff"), 12, -32700, "UTF-8")
        expect(b'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":"x"}', 13, -32600, "params")
        expect(b'[{"jsonrpc":"2.0","id":14,"method":"ping"}]', None, -32600, "batches")
        expect(b'{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"_meta":%s,"name":5}}' % meta, 15, -32602, "tools/call")
        big = run % (16, meta, b"x" * (16 * 1024 * 1024))
        expect(big, 16, -32600, "16 MiB")
        srv.send(run % (17, meta, b"echo still serving"))
        r = srv.recv()
        assert r["id"] == 17 and r["result"]["structuredContent"]["stdout"] == "still serving\n", r
    finally:
        srv.close()


def test_flooding_every_channel_keeps_the_server_within_64_mb():
    """Whatever a sandbox writes, and on whichever channel, the server reads
    it into bounded buffers: its peak memory stays near its idle size."""
    srv = RawServer()

    def status_kib(field: str) -> int:
        for line in open(f"/proc/{srv.proc.pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(field)

    def run(i: int, code: str, **extra) -> dict:
        srv.send({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                  "params": {"name": "run", "arguments": {"env": "bash", "code": code, **extra}}})
        r = srv.recv(timeout=120)
        assert r["id"] == i, r
        return r["result"]["structuredContent"]

    try:
        assert run(1, "echo warm")["stdout"] == "warm\n"
        run(2, "echo warm", session="flood")
        idle = status_kib("VmRSS")
        # The reply channel: one endless line, then endless short lines.
        sc = run(3, "while :; do printf '%01024d' 0 >&204; done", session="flood")
        # The server kills the session: a failed run, by SIGKILL.
        assert sc["ok"] is False, sc
        assert sc["error"]["code"] == "killed_by_signal" and sc["signal"] == "SIGKILL", sc
        assert "4096 bytes in a line" in sc["session"]["reset"], sc
        sc = run(4, "yes '{}' >&204", session="flood")
        assert "1024 KiB in a call" in sc["session"]["reset"], sc
        # Both output streams, in a run and in a session.
        sc = run(5, "yes 'stdout flood' & yes 'stderr flood' >&2; wait")
        assert sc["error"]["code"] == "output_limit", sc
        sc = run(6, "head -c 300000000 /dev/zero", session="flood")
        assert sc["error"]["code"] == "output_limit", sc
        peak = status_kib("VmHWM")
        assert peak - idle < 64 * 1024, f"idle {idle} KiB, peak {peak} KiB"
        assert run(7, "echo still serving")["stdout"] == "still serving\n"
    finally:
        srv.close()


def test_code_with_a_nul_byte_is_refused_at_once_in_every_mode():
    async def t():
        async with session() as s:
            for env in ("bash", "python", "node"):
                for mode in ({}, {"session": f"nul-{env}"}, {"background": True}):
                    sc, _, err = await call(s, env, "print(1)\x00\necho 2", **mode)
                    assert err and sc["error"]["code"] == "invalid_input", dump(sc)
                    assert "NUL byte (at byte 8)" in sc["error"]["message"], dump(sc)
            # The session was never started by the refused call: its first real call is new.
            sc, _, err = await call(s, "python", "print('fine')", session="nul-python")
            assert not err and sc["stdout"] == "fine\n" and sc["session"]["state"] == "new", dump(sc)
    run_async(t)


def test_client_disconnect_mid_run_kills_the_sandbox():
    marker = str(uuid.uuid4().int % 10**8)
    srv = RawServer()
    srv.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": "run", "arguments": {"env": "bash", "code": f"setsid sleep {marker} & sleep {marker}.5"}}})
    deadline = time.monotonic() + 5
    while not processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker), "the run never started"
    srv.proc.stdin.close()
    srv.proc.wait(timeout=10)
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


def test_audit_log_records_runs_without_code_or_output(tmp_path):
    log = tmp_path / "audit.jsonl"
    config = write_config(f'[server]\naudit_log = "{log}"\n')

    async def t():
        async with session(config=config) as s:
            await call(s, "python", "print('AUDIT-SECRET-OUTPUT')  # AUDIT-SECRET-CODE")
            await call(s, "bash", "exit 5")
    run_async(t)
    lines = [json.loads(l) for l in log.read_text().splitlines()]
    assert len(lines) == 2
    assert "AUDIT-SECRET" not in log.read_text()
    assert lines[0]["env"] == "python" and lines[0]["exit_code"] == 0 and len(lines[0]["code_sha256"]) == 64
    assert lines[0]["stdout_bytes"] == len("AUDIT-SECRET-OUTPUT\n")
    assert lines[1]["exit_code"] == 5 and lines[1]["error"] == "exit_nonzero"
    for key in ("time", "source", "interpreter", "signal", "duration_ms", "limit"):
        assert key in lines[0], key


def test_a_killed_server_leaves_no_sandbox_behind():
    srv = RawServer()
    deadline = time.monotonic() + 5
    while not sandbox_scripts() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_scripts(), "the server keeps sandboxes ready; none appeared"
    srv.proc.kill()
    srv.proc.wait()
    deadline = time.monotonic() + 5
    while sandbox_scripts() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_scripts() == []


@pytest.mark.parametrize("nest", ["on", "off"])
def test_servers_closed_while_they_prepare_sandboxes_leave_none_behind(nest):
    """A server closed right after the handshake is still preparing sandboxes:
    a bubblewrap ended between creating its init and writing the init's uid
    map left that init waiting for ever (one in about eight closes, without
    the nest). Twenty quick closes, with and without the nest: nothing left."""
    env = {"NIX_SANDBOX_LIMITS": "rlimits"} if nest == "on" else {"NIX_SANDBOX_LIMITS": "rlimits", "NIX_SANDBOX_NEST": "off"}

    async def listed() -> None:
        async with session(env=env) as s:
            await s.list_tools()

    for _ in range(20):
        run_async(listed)
    deadline = time.monotonic() + 5
    while sandbox_scripts() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_scripts() == []


def command_of(pid: int) -> str:
    """What `pid` runs, or that it has gone."""
    try:
        return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return "(gone)"


def test_sustained_load_leaves_no_zombies():
    """The server reaps what its sandboxes leave behind (it is their
    subreaper), during load and when it exits: nothing is left to the host's
    PID 1, which in containers may never reap it. This test process is a
    subreaper too, so anything the server failed to reap would end up here."""
    before = set(zombie_children(os.getpid()))
    for limits in (None, "rlimits"):
        srv = RawServer(env={"NIX_SANDBOX_LIMITS": limits} if limits else None)
        for i in range(40):
            srv.send({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                      "params": {"name": "run", "arguments": {"env": "bash", "code": "sleep 0.01 & true"}}})
            assert srv.recv()["result"]["structuredContent"]["ok"]
        # A zombie that stays is a leak; one the pool's refill makes while
        # we look, and reaps a moment later, is not.
        deadline = time.monotonic() + 5
        stayed = set(zombie_children(srv.proc.pid))
        while stayed and time.monotonic() < deadline:
            time.sleep(0.05)
            stayed &= set(zombie_children(srv.proc.pid))
        left = {pid: command_of(pid) for pid in stayed}
        assert left == {}, f"unreaped under load ({limits or 'cgroups'}): {left}"
        srv.shut_down()
    time.sleep(0.5)
    assert set(zombie_children(os.getpid())) - before == set()


def cgroup_counts_cpu() -> bool:
    """Whether a cgroup counts the CPU time of all of a run's processes
    together here: cgroup v2 always (cpu.stat), cgroup v1 where the host
    mounts the cpuacct controller; rlimits never (RLIMIT_CPU is per
    process). `cpu_quota()` is another matter: the cpu controller's quota."""
    mechanism = limits_mechanism()
    if mechanism == "cgroup v2":
        return True
    if mechanism == "cgroup v1":
        mounts = [line.split() for line in pathlib.Path("/proc/self/mounts").read_text().splitlines()]
        return any(m[2] == "cgroup" and "cpuacct" in m[3].split(",") for m in mounts)
    return False


CPU_ONE_SECOND = write_config("[defaults]\ncpu_seconds = 1\ntimeout_ms = 30000\n")

def spread_cpu(idle_seconds: int) -> str:
    """Four processes with 0.6 s of CPU each: 2.4 s together, each under
    the limit of 1 s. Then the main one waits, idle, for `idle_seconds`
    (for the limit, where a cgroup counts the sum)."""
    return ("import os, time\nfor i in range(4):\n    if os.fork() == 0:\n        t = time.process_time()\n"
            "        while time.process_time() - t < 0.6:\n            pass\n        os.write(1, b'done %d\\n' % i)\n"
            f"        os._exit(0)\nfor i in range(4):\n    os.wait()\nprint('all done', flush=True)\ntime.sleep({idle_seconds})\n")


def test_cpu_time_counts_every_process_of_a_run():
    """With a cgroup that counts CPU, cpu_seconds bounds the run's CPU time
    however it is spread: four processes, none over the limit on its own,
    are stopped together once their sum passes it (a per-process
    RLIMIT_CPU never fires for them: the next test)."""
    if not cgroup_counts_cpu():
        pytest.skip(f"limits here: {limits_mechanism()}, no cgroup counts CPU time: "
                    "cpu_seconds is per process (RLIMIT_CPU), as documented")

    async def t():
        async with session(config=CPU_ONE_SECOND) as s:
            t0 = time.monotonic()
            sc, _, err = await call(s, "python", spread_cpu(20))
            assert err and sc["limit"] == "cpu" and sc["error"]["code"] == "cpu_limit", dump(sc)
            assert "1 s of CPU time" in sc["error"]["message"], dump(sc)
            # Stopped by the count, not by the run's 30 s limit.
            assert time.monotonic() - t0 < 15 and not sc["timed_out"], dump(sc)
            assert sc["cpu_ms"] >= 1000, dump(sc)
            await still_serving(s)
    run_async(t)


def test_without_a_cgroup_cpu_seconds_bounds_each_process_alone():
    """rlimits (the fallback, forced here): the same four processes each
    stay under RLIMIT_CPU, so the run ends by itself: what the test above
    tells a counting cgroup from."""
    async def t():
        async with session(config=CPU_ONE_SECOND, env={"NIX_SANDBOX_LIMITS": "rlimits"}) as s:
            sc, _, err = await call(s, "python", spread_cpu(0))
            assert not err and sc["stdout"].endswith("all done\n") and sc["stdout"].count("done ") == 4, dump(sc)
    run_async(t)


def test_a_busy_process_meets_the_cpu_limit_under_every_mechanism():
    """One process over the limit is stopped whatever the mechanism (its
    RLIMIT_CPU, or the cgroup's count), busy siblings beside it."""
    async def t():
        async with session(config=CPU_ONE_SECOND) as s:
            sc, _, err = await call(s, "bash", "for i in 1 2; do (while :; do :; done) & done; while :; do :; done")
            assert err and sc["limit"] == "cpu" and sc["error"]["code"] == "cpu_limit", dump(sc)
            assert "1 s of CPU time" in sc["error"]["message"], dump(sc)
            await still_serving(s)
    run_async(t)


def test_a_cpu_quota_holds():
    if not cpu_quota():
        pytest.skip("no cgroup with the cpu controller here: cpus is not enforced (as documented)")
    code = ("import time\nwall, cpu = time.time(), time.process_time()\nwhile time.time() - wall < 2:\n    pass\n"
            "print(time.process_time() - cpu)")

    async def t():
        async with session(config=write_config("[defaults]\ncpus = 0.25\n")) as s:
            sc, _, err = await call(s, "python", code)
            assert not err, dump(sc)
            # A quarter of a core for two seconds: half a second, give or take.
            assert float(sc["stdout"]) < 1.2, dump(sc)
    run_async(t)
