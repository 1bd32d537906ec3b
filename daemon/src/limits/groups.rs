//! The pool of per-sandbox cgroups, whatever the hierarchy: groups are
//! created ahead of time, handed out one per sandbox, and after use emptied
//! and returned by a background thread, so no cgroup is created or removed
//! on a call's critical path. A group's counter files stay open while it
//! is reused (see [`ControlFiles`]).

use std::fs;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Counters, Mechanism};
use crate::limits::Limits;
use crate::sync::Recover;

/// A cgroup layout that can hold per-sandbox groups (cgroup v2, or v1 with
/// one directory per controller hierarchy).
pub(super) trait Hierarchy: Send + Sync + std::fmt::Debug {
    fn mechanism(&self) -> Mechanism;
    fn describe(&self) -> String;
    /// The directories (one per hierarchy) under which groups are created.
    fn containers(&self) -> Vec<PathBuf>;
    /// Writes `limits` into a group's directories.
    fn apply(&self, dirs: &[PathBuf], limits: &Limits) -> io::Result<()>;
    fn counters(&self, files: &ControlFiles) -> Counters;
    /// Whether any process (a zombie included, where the hierarchy can tell)
    /// is still in the group.
    fn populated(&self, files: &ControlFiles) -> bool {
        files.lists_processes()
    }
    /// Prepares an emptied group for another sandbox (resetting what it
    /// counted); false when the group cannot serve again.
    fn reusable(&self, files: &ControlFiles) -> bool;
    /// Whether a CPU quota is applied.
    fn limits_cpu(&self) -> bool;
    /// The file through which a process moves its own (only) thread into
    /// a group, where the hierarchy has one (see [`Group::joins`]).
    fn thread_file(&self) -> Option<&'static str> {
        None
    }
    /// Kills everything in the group at once, where the hierarchy can.
    fn kill_at_once(&self, _dirs: &[PathBuf]) -> bool {
        false
    }
    /// Freezes or thaws the group; `None` where the hierarchy cannot (or
    /// where a frozen process would not die of SIGKILL).
    fn freeze(&self, _dirs: &[PathBuf], _frozen: bool) -> Option<io::Result<()>> {
        None
    }
}

/// A group's directories, with the files used on every call kept open.
/// Re-reading an open cgroup file at offset 0 regenerates its contents for
/// a fraction of the CPU that opening, reading and closing it again costs
/// (the path walk through cgroupfs, and the kernel's per-open state); a
/// call reads four counters before its run and four after it, and the
/// recycler checks every finished group for emptiness and resets it.
/// Files are opened on first use, so only those a hierarchy uses are held,
/// and closed with the group.
#[derive(Debug)]
pub(super) struct ControlFiles {
    dirs: Vec<PathBuf>,
    open: Mutex<Vec<OpenFile>>,
}

#[derive(Debug)]
struct OpenFile {
    dir: usize,
    name: &'static str,
    writable: bool,
    file: fs::File,
}

impl ControlFiles {
    fn new(dirs: Vec<PathBuf>) -> ControlFiles {
        ControlFiles {
            dirs,
            open: Mutex::new(Vec::new()),
        }
    }

    /// The group's directories, one per hierarchy.
    pub(super) fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Whether the `cgroup.procs` of any of the directories lists a process.
    pub(super) fn lists_processes(&self) -> bool {
        self.dirs.iter().any(|d| !procs(d).is_empty())
    }

    /// Runs `f` on file `name` in directory `dir`, opened for reading or
    /// for writing, opening it on first use.
    fn with<T>(
        &self,
        dir: usize,
        name: &'static str,
        writable: bool,
        f: impl FnOnce(&fs::File) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let kept = open
            .iter()
            .position(|o| o.dir == dir && o.name == name && o.writable == writable);
        let at = match kept {
            Some(at) => at,
            None => {
                let path = self
                    .dirs
                    .get(dir)
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?
                    .join(name);
                let file = fs::OpenOptions::new()
                    .read(!writable)
                    .write(writable)
                    .open(path)?;
                open.push(OpenFile {
                    dir,
                    name,
                    writable,
                    file,
                });
                open.len() - 1
            }
        };
        f(&open[at].file)
    }

    /// The current contents of file `name` in directory `dir`, or `None`
    /// where it cannot be read (the hierarchy lacks it, say).
    pub(super) fn read(&self, dir: usize, name: &'static str) -> Option<String> {
        // Counter files are a line or a few short ones.
        let mut buf = [0u8; 4096];
        let n = self
            .with(dir, name, false, |f| f.read_at(&mut buf, 0))
            .ok()?;
        String::from_utf8(buf[..n].to_vec()).ok()
    }

    /// The file's contents as one number.
    pub(super) fn number(&self, dir: usize, name: &'static str) -> Option<u64> {
        self.read(dir, name)?.trim().parse().ok()
    }

    /// `key N` from a flat-keyed file.
    pub(super) fn key(&self, dir: usize, name: &'static str, key: &str) -> Option<u64> {
        flat_key(&self.read(dir, name)?, key)
    }

    /// Writes `value` to file `name` in directory `dir`.
    pub(super) fn write(&self, dir: usize, name: &'static str, value: &str) -> io::Result<()> {
        self.with(dir, name, true, |f| f.write_all_at(value.as_bytes(), 0))
    }
}

/// One sandbox's group: a directory per hierarchy.
#[derive(Debug)]
pub(super) struct Group {
    files: ControlFiles,
    /// Each directory's thread file, open for writing, where the hierarchy
    /// has one (cgroup v1's `tasks`). A single-threaded process that writes
    /// "0" there moves itself without the write lock on the kernel's
    /// process-wide `cgroup_threadgroup_rwsem`, which moving a process by
    /// pid takes and which every fork, exec and exit on the machine reads.
    /// Opened once, when the group is made, and kept while it is reused.
    joins: Option<Arc<Vec<OwnedFd>>>,
    /// Limits currently written to the group, to skip rewriting them.
    applied: Option<(u64, u64, u32)>,
}

#[derive(Debug)]
pub(super) struct GroupPool {
    hierarchy: Box<dyn Hierarchy>,
    free: Mutex<Vec<Group>>,
    /// Groups to keep ready (see [`GroupPool::warm`]).
    target: std::sync::atomic::AtomicUsize,
    next_id: Mutex<u64>,
    /// Finished groups go here; a background thread waits for each to empty
    /// and returns it to `free`.
    recycle: Mutex<Option<std::sync::mpsc::Sender<Group>>>,
    teardown: Arc<Teardown>,
}

/// A pool's containers and whether they are removed yet. Groups are created
/// only under its lock, and never once it is removed: a teardown and a
/// group made at the same moment cannot leave the group behind.
#[derive(Debug)]
struct Teardown {
    containers: Vec<PathBuf>,
    removed: Mutex<bool>,
}

impl Teardown {
    fn run(&self) {
        let mut removed = self.removed.lock().recover();
        if !*removed {
            for c in &self.containers {
                remove_container(c);
            }
            *removed = true;
        }
    }
}

/// The teardown of every pool this process started. The thread that drops
/// a pool last runs its teardown; where that thread is still at it when the
/// process ends (a server signalled as it starts, with a sandbox being
/// prepared in the background), [`remove_every_group`] finishes it.
static TEARDOWNS: Mutex<Vec<Arc<Teardown>>> = Mutex::new(Vec::new());

/// Removes the groups and containers of every pool this process started,
/// waiting for a teardown under way elsewhere: called as the process ends.
pub(super) fn remove_every_group() {
    let teardowns = std::mem::take(&mut *TEARDOWNS.lock().recover());
    for t in teardowns {
        t.run();
    }
}

impl GroupPool {
    pub(super) fn start(hierarchy: Box<dyn Hierarchy>) -> Arc<GroupPool> {
        let (tx, rx) = std::sync::mpsc::channel::<Group>();
        let teardown = Arc::new(Teardown {
            containers: hierarchy.containers(),
            removed: Mutex::new(false),
        });
        TEARDOWNS.lock().recover().push(teardown.clone());
        let pool = Arc::new(GroupPool {
            hierarchy,
            free: Mutex::new(Vec::new()),
            target: std::sync::atomic::AtomicUsize::new(0),
            next_id: Mutex::new(0),
            recycle: Mutex::new(Some(tx)),
            teardown,
        });
        let weak = Arc::downgrade(&pool);
        let spawned = std::thread::Builder::new()
            .name("cgroup-recycler".into())
            .spawn(move || {
                for group in rx {
                    let Some(pool) = weak.upgrade() else { break };
                    if !pool.wait_empty(&group, Duration::from_secs(2)) {
                        tracing::warn!(
                            "cgroup {:?} did not empty; discarding it",
                            group.files.dirs()
                        );
                        pool.kill(&group);
                    } else if pool.hierarchy.reusable(&group.files) {
                        pool.free.lock().recover().push(group);
                    } else {
                        pool.remove(&group);
                        pool.top_up();
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the cgroup recycler ({e}); groups are not reused");
            *pool.recycle.lock().recover() = None;
        }
        pool
    }

    pub(super) fn mechanism(&self) -> Mechanism {
        self.hierarchy.mechanism()
    }

    pub(super) fn describe(&self) -> String {
        self.hierarchy.describe()
    }

    /// Keeps `count` groups ready, creating them now.
    pub(super) fn warm(&self, count: usize) {
        self.target
            .store(count, std::sync::atomic::Ordering::Relaxed);
        self.top_up();
    }

    /// Creates groups until `target` are free.
    fn top_up(&self) {
        let target = self.target.load(std::sync::atomic::Ordering::Relaxed);
        let missing = target.saturating_sub(self.free.lock().recover().len());
        let mut made = Vec::new();
        for _ in 0..missing {
            match self.create() {
                Ok(g) => made.push(g),
                Err(e) => {
                    tracing::warn!("cannot prepare a cgroup: {e}");
                    break;
                }
            }
        }
        self.free.lock().recover().extend(made);
    }

    /// A free group, or a new one.
    pub(super) fn take(&self) -> io::Result<Group> {
        let free = self.free.lock().recover().pop();
        match free {
            Some(g) => Ok(g),
            None => self.create(),
        }
    }

    fn create(&self) -> io::Result<Group> {
        let id = {
            let mut n = self.next_id.lock().recover();
            *n += 1;
            *n
        };
        let removed = self.teardown.removed.lock().recover();
        if *removed {
            return Err(io::Error::other("the server is shutting down"));
        }
        let mut dirs = Vec::new();
        for c in &self.teardown.containers {
            let d = c.join(format!("run-{id}"));
            match fs::create_dir(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            dirs.push(d);
        }
        drop(removed);
        // Where a thread file cannot be opened, the process is moved by pid.
        let joins = self.hierarchy.thread_file().and_then(|name| {
            let open = |d: &PathBuf| fs::OpenOptions::new().write(true).open(d.join(name));
            match dirs.iter().map(open).collect::<io::Result<Vec<_>>>() {
                Ok(files) => Some(Arc::new(files.into_iter().map(OwnedFd::from).collect())),
                Err(e) => {
                    tracing::debug!("cgroup thread files not writable ({e}); moving by pid");
                    None
                }
            }
        });
        Ok(Group {
            files: ControlFiles::new(dirs),
            joins,
            applied: None,
        })
    }

    pub(super) fn adopt(&self, g: &Group, pid: u32) -> io::Result<()> {
        for dir in g.files.dirs() {
            write_file(&dir.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// The group's thread files (see [`Group::joins`]), where it has them.
    pub(super) fn joins(&self, g: &Group) -> Option<Arc<Vec<OwnedFd>>> {
        g.joins.clone()
    }

    pub(super) fn apply(&self, g: &mut Group, limits: &Limits) -> io::Result<()> {
        let wanted = (limits.memory_bytes, limits.pids, limits.cpu_millis);
        if g.applied != Some(wanted) {
            self.hierarchy.apply(g.files.dirs(), limits)?;
            g.applied = Some(wanted);
        }
        Ok(())
    }

    pub(super) fn counters(&self, g: &Group) -> Counters {
        self.hierarchy.counters(&g.files)
    }

    pub(super) fn freeze(&self, g: &Group, frozen: bool) -> Option<io::Result<()>> {
        self.hierarchy.freeze(g.files.dirs(), frozen)
    }

    pub(super) fn limits_cpu(&self) -> bool {
        self.hierarchy.limits_cpu()
    }

    fn remove(&self, g: &Group) {
        for d in g.files.dirs() {
            let _ = fs::remove_dir(d);
        }
    }

    pub(super) fn kill(&self, g: &Group) {
        // A frozen process dies only once thawed (cgroup v1).
        let dirs = g.files.dirs();
        let _ = self.hierarchy.freeze(dirs, false);
        if !self.hierarchy.kill_at_once(dirs) {
            for d in dirs {
                kill_pids_in(d);
            }
        }
    }

    /// Returns a finished group to the pool once it is empty, in the background.
    pub(super) fn recycle(&self, group: Group) {
        let sender = self.recycle.lock().recover().clone();
        if let Some(tx) = sender {
            let _ = tx.send(group);
        }
    }

    fn wait_empty(&self, g: &Group, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if !self.hierarchy.populated(&g.files) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.kill(g);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Removes every group and container (at shutdown). Groups still on
    /// their way back (sandboxes discarded just now, or still being
    /// prepared) are emptied and removed too.
    pub(super) fn cleanup(&self) {
        *self.recycle.lock().recover() = None;
        // The recycler makes no more groups either.
        self.target.store(0, std::sync::atomic::Ordering::Relaxed);
        self.free.lock().recover().clear();
        self.teardown.run();
    }
}

/// A pool that goes away (a server that stops, or fails to start after its
/// limits were set up) takes its groups and containers with it.
impl Drop for GroupPool {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Kills what is left in a container's groups and removes them and it.
pub(super) fn remove_container(container: &Path) {
    let groups = subdirectories(container);
    for g in &groups {
        kill_pids_in(g);
    }
    for g in &groups {
        // Busy while the killed processes finish exiting; any other error
        // (a group of another user's daemon) will not go away.
        for _ in 0..100 {
            match fs::remove_dir(g) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
    let _ = fs::remove_dir(container);
}

pub(super) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

/// `key N` from the text of a flat-keyed cgroup file.
fn flat_key(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

pub(super) fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
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

pub(super) fn kill_pids_in(group: &Path) {
    for pid in procs(group) {
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_flat_keyed_files() {
        let text = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n";
        assert_eq!(flat_key(text, "oom_kill"), Some(2));
        assert_eq!(flat_key(text, "max"), Some(3));
        assert_eq!(flat_key(text, "absent"), None);
    }

    /// A kept file is read afresh each time, not from what it held when
    /// opened; one that cannot be opened reads as nothing.
    #[test]
    fn control_files_read_current_contents() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pids.events");
        fs::write(&f, "max 1\n").unwrap();
        let files = ControlFiles::new(vec![dir.path().to_path_buf()]);
        assert_eq!(files.key(0, "pids.events", "max"), Some(1));
        fs::write(&f, "max 12\n").unwrap();
        assert_eq!(files.key(0, "pids.events", "max"), Some(12));
        fs::write(dir.path().join("pids.current"), "7\n").unwrap();
        assert_eq!(files.number(0, "pids.current"), Some(7));
        assert_eq!(files.number(0, "absent"), None);
        assert_eq!(files.number(1, "pids.current"), None);
        files.write(0, "pids.current", "0").unwrap();
        assert_eq!(files.number(0, "pids.current"), Some(0));
        assert!(files.write(0, "absent", "0").is_err());
        // Each file once for reading, pids.current once more for writing.
        assert_eq!(files.open.lock().recover().len(), 3);
    }
}
