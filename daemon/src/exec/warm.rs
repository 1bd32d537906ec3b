//! Pre-started interpreters: a sandbox kept ready for bash, python or node
//! holds its interpreter already started, paused inside the interpreter's
//! own start-up until the call's code is in the code file. The interpreter
//! is started exactly as a cold one (same argv, code file, working
//! directory, stdin, environment) plus one variable it reads at start-up,
//! which names a hook:
//!
//! - bash: `BASH_ENV=/dev/fd/N`, the read end of a pipe. bash sources it
//!   before the script, so it blocks until the daemon writes the hook's
//!   text and closes the pipe; the text closes the descriptor, unsets the
//!   variable and leaves `$_` as a cold start has it.
//! - python: `PYTHONPATH` with a directory on the staged /tmp in front,
//!   holding a `sitecustomize` that removes every trace of itself (the
//!   directory, its `sys.path` and importer-cache entries, the variable's
//!   value), imports the environment's own `sitecustomize`, if there is
//!   one, in its place (as a cold start would have by then), and last
//!   blocks reading one byte from the pipe, which it then closes. Before it
//!   blocks, a python that has `gc.freeze()` (3.7 on) freezes the objects
//!   of the start-up, so that
//!   CPython's exit, which otherwise walks every object in its collections
//!   (a third of a short program's run), skips them; an exit handler it
//!   registers first, and so runs last, undoes the freeze when anything the
//!   code made could notice (an object with a finalizer, a weak reference
//!   with a callback, gc callbacks or debug flags, or too many objects to
//!   look over): objects that only the start-up's module dictionaries hold
//!   are then collected as on a cold start.
//! - node: `NODE_OPTIONS=--require` of a file in that directory, the same
//!   way (the preload also leaves `require.cache`).
//!
//! What the code sees is what a cold start shows it; `tests/mcp/test_warm.py`
//! compares the two. Only an interpreter run with no options that could
//! skip the hook is pre-started; one that still runs the (empty) code file
//! before the call (found dead when a call takes it) turns pre-starting
//! off for its recipe.

use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use rustix::fs::{Mode, OFlags};

use crate::environment::{Environment, InterpreterKind};
use crate::jail::{self, Value, staged};

/// Where the python and node hooks live while the interpreter starts.
const HOOK_DIR: &str = ".nsm-prestart";
/// Objects the code may have made for a pre-started python's exit to look
/// them over for finalizers; past it, the exit is a cold start's at once.
const EXIT_SCAN_LIMIT: usize = 20_000;

/// How a recipe's interpreter is pre-started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Warm {
    kind: InterpreterKind,
    /// The hook's variable as the environment sets it without the hook;
    /// the hook puts it back.
    original: Option<String>,
    /// The interpreter's `argv[0]` (bash's `$_` as its script starts).
    argv0: String,
}

impl Warm {
    /// How `command` (the interpreter on the code file) can be pre-started
    /// in `env`, if it can: `staged` says whether the sandbox's /tmp is
    /// staged by the nest, where the python and node hooks are written.
    pub(super) fn plan(
        env: &Environment,
        inherited: &[(String, String)],
        command: &[String],
        staged: bool,
    ) -> Option<Warm> {
        let kind = env.kind?;
        let (program, args) = command.split_first()?;
        let name = program.rsplit('/').next().unwrap_or(program);
        let options: Vec<&String> = args.iter().filter(|a| a.starts_with('-')).collect();
        let usable = match kind {
            // Invoked as sh, or with options (--posix, -p), bash may not
            // read BASH_ENV.
            InterpreterKind::Bash => name.starts_with("bash") && options.is_empty(),
            // -E, -I and -S skip the hook; these do not.
            InterpreterKind::Python => {
                staged
                    && options
                        .iter()
                        .all(|o| ["-u", "-B", "-b", "-O", "-OO", "-q"].contains(&o.as_str()))
            }
            InterpreterKind::Node => staged && options.is_empty(),
        };
        if !usable {
            return None;
        }
        let variable = variable(kind);
        // The last setting wins, as in the jail.
        let original = env
            .vars
            .iter()
            .chain(inherited.iter().map(|(k, v)| (k, v)))
            .filter(|(k, _)| k.as_str() == variable)
            .map(|(_, v)| v.clone())
            .next_back();
        // A BASH_ENV of the environment's own would have to be sourced
        // after the hook, with bash's expansion rules: not worth it.
        if kind == InterpreterKind::Bash && original.is_some() {
            return None;
        }
        Some(Warm {
            kind,
            original,
            argv0: program.clone(),
        })
    }

    /// The variable naming the hook, set after every other (bash's names
    /// the pipe it waits on, as the interpreter inherits it).
    pub(super) fn vars(&self) -> Vec<(String, Value)> {
        let dir = hook_dir();
        let value = match self.kind {
            InterpreterKind::Bash => Value::GoPipe,
            InterpreterKind::Python => Value::Text(match &self.original {
                Some(o) => format!("{dir}:{o}"),
                None => dir,
            }),
            InterpreterKind::Node => Value::Text(match &self.original {
                Some(o) => format!("--require {dir}/hook.js {o}"),
                None => format!("--require {dir}/hook.js"),
            }),
        };
        vec![(variable(self.kind).to_string(), value)]
    }

    /// Writes the hook into the sandbox's staged tmpfs (python and node),
    /// owned by `run_as` when the sandbox runs as another user.
    pub(super) fn stage(
        &self,
        staged_root: &OwnedFd,
        go: RawFd,
        run_as: Option<(u32, u32)>,
    ) -> io::Result<()> {
        let (file, text) = match self.kind {
            InterpreterKind::Bash => return Ok(()),
            InterpreterKind::Python => ("sitecustomize.py", self.python_hook(go)),
            InterpreterKind::Node => ("hook.js", self.node_hook(go)),
        };
        let tmp = rustix::fs::openat(
            staged_root,
            staged::TMP,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        rustix::fs::mkdirat(&tmp, HOOK_DIR, Mode::from_raw_mode(0o700))?;
        let dir = rustix::fs::openat(
            &tmp,
            HOOK_DIR,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let hook = rustix::fs::openat(
            &dir,
            file,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut out = std::fs::File::from(hook);
        io::Write::write_all(&mut out, text.as_bytes())?;
        if let Some((uid, gid)) = run_as {
            let owner = (
                Some(rustix::process::Uid::from_raw(uid)),
                Some(rustix::process::Gid::from_raw(gid)),
            );
            rustix::fs::fchown(out.as_fd(), owner.0, owner.1)?;
            rustix::fs::fchown(&dir, owner.0, owner.1)?;
        }
        Ok(())
    }

    /// What the daemon writes into the pipe, then closes, to let the
    /// interpreter go on to the code file.
    pub(super) fn go(&self, go: RawFd) -> Vec<u8> {
        match self.kind {
            InterpreterKind::Bash => format!(
                "exec {go}<&-; unset BASH_ENV; : {}\n",
                shell_quote(&self.argv0)
            )
            .into_bytes(),
            InterpreterKind::Python | InterpreterKind::Node => b"x".to_vec(),
        }
    }

    fn python_hook(&self, go: RawFd) -> String {
        let restore = match &self.original {
            Some(o) => format!("os.environ['PYTHONPATH'] = {}", literal(o)),
            None => "os.environ.pop('PYTHONPATH', None)".to_string(),
        };
        let dir = literal(&hook_dir());
        format!(
            r#"import os, sys
def _leave():
    here = {dir}
    while here in sys.path:
        sys.path.remove(here)
    sys.path_importer_cache.pop(here, None)
    {restore}
    for top, dirs, files in os.walk(here, topdown=False):
        for name in files:
            os.unlink(os.path.join(top, name))
        for name in dirs:
            os.rmdir(os.path.join(top, name))
    os.rmdir(here)
_leave()
del sys.modules['sitecustomize']
_loaded = [name for name in ('gc', 'atexit') if name in sys.modules]
import gc, atexit, _weakref
def _exit(gc=gc, refs=_weakref.ReferenceType, proxies=(_weakref.ProxyType, _weakref.CallableProxyType)):
    if gc.callbacks or gc.get_debug():
        return gc.unfreeze()
    made = gc.get_objects()
    if len(made) > {EXIT_SCAN_LIMIT}:
        return gc.unfreeze()
    for o in made:
        if (hasattr(type(o), '__del__') or isinstance(o, proxies)
                or (isinstance(o, refs) and o.__callback__ is not None)):
            return gc.unfreeze()
_freezes = hasattr(gc, 'freeze')
if _freezes:
    atexit.register(_exit)
try:
    import sitecustomize
finally:
    if _freezes:
        gc.freeze()
    for _name in ('gc', 'atexit'):
        if _name not in _loaded:
            del sys.modules[_name]
    os.read({go}, 1)
    os.close({go})
"#
        )
    }

    fn node_hook(&self, go: RawFd) -> String {
        let restore = match &self.original {
            Some(o) => format!("process.env.NODE_OPTIONS = {};", literal(o)),
            None => "delete process.env.NODE_OPTIONS;".to_string(),
        };
        let dir = literal(&hook_dir());
        format!(
            r#"'use strict';
{{
  const fs = require('fs');
  const one = Buffer.alloc(1);
  for (;;) {{
    try {{
      fs.readSync({go}, one, 0, 1, null);
      break;
    }} catch (e) {{
      if (e.code !== 'EAGAIN' && e.code !== 'EINTR') throw e;
    }}
  }}
  fs.closeSync({go});
  fs.rmSync({dir}, {{ recursive: true, force: true }});
  {restore}
  delete require.cache[__filename];
}}
"#
        )
    }
}

fn variable(kind: InterpreterKind) -> &'static str {
    match kind {
        InterpreterKind::Bash => "BASH_ENV",
        InterpreterKind::Python => "PYTHONPATH",
        InterpreterKind::Node => "NODE_OPTIONS",
    }
}

/// The hook directory as the sandbox sees it.
fn hook_dir() -> String {
    format!("{}/{HOOK_DIR}", jail::TMP)
}

/// `s` in single quotes for bash.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `s` as a string literal that python and javascript read alike (JSON's
/// escapes are valid in both).
fn literal(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(kind: InterpreterKind) -> Environment {
        let mut e = crate::app::self_test_env(Default::default());
        e.kind = Some(kind);
        e
    }

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_interpreters_that_read_the_hook_are_pre_started() {
        let bash = env(InterpreterKind::Bash);
        let python = env(InterpreterKind::Python);
        let node = env(InterpreterKind::Node);
        let plan = |e: &Environment, a: &[&str], staged| Warm::plan(e, &[], &argv(a), staged);
        assert!(plan(&bash, &["/bin/bash", "/workspace/.main.sh"], false).is_some());
        assert!(plan(&bash, &["/bin/sh", "/workspace/.main.sh"], true).is_none());
        assert!(plan(&bash, &["/bin/bash", "--posix", "/w/.main.sh"], true).is_none());
        assert!(plan(&python, &["/bin/python3", "-u", "/w/.main.py"], true).is_some());
        assert!(plan(&python, &["/bin/python3", "/w/.main.py"], false).is_none());
        assert!(plan(&python, &["/bin/python3", "-I", "/w/.main.py"], true).is_none());
        assert!(plan(&python, &["/bin/python3", "-E", "/w/.main.py"], true).is_none());
        assert!(plan(&node, &["/bin/node", "/w/.main.js"], true).is_some());
        assert!(plan(&node, &["/bin/node", "--no-warnings", "/w/.main.js"], true).is_none());
        let mut unknown = env(InterpreterKind::Bash);
        unknown.kind = None;
        assert!(plan(&unknown, &["/bin/bash", "/w/.main.sh"], true).is_none());
    }

    #[test]
    fn the_hook_variable_keeps_what_the_environment_sets() {
        let mut python = env(InterpreterKind::Python);
        python.vars.insert("PYTHONPATH".into(), "/lib/a".into());
        let cmd = argv(&["/bin/python3", "/w/.main.py"]);
        let w = Warm::plan(&python, &[], &cmd, true).unwrap();
        assert_eq!(
            w.vars(),
            vec![(
                "PYTHONPATH".to_string(),
                Value::Text("/tmp/.nsm-prestart:/lib/a".to_string())
            )]
        );
        // An inherited value is set after the environment's, so it wins.
        let inherited = [("PYTHONPATH".to_string(), "/lib/b".to_string())];
        let w = Warm::plan(&python, &inherited, &cmd, true).unwrap();
        assert!(
            w.python_hook(9)
                .contains(r#"os.environ['PYTHONPATH'] = "/lib/b""#)
        );
        let mut node = env(InterpreterKind::Node);
        node.vars
            .insert("NODE_OPTIONS".into(), "--max-old-space-size=64".into());
        let w = Warm::plan(&node, &[], &argv(&["/bin/node", "/w/.main.js"]), true).unwrap();
        assert_eq!(
            w.vars()[0].1,
            Value::Text("--require /tmp/.nsm-prestart/hook.js --max-old-space-size=64".to_string())
        );
        let mut bash = env(InterpreterKind::Bash);
        bash.vars.insert("BASH_ENV".into(), "/etc/profile".into());
        assert!(Warm::plan(&bash, &[], &argv(&["/bin/bash", "/w/.main.sh"]), false).is_none());
    }

    #[test]
    fn bash_is_let_go_with_its_own_dollar_underscore() {
        let bash = env(InterpreterKind::Bash);
        let w = Warm::plan(&bash, &[], &argv(&["/opt/it's/bash", "/w/.main.sh"]), false).unwrap();
        // The pipe, as bash inherits it (see `jail::Wiring::go`).
        assert_eq!(w.vars()[0], ("BASH_ENV".to_string(), Value::GoPipe));
        assert_eq!(
            String::from_utf8(w.go(12)).unwrap(),
            "exec 12<&-; unset BASH_ENV; : '/opt/it'\\''s/bash'\n"
        );
    }
}
