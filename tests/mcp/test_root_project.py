"""A root server with a project root owns (the case of every container and
CI job that runs as root): in the default overlay mode the sandbox changes
the project's files as their owner can, through runs, sessions and declared
commands, while the host's files stay as they were, the sandbox's processes
keep an unprivileged uid on the host, and nothing outside the project
becomes writable. Skipped (visibly) when the tests do not run as root."""

from __future__ import annotations

import os
import pathlib

import pytest

from harness import call, dump, processes_with, readable_tmpdir, run_async, session, write_config

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="needs a root server (the tests run as root)")


def root_project() -> pathlib.Path:
    proj = readable_tmpdir() / "root-owned"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "main.txt").write_text("main\n")
    (proj / "notes.txt").write_text("notes\n")
    (proj / "owner-only.txt").write_text("the owner's\n")
    for p in [proj, proj / "src"]:
        p.chmod(0o755)
    for p in [proj / "src" / "main.txt", proj / "notes.txt"]:
        p.chmod(0o644)
    (proj / "owner-only.txt").chmod(0o600)
    assert all(p.stat().st_uid == 0 for p in [proj, *proj.rglob("*")])
    return proj


def snapshot(root: pathlib.Path) -> dict:
    return {str(p): (p.stat().st_mode, p.stat().st_uid, p.read_bytes() if p.is_file() else b"")
            for p in sorted([root, *root.rglob("*")])}


EDIT = (
    "set -e; cd /project\n"
    "echo two >> notes.txt\n"
    "mkdir -p build && echo obj > build/out.o\n"
    "echo new > src/new.txt\n"
    "cat notes.txt src/new.txt\n"
)


def test_a_root_server_lets_the_sandbox_change_a_root_owned_project_in_its_overlay():
    proj = root_project()
    before = snapshot(proj)

    async def t():
        async with session(project=str(proj)) as s:
            sc, text, err = await call(s, "bash", EDIT)
            assert not err and sc["stdout"] == "notes\ntwo\nnew\n", text
            changes = sc["changes"]
            assert (changes["added"], changes["modified"]) == (2, 1), dump(changes)
            # The sandbox's processes stay unprivileged on the host side.
            marker = f"nsm-root-{os.getpid()}"
            sc, _, _ = await call(s, "bash", f"(exec -a {marker} sleep 30) & touch /etc/x 2>/dev/null || echo refused",
                                  session="uid")
            assert sc["stdout"] == "refused\n", dump(sc)
            found = processes_with(marker)
            assert found, "the marker process is not running"
            pid = found[0].split(":")[0]
            uids = [line for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("Uid:")][0].split()[1:]
            assert set(uids) == {"65534"}, uids
            # A session too.
            sc, text, err = await call(s, "python", "open('/project/notes.txt', 'a').write('py\\n')", session="p")
            assert not err, text
            sc, _, _ = await call(s, "python", "print(open('/project/notes.txt').read())", session="p")
            assert sc["stdout"] == "notes\npy\n\n", dump(sc)
    run_async(t)
    assert snapshot(proj) == before, "the host's files changed"


def test_a_declared_command_writes_its_build_output_in_a_root_owned_project():
    proj = root_project()
    before = snapshot(proj)
    config = write_config(
        '[commands.build]\ndescription = "Build"\nenv = "bash"\n'
        'argv = ["sh", "-c", "mkdir -p target && echo built > target/app && cat target/app"]\n'
    )

    async def t():
        async with session(project=str(proj), config=config) as s:
            r = await s.call_tool("build", {})
            sc = r.structured_content
            assert not r.is_error and sc["stdout"] == "built\n", dump(sc)
    run_async(t)
    assert snapshot(proj) == before


def test_what_the_mapping_shows_the_sandbox_is_the_projects_own_files_only():
    proj = root_project()
    outside = readable_tmpdir() / "outside-secret"
    outside.write_text("not the project's\n")
    outside.chmod(0o600)

    async def t():
        async with session(project=str(proj)) as s:
            sc, _, _ = await call(s, "bash", f"cat /project/owner-only.txt; cat {outside} 2>&1 || true; ls -ln /project")
            # The owner's private file in the project is the sandbox's to read (docs/security.md says so) ...
            assert sc["stdout"].startswith("the owner's\n"), dump(sc)
            # ... nothing outside the project changes.
            assert "not the project's" not in sc["stdout"], dump(sc)
    run_async(t)
