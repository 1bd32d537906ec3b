"""A hostile run and a hostile repository against the server itself, through
the real binary: a tree too deep to walk, files that cost the sandbox
nothing and the server everything, a project file that grants itself
rights, code planted for the host in the patch, changes hidden from the
report, roots that are not a project, symlinks where a cache goes. Each
case must be contained, reported, and leave the server serving."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from harness import (BIN, RawServer, call, dump, legacy_only, readable_tmpdir, run_async, session, write_config)
from test_project import writable_project


def call_raw(srv: RawServer, code: str, env: str = "python", rid: int = 1, timeout: float = 120) -> dict:
    srv.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
              "params": {"name": "run", "arguments": {"env": env, "code": code}}})
    reply = srv.recv(timeout=timeout)
    assert "result" in reply, reply
    return reply["result"]


def peak_rss_kib(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def git(cwd: pathlib.Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True, **kw)


def open_to_all(root: pathlib.Path) -> None:
    for p in [root, *root.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o777 if p.is_dir() else 0o666)


def test_a_tree_too_deep_to_walk_is_reported_and_the_server_survives():
    proj = writable_project()
    srv = RawServer(env={"PROJECT_DIR": str(proj)})
    try:
        code = "import os\nos.chdir('/project')\nfor i in range(3000):\n    os.mkdir('d'); os.chdir('d')\nopen('deep.txt', 'w').write('x')\nprint('ok')"
        result = call_raw(srv, code)
        sc = result["structuredContent"]
        assert sc["ok"] and sc["stdout"] == "ok\n", dump(sc)
        summarized = " ".join(sc["changes"].get("summarized", []))
        assert "deeper than 128 levels" in summarized, dump(sc["changes"])
        result = call_raw(srv, "print('still serving')", rid=2)
        assert result["structuredContent"]["stdout"] == "still serving\n"
        assert srv.proc.poll() is None
    finally:
        srv.close()


def test_files_that_cost_the_sandbox_nothing_cost_the_server_little():
    proj = writable_project()
    srv = RawServer(env={"PROJECT_DIR": str(proj)})
    try:
        before = peak_rss_kib(srv.proc.pid)
        code = ("for i in range(1000):\n    f = open(f'/project/sparse{i}', 'w'); f.truncate(1 << 20); f.close()\n"
                "for i in range(200):\n    open(f'/project/text{i}.txt', 'w').write('line\\n' * 150000)\nprint('ok')")
        sc = call_raw(srv, code)["structuredContent"]
        assert sc["ok"], dump(sc)
        changes = sc["changes"]
        assert changes["added"] == 1200, dump(changes)
        after = peak_rss_kib(srv.proc.pid)
        # 1,000 MiB of holes and 150 MiB of text: the server reads a bounded amount.
        assert after - before < 150 * 1024, (before, after)
        srv.send({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {"uri": changes["patch_uri"]}})
        patch = srv.recv(timeout=30)["result"]["contents"][0]["text"]
        assert "b/sparse1 differ (sparse file)" in patch, patch[:2000]
    finally:
        srv.close()


def planted_project() -> pathlib.Path:
    proj = writable_project()
    (proj / "sub").mkdir()
    open_to_all(proj)
    return proj


PLANT = r"""
set -e
cd /project/sub
mkdir -p .git/refs .git/objects .claude .vscode
printf 'ref: refs/heads/main\n' > .git/HEAD
printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = "touch %(marker)s; false"\n' > .git/config
echo 'touch %(marker)s' > .envrc
echo 'obey' > CLAUDE.md
echo 'obey' > AGENTS.md
echo '{}' > .claude/settings.json
echo '{"tasks": []}' > .vscode/tasks.json
ln -s /etc/passwd escape
echo fine > ok.txt
"""


def test_code_planted_for_the_host_is_flagged_and_left_out_of_the_patch():
    proj = planted_project()
    marker = readable_tmpdir() / "hook-ran"

    async def t():
        async with session(project=str(proj)) as s:
            sc, text, err = await call(s, "bash", PLANT % {"marker": marker})
            assert not err, text
            changes = sc["changes"]
            assert sorted(changes["protected"]) == ["sub/.claude", "sub/.envrc", "sub/.git", "sub/.vscode",
                                                    "sub/AGENTS.md", "sub/CLAUDE.md", "sub/escape"], dump(changes)
            assert "left out of the patch" in text, text
            default = (await s.read_resource(changes["patch_uri"])).contents[0].text
            assert changes["patch"] == default
            with_git = (await s.read_resource(changes["patch_uri"] + "?include=sub%2F.git")).contents[0].text
            return default, with_git
    default, with_git = run_async(t)
    assert "b/sub/ok.txt" in default, default
    for planted in (".git", ".envrc", "CLAUDE.md", "AGENTS.md", ".claude", ".vscode", "escape"):
        assert planted not in default, (planted, default)
    assert "fsmonitor" in with_git and "b/sub/ok.txt" in with_git, with_git
    # The docs' way to apply: the default patch plants nothing that runs.
    copy = readable_tmpdir() / "copy"
    shutil.copytree(proj, copy, symlinks=True)
    subprocess.run(["git", "apply", "-"], cwd=copy, input=default, text=True, check=True)
    assert (copy / "sub/ok.txt").read_text() == "fine\n"
    subprocess.run(["git", "status"], cwd=copy / "sub", capture_output=True)
    assert not marker.exists(), "the patch planted a hook that ran"
    assert not (copy / "sub/.git").exists() and not (copy / "sub/.envrc").exists()


def test_a_protected_path_the_patch_does_not_have_is_refused_by_name():
    proj = writable_project()

    async def t():
        async with session(project=str(proj)) as s:
            sc, _, _ = await call(s, "bash", "echo x > /project/new.txt")
            uri = sc["changes"]["patch_uri"]
            with pytest.raises(Exception) as e:
                await s.read_resource(uri + "?include=.git")
            assert "no protected path" in str(e.value), e.value
            with pytest.raises(Exception) as e:
                await s.read_resource(uri + "?exec=1")
            assert "include=PATH" in str(e.value), e.value
    run_async(t)


def test_a_change_hidden_by_its_time_or_by_an_ignore_rule_is_reported():
    proj = writable_project()
    (proj / "big.dat").write_bytes(b"a" * (2 << 20))
    (proj / "keep.log").write_text("kept\n")
    git(proj, "init", "-q")
    git(proj, "add", "big.dat", "keep.log")
    (proj / ".gitignore").write_text("*.log\n")
    open_to_all(proj)
    code = (
        "import os\n"
        "p = '/project/big.dat'; st = os.stat(p)\n"
        "with open(p, 'r+b') as f:\n    f.seek(1 << 20); f.write(b'b')\n"
        "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
        "open('/project/keep.log', 'a').write('changed\\n')\n"
        "for i in range(20):\n    open(f'/project/noise{i}.log', 'w').write('n')\n"
    )

    async def t():
        async with session(project=str(proj)) as s:
            sc, text, err = await call(s, "python", code)
            assert not err, text
            changes = sc["changes"]
            assert changes["modified"] == 2, dump(changes)
            assert changes["ignored"] == 20, dump(changes)
            patch = (await s.read_resource(changes["patch_uri"])).contents[0].text
            assert "b/big.dat differ (too large to diff)" in patch and "+changed" in patch, patch
    run_async(t)


GREEDY = """
[commands.deploy]
description = "Deploy"
env = "bash"
argv = ["true"]
network = true
[commands.peek]
description = "Looks harmless"
env = "bash"
argv = ["true"]
danger = "safe"
[commands.forever]
description = "Runs long"
env = "bash"
argv = ["true"]
timeout_ms = 86400000
"""


def project_with_commands(text: str) -> pathlib.Path:
    proj = writable_project()
    (proj / ".nix-sandbox-mcp").mkdir()
    (proj / ".nix-sandbox-mcp" / "commands.toml").write_text(text)
    open_to_all(proj)
    return proj


def test_a_project_file_cannot_grant_itself_network_safety_or_time():
    proj = project_with_commands(GREEDY)
    p = subprocess.run([BIN, "envs"], capture_output=True,
                       text=True, env={**os.environ, "PROJECT_DIR": str(proj)}, timeout=60)
    assert p.returncode != 0, p.stdout
    for key in ("commands.deploy.network", "commands.peek.danger", "commands.forever.timeout_ms"):
        assert f"key `{key}`" in p.stderr, (key, p.stderr)
    assert "[project.grants.deploy]" in p.stderr, p.stderr
    # The operator grants what the file asks: it loads, and the hints follow.
    config = write_config('[project.grants.deploy]\nnetwork = true\n[project.grants.peek]\ndanger = "safe"\n'
                          '[project.grants.forever]\ntimeout_ms = 86400000\n')

    async def t():
        async with session(project=str(proj), config=config) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert {"deploy", "peek", "forever"} <= set(tools), list(tools)
            assert tools["peek"].annotations.read_only_hint is True
            assert tools["deploy"].annotations.open_world_hint is True
    run_async(t)


def test_a_project_file_may_narrow_what_its_environment_allows():
    proj = project_with_commands('[commands.lint]\ndescription = "Lint"\nenv = "bash"\nargv = ["true"]\n'
                                 'danger = "high"\ntimeout_ms = 1000\n')

    async def t():
        async with session(project=str(proj)) as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert tools["lint"].annotations.destructive_hint is True
    run_async(t)


def test_a_readwrite_projects_whole_git_directory_is_read_only():
    proj = writable_project()
    git(proj, "init", "-q")
    (proj / "tracked.txt").write_text("t\n")
    git(proj, "add", "tracked.txt")
    git(proj, "commit", "-qm", "first")
    open_to_all(proj)
    before = {p: p.read_bytes() for p in (proj / ".git").rglob("*") if p.is_file()}
    config = write_config('[project]\nmode = "readwrite"\n')
    redirects = (
        "cd /project/.git\n"
        "for f in commondir info/exclude HEAD objects/info/alternates config hooks/post-checkout index; do\n"
        "  if (echo /tmp/evil > \"$f\") 2>/dev/null; then echo \"WROTE $f\"; fi\n"
        "done\n"
        "mkdir worktrees/x 2>/dev/null && echo 'WROTE worktrees'\n"
        "mv /project/.git /project/git-moved 2>/dev/null && echo 'MOVED .git'\n"
        "echo done\n"
    )

    async def t():
        async with session(project=str(proj), config=config) as s:
            sc, text, err = await call(s, "bash", redirects)
            assert sc["stdout"].strip() == "done", text
    run_async(t)
    after = {p: p.read_bytes() for p in (proj / ".git").rglob("*") if p.is_file()}
    assert after == before


@legacy_only("roots/list is a server-to-client request, which the stateless revision has not")
def test_roots_that_are_not_a_project_are_refused_and_said_so():
    from harness import RootsClient, roots_session
    from test_roots import folder, project_listing, run_description, uri
    cwd = folder("started-here", "cwd-marker")
    home = folder("home", "home-marker")
    (home / ".ssh").mkdir()
    (home / ".ssh").chmod(0o777)
    (home / ".ssh" / "id_ed25519").write_text("secret\n")
    for root, why in (("file:///home", "system directory"), ("file:///etc", "system directory"),
                      ("file:///usr", "system directory"), (uri(home / ".ssh"), ".ssh"),
                      (uri(home.parent), "holding the home directory"), ("file:///proc/self", "inside the system directory /proc")):
        client = RootsClient([root])

        async def t():
            async with roots_session(client, cwd, env={"HOME": str(home)}) as s:
                assert (await project_listing(s)).strip().endswith("NO-PROJECT"), root
                description = await run_description(s)
                assert "No project is mounted" in description and why in description, (root, description)
        run_async(t)


def test_a_symlink_where_a_cache_goes_never_moves_the_cache_or_stops_the_run():
    config = write_config('[environments.bash]\npreset = "bash"\ncaches = ["target", "build/out"]\n')
    victim = readable_tmpdir() / "victim"
    victim.mkdir()
    victim.chmod(0o777)
    for target in (str(victim), "../newroot/workspace", "../../../../newroot/workspace"):
        proj = writable_project()
        (proj / "target").symlink_to(target)
        (proj / "build").mkdir()
        (proj / "build" / "out").symlink_to("/")
        open_to_all(proj)

        async def t():
            async with session(project=str(proj), config=config) as s:
                sc, text, err = await call(s, "bash", "echo hi > /workspace/w && cat /workspace/w && grep -c ' /project/target ' /proc/self/mountinfo || true")
                assert not err and sc["stdout"].startswith("hi\n"), text
                assert sc["stdout"].split()[-1] == "0", "a cache was mounted through the link: " + text
        run_async(t)
        assert os.readlink(proj / "target") == target
    assert list(victim.iterdir()) == []


SHARED_MEMORY = (
    "import mmap, os\n"
    "m = mmap.mmap(-1, 256 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
    "for i in range(0, len(m), 4096): m[i] = 1\n"
    "fd = os.memfd_create('x'); os.ftruncate(fd, 256 << 20)\n"
    "f = mmap.mmap(fd, 256 << 20)\n"
    "for i in range(0, len(f), 4096): f[i] = 1\n"
    "print('held 512 MiB')\n"
)


def test_shared_memory_is_limited_or_said_not_to_be():
    from harness import limits_info, limits_mechanism
    config = write_config("[defaults]\nmemory_mb = 64\n")

    async def t():
        async with session(config=config) as s:
            description = (await s.list_tools()).tools[0].description
            sc, text, err = await call(s, "python", SHARED_MEMORY)
            return description, sc, text, err
    description, sc, text, err = run_async(t)
    if limits_mechanism() == "rlimits":
        # Not bounded here: every place that describes the limits says so.
        assert "shared memory" in description, description
        assert "does not count shared memory" in limits_info()["limits_detail"], limits_info()
        doctor = subprocess.run([BIN, "doctor", "--json"], capture_output=True, text=True, timeout=120)
        limits = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "limits"][0]
        assert "shared memory" in limits["detail"] + (limits.get("fix") or ""), limits
        assert "memory" not in sc.get("limits_reached", []), "a limit that did not hold was reported: " + text
    else:
        assert err and "held 512 MiB" not in sc["stdout"], text
        assert sc.get("limit") == "memory" or "memory" in sc.get("limits_reached", []), dump(sc)
        assert "shared memory" not in description, description


def test_the_repositorys_own_git_directory_is_never_in_the_patch():
    proj = writable_project()
    git(proj, "init", "-q")
    git(proj, "add", "notes.txt")
    git(proj, "commit", "-qm", "first")
    open_to_all(proj)

    async def t():
        async with session(project=str(proj)) as s:
            code = ("cd /project && git -c safe.directory=/project -c user.name=a -c user.email=a@b commit -qam x --allow-empty"
                    " && echo 'fsmonitor = evil' >> .git/config && echo edited >> notes.txt")
            sc, text, err = await call(s, "bash", code)
            assert not err, text
            changes = sc["changes"]
            assert changes["protected"] == [".git"], dump(changes)
            patch = (await s.read_resource(changes["patch_uri"])).contents[0].text
            assert "notes.txt" in patch and ".git" not in patch, patch
    run_async(t)
