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

/// Why this daemon has no cgroup v2, and the step that would give it one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WithoutV2 {
    pub why: String,
    pub step: String,
}

/// The sentence `doctor` and `envs` show.
impl std::fmt::Display for WithoutV2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cgroup v2 is not used: {}; to use it: {}",
            self.why, self.step
        )
    }
}

/// What the host offers: the best hierarchy (cgroup v2, else v1) or why
/// neither, and, unless it is v2, why not v2.
pub(super) struct Detected {
    pub(super) hierarchy: Result<Box<dyn Hierarchy>, String>,
    pub(super) without_v2: Option<WithoutV2>,
}

pub(super) fn hierarchy() -> Detected {
    match detect_v2() {
        Ok(h) => Detected {
            hierarchy: Ok(Box::new(h)),
            without_v2: None,
        },
        Err(v2) => Detected {
            hierarchy: match detect_v1() {
                Ok(h) => Ok(Box::new(h)),
                Err(v1) => Err(format!("cgroup v2: {}; {v1}", v2.why)),
            },
            without_v2: Some(v2),
        },
    }
}

/// The step that puts the memory and pids controllers on cgroup v2, for a
/// kernel that has them on v1 (or mounts no cgroup2 at all).
fn kernel_step(systemd: bool) -> String {
    if systemd {
        "boot with cgroup v2 alone: add `systemd.unified_cgroup_hierarchy=1` to the kernel command line (GRUB_CMDLINE_LINUX in /etc/default/grub, then `update-grub`) and reboot; systemd then gives the server a delegated cgroup by itself".to_string()
    } else {
        "boot with the controllers on cgroup v2 (kernel command line `cgroup_no_v1=all`) and mount cgroup2 on /sys/fs/cgroup; in a container, run it on a host that has cgroup v2. Then start the server as root, or in a cgroup delegated to its user".to_string()
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

fn detect_v2() -> Result<CgroupV2, WithoutV2> {
    let kernel = |why: String| WithoutV2 {
        why,
        step: kernel_step(systemd::systemd_booted()),
    };
    let mount = mounts()
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .ok_or_else(|| kernel("not mounted".to_string()))?;
    // A hybrid host keeps the controllers on v1: nothing to delegate here.
    let offered = systemd::features(&mount.point);
    for c in ["memory", "pids"] {
        if !offered.has(c) {
            return Err(kernel(format!(
                "the {c} controller is not on the unified hierarchy {} (it is bound to cgroup v1)",
                mount.point.display()
            )));
        }
    }
    let delegated = systemd::delegated_cgroup().map_err(|e| WithoutV2 {
        why: e.to_string(),
        step: e.step(),
    })?;
    if let Some(unit) = &delegated.started {
        tracing::info!("systemd started {unit}, a delegated cgroup for the sandboxes' limits");
    }
    let base = delegated.dir;
    let features = systemd::features(&base);
    for c in ["memory", "pids"] {
        if !features.has(c) {
            return Err(WithoutV2 {
                why: format!("the {c} controller is not delegated to {}", base.display()),
                step: systemd::controllers_step(),
            });
        }
    }
    set_up_v2(&mount.point, &base, &features).map_err(|why| WithoutV2 {
        why,
        step: systemd::delegation_step(),
    })
}

/// Our leaf and container in the delegated group `base`, with the
/// controllers enabled for the sandboxes' groups.
fn set_up_v2(
    hierarchy_root: &Path,
    base: &Path,
    features: &systemd::Features,
) -> Result<CgroupV2, String> {
    // The "no internal processes" rule: controllers can only be enabled for
    // children once our own group holds no processes, so we move into a
    // leaf. The group is ours alone (delegation checked that), but the
    // hierarchy's root is exempt from the rule.
    if base != hierarchy_root {
        let leaf = base.join("daemon");
        fs::create_dir_all(&leaf).map_err(|e| format!("cannot create {}: {e}", leaf.display()))?;
        write_file(&leaf.join("cgroup.procs"), "0")
            .map_err(|e| format!("cannot move into {}: {e}", leaf.display()))?;
    }
    remove_stale_containers(base);
    let controllers = if features.has("cpu") {
        "+memory +pids +cpu"
    } else {
        "+memory +pids"
    };
    let enable = |dir: &Path| {
        write_file(&dir.join("cgroup.subtree_control"), controllers)
            .map_err(|e| format!("cannot enable {controllers} in {}: {e}", dir.display()))
    };
    enable(base)?;
    let container = base.join(container_name());
    fs::create_dir_all(&container)
        .map_err(|e| format!("cannot create {}: {e}", container.display()))?;
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
    fn controllers_on_v1_call_for_a_boot_with_v2() {
        let with_systemd = kernel_step(true);
        assert!(
            with_systemd.contains("systemd.unified_cgroup_hierarchy=1"),
            "{with_systemd}"
        );
        let without = kernel_step(false);
        assert!(
            without.contains("cgroup_no_v1=all") && !without.contains("systemd"),
            "{without}"
        );
    }

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
