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


# A static program that lists its store (the parent of its store path),
# tries to write there, in its own path, in the store's parent and at the
# root (all read-only, the root made so with the view), and says whether the store
# directory is a mount of its own (a store view) or a directory holding one
# bind per path.
LISTER = r"""
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
int main(int argc, char **argv) {
    char own[4096], store[4096], parent[4096], path[8192];
    strncpy(own, argv[0], sizeof own - 1);
    *strrchr(own, '/') = 0; *strrchr(own, '/') = 0;
    strcpy(store, own); *strrchr(store, '/') = 0;
    strcpy(parent, store); *strrchr(parent, '/') = 0;
    DIR *d = opendir(store);
    if (!d) return 2;
    struct dirent *e;
    while ((e = readdir(d))) if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) printf("%s\n", e->d_name);
    snprintf(path, sizeof path, "%s/new", store);
    printf("store writable: %d\n", open(path, O_CREAT | O_WRONLY, 0644) >= 0);
    snprintf(path, sizeof path, "%s/new", own);
    printf("path writable: %d\n", open(path, O_CREAT | O_WRONLY, 0644) >= 0);
    snprintf(path, sizeof path, "%s/new", parent);
    printf("parent writable: %d\n", open(path, O_CREAT | O_WRONLY, 0644) >= 0);
    printf("root writable: %d\n", open("/new", O_CREAT | O_WRONLY, 0644) >= 0);
    struct stat s, p;
    stat(store, &s); stat(parent, &p);
    printf("store is a mount: %d\n", s.st_dev != p.st_dev);
    return 0;
}
"""


@pytest.mark.skipif(MODE != "host" or shutil.which("cc") is None, reason="a static program, built with cc")
def test_a_closure_is_seen_exactly_through_a_store_view_or_path_by_path():
    top = var_tmpdir()
    store = top / "store"
    program = store / ("0" * 32 + "-lister")
    (program / "bin").mkdir(parents=True)
    (top / "lister.c").write_text(LISTER)
    subprocess.run(["cc", "-static", "-O2", "-o", str(program / "bin" / "lister"), str(top / "lister.c")], check=True)
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
