//! A delegated cgroup v2 subtree for this process. Finds the cgroup the
//! process is in and tells whether it is delegated to it (from the
//! filesystem, and for a unit of the user's own systemd manager, from that
//! manager); when it is not and systemd runs the machine, asks systemd over
//! D-Bus (the user's manager, or the system manager as root) for a transient
//! scope with `Delegate=yes` holding the process, the way container runtimes
//! do; says what the delegated cgroup offers (controllers, `cgroup.kill`,
//! `cgroup.freeze`, `memory.peak`). Creates no groups and moves nothing
//! inside the subtree: that is the caller's. Knows nothing about sandboxes.
//! The conversation with systemd is in `dbus.rs`.

mod dbus;
#[cfg(test)]
mod tests;

use dbus::{DEADLINE, start_scope, unit_interface, user_unit_delegates, with_manager};

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How to run the server so that systemd hands it a delegated cgroup itself.
const RUN_IN_SCOPE: &str = "start the server in a delegated scope: `systemd-run --user --scope -p Delegate=yes nix-sandbox-mcp --stdio`";

/// The same for root, from the system manager.
const RUN_IN_SYSTEM_SCOPE: &str = "start the server in a delegated scope: `systemd-run --scope -p Delegate=yes nix-sandbox-mcp --stdio`";

/// Why no delegated cgroup could be had. Each message says what failed and
/// what would fix it.
#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error(
        "this process has no cgroup v2 directory: no cgroup2 mount in /proc/self/mountinfo holds the `0::` path of /proc/self/cgroup"
    )]
    NoCgroup2,
    #[error("{} is not delegated to this process: {why}", dir.display())]
    NotDelegated { dir: PathBuf, why: String },
    #[error(
        "systemd does not run this machine (/run/systemd/system is missing), so there is no manager to ask for a delegated cgroup; run the server as root on a writable cgroup2 mount, or in a cgroup delegated to its user"
    )]
    NoSystemd,
    #[error("cannot reach {manager}: {tried}; {fix}")]
    NoBus {
        manager: Manager,
        tried: String,
        fix: String,
    },
    #[error("{manager} refused to start {unit}: {error}{fix}")]
    Refused {
        manager: Manager,
        unit: String,
        error: String,
        fix: &'static str,
    },
    #[error(
        "{manager} did not answer about {unit} within {}s; `{} status {unit}` shows where it is",
        DEADLINE.as_secs(), manager.systemctl()
    )]
    Timeout { manager: Manager, unit: String },
    #[error(
        "{manager} ended the start of {unit} with `{result}`, not `done`; `journalctl {}-u {unit}` says why",
        if *manager == Manager::User { "--user " } else { "" }
    )]
    JobFailed {
        manager: Manager,
        unit: String,
        result: String,
    },
    #[error(
        "{manager} started {unit} but this process is still in {found}; is it in another PID namespace than the manager?"
    )]
    NotMoved {
        manager: Manager,
        unit: String,
        found: String,
    },
    #[error("talking to {manager} over D-Bus: {error}")]
    Bus {
        manager: Manager,
        error: zbus::Error,
    },
    #[error("cannot start the thread that talks to systemd: {0}")]
    Thread(io::Error),
}

impl ScopeError {
    /// The step that would give this process a delegated cgroup, for
    /// `doctor` and `envs` (the message says what failed; this, what to do).
    pub fn step(&self) -> String {
        step_for(self, rustix::process::geteuid().as_raw())
    }
}

fn step_for(error: &ScopeError, uid: u32) -> String {
    match error {
        ScopeError::NoCgroup2 => "mount the cgroup2 hierarchy that holds this process (in a container: give it a cgroup namespace of its own, as `docker run --cgroupns=private` does, so that its /sys/fs/cgroup is its own group)".to_string(),
        ScopeError::NotDelegated { .. } | ScopeError::NoSystemd => delegate_without_systemd(uid),
        ScopeError::NoBus { fix, .. } => fix.clone(),
        ScopeError::Refused { fix, .. } if !fix.is_empty() => {
            fix.trim_start_matches("; ").to_string()
        }
        ScopeError::Refused { manager, .. }
        | ScopeError::Timeout { manager, .. }
        | ScopeError::JobFailed { manager, .. }
        | ScopeError::NotMoved { manager, .. }
        | ScopeError::Bus { manager, .. } => run_in_scope(*manager).to_string(),
        ScopeError::Thread(_) => run_in_scope(Manager::for_uid(uid)).to_string(),
    }
}

fn run_in_scope(manager: Manager) -> &'static str {
    match manager {
        Manager::User => RUN_IN_SCOPE,
        Manager::System => RUN_IN_SYSTEM_SCOPE,
    }
}

/// Without systemd, root makes the cgroup; for another user, root delegates
/// one to it (chown, as the kernel's cgroup v2 documentation describes) and
/// moves the user's shell into it, since only a writer of both groups'
/// common ancestor may move a process between them. The names are not of
/// the form of the daemon's own containers (`nix-sandbox-mcp-<pid>-<n>`),
/// which a daemon removes when their pid is gone.
fn delegate_without_systemd(uid: u32) -> String {
    if uid == 0 {
        return "start the server from a shell in an empty cgroup of its own, with /sys/fs/cgroup mounted read-write: `mkdir /sys/fs/cgroup/nix-sandbox-mcp && echo '+memory +pids +cpu' > /sys/fs/cgroup/cgroup.subtree_control && echo $$ > /sys/fs/cgroup/nix-sandbox-mcp/cgroup.procs`".to_string();
    }
    let dir = format!("/sys/fs/cgroup/nix-sandbox-mcp.user-{uid}");
    format!(
        "have root delegate a cgroup to uid {uid}: `mkdir {dir} && chown {uid} {dir} {dir}/cgroup.procs {dir}/cgroup.subtree_control {dir}/cgroup.threads`, enable the controllers for it (`echo '+memory +pids +cpu' > /sys/fs/cgroup/cgroup.subtree_control`) and move the user's shell there (`echo <shell's pid> > {dir}/cgroup.procs`); then start the server from that shell"
    )
}

/// The step that would give this process's cgroup the memory and pids
/// controllers it lacks.
pub fn controllers_step() -> String {
    let uid = rustix::process::geteuid().as_raw();
    match (systemd_booted(), uid) {
        (true, 0) => "give the unit that runs the server `Delegate=yes`, or start it with `systemd-run --scope -p Delegate=yes nix-sandbox-mcp --stdio`".to_string(),
        (true, _) => "have systemd delegate them to users' managers: `sudo systemctl edit user@.service`, add `[Service]` and `Delegate=memory pids cpu`, then log out and in again".to_string(),
        (false, uid) => delegate_without_systemd(uid),
    }
}

/// The step that would give this process a delegated cgroup when one it was
/// given turns out unusable (a group it cannot make, enter or enable
/// controllers in).
pub fn delegation_step() -> String {
    let uid = rustix::process::geteuid().as_raw();
    if systemd_booted() {
        run_in_scope(Manager::for_uid(uid)).to_string()
    } else {
        delegate_without_systemd(uid)
    }
}

/// The systemd instance asked for a scope: the user's own manager for an
/// unprivileged process, the system manager for root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    User,
    System,
}

impl Manager {
    fn for_uid(uid: u32) -> Manager {
        if uid == 0 {
            Manager::System
        } else {
            Manager::User
        }
    }

    fn systemctl(self) -> &'static str {
        match self {
            Manager::User => "systemctl --user",
            Manager::System => "systemctl",
        }
    }
}

impl std::fmt::Display for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Manager::User => "the user's systemd manager",
            Manager::System => "the systemd system manager",
        })
    }
}

/// A delegated cgroup and how it was had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegated {
    /// The cgroup directory on the host, e.g.
    /// `/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/nix-sandbox-mcp-42.scope`.
    pub dir: PathBuf,
    /// The scope unit started for this process, or `None` when the process
    /// was already in a delegated cgroup.
    pub started: Option<String>,
}

/// The cgroup this process is in, delegated to it: the current one when it
/// already is (a unit with `Delegate=yes`, `systemd-run -p Delegate=yes`,
/// root on a cgroup2 mount that systemd does not manage), else a new scope
/// from systemd. Call it early, before starting other processes: only this
/// process moves into the scope, not its children.
pub fn delegated_cgroup() -> Result<Delegated, ScopeError> {
    let dir = current_cgroup_v2().ok_or(ScopeError::NoCgroup2)?;
    let uid = rustix::process::geteuid().as_raw();
    let systemd = systemd_booted();
    let refusal = match check_delegated(&dir) {
        Err(e) => e,
        Ok(()) => match unit_to_confirm(&dir, uid, systemd) {
            None => return Ok(Delegated { dir, started: None }),
            Some(unit) => match user_unit_delegates(&unit) {
                Ok(true) => return Ok(Delegated { dir, started: None }),
                Ok(false) => ScopeError::NotDelegated {
                    dir: dir.clone(),
                    why: format!(
                        "the user's systemd manager runs it as {unit} without `Delegate=yes`, so it takes back the controllers this process enables"
                    ),
                },
                Err(e) => {
                    tracing::warn!(
                        "cannot ask whether {unit} is delegated ({e}); using {} as it is",
                        dir.display()
                    );
                    return Ok(Delegated { dir, started: None });
                }
            },
        },
    };
    if !systemd {
        return Err(refusal);
    }
    tracing::debug!("{refusal}; asking systemd for a delegated scope");
    let dir = request_delegated_scope()?;
    Ok(Delegated {
        started: dir.file_name().map(|n| n.to_string_lossy().into_owned()),
        dir,
    })
}

/// This process's cgroup v2 directory on the host (under the cgroup2 mount),
/// from /proc/self/cgroup and /proc/self/mountinfo.
pub fn current_cgroup_v2() -> Option<PathBuf> {
    let cgroup = fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    cgroup_v2_dir(&cgroup, &mountinfo)
}

/// Whether systemd runs this machine (what `sd_booted()` checks).
pub fn systemd_booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
}

/// Whether `dir` is delegated to this process, as far as the filesystem
/// tells. See [`check_delegated`] for the rules, and [`delegated_cgroup`]
/// for what it adds for units of the user's own manager.
pub fn is_delegated(dir: &Path) -> bool {
    check_delegated(dir).is_ok()
}

/// `Ok` when this process may run its own subtree in `dir`: it can write the
/// group's `cgroup.procs` and `cgroup.subtree_control`, no other process
/// shares the group (the caller must be able to empty it into a leaf before
/// enabling controllers), and the group is its to manage:
/// - as an unprivileged user, the directory and those files belong to it.
///   The system manager chowns a unit's group to its user only with
///   `Delegate=yes`, but the user's own manager owns all its units' groups
///   and marks none, so for those ownership is not enough: there
///   [`delegated_cgroup`] asks the manager;
/// - as root under systemd, systemd marked the group delegated (the
///   `trusted.delegate` or `user.delegate` attribute, set by the system
///   manager for units with `Delegate=yes`);
/// - as root without systemd, nothing else manages the tree.
///
/// The root of the hierarchy is exempt from the sharing rule: the kernel lets
/// it enable controllers while it holds processes.
pub fn check_delegated(dir: &Path) -> Result<(), ScopeError> {
    let uid = rustix::process::geteuid().as_raw();
    check_delegated_as(dir, uid, systemd_booted(), std::process::id())
}

/// What a delegated cgroup offers its subtree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Features {
    /// `cgroup.controllers`: the controllers the group may enable for its
    /// children, e.g. `["cpu", "memory", "pids"]`.
    pub controllers: Vec<String>,
    /// `cgroup.kill` (Linux 5.14): kills a whole group in one write.
    pub kill: bool,
    /// `cgroup.freeze` (Linux 5.2): freezes a whole group.
    pub freeze: bool,
    /// `memory.peak` (Linux 5.19): a group's highest memory use. Read from
    /// `dir` itself, so only known when the memory controller is enabled
    /// for it, as it is for a systemd unit with memory delegated.
    pub memory_peak: bool,
}

impl Features {
    pub fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }
}

/// What `dir` offers; interface files are a kernel matter, so their presence
/// here means its children have them too.
pub fn features(dir: &Path) -> Features {
    Features {
        controllers: fs::read_to_string(dir.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        kill: dir.join("cgroup.kill").exists(),
        freeze: dir.join("cgroup.freeze").exists(),
        memory_peak: dir.join("memory.peak").exists(),
    }
}

/// Asks systemd for a transient scope `nix-sandbox-mcp-<pid>.scope` with
/// `Delegate=yes` holding this process, waits for systemd to finish starting
/// it, and returns the scope's cgroup directory (which this process is then
/// in, alone). Non-root talks to the user's manager on the user bus, root to
/// the system manager on the system bus. Runs on a thread of its own, so it
/// may be called from anywhere, async code included; it blocks for at most
/// about ten seconds.
pub fn request_delegated_scope() -> Result<PathBuf, ScopeError> {
    if !systemd_booted() {
        return Err(ScopeError::NoSystemd);
    }
    let manager = Manager::for_uid(rustix::process::geteuid().as_raw());
    let pid = std::process::id();
    let unit = format!("nix-sandbox-mcp-{pid}.scope");
    let name = unit.clone();
    with_manager(manager, &unit, move |conn| async move {
        start_scope(&conn, manager, &name, pid).await
    })?;
    let found = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let moved = own_cgroup_path(&found)
        .is_some_and(|p| Path::new(p).file_name() == Some(unit.as_ref()))
        .then(current_cgroup_v2)
        .flatten();
    moved.ok_or_else(|| ScopeError::NotMoved {
        manager,
        unit,
        found: own_cgroup_path(&found).unwrap_or("no cgroup").to_string(),
    })
}

fn check_delegated_as(dir: &Path, uid: u32, systemd: bool, pid: u32) -> Result<(), ScopeError> {
    let refuse = |why: String| ScopeError::NotDelegated {
        dir: dir.to_path_buf(),
        why,
    };
    let procs = dir.join("cgroup.procs");
    let subtree = dir.join("cgroup.subtree_control");
    for path in [dir, &procs, &subtree] {
        let meta = fs::metadata(path).map_err(|e| refuse(format!("{}: {e}", path.display())))?;
        if meta.uid() != uid {
            let fix = if uid == 0 || !systemd {
                String::new()
            } else {
                format!("; {RUN_IN_SCOPE}")
            };
            return Err(refuse(format!(
                "{} belongs to uid {}, not to this process's uid {uid}{fix}",
                path.display(),
                meta.uid(),
            )));
        }
        if path != dir && !writable(path) {
            return Err(refuse(format!("{} is not writable", path.display())));
        }
    }
    if uid == 0 && systemd && !marked_delegated(dir) {
        return Err(refuse(
            "systemd manages it and did not delegate it (no `Delegate=yes` on its unit)".into(),
        ));
    }
    // The root of the hierarchy (it alone has no cgroup.type) may hold
    // processes and still enable controllers for its children.
    if !dir.join("cgroup.type").exists() {
        return Ok(());
    }
    let others: Vec<String> = fs::read_to_string(&procs)
        .map_err(|e| refuse(format!("{}: {e}", procs.display())))?
        .lines()
        .map(str::trim)
        .filter(|p| !p.is_empty() && *p != pid.to_string())
        .map(str::to_string)
        .collect();
    if !others.is_empty() {
        let shown = others.iter().take(5).cloned().collect::<Vec<_>>().join(" ");
        return Err(refuse(format!(
            "it is shared with {} other process{} (pids {shown}{}), so it cannot be emptied into a leaf",
            others.len(),
            if others.len() == 1 { "" } else { "es" },
            if others.len() > 5 { " …" } else { "" }
        )));
    }
    Ok(())
}

fn writable(path: &Path) -> bool {
    use rustix::fs::{Access, AtFlags, CWD, accessat};
    accessat(CWD, path, Access::WRITE_OK, AtFlags::EACCESS).is_ok()
}

/// The mark systemd's system manager puts on a delegated unit's group.
fn marked_delegated(dir: &Path) -> bool {
    ["trusted.delegate", "user.delegate"].iter().any(|name| {
        let mut value = [0u8; 8];
        rustix::fs::getxattr(dir, *name, &mut value).is_ok_and(|n| &value[..n] == b"1")
    })
}

/// The `0::` path of /proc/self/cgroup.
fn own_cgroup_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// Maps the `0::` path of /proc/self/cgroup onto the cgroup2 mount that
/// holds it.
fn cgroup_v2_dir(proc_cgroup: &str, mountinfo: &str) -> Option<PathBuf> {
    let own = own_cgroup_path(proc_cgroup)?;
    crate::mountinfo::parse(mountinfo)
        .into_iter()
        .find_map(|m| {
            if m.fstype != "cgroup2" {
                return None;
            }
            let rel = if m.root == "/" {
                own
            } else {
                let rest = own.strip_prefix(m.root.as_str())?;
                if !rest.is_empty() && !rest.starts_with('/') {
                    return None;
                }
                rest
            };
            Some(m.point.join(rel.trim_start_matches('/')))
        })
}

/// The unit whose delegation only its manager can confirm: `dir` is a unit's
/// own group (not a group below one, which only a delegate makes) under a
/// user's manager (`user@UID.service`), and no system manager marked it.
fn unit_to_confirm(dir: &Path, uid: u32, systemd: bool) -> Option<String> {
    if uid == 0 || !systemd || marked_delegated(dir) {
        return None;
    }
    let unit = dir.file_name()?.to_str()?;
    unit_interface(unit)?;
    dir.ancestors()
        .skip(1)
        .any(|a| {
            a.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("user@") && n.ends_with(".service"))
        })
        .then(|| unit.to_string())
}
