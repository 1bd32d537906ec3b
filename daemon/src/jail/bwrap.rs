//! A [`Plan`] as bubblewrap's options. Everything about the sandbox comes
//! from the plan; this file knows only bubblewrap's spelling of it, which
//! of its options the chosen bubblewrap has ([`Features`]), and the call's
//! [`Wiring`]: the descriptors and the code file, which differ between two
//! sandboxes of one plan.
//!
//! | plan | bubblewrap |
//! |---|---|
//! | namespaces | `--unshare-user --unshare-ipc --unshare-pid --unshare-uts --unshare-cgroup`, `--unshare-net` unless [`NetworkNamespace::Given`] |
//! | identity | `--uid`, `--gid`, `--hostname`, `--cap-drop ALL`, `--disable-userns` (0.8), `--die-with-parent --new-session` |
//! | variables | `--clearenv`, then `--setenv` each |
//! | [`Op::Bind`] | `--ro-bind`, `--bind`, `--dev-bind` |
//! | [`Op::Tmpfs`] | `[--perms] [--size] --tmpfs` |
//! | [`Op::Sync`] | `--file FD` (the pipe's read end) |
//! | [`Op::StoreView`] | `--size 65536 --tmpfs STORE --file FD STORE/.nsm-view-sync` |
//! | other ops | `--symlink`, `--proc`, `--dev`, `--dir`, `--remount-ro` |
//! | wiring | `--add-seccomp-fd` (or `--seccomp`), `--json-status-fd`, `--block-fd` |
//! | workdir | `--chdir` |
//!
//! The options that are not mount operations come before those, which
//! bubblewrap makes in order; the command follows `--` on its own line.

use std::ffi::{OsStr, OsString};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use super::plan::{Access, NetworkNamespace, Op, Pipe, Plan, Source, Value};
use super::{SYNC_TMPFS_BYTES, VIEW_SYNC_FILE};

/// The options of the jail's that a bubblewrap may lack (see `platform::bwrap`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// `--disable-userns` (0.8 and later).
    pub disable_userns: bool,
    /// Several seccomp programs (`--add-seccomp-fd`, 0.5).
    pub add_seccomp_fd: bool,
    /// Its status as JSON (`--json-status-fd`, 0.5).
    pub json_status_fd: bool,
}

/// What one sandbox of a plan is wired to.
#[derive(Debug, Clone, Default)]
pub struct Wiring<'a> {
    /// The host file holding the code ([`Source::CodeFile`]).
    pub code_file: Option<&'a Path>,
    /// bubblewrap waits on this descriptor, with the sandbox fully set up,
    /// before it starts the command.
    pub block: Option<RawFd>,
    /// The compiled seccomp programs, in load order.
    pub seccomp: Vec<RawFd>,
    /// Where bubblewrap writes its JSON status.
    pub status: Option<RawFd>,
    /// The read ends of the pipes setting up waits on ([`Pipe`]).
    pub proc_masks: Option<RawFd>,
    pub store_view: Option<RawFd>,
    /// The pipe a pre-started interpreter waits on ([`Value::GoPipe`]).
    pub go: Option<RawFd>,
}

/// bubblewrap's options for `plan` wired as `wiring`: everything but the
/// command. A part of the plan the wiring lacks (a pipe, the code file)
/// is a bug of the caller's, and panics.
pub fn options(plan: &Plan, features: Features, wiring: &Wiring) -> Vec<OsString> {
    let mut a = Args::default();
    // Every namespace is the sandbox's own, the network's too: bubblewrap
    // makes it, or it is given. Capabilities are dropped even when bwrap
    // runs with privileges.
    a.flags(&[
        "--unshare-user",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup",
    ]);
    if plan.network == NetworkNamespace::Own {
        a.flag("--unshare-net");
    }
    a.pair("--uid", &plan.uid.to_string());
    a.pair("--gid", &plan.gid.to_string());
    a.pair("--hostname", &plan.hostname);
    if plan.refuse_nested_userns && features.disable_userns {
        a.flag("--disable-userns");
    }
    a.pair("--cap-drop", "ALL");
    a.flags(&["--die-with-parent", "--new-session"]);

    a.flag("--clearenv");
    for (name, value) in &plan.vars {
        let value = match value {
            Value::Text(t) => t.clone(),
            Value::GoPipe => format!("/dev/fd/{}", wired(wiring.go, "the go pipe")),
        };
        a.triple("--setenv", name.as_ref(), value.as_ref());
    }

    if features.add_seccomp_fd {
        for fd in &wiring.seccomp {
            a.pair("--add-seccomp-fd", &fd.to_string());
        }
    } else if let Some(fd) = wiring.seccomp.first() {
        // Older bubblewrap loads one program: the main filter.
        a.pair("--seccomp", &fd.to_string());
    }
    if let (true, Some(fd)) = (features.json_status_fd, wiring.status) {
        a.pair("--json-status-fd", &fd.to_string());
    }
    if let Some(fd) = wiring.block {
        a.pair("--block-fd", &fd.to_string());
    }
    a.pair("--chdir", &plan.workdir);

    for op in &plan.ops {
        match op {
            Op::Bind {
                source,
                target,
                access,
            } => {
                let option = match access {
                    Access::ReadOnly => "--ro-bind",
                    Access::ReadWrite => "--bind",
                    Access::Devices => "--dev-bind",
                };
                a.triple(option, source_path(source, wiring), target.as_os_str());
            }
            Op::Symlink { target, link } => {
                a.triple("--symlink", target.as_os_str(), link.as_os_str())
            }
            Op::Proc { target } => a.pair_os("--proc", target),
            Op::Dev { target } => a.pair_os("--dev", target),
            Op::Tmpfs {
                target,
                size_bytes,
                mode,
            } => {
                if let Some(mode) = mode {
                    a.pair("--perms", &format!("{mode:o}"));
                }
                if let Some(size) = size_bytes {
                    a.pair("--size", &size.to_string());
                }
                a.pair_os("--tmpfs", target);
            }
            Op::Dir { target } => a.pair_os("--dir", target),
            Op::RemountReadOnly { target } => a.pair_os("--remount-ro", target),
            Op::Sync { pipe, target } => {
                let fd = pipe_end(*pipe, wiring);
                a.triple("--file", fd.as_ref(), target.as_os_str());
            }
            Op::StoreView { store, .. } => {
                let fd = pipe_end(Pipe::StoreView, wiring);
                a.pair("--size", &SYNC_TMPFS_BYTES.to_string());
                a.pair_os("--tmpfs", store);
                a.triple(
                    "--file",
                    fd.as_ref(),
                    store.join(VIEW_SYNC_FILE).as_os_str(),
                );
            }
        }
    }
    a.0
}

/// The host paths `plan` binds (in order, then those mounted from
/// outside): all must be there where bubblewrap runs. The code file is
/// the caller's, and not among them.
pub fn sources(plan: &Plan) -> Vec<PathBuf> {
    let binds = plan.ops.iter().filter_map(|op| match op {
        Op::Bind {
            source: Source::Host(p),
            ..
        } => Some(p),
        _ => None,
    });
    let outside = plan.outside.mounts.iter().filter_map(|m| match &m.source {
        Source::Host(p) => Some(p),
        Source::CodeFile => None,
    });
    binds.chain(outside).cloned().collect()
}

fn source_path<'a>(source: &'a Source, wiring: &Wiring<'a>) -> &'a OsStr {
    match source {
        Source::Host(p) => p.as_os_str(),
        Source::CodeFile => wired(wiring.code_file, "the code file").as_os_str(),
    }
}

fn pipe_end(pipe: Pipe, wiring: &Wiring) -> String {
    let fd = match pipe {
        Pipe::ProcMasks => wired(wiring.proc_masks, "the /proc masks' pipe"),
        Pipe::StoreView => wired(wiring.store_view, "the store view's pipe"),
    };
    fd.to_string()
}

fn wired<T>(part: Option<T>, what: &str) -> T {
    part.unwrap_or_else(|| panic!("the plan needs {what}, and the wiring has none"))
}

/// bubblewrap's options as they are built.
#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flag(&mut self, f: &str) {
        self.0.push(f.into());
    }
    fn flags(&mut self, fs: &[&str]) {
        for f in fs {
            self.flag(f);
        }
    }
    fn pair(&mut self, f: &str, v: &str) {
        self.pair_os(f, OsStr::new(v));
    }
    fn pair_os(&mut self, f: &str, v: impl AsRef<OsStr>) {
        self.0.push(f.into());
        self.0.push(v.as_ref().into());
    }
    fn triple(&mut self, f: &str, a: &OsStr, b: &OsStr) {
        self.0.push(f.into());
        self.0.push(a.into());
        self.0.push(b.into());
    }
}
