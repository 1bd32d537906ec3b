//! The conversation with systemd over D-Bus: which bus reaches the user's
//! or the system manager, starting a transient scope with `Delegate=yes`
//! and waiting for its job, and asking whether a user unit delegates.

use std::fs;
use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use zbus::message::Type as MessageType;
use zbus::{Connection, DBusError, MatchRule, MessageStream, OwnedObjectPath, Variant};

use super::{Manager, RUN_IN_SCOPE, ScopeError};

const MANAGER_NAME: &str = "org.freedesktop.systemd1";
pub(super) const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
pub(super) const MANAGER_INTERFACE: &str = "org.freedesktop.systemd1.Manager";
pub(super) const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";

/// One exchange with systemd: connecting, then starting the scope and
/// waiting for its job, or asking about a unit. Starting a scope only moves a
/// process, so systemd normally answers within a second; the bound is for a
/// manager that is stuck.
pub(super) const DEADLINE: Duration = Duration::from_secs(10);

/// Asks the user's manager whether its unit `unit` has `Delegate=yes`.
pub(super) fn user_unit_delegates(unit: &str) -> Result<bool, ScopeError> {
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
pub(super) fn unit_interface(unit: &str) -> Option<&'static str> {
    Some(match unit.rsplit_once('.')?.1 {
        "scope" => "org.freedesktop.systemd1.Scope",
        "service" => "org.freedesktop.systemd1.Service",
        "socket" => "org.freedesktop.systemd1.Socket",
        "mount" => "org.freedesktop.systemd1.Mount",
        "swap" => "org.freedesktop.systemd1.Swap",
        _ => return None,
    })
}

/// Runs `work` with a connection to `manager`, bounded by [`DEADLINE`], on
/// a thread and runtime of its own so that callers in async code are fine.
pub(super) fn with_manager<T, F, Fut>(
    manager: Manager,
    unit: &str,
    work: F,
) -> Result<T, ScopeError>
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
pub(super) async fn start_scope(
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
pub(super) enum Endpoint {
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
pub(super) struct BusEnv {
    pub(super) uid: u32,
    pub(super) session_bus: Option<String>,
    pub(super) system_bus: Option<String>,
    pub(super) runtime_dir: Option<PathBuf>,
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
pub(super) fn endpoints(manager: Manager, env: &BusEnv) -> (Vec<Endpoint>, Vec<String>) {
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
pub(super) async fn connect(
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
