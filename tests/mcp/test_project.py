"""The project through a real MCP client, in each mode: `overlay` (the
default: writable, every change stays in the sandbox, the host's files are
byte-identical afterwards), `readonly` and `readwrite`; the fallback when the
host cannot make the overlay; and what the mount does not leak or lock."""

from __future__ import annotations

import fcntl
import os
import pathlib
import stat
import subprocess

from harness import (BIN, RawServer, call, dump, readable_tmpdir, run_async, server_params, session, stateless_only,
                     write_config)


def writable_project() -> pathlib.Path:
    """A project anyone may write (a root server's sandbox runs as uid 65534):
    files, a directory, a symlink that leaves the project."""
    root = readable_tmpdir()
    proj = root / "project"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "main.txt").write_text("main\n")
    (proj / "notes.txt").write_text("notes\n")
    (proj / "gone").mkdir()
    (proj / "gone" / "file").write_text("x\n")
    (root / "outside.txt").write_text("outside\n")
    (proj / "outside-link").symlink_to(root / "outside.txt")
    for p in [proj, *proj.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o777 if p.is_dir() else 0o666)
    (root / "outside.txt").chmod(0o666)
    return proj


def snapshot(root: pathlib.Path) -> dict[str, tuple]:
    """Every entry under `root` (and the file outside it): type, mode, content."""
    out = {}
    for p in sorted([root, *root.rglob("*"), root.parent / "outside.txt"]):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[str(p)] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[str(p)] = ("dir", st.st_mode, st.st_uid, st.st_gid)
        else:
            out[str(p)] = ("file", st.st_mode, st.st_uid, st.st_gid, p.read_bytes())
    return out


EDITS = (
    "set -e\n"
    "echo changed > /project/notes.txt\n"
    "echo more >> /project/src/main.txt\n"
    "echo new > /project/src/new.txt\n"
    "rm -r /project/gone\n"
    "mv /project/src/main.txt /project/src/renamed.txt\n"
    "chmod 600 /project/src/new.txt\n"
    "mkdir -p /project/build/out && echo obj > /project/build/out/a.o\n"
    "{ echo escaped > /project/outside-link; } 2>/dev/null || true\n"
    "cat /project/notes.txt /project/src/renamed.txt /project/src/new.txt\n"
    "ls /project | tr '\\n' ' '\n"
)


def test_overlay_writes_land_in_the_sandbox_and_never_on_the_host():
    proj = writable_project()
    before = snapshot(proj)

    async def t():
        async with session(project=str(proj)) as s:
            run = (await s.list_tools()).tools[0]
            assert "writable copy; changes come back as a patch" in run.description, run.description
            sc, text, err = await call(s, "bash", EDITS)
            assert not err, text
            assert sc["stdout"] == "changed\nmain\nmore\nnew\nbuild notes.txt outside-link src ", dump(sc)
            # The next run starts from the host's tree again.
            sc, _, _ = await call(s, "bash", "cat /project/notes.txt; ls /project/src; ls /project/build 2>&1 | head -1")
            assert sc["stdout"].startswith("notes\nmain.txt\n"), dump(sc)
    run_async(t)
    assert snapshot(proj) == before


def test_a_session_keeps_its_changes_between_calls():
    proj = writable_project()
    before = snapshot(proj)

    async def t():
        async with session(project=str(proj)) as s:
            sc, text, err = await call(s, "bash", "echo 1 > /project/counter; mkdir /project/target", session="b")
            assert not err, text
            sc, text, err = await call(s, "bash", "echo $(( $(cat /project/counter) + 1 )); ls -d /project/target", session="b")
            assert not err and sc["stdout"] == "2\n/project/target\n", dump(sc)
            sc, _, _ = await call(s, "python", "import os; print(os.path.exists('/project/counter'))", session="p")
            assert sc["stdout"] == "False\n", "sessions do not share their changes"
    run_async(t)
    assert snapshot(proj) == before


def test_readonly_mode_refuses_every_write():
    proj = writable_project()
    before = snapshot(proj)
    config = write_config('[project]\nmode = "readonly"\n')

    async def t():
        async with session(project=str(proj), config=config) as s:
            run = (await s.list_tools()).tools[0]
            assert "(read-only)" in run.description, run.description
            code = (
                "for f in /project/notes.txt /project/new; do echo x > $f 2>/dev/null && echo WROTE || echo denied; done\n"
                "rm -r /project/gone 2>/dev/null && echo REMOVED || echo denied\n"
                "cat /project/notes.txt\n"
            )
            sc, _, _ = await call(s, "bash", code)
            assert sc["stdout"] == "denied\ndenied\ndenied\nnotes\n", dump(sc)
    run_async(t)
    assert snapshot(proj) == before


def test_readwrite_mode_changes_the_host_tree():
    proj = writable_project()
    config = write_config('[project]\nmode = "readwrite"\n')

    async def t():
        async with session(project=str(proj), config=config) as s:
            run = (await s.list_tools()).tools[0]
            assert "changes are real" in run.description, run.description
            sc, text, err = await call(s, "bash", "echo real > /project/notes.txt")
            assert not err, text
    run_async(t)
    assert (proj / "notes.txt").read_text() == "real\n"


def test_without_the_overlay_the_project_is_read_only_and_says_why():
    proj = writable_project()
    before = snapshot(proj)

    async def t():
        async with session(project=str(proj), env={"NIX_SANDBOX_NEST": "off"}) as s:
            run = (await s.list_tools()).tools[0]
            assert "read-only: no copy-on-write on this host" in run.description, run.description
            sc, _, _ = await call(s, "bash", "echo x > /project/notes.txt 2>/dev/null && echo WROTE || echo denied")
            assert sc["stdout"] == "denied\n", dump(sc)
    run_async(t)
    assert snapshot(proj) == before
    doctor = subprocess.run([os.environ.get("NSM_BIN", "nix-sandbox-mcp"), "doctor"], capture_output=True, text=True,
                            env={**os.environ, "NIX_SANDBOX_NEST": "off", "PROJECT_DIR": str(proj)})
    assert "NIX_SANDBOX_NEST=off" in doctor.stdout and "read-only" in doctor.stdout, doctor.stdout


def test_a_sandbox_cannot_lock_the_hosts_project_files():
    """Host tools (git, cargo, package managers) lock files in the project; a
    sandbox holding locks on the same files must not make them wait."""
    proj = writable_project()
    for mode in ("overlay", "readonly"):
        config = write_config(f'[project]\nmode = "{mode}"\n')
        srv = RawServer(config=config, env={"PROJECT_DIR": str(proj)})
        code = ("import fcntl, time\n"
                "f = open('/project/notes.txt'); fcntl.flock(f, fcntl.LOCK_EX)\n"
                "g = open('/project/src/main.txt'); fcntl.lockf(g, fcntl.LOCK_SH)\n"
                "print('locked', flush=True)\n")
        srv.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                  "params": {"name": "run", "arguments": {"env": "python", "session": "l", "code": code}}})
        assert srv.recv()["result"]["structuredContent"]["stdout"] == "locked\n"
        with open(proj / "notes.txt") as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the sandbox's lock reached the host
        with open(proj / "src" / "main.txt", "r+") as g:
            fcntl.lockf(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
        srv.shut_down()


def test_mountinfo_names_no_host_path_of_the_project_or_the_home():
    proj = writable_project()
    home = os.path.expanduser("~")

    async def t(config: str) -> None:
        async with session(project=str(proj), config=config) as s:
            sc, _, _ = await call(s, "bash", "cat /proc/self/mountinfo /proc/self/mounts /proc/1/mountinfo")
            assert "/project" in sc["stdout"], dump(sc)
            for host_path in (str(proj), str(proj.parent), home):
                assert host_path not in sc["stdout"], (host_path, sc["stdout"])
    for mode in ("overlay", "readonly"):
        run_async(t, write_config(f'[project]\nmode = "{mode}"\n'))


def tree(root: pathlib.Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Files and symlinks under `root` (relative path -> content, mode), leaving out `skip` prefixes."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.startswith(skip) or (p.is_dir() and not p.is_symlink()):
            continue
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        else:
            out[rel] = ("file", p.read_bytes(), p.stat().st_mode & 0o111 != 0)
    return out


SANDBOX_TREE = (
    "cd /project && find . \\( -type f -o -type l \\) -not -path './build/*' | sort | while read -r f; do\n"
    "  if [ -L \"$f\" ]; then echo \"$f link $(readlink \"$f\")\"; else echo \"$f $(sha256sum < \"$f\" | cut -c1-16) $([ -x \"$f\" ] && echo x)\"; fi\n"
    "done\n"
)


def describe(root: pathlib.Path) -> str:
    """The host-side listing SANDBOX_TREE prints inside the sandbox."""
    import hashlib
    lines = []
    for rel, entry in tree(root, skip=("build/", ".git/")).items():
        if entry[0] == "link":
            lines.append(f"./{rel} link {entry[1]}")
        else:
            lines.append(f"./{rel} {hashlib.sha256(entry[1]).hexdigest()[:16]} {'x' if entry[2] else ''}")
    return "\n".join(sorted(lines)) + "\n"


def test_the_patch_turns_the_host_tree_into_what_the_sandbox_left():
    proj = writable_project()
    (proj / ".gitignore").write_text("build/\n")
    before = snapshot(proj)

    async def t():
        async with session(project=str(proj)) as s:
            sc, text, err = await call(s, "bash", EDITS + SANDBOX_TREE)
            assert not err, text
            changes = sc["changes"]
            assert (changes["added"], changes["modified"], changes["deleted"]) == (2, 1, 2), dump(changes)
            assert changes["ignored_paths"] == ["build/"], dump(changes)
            assert "build/" not in changes["patch"] and "left out of the patch as ignored" in text
            res = await s.read_resource(changes["patch_uri"])
            assert res.contents[0].text == changes["patch"]
            return changes["patch"], sc["stdout"].split("build notes.txt outside-link src ")[1]
    patch, in_sandbox = run_async(t)
    assert snapshot(proj) == before
    copy = readable_tmpdir() / "copy"
    subprocess.run(["cp", "-a", str(proj), str(copy)], check=True)
    applied = subprocess.run(["git", "apply", "--verbose", "-"], cwd=copy, input=patch, text=True, capture_output=True)
    assert applied.returncode == 0, applied.stderr + patch
    assert describe(copy) == in_sandbox, patch


def test_a_large_patch_is_a_resource_and_protected_files_are_flagged():
    proj = writable_project()

    async def t():
        async with session(project=str(proj)) as s:
            code = ("seq 1 3000 > /project/big.txt; echo '# be evil' > /project/AGENTS.md; mkdir -p /project/.claude && echo {} > /project/.claude/settings.json\n"
                    "printf 'a\\0b\\377' > /project/blob.bin; seq 1 300000 > /project/huge.txt")
            res = await s.call_tool("run", {"env": "bash", "code": code})
            text = "".join(getattr(c, "text", "") for c in res.content)
            assert not res.is_error, text
            changes = res.structured_content["changes"]
            assert "patch" not in changes and changes["patch_bytes"] > 4096, dump(changes)
            assert sorted(changes["protected"]) == [".claude", "AGENTS.md"], dump(changes)
            assert f"read the resource {changes['patch_uri']}" in text and "review" in text, text
            links = [c for c in res.content if c.type == "resource_link"]
            assert [str(c.uri) for c in links] == [changes["patch_uri"]], res.content
            res = await s.read_resource(changes["patch_uri"])
            patch = res.contents[0].text
            assert "+3000\n" in patch
            # Binary files and files too large to diff are named, not dumped.
            assert "Binary files /dev/null and b/blob.bin differ" in patch, patch[-2000:]
            assert "b/huge.txt differ (too large to diff)" in patch and "+299999\n" not in patch, patch[-2000:]
            listed = await s.list_resources()
            assert changes["patch_uri"] in [str(r.uri) for r in listed.resources]
            sc, _, _ = await call(s, "bash", "cat /project/notes.txt")
            assert "changes" not in sc, "a run that changed nothing reports nothing"
    run_async(t)


def test_an_overlay_change_to_git_or_a_configured_path_is_flagged():
    proj = writable_project()
    (proj / ".git" / "hooks").mkdir(parents=True)
    (proj / ".git" / "config").write_text("[core]\n")
    for p in [proj / ".git", proj / ".git" / "hooks", proj / ".git" / "config"]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    config = write_config('[project]\nprotected = ["deploy/"]\n')

    async def t():
        async with session(project=str(proj), config=config) as s:
            code = ("cd /project && echo evil > .git/hooks/pre-commit && echo '[x]' >> .git/config"
                    " && mkdir deploy && echo k > deploy/key")
            sc, text, err = await call(s, "bash", code)
            assert not err, text
            assert sorted(sc["changes"]["protected"]) == [".git", "deploy"], dump(sc)
    run_async(t)
    assert (proj / ".git" / "config").read_text() == "[core]\n"
    assert not (proj / ".git" / "hooks" / "pre-commit").exists()


def test_a_session_reports_its_changes_so_far_when_a_call_changes_them():
    proj = writable_project()

    async def t():
        async with session(project=str(proj)) as s:
            sc, _, _ = await call(s, "bash", "echo a > /project/a.txt", session="w")
            assert sc["changes"]["added"] == 1, dump(sc)
            sc, _, _ = await call(s, "bash", "cat /project/a.txt", session="w")
            assert "changes" not in sc, dump(sc)
            sc, _, _ = await call(s, "bash", "echo b > /project/b.txt", session="w")
            assert sc["changes"]["added"] == 2 and sc["changes"]["cumulative"], dump(sc)
    run_async(t)


def test_a_readwrite_project_keeps_protected_files_read_only_and_names_new_ones():
    proj = writable_project()
    (proj / "CLAUDE.md").write_text("the user's rules\n")
    (proj / "CLAUDE.md").chmod(0o666)
    config = write_config('[project]\nmode = "readwrite"\nprotected = ["deploy/"]\n')
    (proj / "deploy").mkdir(mode=0o777)
    (proj / "deploy").chmod(0o777)

    async def t():
        async with session(project=str(proj), config=config) as s:
            code = ("echo evil > /project/CLAUDE.md 2>/dev/null && echo WROTE || echo refused\n"
                    "rm /project/CLAUDE.md 2>/dev/null && echo REMOVED || echo refused\n"
                    "touch /project/deploy/key 2>/dev/null && echo WROTE || echo refused\n"
                    "echo '{}' > /project/.mcp.json && echo created\n")
            sc, _, _ = await call(s, "bash", code)
            assert sc["stdout"] == "refused\nrefused\nrefused\ncreated\n", dump(sc)
            assert sc["changes"] == {"protected_created": [".mcp.json"]}, dump(sc)
    run_async(t)
    assert (proj / "CLAUDE.md").read_text() == "the user's rules\n"


def test_a_protected_path_cannot_be_moved_aside_with_its_directory_in_a_readwrite_project():
    proj = writable_project()
    for d in (".git/hooks", ".github"):
        (proj / d).mkdir(parents=True, mode=0o777)
    (proj / ".git/config").write_text("[core]\n")
    (proj / ".github/copilot-instructions.md").write_text("the user's rules\n")
    for p in [proj / ".git", proj / ".git/hooks", proj / ".git/config", proj / ".github",
              proj / ".github/copilot-instructions.md"]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    config = write_config('[project]\nmode = "readwrite"\n')

    async def t():
        async with session(project=str(proj), config=config) as s:
            code = ("cd /project\n"
                    "mv .git .git-aside 2>/dev/null && echo MOVED || echo refused\n"
                    "mv .github .github-aside 2>/dev/null && echo MOVED || echo refused\n"
                    "rm -rf .git 2>/dev/null; test -f .git/config && echo kept\n"
                    "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit 2>/dev/null && echo WROTE || echo refused\n"
                    "echo evil > .git/config 2>/dev/null && echo WROTE || echo refused\n"
                    "echo ok > .git/description 2>/dev/null && echo WROTE || echo refused\n"
                    "echo ok > .github/notes.md && echo written\n")
            sc, _, _ = await call(s, "bash", code)
            assert sc["stdout"] == "refused\nrefused\nkept\nrefused\nrefused\nrefused\nwritten\n", dump(sc)
    run_async(t)
    assert (proj / ".git/config").read_text() == "[core]\n"
    assert not (proj / ".git/hooks/pre-commit").exists()
    assert (proj / ".github/copilot-instructions.md").read_text() == "the user's rules\n"
    assert not (proj / ".git/description").exists(), "the whole .git is read-only"
    assert (proj / ".github/notes.md").read_text() == "ok\n"
    assert not (proj / ".git-aside").exists() and not (proj / ".github-aside").exists()


def named_projects() -> tuple[str, pathlib.Path, pathlib.Path]:
    """A configuration with two projects, alpha and beta, each holding a file
    that says which it is."""
    top = readable_tmpdir()
    dirs = []
    for name in ("alpha", "beta"):
        d = top / name
        d.mkdir()
        d.chmod(0o755)
        (d / "which").write_text(f"{name}\n")
        (d / "which").chmod(0o644)
        dirs.append(d)
    config = write_config("".join(f'[projects.{d.name}]\npath = "{d}"\n' for d in dirs))
    return config, dirs[0], dirs[1]


def test_a_call_may_name_a_configured_project_and_never_a_path():
    config, alpha, beta = named_projects()

    async def t():
        async with session(config=config) as s:
            run = (await s.list_tools()).tools[0]
            assert run.input_schema["properties"]["project"]["enum"] == ["alpha", "beta"], run.input_schema
            assert f"alpha ({alpha})" in run.description and f"beta ({beta})" in run.description, run.description
            for name in ("alpha", "beta"):
                sc, _, err = await call(s, "bash", "cat /project/which", project=name)
                assert not err and sc["stdout"] == f"{name}\n", dump(sc)
            sc, _, err = await call(s, "bash", "cat /project/data.txt")
            assert not err and sc["stdout"] == "project data\n", dump(sc)
            for given in ("/etc", str(alpha), "gamma", "../alpha"):
                sc, _, err = await call(s, "bash", "cat /project/which", project=given)
                assert err and sc["error"]["code"] == "invalid_input" and "stdout" not in sc, dump(sc)
                assert "alpha, beta" in sc["error"]["suggestion"], dump(sc)
            # Its changes stay in the sandbox, as in the project's.
            sc, _, err = await call(s, "bash", "echo changed > /project/which", project="alpha")
            assert not err and "which" in str(sc.get("changes")), dump(sc)
            assert (alpha / "which").read_text() == "alpha\n"
    run_async(t)


def test_a_session_and_a_job_keep_the_project_they_name():
    config, _, _ = named_projects()

    async def t():
        async with session(config=config) as s:
            sc, _, err = await call(s, "python", "f = open('/project/which')", session="w", project="beta")
            assert not err, dump(sc)
            sc, _, err = await call(s, "python", "print(f.read(), end='')", session="w", project="beta")
            assert not err and sc["stdout"] == "beta\n", dump(sc)
            sc, _, err = await call(s, "python", "print(1)", session="w")
            assert err and sc["error"]["code"] == "session_mismatch" and "project beta" in sc["error"]["message"], dump(sc)
            sc, _, err = await call(s, "bash", "cat /project/which", project="alpha", background=True)
            assert not err, dump(sc)
            job = sc["job"]
            res = await s.call_tool("job", {"id": job, "wait_seconds": 30})
            assert res.structured_content["stdout"] == "alpha\n", res.structured_content
    run_async(t)


def test_a_configured_project_that_cannot_be_mounted_stops_the_server():
    p = server_params(config=write_config('[projects.gone]\npath = "/nonexistent/nsm-project"\n'))
    r = subprocess.run([BIN, *p.args], env={**os.environ, **(p.env or {})}, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "[projects.gone]" in r.stderr and "/nonexistent/nsm-project" in r.stderr, r.stderr


@stateless_only()
def test_a_stateless_client_gets_the_working_directory_and_is_never_asked_for_roots():
    """Under 2026-07-28 the server sends no requests: without a configured
    project it is the directory the server started in."""
    cwd = readable_tmpdir()
    (cwd / "here.txt").write_text("started here\n")
    (cwd / "here.txt").chmod(0o644)

    async def t():
        async with session(project="", cwd=str(cwd)) as s:
            sc, _, err = await call(s, "bash", "cat /project/here.txt")
            assert not err and sc["stdout"] == "started here\n", sc
    run_async(t)
