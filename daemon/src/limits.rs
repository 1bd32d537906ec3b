//! How resource limits are enforced on this host. Detects, once, the best
//! mechanism available: a delegated cgroup v2 subtree, else cgroup v1 leaf groups
//! (memory and pids), else rlimits alone. Keeps a pool of prepared leaf groups
//! so no cgroup is created or removed on a call's critical path, and tells the
//! caller which limit fired. Knows nothing about bubblewrap or MCP.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::environment::Limits;

/// The active enforcement mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    CgroupV2,
    CgroupV1,
    Rlimits,
}

impl Mechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::CgroupV2 => "cgroup v2",
            Mechanism::CgroupV1 => "cgroup v1",
            Mechanism::Rlimits => "rlimits",
        }
    }
}

/// Limits that fired during a run, as far as the mechanism can tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fired {
    pub memory: bool,
    pub pids: bool,
}

/// One resource limit, applied to bubblewrap (and so to everything it starts)
/// before it sets the sandbox up.
#[derive(Debug, Clone, Copy)]
pub struct Rlimit {
    pub resource: rustix::process::Resource,
    pub value: u64,
}

#[derive(Debug)]
enum Hierarchy {
    /// Run groups live in `container`, a directory of the unified hierarchy.
    V2 { container: PathBuf },
    /// Run groups live in `memory` and `pids`, containers in each v1 hierarchy.
    V1 { memory: PathBuf, pids: PathBuf },
}

#[derive(Debug)]
struct Group {
    /// One directory per hierarchy (one for v2, memory and pids for v1).
    dirs: Vec<PathBuf>,
    /// Limits currently written to the group, to skip rewriting them.
    applied: Option<(u64, u64)>,
}

#[derive(Debug)]
struct Pool {
    hierarchy: Hierarchy,
    free: Mutex<Vec<Group>>,
    next_id: Mutex<u64>,
    /// Why cgroups are not used, when they are not.
    note: Option<String>,
    /// Finished groups go here; a background thread waits for each to empty
    /// and returns it to `free`, off the run's critical path.
    recycle: Mutex<Option<std::sync::mpsc::Sender<Group>>>,
}

/// Decides and applies limits for every run of this daemon.
#[derive(Debug)]
pub struct Enforcer {
    pool: Option<Arc<Pool>>,
    /// Process-count allowance for rlimit mode: RLIMIT_NPROC counts every
    /// process of the uid, so the limit is set relative to those already running.
    nproc_baseline: u64,
    fallback_note: Option<String>,
}

const CONTAINER_PREFIX: &str = "nix-sandbox-mcp-";

impl Enforcer {
    /// Probes the host. Never fails: the worst case is rlimits alone, with the
    /// reason kept for `doctor`.
    pub fn detect(sandbox_uid: u32) -> Enforcer {
        let (pool, note) =
            match detect_v2().or_else(|v2| detect_v1().map_err(|v1| format!("{v2}; {v1}"))) {
                Ok(h) => (Some(Pool::start(h)), None),
                Err(why) => (None, Some(why)),
            };
        Enforcer {
            pool,
            nproc_baseline: count_processes_of(sandbox_uid),
            fallback_note: note,
        }
    }

    /// An enforcer that uses rlimits only (for tests and `--no-cgroups`).
    pub fn rlimits_only(sandbox_uid: u32, why: &str) -> Enforcer {
        Enforcer {
            pool: None,
            nproc_baseline: count_processes_of(sandbox_uid),
            fallback_note: Some(why.to_string()),
        }
    }

    pub fn mechanism(&self) -> Mechanism {
        match self.pool.as_ref().map(|p| &p.hierarchy) {
            Some(Hierarchy::V2 { .. }) => Mechanism::CgroupV2,
            Some(Hierarchy::V1 { .. }) => Mechanism::CgroupV1,
            None => Mechanism::Rlimits,
        }
    }

    /// A sentence for `doctor` and `envs`.
    pub fn describe(&self) -> String {
        match (&self.pool, &self.fallback_note) {
            (Some(p), _) => match &p.hierarchy {
                Hierarchy::V2 { container } => format!(
                    "cgroup v2 (memory, pids) under {}; rlimits for cpu, file size, open files",
                    container.display()
                ),
                Hierarchy::V1 { memory, pids } => format!(
                    "cgroup v1 leaf groups (memory under {}, pids under {}); rlimits for cpu, file size, open files",
                    memory.display(),
                    pids.display()
                ),
            }
            .to_string()
                + p.note.as_deref().unwrap_or(""),
            (None, note) => format!(
                "rlimits only (memory as RLIMIT_DATA, processes as RLIMIT_NPROC); no usable cgroup: {}",
                note.as_deref().unwrap_or("not probed")
            ),
        }
    }

    /// Creates `count` groups ahead of time so runs never wait on mkdir.
    pub fn warm(&self, count: usize) {
        let Some(pool) = &self.pool else { return };
        let mut made = Vec::new();
        for _ in 0..count {
            match pool.create_group() {
                Ok(g) => made.push(g),
                Err(e) => {
                    tracing::warn!("cannot prepare a cgroup: {e}");
                    break;
                }
            }
        }
        pool.free.lock().unwrap().extend(made);
    }

    /// Reserves a group for one sandbox (none in rlimit mode). The sandbox's
    /// bubblewrap is moved into it with [`Lease::adopt`]; limits are set with
    /// [`Lease::apply`] when the run is known.
    pub fn reserve(&self) -> io::Result<Lease> {
        let Some(pool) = &self.pool else {
            return Ok(Lease { cgroup: None });
        };
        let group = match pool.free.lock().unwrap().pop() {
            Some(g) => g,
            None => pool.create_group()?,
        };
        Ok(Lease {
            cgroup: Some(CgroupLease {
                pool: pool.clone(),
                group: Some(group),
                before: Counters::default(),
            }),
        })
    }

    /// The rlimits for a run: always CPU, file size, open files and core
    /// dumps; memory and processes too when no cgroup enforces them.
    pub fn rlimits(&self, limits: &Limits) -> Vec<Rlimit> {
        use rustix::process::Resource;
        let mut out = vec![
            Rlimit {
                resource: Resource::Cpu,
                value: limits.cpu_seconds,
            },
            Rlimit {
                resource: Resource::Fsize,
                value: limits.file_size_bytes,
            },
            Rlimit {
                resource: Resource::Nofile,
                value: limits.open_files,
            },
            Rlimit {
                resource: Resource::Core,
                value: 0,
            },
        ];
        if self.pool.is_none() {
            out.push(Rlimit {
                resource: Resource::Data,
                value: limits.memory_bytes,
            });
            out.push(Rlimit {
                resource: Resource::Nproc,
                value: self.nproc_baseline + limits.pids,
            });
        }
        out
    }

    /// Removes every prepared group (at shutdown).
    pub fn cleanup(&self) {
        if let Some(pool) = &self.pool {
            *pool.recycle.lock().unwrap() = None;
            // Sandboxes still being prepared are in groups no lease returned yet.
            for c in pool.containers() {
                for g in run_groups(&c) {
                    kill_pids_in(&g);
                }
            }
            for g in pool.free.lock().unwrap().drain(..) {
                pool.remove_group(&g);
            }
            for c in pool.containers() {
                let _ = fs::remove_dir(c);
            }
        }
    }
}

/// A reserved group for one sandbox. Keep it alive until the run has ended,
/// then call [`Lease::finish`].
#[derive(Debug)]
pub struct Lease {
    cgroup: Option<CgroupLease>,
}

#[derive(Debug)]
struct CgroupLease {
    pool: Arc<Pool>,
    group: Option<Group>,
    before: Counters,
}

impl Lease {
    /// Moves process `pid` (a bubblewrap that has not started anything yet)
    /// into the group. Blocking: the kernel may wait for an RCU grace period,
    /// which is why this happens before a run, not during it.
    pub fn adopt(&self, pid: u32) -> io::Result<()> {
        if let Some(c) = &self.cgroup
            && let Some(g) = &c.group
        {
            for dir in &g.dirs {
                write_file(&dir.join("cgroup.procs"), &pid.to_string())?;
            }
        }
        Ok(())
    }

    /// Sets the group's limits for the coming run and notes the counters
    /// against which fired limits are judged.
    pub fn apply(&mut self, limits: &Limits) -> io::Result<()> {
        if let Some(c) = &mut self.cgroup
            && let Some(g) = &mut c.group
        {
            c.pool.apply(g, limits)?;
            c.before = c.pool.counters(g);
        }
        Ok(())
    }

    /// Kills every process still in the run's group (a backstop: the pid
    /// namespace normally takes them all down with it).
    pub fn kill_all(&self) {
        if let Some(c) = &self.cgroup
            && let Some(g) = &c.group
        {
            c.pool.kill_group(g);
        }
    }

    /// Limits that fired since `apply` or the last check (for a group that
    /// serves several runs, as a session's does).
    pub fn check(&mut self) -> Fired {
        let Some(c) = &mut self.cgroup else {
            return Fired::default();
        };
        let Some(g) = &c.group else {
            return Fired::default();
        };
        let now = c.pool.counters(g);
        let fired = Fired {
            memory: now.oom_kills > c.before.oom_kills,
            pids: now.pids_max_hits > c.before.pids_max_hits,
        };
        c.before = now;
        fired
    }

    /// Ends the run: reports which limits fired and returns the group to the pool
    /// once it is empty.
    pub fn finish(mut self) -> Fired {
        let fired = self.check();
        if let Some(mut c) = self.cgroup.take()
            && let Some(group) = c.group.take()
        {
            c.pool.recycle(group);
        }
        fired
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(c) = &mut self.cgroup
            && let Some(g) = c.group.take()
        {
            c.pool.kill_group(&g);
            c.pool.recycle(g);
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    oom_kills: u64,
    pids_max_hits: u64,
}

impl Pool {
    fn start(hierarchy: Hierarchy) -> Arc<Pool> {
        let (tx, rx) = std::sync::mpsc::channel::<Group>();
        let pool = Arc::new(Pool {
            hierarchy,
            free: Mutex::new(Vec::new()),
            next_id: Mutex::new(0),
            note: None,
            recycle: Mutex::new(Some(tx)),
        });
        let weak = Arc::downgrade(&pool);
        let spawned = std::thread::Builder::new()
            .name("cgroup-recycler".into())
            .spawn(move || {
                for group in rx {
                    let Some(pool) = weak.upgrade() else { break };
                    if pool.wait_empty(&group, Duration::from_secs(2)) {
                        pool.free.lock().unwrap().push(group);
                    } else {
                        tracing::warn!("cgroup {:?} did not empty; discarding it", group.dirs);
                        pool.kill_group(&group);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the cgroup recycler ({e}); groups are not reused");
            *pool.recycle.lock().unwrap() = None;
        }
        pool
    }

    /// Returns a finished group to the pool once it is empty, in the background.
    fn recycle(&self, group: Group) {
        let sender = self.recycle.lock().unwrap().clone();
        if let Some(tx) = sender {
            let _ = tx.send(group);
        }
    }

    fn containers(&self) -> Vec<PathBuf> {
        match &self.hierarchy {
            Hierarchy::V2 { container } => vec![container.clone()],
            Hierarchy::V1 { memory, pids } => vec![memory.clone(), pids.clone()],
        }
    }

    fn create_group(&self) -> io::Result<Group> {
        let id = {
            let mut n = self.next_id.lock().unwrap();
            *n += 1;
            *n
        };
        let mut dirs = Vec::new();
        for c in self.containers() {
            let d = c.join(format!("run-{id}"));
            match fs::create_dir(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            dirs.push(d);
        }
        Ok(Group {
            dirs,
            applied: None,
        })
    }

    fn remove_group(&self, g: &Group) {
        for d in &g.dirs {
            let _ = fs::remove_dir(d);
        }
    }

    fn apply(&self, g: &mut Group, limits: &Limits) -> io::Result<()> {
        let wanted = (limits.memory_bytes, limits.pids);
        if g.applied == Some(wanted) {
            return Ok(());
        }
        match &self.hierarchy {
            Hierarchy::V2 { .. } => {
                let d = &g.dirs[0];
                write_file(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
                // No swap: the memory limit is the memory the run gets.
                let _ = write_file(&d.join("memory.swap.max"), "0");
                write_file(&d.join("pids.max"), &limits.pids.to_string())?;
            }
            Hierarchy::V1 { .. } => {
                let mem = &g.dirs[0];
                let memsw = mem.join("memory.memsw.limit_in_bytes");
                let has_memsw = memsw.exists();
                // memsw must stay >= the memory limit: lift it, set, then match.
                if has_memsw {
                    write_file(&memsw, "-1")?;
                }
                write_file(
                    &mem.join("memory.limit_in_bytes"),
                    &limits.memory_bytes.to_string(),
                )?;
                if has_memsw {
                    write_file(&memsw, &limits.memory_bytes.to_string())?;
                }
                write_file(&g.dirs[1].join("pids.max"), &limits.pids.to_string())?;
            }
        }
        g.applied = Some(wanted);
        Ok(())
    }

    fn counters(&self, g: &Group) -> Counters {
        let (mem_file, pids_file) = match &self.hierarchy {
            Hierarchy::V2 { .. } => (
                g.dirs[0].join("memory.events"),
                g.dirs[0].join("pids.events"),
            ),
            Hierarchy::V1 { .. } => (
                g.dirs[0].join("memory.oom_control"),
                g.dirs[1].join("pids.events"),
            ),
        };
        Counters {
            oom_kills: read_key(&mem_file, "oom_kill").unwrap_or(0),
            pids_max_hits: read_key(&pids_file, "max").unwrap_or(0),
        }
    }

    fn pids_in(&self, g: &Group) -> Vec<i32> {
        g.dirs.iter().flat_map(|d| procs(d)).collect()
    }

    fn kill_group(&self, g: &Group) {
        if let Hierarchy::V2 { .. } = self.hierarchy
            && write_file(&g.dirs[0].join("cgroup.kill"), "1").is_ok()
        {
            return;
        }
        for d in &g.dirs {
            kill_pids_in(d);
        }
    }

    fn wait_empty(&self, g: &Group, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.pids_in(g).is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.kill_group(g);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

/// Reads `key N` from a flat-keyed cgroup file.
fn read_key(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A mount from /proc/self/mountinfo.
struct Mount {
    root: String,
    point: PathBuf,
    fstype: String,
    options: String,
}

fn mounts() -> Vec<Mount> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            Some(Mount {
                root: unescape_mount(pre.get(3)?),
                point: PathBuf::from(unescape_mount(pre.get(4)?)),
                fstype: post.first()?.to_string(),
                options: post.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect()
}

fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
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
        let runs = run_groups(&e.path());
        for r in &runs {
            kill_pids_in(r);
        }
        for r in &runs {
            for _ in 0..100 {
                if fs::remove_dir(r).is_ok() || !r.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = fs::remove_dir(e.path());
    }
}

fn run_groups(container: &Path) -> Vec<PathBuf> {
    fs::read_dir(container)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// The processes in one cgroup directory.
fn procs(group: &Path) -> Vec<i32> {
    fs::read_to_string(group.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn kill_pids_in(group: &Path) {
    for pid in procs(group) {
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

fn detect_v2() -> Result<Hierarchy, String> {
    let mount = mounts()
        .into_iter()
        .find(|m| m.fstype == "cgroup2")
        .ok_or("cgroup v2: not mounted")?;
    let own = own_cgroup("").ok_or("cgroup v2: this process has no unified cgroup")?;
    let base = host_path(&mount, &own);
    let available = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    for c in ["memory", "pids"] {
        if !available.split_whitespace().any(|x| x == c) {
            return Err(format!(
                "cgroup v2: the {c} controller is not delegated to {}",
                base.display()
            ));
        }
    }
    let is_root = own == "/";
    let parent = if is_root {
        base.clone()
    } else {
        // The "no internal processes" rule: controllers can only be enabled for
        // children once our own group holds no processes, so we move into a leaf.
        // That is only ours to do when we are alone in the group.
        let procs =
            fs::read_to_string(base.join("cgroup.procs")).map_err(|e| format!("cgroup v2: {e}"))?;
        let me = std::process::id().to_string();
        if procs.lines().any(|p| p.trim() != me) {
            return Err(format!(
                "cgroup v2: {} is shared with other processes, so it cannot be delegated (run the server in its own scope, e.g. `systemd-run --user --scope -p Delegate=yes nix-sandbox-mcp --stdio`)",
                base.display()
            ));
        }
        let leaf = base.join("daemon");
        fs::create_dir_all(&leaf)
            .map_err(|e| format!("cgroup v2: cannot create {}: {e}", leaf.display()))?;
        write_file(&leaf.join("cgroup.procs"), "0")
            .map_err(|e| format!("cgroup v2: cannot move into {}: {e}", leaf.display()))?;
        base.clone()
    };
    remove_stale_containers(&parent);
    write_file(&parent.join("cgroup.subtree_control"), "+memory +pids").map_err(|e| {
        format!(
            "cgroup v2: cannot enable memory and pids in {}: {e}",
            parent.display()
        )
    })?;
    let container = parent.join(container_name());
    fs::create_dir_all(&container)
        .map_err(|e| format!("cgroup v2: cannot create {}: {e}", container.display()))?;
    write_file(&container.join("cgroup.subtree_control"), "+memory +pids").map_err(|e| {
        let _ = fs::remove_dir(&container);
        format!(
            "cgroup v2: cannot enable controllers in {}: {e}",
            container.display()
        )
    })?;
    Ok(Hierarchy::V2 { container })
}

fn detect_v1() -> Result<Hierarchy, String> {
    let all = mounts();
    let name = container_name();
    let mut dirs = Vec::new();
    for controller in ["memory", "pids"] {
        let mount = all
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.split(',').any(|o| o == controller))
            .ok_or_else(|| format!("cgroup v1: no {controller} hierarchy"))?;
        let own =
            own_cgroup(controller).ok_or_else(|| format!("cgroup v1: no {controller} cgroup"))?;
        let base = host_path(mount, &own);
        remove_stale_containers(&base);
        let container = base.join(&name);
        fs::create_dir_all(&container)
            .map_err(|e| format!("cgroup v1: cannot create {}: {e}", container.display()))?;
        dirs.push(container);
    }
    let pids = dirs.pop().expect("two hierarchies");
    let memory = dirs.pop().expect("two hierarchies");
    Ok(Hierarchy::V1 { memory, pids })
}

/// Processes currently owned by `uid` (for the RLIMIT_NPROC baseline).
fn count_processes_of(uid: u32) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| e.metadata().map(|m| m.uid() == uid).unwrap_or(false))
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_flat_keyed_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("memory.events");
        fs::write(&f, "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n").unwrap();
        assert_eq!(read_key(&f, "oom_kill"), Some(2));
        assert_eq!(read_key(&f, "max"), Some(3));
        assert_eq!(read_key(&f, "absent"), None);
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

    #[test]
    fn rlimit_mode_adds_memory_and_process_limits() {
        let e = Enforcer::rlimits_only(u32::MAX, "test");
        let l = Limits::resolve(Default::default());
        let rlimits = e.rlimits(&l);
        use rustix::process::Resource;
        let data = rlimits
            .iter()
            .find(|r| r.resource == Resource::Data)
            .unwrap();
        assert_eq!(data.value, l.memory_bytes);
        let nproc = rlimits
            .iter()
            .find(|r| r.resource == Resource::Nproc)
            .unwrap();
        assert_eq!(nproc.value, l.pids);
        let mut lease = e.reserve().unwrap();
        lease.adopt(std::process::id()).unwrap();
        lease.apply(&l).unwrap();
        assert_eq!(lease.finish(), Fired::default());
    }
}
