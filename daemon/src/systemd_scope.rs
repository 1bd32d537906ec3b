//! A delegated cgroup v2 subtree for this process. Finds the cgroup the
//! process is in and tells whether it is delegated to it (from the
//! filesystem, and for a unit of the user's own systemd manager, from that
//! manager); when it is not and systemd runs the machine, asks systemd over
//! D-Bus (the user's manager, or the system manager as root) for a transient
//! scope with `Delegate=yes` holding the process, the way container runtimes
//! do; says what the delegated cgroup offers (controllers, `cgroup.kill`,
//! `cgroup.freeze`, `memory.peak`). Creates no groups and moves nothing
//! inside the subtree: that is the caller's. Knows nothing about sandboxes.

use std::fs;
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use zbus::message::Type as MessageType;
use zbus::{Connection, DBusError, MatchRule, MessageStream, OwnedObjectPath, Variant};

const MANAGER_NAME: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER_INTERFACE: &str = "org.freedesktop.systemd1.Manager";
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";

/// One exchange with systemd: connecting, then starting the scope and
/// waiting for its job, or asking about a unit. Starting a scope only moves a
/// process, so systemd normally answers within a second; the bound is for a
/// manager that is stuck.
const DEADLINE: Duration = Duration::from_secs(10);

/// How to run the server so that systemd hands it a delegated cgroup itself.
const RUN_IN_SCOPE: &str = "start the server in a delegated scope: `systemd-run --user --scope -p Delegate=yes nix-sandbox-mcp --stdio`";

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

/// Asks the user's manager whether its unit `unit` has `Delegate=yes`.
fn user_unit_delegates(unit: &str) -> Result<bool, ScopeError> {
    let name = unit.to_string();
    with_manager(Manager::User, unit, move |conn| async move {
        let bus = |error| ScopeError::Bus {
            manager: Manager::User,
            error,
        };
        let path: OwnedObjectPath = conn
            .call_method(
                Some(MANAGER_NAME),
                MANAGER_PATH,
                Some(MANAGER_INTERFACE),
                "GetUnit",
                &(name.as_str(),),
            )
            .await
            .and_then(|reply| reply.body().deserialize())
            .map_err(bus)?;
        let interface = unit_interface(&name).unwrap_or("org.freedesktop.systemd1.Scope");
        let delegate: Variant<'_> = conn
            .call_method(
                Some(MANAGER_NAME),
                &path,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(interface, "Delegate"),
            )
            .await
            .map_err(bus)?
            .body()
            .deserialize::<zbus::OwnedVariant>()
            .map_err(bus)?
            .into();
        bool::try_from(delegate).map_err(bus)
    })
}

/// The D-Bus interface that carries a unit type's cgroup settings.
fn unit_interface(unit: &str) -> Option<&'static str> {
    Some(match unit.rsplit_once('.')?.1 {
        "scope" => "org.freedesktop.systemd1.Scope",
        "service" => "org.freedesktop.systemd1.Service",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "swap" => "org.freedesktop.systemd1.Swap",
        _ => return None,
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

/// Runs `work` with a connection to `manager`, bounded by [`DEADLINE`], on
/// a thread and runtime of its own so that callers in async code are fine.
fn with_manager<T, F, Fut>(manager: Manager, unit: &str, work: F) -> Result<T, ScopeError>
where
    T: Send + 'static,
    F: FnOnce(Connection) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, ScopeError>>,
{
    let unit = unit.to_string();
    let env = BusEnv::from_process(rustix::process::geteuid().as_raw());
    std::thread::Builder::new()
        .name("systemd-dbus".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ScopeError::Thread(io::Error::other(e)))?;
            runtime.block_on(async {
                let talk = async {
                    let (conn, via) = connect(manager, &endpoints(manager, &env)).await?;
                    tracing::debug!("asking {manager} through {via} about {unit}");
                    work(conn).await
                };
                tokio::time::timeout(DEADLINE, talk)
                    .await
                    .unwrap_or_else(|_| Err(ScopeError::Timeout { manager, unit }))
            })
        })
        .map_err(ScopeError::Thread)?
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The scope's properties: systemd delegates the subtree to the process it
/// moves in; a failed scope is collected at once, so a later process with
/// the same pid can reuse the name.
fn scope_properties(pid: u32) -> Vec<(&'static str, Variant<'static>)> {
    vec![
        (
            "Description",
            Variant::from(format!("nix-sandbox-mcp (pid {pid}) and its sandboxes")),
        ),
        ("PIDs", Variant::from(vec![pid])),
        ("Delegate", Variant::from(true)),
        ("CollectMode", Variant::from("inactive-or-failed")),
    ]
}

/// StartTransientUnit, then waits for the job's JobRemoved signal.
async fn start_scope(
    conn: &Connection,
    manager: Manager,
    unit: &str,
    pid: u32,
) -> Result<(), ScopeError> {
    let bus = |error| ScopeError::Bus { manager, error };
    // Listen before asking: the job may end before the reply is read.
    let rule = MatchRule::builder()
        .msg_type(MessageType::Signal)
        .path(MANAGER_PATH)
        .interface(MANAGER_INTERFACE)
        .member("JobRemoved")
        .build()
        .map_err(bus)?;
    let mut removed = MessageStream::for_match_rule(rule, conn, None)
        .await
        .map_err(bus)?;
    let job = match start_transient_unit(conn, unit, pid).await {
        Err(e) if error_name(&e).as_deref() == Some(UNIT_EXISTS) => {
            // Left by an earlier process with our pid: have systemd collect
            // it and try once more.
            let _ = conn
                .call_method(
                    Some(MANAGER_NAME),
                    MANAGER_PATH,
                    Some(MANAGER_INTERFACE),
                    "ResetFailedUnit",
                    &(unit,),
                )
                .await;
            start_transient_unit(conn, unit, pid).await
        }
        other => other,
    }
    .map_err(|e| refused(manager, unit, e))?;
    while let Some(signal) = removed.next().await {
        let signal = signal.map_err(bus)?;
        let Ok((_id, path, _unit, result)) = signal
            .body()
            .deserialize::<(u32, OwnedObjectPath, String, String)>()
        else {
            continue;
        };
        if path != job {
            continue;
        }
        return if result == "done" {
            Ok(())
        } else {
            Err(ScopeError::JobFailed {
                manager,
                unit: unit.to_string(),
                result,
            })
        };
    }
    Err(bus(zbus::Error::Failure(
        "the connection closed before the job ended".into(),
    )))
}

async fn start_transient_unit(
    conn: &Connection,
    unit: &str,
    pid: u32,
) -> zbus::Result<OwnedObjectPath> {
    let aux: Vec<(&str, Vec<(&str, Variant<'_>)>)> = Vec::new();
    // "fail": refuse rather than replace a job already queued for the unit.
    let reply = conn
        .call_method(
            Some(MANAGER_NAME),
            MANAGER_PATH,
            Some(MANAGER_INTERFACE),
            "StartTransientUnit",
            &(unit, "fail", scope_properties(pid), aux),
        )
        .await?;
    reply.body().deserialize()
}

fn error_name(e: &zbus::Error) -> Option<String> {
    match e {
        zbus::Error::MethodError(name, _, _) => Some(name.to_string()),
        zbus::Error::FDO(fdo) => Some(fdo.name().to_string()),
        _ => None,
    }
}

fn refused(manager: Manager, unit: &str, e: zbus::Error) -> ScopeError {
    let name = error_name(&e);
    let fix = match name.as_deref() {
        Some(UNIT_EXISTS) => {
            "; another process with this pid holds a scope of this name (a second PID namespace?)"
        }
        Some(
            "org.freedesktop.DBus.Error.ServiceUnknown"
            | "org.freedesktop.DBus.Error.NameHasNoOwner",
        ) => {
            "; no systemd manager answers on that bus: log in through a systemd session (pam_systemd) or `loginctl enable-linger`"
        }
        Some(
            "org.freedesktop.DBus.Error.AccessDenied"
            | "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
        ) => "; the manager does not let this user start units",
        _ => "",
    };
    ScopeError::Refused {
        manager,
        unit: unit.to_string(),
        error: e.to_string(),
        fix,
    }
}

/// Where a manager may be reached: a bus on which it is
/// `org.freedesktop.systemd1`. (Not its private socket `systemd/private`,
/// where it names itself as sender in a way this D-Bus library refuses.)
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    /// A bus address from the environment.
    Address(String),
    /// The bus socket at its usual place.
    Socket(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Address(a) => write!(f, "{a}"),
            Endpoint::Socket(p) => write!(f, "{}", p.display()),
        }
    }
}

/// What the process's environment says about where the buses are.
#[derive(Debug, Clone, Default)]
struct BusEnv {
    uid: u32,
    session_bus: Option<String>,
    system_bus: Option<String>,
    runtime_dir: Option<PathBuf>,
}

impl BusEnv {
    fn from_process(uid: u32) -> BusEnv {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        BusEnv {
            uid,
            session_bus: var("DBUS_SESSION_BUS_ADDRESS"),
            system_bus: var("DBUS_SYSTEM_BUS_ADDRESS"),
            runtime_dir: var("XDG_RUNTIME_DIR").map(PathBuf::from),
        }
    }
}

/// The endpoints to try, best first, and for each one left out, why.
fn endpoints(manager: Manager, env: &BusEnv) -> (Vec<Endpoint>, Vec<String>) {
    let (variable, address, socket) = match manager {
        Manager::User => (
            "DBUS_SESSION_BUS_ADDRESS",
            &env.session_bus,
            env.runtime_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("/run/user/{}", env.uid)))
                .join("bus"),
        ),
        Manager::System => (
            "DBUS_SYSTEM_BUS_ADDRESS",
            &env.system_bus,
            PathBuf::from("/run/dbus/system_bus_socket"),
        ),
    };
    let mut found = Vec::new();
    let mut missing = Vec::new();
    match address {
        Some(a) => found.push(Endpoint::Address(a.clone())),
        None => missing.push(format!("{variable} unset")),
    }
    let same = address.as_deref() == Some(&format!("unix:path={}", socket.display()));
    if fs::metadata(&socket).is_ok_and(|m| m.file_type().is_socket()) {
        if !same {
            found.push(Endpoint::Socket(socket));
        }
    } else {
        missing.push(format!("no {}", socket.display()));
    }
    (found, missing)
}

/// The first endpoint that accepts a connection.
async fn connect(
    manager: Manager,
    (found, missing): &(Vec<Endpoint>, Vec<String>),
) -> Result<(Connection, Endpoint), ScopeError> {
    let mut tried = missing.clone();
    for endpoint in found {
        match open(endpoint).await {
            Ok(conn) => return Ok((conn, endpoint.clone())),
            Err(e) => tried.push(format!("{endpoint}: {e}")),
        }
    }
    let fix = match manager {
        Manager::User => format!(
            "log in through a systemd session (pam_systemd starts the user's manager), or `loginctl enable-linger` for a user without one; or {RUN_IN_SCOPE}"
        ),
        Manager::System => {
            "root asks systemd through the system bus: is dbus (dbus-daemon or dbus-broker) running?".to_string()
        }
    };
    Err(ScopeError::NoBus {
        manager,
        tried: tried.join(", "),
        fix,
    })
}

async fn open(endpoint: &Endpoint) -> zbus::Result<Connection> {
    let builder = match endpoint {
        Endpoint::Address(address) => zbus::connection::Builder::address(address.as_str()),
        Endpoint::Socket(path) => {
            zbus::connection::Builder::unix_stream(UnixStream::connect(path)?)
        }
    };
    builder.method_timeout(DEADLINE).build().await
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
            let fix = if uid == 0 {
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
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split(' ').next()? != "cgroup2" {
            return None;
        }
        let mut fields = pre.split(' ').skip(3);
        let root = unescape_mount(fields.next()?);
        let point = PathBuf::from(unescape_mount(fields.next()?));
        let rel = if root == "/" {
            own
        } else {
            let rest = own.strip_prefix(root.as_str())?;
            if !rest.is_empty() && !rest.starts_with('/') {
                return None;
            }
            rest
        };
        Some(point.join(rel.trim_start_matches('/')))
    })
}

/// Undoes the octal escapes of /proc/self/mountinfo.
fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
24 1 0:22 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    #[test]
    fn finds_our_cgroup_under_the_cgroup2_mount() {
        let cgroup = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(
            cgroup_v2_dir(cgroup, MOUNTINFO),
            Some(PathBuf::from(
                "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"
            ))
        );
        // Hybrid hosts list v1 hierarchies too; only the `0::` line counts.
        let hybrid = "4:memory:/x\n0::/\n";
        let mounts = "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup_v2_dir(hybrid, mounts),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn maps_through_a_mount_of_a_subtree() {
        let mounts = "50 1 0:28 /app.slice /mnt/cg\\040x rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup_v2_dir("0::/app.slice/a.scope\n", mounts),
            Some(PathBuf::from("/mnt/cg x/a.scope"))
        );
        assert_eq!(cgroup_v2_dir("0::/app.slicex/a\n", mounts), None);
        assert_eq!(cgroup_v2_dir("0::/other\n", mounts), None);
        assert_eq!(cgroup_v2_dir("1:memory:/a\n", MOUNTINFO), None);
    }

    /// A directory that looks like a cgroup holding `procs`.
    fn fake_cgroup(procs: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("cgroup.procs", procs),
            ("cgroup.subtree_control", ""),
            ("cgroup.controllers", "cpu memory pids\n"),
            ("cgroup.type", "domain\n"),
        ] {
            fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    fn why(result: Result<(), ScopeError>) -> String {
        match result {
            Err(ScopeError::NotDelegated { why, .. }) => why,
            other => panic!("expected NotDelegated, got {other:?}"),
        }
    }

    #[test]
    fn a_group_of_our_own_that_only_we_are_in_is_delegated() {
        let dir = fake_cgroup("42\n");
        let owner = fs::metadata(dir.path()).unwrap().uid();
        check_delegated_as(dir.path(), owner, false, 42).unwrap();
    }

    #[test]
    fn a_group_owned_by_someone_else_is_not_ours_and_the_error_says_how_to_get_one() {
        let dir = fake_cgroup("42\n");
        let owner = fs::metadata(dir.path()).unwrap().uid();
        let why = why(check_delegated_as(dir.path(), owner + 1, true, 42));
        assert!(why.contains(&format!("belongs to uid {owner}")), "{why}");
        assert!(
            why.contains("systemd-run --user --scope -p Delegate=yes"),
            "{why}"
        );
    }

    #[test]
    fn a_group_shared_with_other_processes_is_not_ours() {
        let dir = fake_cgroup("42\n7\n");
        let owner = fs::metadata(dir.path()).unwrap().uid();
        let why = why(check_delegated_as(dir.path(), owner, false, 42));
        assert!(
            why.contains("shared with 1 other process (pids 7)"),
            "{why}"
        );
        // The root of the hierarchy may hold processes and still delegate.
        fs::remove_file(dir.path().join("cgroup.type")).unwrap();
        check_delegated_as(dir.path(), owner, false, 42).unwrap();
    }

    #[test]
    fn root_under_systemd_needs_the_delegation_mark() {
        let dir = fake_cgroup("42\n");
        let owner = fs::metadata(dir.path()).unwrap().uid();
        if owner != 0 {
            return; // Only root's files are owned by uid 0.
        }
        let why = why(check_delegated_as(dir.path(), 0, true, 42));
        assert!(why.contains("Delegate=yes"), "{why}");
        // Without systemd nothing else manages the tree: root may.
        check_delegated_as(dir.path(), 0, false, 42).unwrap();
        // systemd's mark; tmpfs before Linux 6.6 takes no user attributes.
        let marked = rustix::fs::setxattr(
            dir.path(),
            "user.delegate",
            b"1",
            rustix::fs::XattrFlags::empty(),
        );
        if marked.is_ok() {
            check_delegated_as(dir.path(), 0, true, 42).unwrap();
        }
    }

    #[test]
    fn features_list_controllers_and_interface_files() {
        let dir = fake_cgroup("");
        fs::write(dir.path().join("cgroup.kill"), "").unwrap();
        let f = features(dir.path());
        assert_eq!(f.controllers, ["cpu", "memory", "pids"]);
        assert!(f.has("memory") && !f.has("io"));
        assert!(f.kill && !f.freeze && !f.memory_peak);
    }

    #[test]
    fn a_user_without_a_bus_is_told_what_was_tried_and_how_to_fix_it() {
        let empty = tempfile::tempdir().unwrap();
        let env = BusEnv {
            uid: 1000,
            runtime_dir: Some(empty.path().to_path_buf()),
            ..BusEnv::default()
        };
        let found = endpoints(Manager::User, &env);
        assert!(found.0.is_empty());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let Err(e) = runtime.block_on(connect(Manager::User, &found)) else {
            panic!("connected to nothing");
        };
        let text = e.to_string();
        for said in [
            "DBUS_SESSION_BUS_ADDRESS unset",
            &format!("no {}/bus", empty.path().display()),
            "loginctl enable-linger",
            "systemd-run --user --scope -p Delegate=yes nix-sandbox-mcp --stdio",
        ] {
            assert!(text.contains(said), "{said:?} missing from: {text}");
        }
    }

    #[test]
    fn the_session_address_comes_first_then_the_runtime_dir_bus() {
        let dir = tempfile::tempdir().unwrap();
        let _bus = std::os::unix::net::UnixListener::bind(dir.path().join("bus")).unwrap();
        let env = BusEnv {
            uid: 1000,
            runtime_dir: Some(dir.path().to_path_buf()),
            session_bus: Some("unix:path=/elsewhere".into()),
            ..BusEnv::default()
        };
        assert_eq!(
            endpoints(Manager::User, &env).0,
            [
                Endpoint::Address("unix:path=/elsewhere".into()),
                Endpoint::Socket(dir.path().join("bus")),
            ]
        );
        // The same bus twice is tried once.
        let env = BusEnv {
            session_bus: Some(format!("unix:path={}/bus", dir.path().display())),
            ..env
        };
        assert_eq!(endpoints(Manager::User, &env).0.len(), 1);
    }

    #[test]
    fn only_a_user_managers_own_units_are_asked_about() {
        let user = Path::new("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service");
        let scope = user.join("app.slice/run-r1.scope");
        assert_eq!(
            unit_to_confirm(&scope, 1000, true).as_deref(),
            Some("run-r1.scope")
        );
        let service = user.join("app.slice/nix-sandbox-mcp.service");
        assert!(unit_to_confirm(&service, 1000, true).is_some());
        // A group below a unit is a delegate's; root and hosts without
        // systemd go by the filesystem; a system unit chowned to the user
        // was delegated by the system manager.
        for (dir, uid, systemd) in [
            (scope.join("daemon"), 1000, true),
            (scope.clone(), 0, true),
            (scope.clone(), 1000, false),
            (
                PathBuf::from("/sys/fs/cgroup/system.slice/nsm.service"),
                1000,
                true,
            ),
        ] {
            assert_eq!(unit_to_confirm(&dir, uid, systemd), None, "{dir:?}");
        }
    }

    /// What the stand-in manager does with StartTransientUnit.
    #[derive(Clone, Copy)]
    enum Script {
        /// Emits another job's JobRemoved, then ours with this result.
        Finish(&'static str),
        /// Refuses the first start with UnitExists.
        ExistsOnce,
    }

    /// Runs `start_scope` against a stand-in for systemd's manager on a
    /// socket pair, speaking the same D-Bus calls and signals; returns the
    /// result and the methods the manager was called with.
    fn against_manager(script: Script) -> (Result<(), ScopeError>, Vec<String>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (ours, theirs) = UnixStream::pair().unwrap();
            let server = zbus::connection::Builder::unix_stream(theirs)
                .server(zbus::Guid::generate())
                .p2p()
                .build();
            let client = zbus::connection::Builder::unix_stream(ours).p2p().build();
            let (server, client) = futures::try_join!(server, client).unwrap();
            let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let seen = calls.clone();
            let manager = tokio::spawn(async move {
                let mut incoming = MessageStream::from(&server);
                let mut refused = false;
                while let Some(Ok(call)) = incoming.next().await {
                    let header = call.header();
                    let member = header.member().map(|m| m.to_string()).unwrap_or_default();
                    seen.lock().unwrap().push(member.clone());
                    if member == "ResetFailedUnit" {
                        server.reply(&header, &()).await.unwrap();
                        continue;
                    }
                    if let (Script::ExistsOnce, false) = (script, refused) {
                        refused = true;
                        server
                            .reply_error(&header, UNIT_EXISTS, &("Unit exists",))
                            .await
                            .unwrap();
                        continue;
                    }
                    let job = OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap();
                    server.reply(&header, &job).await.unwrap();
                    let result = match script {
                        Script::Finish(result) => result,
                        Script::ExistsOnce => "done",
                    };
                    for (id, path, result) in [
                        (6u32, "/org/freedesktop/systemd1/job/6", "failed"),
                        (7, "/org/freedesktop/systemd1/job/7", result),
                    ] {
                        let body = (id, OwnedObjectPath::try_from(path).unwrap(), "u", result);
                        server
                            .emit_signal(
                                None::<&str>,
                                MANAGER_PATH,
                                MANAGER_INTERFACE,
                                "JobRemoved",
                                &body,
                            )
                            .await
                            .unwrap();
                    }
                }
            });
            let result = tokio::time::timeout(
                Duration::from_secs(3),
                start_scope(&client, Manager::User, "nix-sandbox-mcp-1.scope", 1),
            )
            .await
            .unwrap_or_else(|_| {
                Err(ScopeError::Timeout {
                    manager: Manager::User,
                    unit: "nix-sandbox-mcp-1.scope".into(),
                })
            });
            manager.abort();
            let calls = calls.lock().unwrap().clone();
            (result, calls)
        })
    }

    #[test]
    fn waits_for_its_own_job_and_ignores_others() {
        let (result, calls) = against_manager(Script::Finish("done"));
        result.unwrap();
        assert_eq!(calls, ["StartTransientUnit"]);
    }

    #[test]
    fn a_failed_job_names_the_unit_and_where_to_look() {
        let (result, _) = against_manager(Script::Finish("failed"));
        let text = result.unwrap_err().to_string();
        assert!(text.contains("nix-sandbox-mcp-1.scope"), "{text}");
        assert!(text.contains("`failed`"), "{text}");
        assert!(
            text.contains("journalctl --user -u nix-sandbox-mcp-1.scope"),
            "{text}"
        );
    }

    #[test]
    fn a_leftover_unit_of_the_same_name_is_reset_and_tried_again() {
        let (result, calls) = against_manager(Script::ExistsOnce);
        result.unwrap();
        assert_eq!(
            calls,
            [
                "StartTransientUnit",
                "ResetFailedUnit",
                "StartTransientUnit"
            ]
        );
    }
}
