"""A Nix closure in the jail, with real bubblewrap and a store of the test's
own (NIX_STORE_DIR, no Nix needed): the sandbox sees exactly the closure,
read-only, through a store view (one mount holding the closure's binds,
made once per closure) and, with NIX_SANDBOX_STORE_VIEW=off, path by path."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

from harness import MODE, call, run_async, session, var_tmpdir


# The static program that reports what the sandbox makes of the store
# (its entries, which places are writable, whether the store is a mount of
# its own); the VM tier runs the same one.
LISTER = pathlib.Path(__file__).resolve().parent.parent / "vm" / "store-lister.c"


@pytest.mark.skipif(MODE != "host" or shutil.which("cc") is None, reason="a static program, built with cc")
def test_a_closure_is_seen_exactly_through_a_store_view_or_path_by_path():
    top = var_tmpdir()
    store = top / "store"
    program = store / ("0" * 32 + "-lister")
    (program / "bin").mkdir(parents=True)
    subprocess.run(["cc", "-static", "-O2", "-o", str(program / "bin" / "lister"), str(LISTER)], check=True)
    padding = [store / f"{i:032d}-padding-{i}" for i in range(1, 31)]
    for p in padding:
        (p / "lib").mkdir(parents=True)
    (store / ("9" * 32 + "-not-in-the-closure")).mkdir()
    artifacts = top / "artifacts"
    (artifacts / "listed").mkdir(parents=True)
    closure = [str(program)] + [str(p) for p in padding[:20]]
    (artifacts / "listed" / "manifest.json").write_text(json.dumps({
        "version": 1, "name": "listed", "description": "a static lister",
        "interpreter": {"argv": [str(program / "bin" / "lister"), "{file}"], "file_name": ".main"},
        "closure": closure, "links": {}, "limits": {}, "network": False,
    }))
    for p in [top, *top.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    expected = sorted(pathlib.Path(p).name for p in closure)
    env = {"NIX_STORE_DIR": str(store), "NIX_SANDBOX_DIR": str(artifacts)}

    for view, mounted in (("on", "1"), ("off", "0")):
        async def t():
            async with session(env={**env, "NIX_SANDBOX_STORE_VIEW": view}) as s:
                for _ in range(3):
                    sc, text, err = await call(s, "listed", "unread")
                    assert not err and sc["exit_code"] == 0, text
                    lines = sc["stdout"].splitlines()
                    assert sorted(line for line in lines if ":" not in line) == expected, sc["stdout"]
                    for place in ("store", "path", "parent", "root"):
                        assert f"{place} writable: 0" in lines, (view, sc["stdout"])
                    assert f"store is a mount: {mounted}" in lines, (view, sc["stdout"])
        run_async(t)
