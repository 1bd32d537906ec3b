"""MCP roots through a real client that declares them: with no configured
project, the project is the client's first file:// root (not the server's
working directory), follows notifications/roots/list_changed (the project
file's commands and open sessions with it), lists the other roots, and is
never / or the user's home. A configured project wins over any root."""

from __future__ import annotations

import pathlib
import urllib.parse
import warnings

from mcp.client.session import ClientSession

from harness import RootsClient, call, legacy_only, readable_tmpdir, roots_session, run_async

# Roots are a server-to-client request (roots/list), which 2026-07-28 has not.
pytestmark = legacy_only("roots/list is a server-to-client request, which the stateless revision has not")


def folder(name: str, marker: str, commands: str | None = None) -> pathlib.Path:
    """A project a root server's sandbox can read, holding the file `marker`."""
    d = readable_tmpdir() / name
    d.mkdir()
    # Anyone may write it: a root server's sandbox runs as uid 65534.
    d.chmod(0o777)
    (d / marker).write_text(f"{marker}\n")
    (d / marker).chmod(0o644)
    if commands is not None:
        decl = d / ".nix-sandbox-mcp"
        decl.mkdir()
        decl.chmod(0o755)
        (decl / "commands.toml").write_text(commands)
        (decl / "commands.toml").chmod(0o644)
    return d


def uri(path: pathlib.Path) -> str:
    return "file://" + urllib.parse.quote(str(path))


async def roots_changed(s: ClientSession) -> None:
    """Sends notifications/roots/list_changed (deprecated in the SDK, as roots are; still what clients send)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        await s.send_roots_list_changed()


async def project_listing(s: ClientSession) -> str:
    sc, text, err = await call(s, "bash", "ls /project 2>&1 || echo NO-PROJECT")
    assert not err, text
    return sc["stdout"]


async def run_description(s: ClientSession) -> str:
    return (await s.list_tools()).tools[0].description or ""


def test_the_project_is_the_clients_first_root_not_the_working_directory():
    cwd = folder("started-here", "cwd-marker")
    first = folder("my app", "first-marker")
    second = folder("lib", "second-marker")
    # A root on another host is skipped: the first local one is the project.
    client = RootsClient(["file://fileserver/share/app", uri(first), uri(second)])

    async def t():
        async with roots_session(client, cwd) as s:
            assert (await project_listing(s)).split() == ["first-marker"]
            d = await run_description(s)
            assert "Project: /project (a writable copy" in d, d
            assert f"Not mounted (the client's other roots): {second}." in d, d
            # Writes stay in the sandbox and come back as changes.
            sc, text, err = await call(s, "bash", "echo new > /project/added.txt")
            assert not err and sc["changes"]["added"] == 1, text
        assert client.asked == 1
        assert sorted(p.name for p in first.iterdir()) == ["first-marker"]

    run_async(t)


def test_a_roots_change_moves_the_project_its_commands_and_its_sessions():
    cwd = folder("started-here", "cwd-marker")
    a = folder("a", "a-marker", commands='[commands.hello]\ndescription = "Say hello"\nenv = "bash"\nargv = ["echo", "hello from a"]\n')
    b = folder("b", "b-marker", commands='[commands.greet]\ndescription = "Greet"\nenv = "bash"\nargv = ["echo", "greetings from b"]\n')
    client = RootsClient([uri(a)])

    async def t():
        async with roots_session(client, cwd) as s:
            assert (await project_listing(s)).split() == ["a-marker"]
            names = [t.name for t in (await s.list_tools()).tools]
            assert "hello" in names and "greet" not in names, names
            sc, text, err = await call(s, "bash", "x=41", session="work")
            assert not err, text

            seen = client.tools_changed
            client.roots = [uri(b)]
            await roots_changed(s)
            await client.wait_tools_changed(seen)

            assert (await project_listing(s)).split() == ["b-marker"]
            names = [t.name for t in (await s.list_tools()).tools]
            assert "greet" in names and "hello" not in names, names
            res = await s.call_tool("greet", {})
            assert not res.is_error and "greetings from b" in res.content[0].text, res
            # The session saw the other project: it is closed, and says why.
            sc, text, err = await call(s, "bash", "echo ${x:-unset}", session="work")
            assert err and sc["error"]["code"] == "session_expired", text
            assert "the project changed to" in sc["error"]["message"], text
            sc, text, err = await call(s, "bash", "ls /project", session="work")
            assert not err and sc["stdout"].split() == ["b-marker"], text

            # No roots any more: the working directory again.
            seen = client.tools_changed
            client.roots = []
            await roots_changed(s)
            await client.wait_tools_changed(seen)
            assert (await project_listing(s)).split() == ["cwd-marker"]

    run_async(t)


def test_a_configured_project_wins_over_the_roots():
    cwd = folder("started-here", "cwd-marker")
    configured = folder("configured", "configured-marker")
    root = folder("root", "root-marker")
    client = RootsClient([uri(root)])

    async def t():
        async with roots_session(client, cwd, project=str(configured)) as s:
            assert (await project_listing(s)).split() == ["configured-marker"]
            assert "other roots" not in await run_description(s)
        assert client.asked == 0

    run_async(t)


def test_slash_or_home_as_the_first_root_mounts_no_project():
    cwd = folder("started-here", "cwd-marker")
    home = folder("home", "home-marker")
    for roots in (["file:///"], [uri(home)]):
        client = RootsClient(roots)

        async def t():
            async with roots_session(client, cwd, env={"HOME": str(home)}) as s:
                assert (await project_listing(s)).strip().endswith("NO-PROJECT")
                assert "Project:" not in await run_description(s)

        run_async(t)


def test_a_client_without_roots_gets_the_working_directory():
    cwd = folder("started-here", "cwd-marker")

    async def t():
        async with roots_session(RootsClient(None), cwd) as s:
            assert (await project_listing(s)).split() == ["cwd-marker"]

    run_async(t)

