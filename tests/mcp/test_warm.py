"""Pre-started interpreters: a sandbox kept ready holds bash, python or node
already started, waiting in its start-up for the call's code. What the code
sees must be what a cold start shows it. Each case runs once on a server
that starts interpreters ahead of calls and once on one that does not
(NIX_SANDBOX_WARM_START=off), and the two answers must be the same, byte
for byte. Every program also reports how long its interpreter had been
running, which shows that the first server's calls did take a pre-started
one."""

from __future__ import annotations

import re
import time

import anyio
import pytest

from harness import (call, legacy_only, processes_with, run_async, session)

AGE = """
def _age():
    import os
    with open('/proc/self/stat') as f:
        start = int(f.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/uptime') as f:
        up = float(f.read().split()[0])
    return up - start / os.sysconf('SC_CLK_TCK')
"""

PYTHON_FACTS = AGE + """
import json, os, resource, signal, sys
facts = {
    "argv": sys.argv, "orig_argv": sys.orig_argv, "name": __name__, "file": __file__,
    "cached": __cached__, "spec": repr(__spec__), "loader": type(__loader__).__name__,
    "globals": sorted(globals()), "cwd": os.getcwd(), "env": dict(os.environ),
    "path": sys.path, "modules": sorted(sys.modules), "importers": sorted(sys.path_importer_cache),
    "flags": str(sys.flags), "executable": sys.executable, "prefix": sys.prefix,
    "stdin": [sys.stdin.name, sys.stdin.read(), os.readlink("/proc/self/fd/0")],
    "fds": sorted(os.listdir("/proc/self/fd")), "tmp": os.listdir("/tmp"),
    "workspace": sorted(os.listdir("/workspace")), "pid": os.getpid(), "ppid": os.getppid(),
    "pgid": os.getpgid(0), "sid": os.getsid(0), "umask": os.umask(0o22),
    "handlers": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)],
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
}
print(json.dumps(facts, sort_keys=True))
print("AGE", _age(), file=sys.stderr)
"""

PYTHON = {
    "facts": PYTHON_FACTS,
    "exit code": AGE + "import sys\nprint('AGE', _age(), file=sys.stderr)\nsys.exit(3)\n",
    "traceback": AGE + "import sys\nprint('AGE', _age(), file=sys.stderr)\n"
                 "def inner():\n    raise ValueError('boom')\ndef outer():\n    inner()\nouter()\n",
    "signal": AGE + "import os, sys\nprint('AGE', _age(), file=sys.stderr, flush=True)\nos.kill(os.getpid(), 9)\n",
    "interrupt": AGE + "import os, signal, sys\nprint('AGE', _age(), file=sys.stderr, flush=True)\n"
                 "os.kill(os.getpid(), signal.SIGINT)\n",
    "stdin": AGE + "import sys\nprint('AGE', _age(), file=sys.stderr)\ninput('? ')\n",
    "syntax": "print('AGE', 1, file=__import__('sys').stderr)\nx = (\n",
    # The start-up's objects are frozen in a pre-started python; its exit
    # must still finalize what the code left in cycles held by its module.
    "exit": AGE + """import atexit, os, sys, threading, time
print('AGE', _age(), file=sys.stderr)
class Noisy:
    def __init__(self, name):
        self.name = name
        self.me = self
    def __del__(self, write=os.write):
        write(1, f"finalized {self.name}\\n".encode())
kept = Noisy("a cycle the module holds")
box = [Noisy("a cycle a list holds")]
box.append(box)
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.1), print("thread ran", flush=True))).start()
print("main done", flush=True)
""",
    "exit with an unflushed file": AGE + """import sys
print('AGE', _age(), file=sys.stderr)
out = open(1, "w", closefd=False)
out.write("flushed by the file's finalizer\\n")
loop = [out]
loop.append(loop)
""",
}

NODE_AGE = """
function _age() {
  const fs = require('fs');
  const start = Number(fs.readFileSync('/proc/self/stat', 'utf8').split(')').pop().trim().split(' ')[19]);
  const up = Number(fs.readFileSync('/proc/uptime', 'utf8').split(' ')[0]);
  return up - start / 100;
}
"""

NODE_FACTS = NODE_AGE + """
const fs = require('fs');
fs.mkdirSync('/workspace/node_modules/m', { recursive: true });
fs.writeFileSync('/workspace/node_modules/m/index.js', 'module.exports = __filename;');
fs.writeFileSync('/workspace/local.js', 'module.exports = module.paths;');
const facts = {
  argv: process.argv, execArgv: process.execArgv, execPath: process.execPath, title: process.title,
  cwd: process.cwd(), env: process.env, filename: __filename, dirname: __dirname, id: module.id,
  main: require.main === module, paths: module.paths, parent: String(module.parent),
  cache: Object.keys(require.cache), resolvePaths: require.resolve.paths('anything'),
  m: require('m'), local: require('./local'), cacheAfter: Object.keys(require.cache),
  fds: fs.readdirSync('/proc/self/fd').sort(), tmp: fs.readdirSync('/tmp'),
  workspace: fs.readdirSync('/workspace').sort(), pid: process.pid, ppid: process.ppid,
  umask: process.umask(), globals: Object.keys(globalThis).sort(),
  listeners: ['SIGINT', 'SIGTERM', 'exit', 'uncaughtException'].map((e) => process.listenerCount(e)),
};
console.log(JSON.stringify(facts));
console.error('AGE', _age());
"""

NODE = {
    "facts": NODE_FACTS,
    "exit code": NODE_AGE + "console.error('AGE', _age());\nprocess.exit(3);\n",
    "exception": NODE_AGE + "console.error('AGE', _age());\n"
                 "function inner() { throw new Error('boom'); }\nfunction outer() { inner(); }\nouter();\n",
    "signal": NODE_AGE + "console.error('AGE', _age());\nprocess.kill(process.pid, 'SIGKILL');\n",
    "rejection": NODE_AGE + "console.error('AGE', _age());\nPromise.reject(new TypeError('nope'));\n",
    "stdin": NODE_AGE + "console.error('AGE', _age());\n"
             "console.log(JSON.stringify(require('fs').readFileSync(0, 'utf8')));\n",
}

# bash's age, computed after everything else the program looks at.
BASH_AGE = """
read -r up _ < /proc/uptime
stat=$(< /proc/$$/stat)
set -- ${stat##*)}
echo "AGE $(( ${up%%.*}${up#*.} - ${20} ))e-2" >&2
"""

# One known difference: bash fills BASH_ARGC lazily, and sourcing the hook
# fills it early, so a listing of every variable shows BASH_ARGC=([0]="0")
# where a cold start shows BASH_ARGC=(); naming it shows ([0]="0") in both.
BASH_FACTS = """echo "[$_]"
declare -p BASH_ARGC BASH_ARGV BASH_SOURCE BASH_LINENO
echo "$0 $# $$ $PPID $BASHPID $-"
declare -p | grep -Ev '^declare -[-a-zA-Z]+ (BASHPID|RANDOM|SRANDOM|EPOCHSECONDS|EPOCHREALTIME|SECONDS|BASH_COMMAND|LINENO|BASH_ARGC)='
declare -f
set -o
shopt
trap -p
umask
ulimit -a
pwd
echo /proc/$$/fd/*
echo /tmp/* /tmp/.*
ls -a /workspace
env | sort
""" + BASH_AGE

BASH = {
    "facts": BASH_FACTS,
    "exit code": BASH_AGE + "exit 3\n",
    "not found": BASH_AGE + "no-such-command-here\necho after $?\n",
    "signal": BASH_AGE + "kill -KILL $$\n",
    "stdin": BASH_AGE + "read -r line; echo \"read $? [$line]\"\n",
}

CASES = {"bash": (".main.sh", BASH), "python": (".main.py", PYTHON), "node": (".main.js", NODE)}


def answers(env: str, warm: bool) -> dict[str, tuple]:
    file_name, cases = CASES[env]

    async def go() -> dict[str, tuple]:
        out = {}
        async with session(env={"NIX_SANDBOX_WARM_START": "on" if warm else "off"}) as s:
            for name, code in cases.items():
                if warm:
                    await wait_for_waiting_interpreter(file_name)
                sc, text, _ = await call(s, env, code)
                assert "error" not in sc or sc["error"]["code"] in ("exit_nonzero", "killed_by_signal"), (name, text)
                out[name] = (sc.get("stdout"), sc.get("stderr"), sc.get("exit_code"), sc.get("signal"))
        return out

    return run_async(go)


async def wait_for_waiting_interpreter(file_name: str) -> None:
    """Until an interpreter of ours is started on the code file and has had
    time to reach its hook."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if processes_with(f"/workspace/{file_name}", ours=True):
            await anyio.sleep(0.5)
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"no interpreter waits on /workspace/{file_name}")


def split_age(stderr: str) -> tuple[str, float | None]:
    m = re.search(r"^AGE (\S+)\n", stderr, re.M)
    if not m:
        return stderr, None
    return stderr[:m.start()] + stderr[m.end():], float(m.group(1))


@pytest.mark.parametrize("env", ["bash", "python", "node"])
def test_a_pre_started_interpreter_shows_the_code_what_a_cold_one_does(env):
    cold = answers(env, warm=False)
    warm = answers(env, warm=True)
    for name in CASES[env][1]:
        c_out, c_err, c_code, c_sig = cold[name]
        w_out, w_err, w_code, w_sig = warm[name]
        c_err, c_age = split_age(c_err)
        w_err, w_age = split_age(w_err)
        assert (w_out, w_err, w_code, w_sig) == (c_out, c_err, c_code, c_sig), \
            f"{env} {name}: pre-started\n{w_out!r}\n{w_err!r}\ncold\n{c_out!r}\n{c_err!r}"
        if name != "syntax":
            assert w_age is not None and w_age >= 0.3, f"{env} {name}: not pre-started (age {w_age})"
            assert c_age is not None and c_age < w_age, f"{env} {name}: cold age {c_age}"


@legacy_only("roots/list is a server-to-client request, which the stateless revision has not")
def test_no_interpreter_started_for_the_old_project_runs_after_a_project_change():
    """The client's root changes while python interpreters wait, started
    for the first project: the next call runs in an interpreter started
    after the change, which sees the new project."""
    from harness import RootsClient, roots_session
    from test_roots import folder, roots_changed, uri

    cwd = folder("started-here", "cwd-marker")
    a, b = folder("a", "a-marker"), folder("b", "b-marker")
    client = RootsClient([uri(a)])
    probe = AGE + "import os, sys\nprint(sorted(os.listdir('/project')))\nprint('AGE', _age(), file=sys.stderr)\n"

    async def t():
        async with roots_session(client, cwd) as s:
            await wait_for_waiting_interpreter(".main.py")
            sc, _, _ = await call(s, "python", probe)
            assert sc["stdout"] == "['a-marker']\n", sc
            await wait_for_waiting_interpreter(".main.py")
            seen = client.tools_changed
            client.roots = [uri(b)]
            changed = time.monotonic()
            await roots_changed(s)
            await client.wait_tools_changed(seen)
            sc, text, _ = await call(s, "python", probe)
            since_change = time.monotonic() - changed
            assert sc["stdout"] == "['b-marker']\n", text
            _, age = split_age(sc["stderr"])
            assert age is not None and age < since_change, f"started {age} s ago, the change was {since_change} s ago"

    run_async(t)


@pytest.mark.parametrize("behaviour", ["prints", "raises"])
def test_the_environments_own_sitecustomize_runs_as_on_a_cold_start(behaviour):
    """A PYTHONPATH of the environment's own (here inherited, naming a
    directory of the project) with a sitecustomize that prints, or fails:
    the code sees the same sys.path, variable and module, and the same
    output, pre-started or not."""
    from harness import readable_tmpdir, write_config

    project = readable_tmpdir() / "project"
    (project / "site").mkdir(parents=True)
    body = "import sys\nsys.stderr.write('the site ran\\n')\nsys.site_marker = 1\n"
    if behaviour == "raises":
        body += "raise RuntimeError('a broken site')\n"
    (project / "site" / "sitecustomize.py").write_text(body)
    for p in (project, project / "site", project / "site" / "sitecustomize.py"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    config = write_config('[project.inherit_env]\nvars = ["PYTHONPATH"]\n')
    probe = AGE + """import os, sys
print(sys.path, os.environ.get('PYTHONPATH'), 'sitecustomize' in sys.modules, getattr(sys, 'site_marker', None))
print('AGE', _age(), file=sys.stderr)
"""

    def answer(warm: bool) -> tuple:
        async def go():
            env = {"NIX_SANDBOX_WARM_START": "on" if warm else "off", "PYTHONPATH": "/project/site"}
            async with session(config=config, project=str(project), env=env) as s:
                if warm:
                    await wait_for_waiting_interpreter(".main.py")
                sc, text, _ = await call(s, "python", probe)
                return sc.get("stdout"), split_age(sc.get("stderr", ""))
        return run_async(go)

    c_out, (c_err, _) = answer(False)
    w_out, (w_err, w_age) = answer(True)
    assert (w_out, w_err) == (c_out, c_err), f"pre-started {w_out!r} {w_err!r}, cold {c_out!r} {c_err!r}"
    assert "/project/site" in c_out and "the site ran" in c_err, (c_out, c_err)
    assert w_age is not None and w_age >= 0.3, w_age
