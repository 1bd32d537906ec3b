//! Which cgroup mechanism this host offers the daemon, and why not when it
//! offers none: reads the mount table and the daemon's own cgroups, claims
//! a container of its own (removing containers left by dead daemons), and
//! returns the hierarchy the group pool will use.

use std::fs;
use std::path::{Path, PathBuf};

use super::cgroup_v1::CgroupV1;
use super::cgroup_v2::CgroupV2;
use super::groups::{Hierarchy, remove_container, write_file};
use super::systemd;
use crate::mountinfo::{Mount, mounts};

const CONTAINER_PREFIX: &str = "nix-sandbox-mcp-";

/// The best hierarchy available: cgroup v2, else v1, else why neither.
pub(super) fn hierarchy() -> Result<Box<dyn Hierarchy>, String> {
    match detect_v2() {
        Ok(h) => Ok(Box::new(h)),
        Err(v2) => match detect_v1() {
            Ok(h) => Ok(Box::new(h)),
            Err(v1) => Err(format!("{v2}; {v1}")),
        },
    }
}

/// Our cgroup path in the hierarchy identified by `controller` ("" for v2).
fn own_cgroup(controller: &str) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let id = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        let matches = if controller.is_empty() {
            id == "0" && ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        matches.then(|| path.to_string())
    })
}

fn host_path(mount: &Mount, cgroup: &str) -> PathBuf {
    let rel = cgroup
        .strip_prefix(mount.root.trim_end_matches('/'))
        .unwrap_or(cgroup);
    mount.point.join(rel.trim_start_matches('/'))
}

/// `nix-sandbox-mcp-<pid>-<n>`: the pid tells whether the owner is alive,
/// `n` keeps several enforcers of one process apart.
fn container_name() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{CONTAINER_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes containers left behind by daemons that died without cleaning up.
fn remove_stale_containers(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix(CONTAINER_PREFIX)
            .and_then(|p| p.split('-').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Its owner died without cleaning up (killed, say, while it was
        // setting a sandbox up): nothing in its groups may live on.
        remove_container(&e.path());
    }
}

fn detect_v2() -> Result<CgroupV2, String> {
    let mount = mounts()
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .ok_or("cgroup v2: not mounted")?;
    // A hybrid host keeps the controllers on v1: nothing to delegate here.
    let offered = systemd::features(&mount.point);
    for c in ["memory", "pids"] {
        if !offered.has(c) {
            return Err(format!(
                "cgroup v2: the {c} controller is not on the unified hierarchy {} (it is bound to cgroup v1)",
                mount.point.display()
            ));
        }
    }
    let delegated = systemd::delegated_cgroup().map_err(|e| format!("cgroup v2: {e}"))?;
    if let Some(unit) = &delegated.started {
        tracing::info!("systemd started {unit}, a delegated cgroup for the sandboxes' limits");
    }
    let base = delegated.dir;
    let features = systemd::features(&base);
    for c in ["memory", "pids"] {
        if !features.has(c) {
            return Err(format!(
                "cgroup v2: the {c} controller is not delegated to {}",
                base.display()
            ));
        }
    }
    // The "no internal processes" rule: controllers can only be enabled for
    // children once our own group holds no processes, so we move into a
    // leaf. The group is ours alone (delegation checked that), but the
    // hierarchy's root is exempt from the rule.
    if base != mount.point {
        let leaf = base.join("daemon");
        fs::create_dir_all(&leaf)
            .map_err(|e| format!("cgroup v2: cannot create {}: {e}", leaf.display()))?;
        write_file(&leaf.join("cgroup.procs"), "0")
            .map_err(|e| format!("cgroup v2: cannot move into {}: {e}", leaf.display()))?;
    }
    remove_stale_containers(&base);
    let controllers = if features.has("cpu") {
        "+memory +pids +cpu"
    } else {
        "+memory +pids"
    };
    let enable = |dir: &Path| {
        write_file(&dir.join("cgroup.subtree_control"), controllers).map_err(|e| {
            format!(
                "cgroup v2: cannot enable {controllers} in {}: {e}",
                dir.display()
            )
        })
    };
    enable(&base)?;
    let container = base.join(container_name());
    fs::create_dir_all(&container)
        .map_err(|e| format!("cgroup v2: cannot create {}: {e}", container.display()))?;
    enable(&container).inspect_err(|_| {
        let _ = fs::remove_dir(&container);
    })?;
    Ok(CgroupV2 {
        container,
        cpu: features.has("cpu"),
    })
}

fn detect_v1() -> Result<CgroupV1, String> {
    let all = mounts();
    let name = container_name();
    // The container of ours in the hierarchy of `controller`, when mounted.
    let container = |controller: &str| -> Result<Option<PathBuf>, String> {
        let Some(mount) = all
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.split(',').any(|o| o == controller))
        else {
            return Ok(None);
        };
        let own =
            own_cgroup(controller).ok_or_else(|| format!("cgroup v1: no {controller} cgroup"))?;
        let base = host_path(mount, &own);
        remove_stale_containers(&base);
        let dir = base.join(&name);
        fs::create_dir_all(&dir)
            .map_err(|e| format!("cgroup v1: cannot create {}: {e}", dir.display()))?;
        Ok(Some(dir))
    };
    let required = |controller: &str| {
        container(controller)?.ok_or_else(|| format!("cgroup v1: no {controller} hierarchy"))
    };
    // Optional controllers the daemon cannot write to are simply not used.
    let optional = |controller: &str| container(controller).ok().flatten();
    Ok(CgroupV1 {
        memory: required("memory")?,
        pids: required("pids")?,
        cpu: optional("cpu"),
        cpuacct: optional("cpuacct"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_cgroup_paths_onto_mounts() {
        let m = Mount {
            root: "/".into(),
            point: "/sys/fs/cgroup/memory".into(),
            fstype: "cgroup".into(),
            options: "rw,memory".into(),
        };
        assert_eq!(
            host_path(&m, "/a/b"),
            PathBuf::from("/sys/fs/cgroup/memory/a/b")
        );
        let m = Mount {
            root: "/a".into(),
            ..m
        };
        assert_eq!(
            host_path(&m, "/a/b"),
            PathBuf::from("/sys/fs/cgroup/memory/b")
        );
    }
}
