//! The nest: a user and pid namespace of the daemon's own, held by a small
//! process (`holder.rs`) for the daemon's whole life. Every bubblewrap is
//! started inside it, which gives two things the host alone does not:
//!
//! - **Nothing outlives the daemon, by the kernel's own bookkeeping.** The
//!   nest's init dies with the holder, and the holder with the daemon,
//!   however the daemon ends (even killed outright); the kernel then kills
//!   every process in the nest's pid namespace, which is every sandbox,
//!   paused or not. (Without the nest, bubblewrap's parent-death signal
//!   does the same for each sandbox.)
//! - **Filesystems bubblewrap cannot make.** Holding every capability in
//!   the nest's user namespace, the child that becomes bubblewrap stages
//!   the sandbox's writable filesystems first (`stage.rs`): one tmpfs
//!   bounded in size and in files for the scratch directories, and the
//!   project through a copy-on-write overlay (for a root server, over an
//!   idmapped copy of the project, `idmap.rs`, so the sandbox may change
//!   what the project's owner may).
//!
//! Where the host refuses unprivileged user namespaces (a sysctl, or an
//! AppArmor policy), or overlayfs in one (Linux before 5.11), the nest or
//! the overlay is unavailable, and the daemon says so and falls back.

mod dev;
pub mod holder;
mod idmap;
pub mod network;
pub mod root;
pub mod stage;
pub mod view;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::thread::LinkNameSpaceType;

use super::child::ChildPlan;
pub(super) use stage::Reported;
pub use stage::Spec as StageSpec;

/// How long the holder may take to report that the nest exists.
const START_LIMIT: Duration = Duration::from_secs(5);
/// How many reports of reaped processes are kept for the daemon to collect.
const REPORTS_KEPT: usize = 1024;

/// The nest, once started.
#[derive(Debug)]
pub struct Nest {
    holder: Child,
    namespaces: Arc<Namespaces>,
    /// An empty host directory, the mount point of every sandbox's staged
    /// tmpfs (each in its own mount namespace).
    stage_root: PathBuf,
    /// What the nest's init reaped, by pid in the nest.
    reaped: Arc<Reaped>,
    /// Idle network namespaces for sandboxes without network.
    networks: Arc<network::Pool>,
    /// The mount namespaces of the roots built once (see
    /// [`stage::Template`]), by the host entries they hold; `None` where
    /// one could not be built (each stage then builds its own). Each is
    /// built outside the map's lock, so only callers wanting the same root
    /// wait for it.
    templates: Mutex<std::collections::HashMap<Vec<PathBuf>, Arc<TemplateSlot>>>,
    /// The mappings of a root server's project copies (see `idmap.rs`).
    idmaps: idmap::Idmaps,
    /// An idmapped copy could not be made (said once).
    idmap_failed: std::sync::atomic::AtomicBool,
}

/// A root built once, or being built (see [`Nest::template`]).
type TemplateSlot = std::sync::OnceLock<Option<Arc<OwnedFd>>>;

/// How many roots the nest keeps built (one per set of host entries: a
/// server sees a few).
const TEMPLATES_KEPT: usize = 16;

#[derive(Debug)]
struct Namespaces {
    user: OwnedFd,
    pid: OwnedFd,
    /// The daemon itself: a child checks it is alive once it will die with it.
    daemon: OwnedFd,
}

/// Resource usage of processes the nest's init reaped.
#[derive(Debug, Default)]
pub(super) struct Reaped {
    list: Mutex<VecDeque<(i32, Duration, u64)>>,
    changed: Condvar,
}

impl Reaped {
    /// CPU time and peak resident bytes of the process the nest knows as
    /// `nest_pid`, waiting up to `within` for its report.
    pub(super) fn take(&self, nest_pid: i32, within: Duration) -> Option<(Duration, u64)> {
        let deadline = Instant::now() + within;
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(i) = list.iter().position(|r| r.0 == nest_pid) {
                return list.remove(i).map(|(_, cpu, rss)| (cpu, rss));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            list = self
                .changed
                .wait_timeout(list, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn add(&self, line: &str) {
        let mut words = line.split_whitespace();
        let (Some("reaped"), Some(pid), Some(cpu), Some(rss)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            return;
        };
        let (Ok(pid), Ok(cpu), Ok(rss)) = (pid.parse(), cpu.parse(), rss.parse::<u64>()) else {
            return;
        };
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        if list.len() == REPORTS_KEPT {
            list.pop_front();
        }
        list.push_back((pid, Duration::from_micros(cpu), rss * 1024));
        self.changed.notify_all();
    }
}

/// What a child needs to enter the nest, prepared before it starts.
pub(super) struct Entry {
    namespaces: Arc<Namespaces>,
    stage: Option<Staging>,
    /// The child's end of its reports (see [`Receipt`]).
    socket: OwnedFd,
}

/// What the process that becomes the program stages first.
enum Staging {
    /// A sandbox's filesystems.
    Sandbox(stage::Plan),
    /// A root for many sandboxes (see [`stage::Template`]).
    Template(stage::Template),
}

/// Mounts what a view holds (a store, the /proc masks), and what the
/// sandbox's stage holds, into one sandbox while its bubblewrap waits.
pub(super) struct ViewAttach {
    namespaces: Arc<Namespaces>,
    view: Arc<view::View>,
    /// Each mount: its source in the view, its target in the sandbox.
    mounts: Vec<(std::ffi::CString, std::ffi::CString)>,
    /// Each mount from the stage: its source there, its target in the
    /// sandbox, and whether it is made read-only.
    staged: Vec<view::StagedMount>,
    /// The sandbox's root, made read-only after them (as bubblewrap sets up).
    read_only_root: Option<std::ffi::CString>,
}

impl ViewAttach {
    /// Mounts them in the mount namespace `sandbox`, the staged ones from
    /// the mount namespace `stage` (bubblewrap's); a view that failed is
    /// marked, and not used again.
    pub(super) fn run(
        &self,
        sandbox: Option<&OwnedFd>,
        stage: Option<&OwnedFd>,
    ) -> std::io::Result<()> {
        let result = view::attach(
            &self.namespaces.user,
            (&self.view, &self.mounts),
            (stage, &self.staged),
            sandbox,
            self.read_only_root.as_deref(),
        );
        if result.is_err() {
            self.view
                .failed
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        result
    }
}

/// The daemon's end of a child's reports: the pid of the process that
/// becomes bubblewrap, and the staged tmpfs.
pub(super) struct Receipt(OwnedFd);

impl Nest {
    /// Starts the holder and waits until the nest exists; `stage_root` must
    /// be an empty directory. A root daemon's nest maps every id (and the
    /// sandboxes give up root inside it); a user's maps that user only.
    pub fn start(stage_root: &Path) -> Result<Nest, String> {
        let daemon = rustix::process::pidfd_open(
            rustix::process::getpid(),
            rustix::process::PidfdFlags::empty(),
        )
        .map_err(|e| format!("pidfd_open: {e}"))?;
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg(holder::HOLDER)
            .arg(rustix::process::getpid().as_raw_nonzero().to_string())
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        ChildPlan::bare(None).install(&mut cmd);
        let mut holder = cmd
            .spawn()
            .map_err(|e| format!("cannot start the nest's holder: {e}"))?;
        if let Err(e) = map_if_root(&mut holder).and_then(|()| wait_ready(&mut holder)) {
            let why = stop_helper(&mut holder, "nix-sandbox-mcp nest: ");
            return Err(if why.is_empty() { e } else { why });
        }
        let open = |what: &str| {
            let path = format!("/proc/{}/ns/{what}", holder.id());
            rustix::fs::open(
                path.as_str(),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| format!("cannot open {path}: {e}"))
        };
        let namespaces = match (open("user"), open("pid_for_children")) {
            (Ok(user), Ok(pid)) => Namespaces { user, pid, daemon },
            (Err(e), _) | (_, Err(e)) => {
                let _ = holder.kill();
                let _ = holder.wait();
                return Err(e);
            }
        };
        let reaped = Arc::new(Reaped::default());
        let reports = holder.stdout.take().expect("piped");
        let sink = reaped.clone();
        std::thread::Builder::new()
            .name("nest-reports".into())
            .spawn(move || {
                for line in BufReader::new(reports).lines() {
                    match line {
                        Ok(line) => sink.add(&line),
                        Err(_) => break,
                    }
                }
            })
            .map_err(|e| format!("cannot start the nest's report reader: {e}"))?;
        Ok(Nest {
            holder,
            namespaces: Arc::new(namespaces),
            stage_root: stage_root.to_path_buf(),
            reaped,
            networks: Arc::default(),
            templates: Mutex::default(),
            idmaps: idmap::Idmaps::default(),
            idmap_failed: Default::default(),
        })
    }

    /// What a child needs to enter the nest and stage `spec` there, and
    /// the daemon's end of its reports.
    /// `owner` is who the sandbox runs as, when not the daemon's uid.
    pub(super) fn entry(
        &self,
        spec: Option<&StageSpec>,
        owner: Option<(u32, u32)>,
    ) -> std::io::Result<(Entry, Receipt)> {
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let stage = match spec {
            Some(spec) => Some(Staging::Sandbox(stage::Plan::new(
                &self.stage_root,
                spec,
                owner,
                spec.network.then(|| self.networks.plan()),
                self.template(&spec.host_root, owner),
                self.idmapped_project(spec, owner),
            )?)),
            None => None,
        };
        Ok(self.entry_staging(stage, ours, theirs))
    }

    /// For a root server's sandbox (which runs as `owner`) with a writable
    /// project: the project's mount idmapped so that the project owner's
    /// files are `owner`'s (see `idmap.rs`). `None` where the project's
    /// owner is `owner` already, or where the copy cannot be made (said
    /// once; the sandbox then changes only what `owner` may).
    fn idmapped_project(&self, spec: &StageSpec, owner: Option<(u32, u32)>) -> Option<OwnedFd> {
        use std::os::unix::fs::MetadataExt;
        let (project, owner) = (spec.project.as_ref().filter(|p| p.writable)?, owner?);
        let meta = std::fs::metadata(&project.host_path).ok()?;
        let from = (meta.uid(), meta.gid());
        if from == owner {
            return None;
        }
        match self.idmaps.project(&project.host_path, from, owner) {
            Ok(copy) => Some(copy),
            Err(e) => {
                if !self
                    .idmap_failed
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(
                        "the sandbox cannot change the project's files as their owner (uid {}) can: an idmapped mount of {} could not be made ({e}; Linux 5.19 or later and a filesystem that allows idmapping are needed); it changes only what uid {} may",
                        from.0,
                        project.host_path.display(),
                        owner.0
                    );
                }
                None
            }
        }
    }

    fn entry_staging(
        &self,
        stage: Option<Staging>,
        ours: OwnedFd,
        theirs: OwnedFd,
    ) -> (Entry, Receipt) {
        (
            Entry {
                namespaces: self.namespaces.clone(),
                stage,
                socket: theirs,
            },
            Receipt(ours),
        )
    }

    /// The mount namespace of the root holding `entries` built once, built
    /// now if it is not yet; `None` for no own root (`entries` empty), or
    /// where it cannot be built.
    fn template(&self, entries: &[PathBuf], owner: Option<(u32, u32)>) -> Option<Arc<OwnedFd>> {
        if entries.is_empty() {
            return None;
        }
        let slot = {
            let mut templates = self.templates.lock().unwrap_or_else(|p| p.into_inner());
            match templates.get(entries) {
                Some(slot) => slot.clone(),
                None => {
                    if templates.len() >= TEMPLATES_KEPT {
                        templates.clear();
                    }
                    let slot = Arc::new(TemplateSlot::new());
                    templates.insert(entries.to_vec(), slot.clone());
                    slot
                }
            }
        };
        slot.get_or_init(|| match self.build_template(entries, owner) {
            Ok(built) => Some(Arc::new(built)),
            Err(e) => {
                tracing::warn!("each sandbox builds its own root: {e}");
                None
            }
        })
        .clone()
    }

    /// Builds the root holding `entries` once, in a child that then ends
    /// (staging succeeds or fails before its exec of `/dev/null`): the
    /// mount namespace it reported holds the root.
    fn build_template(
        &self,
        entries: &[PathBuf],
        owner: Option<(u32, u32)>,
    ) -> Result<OwnedFd, String> {
        let template = stage::Template::new(&self.stage_root, entries, owner)
            .map_err(|e| format!("cannot plan a root of its own: {e}"))?;
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| e.to_string())?;
        let (entry, receipt) = self.entry_staging(Some(Staging::Template(template)), ours, theirs);
        let (_, staged) = self.run_entry(entry, receipt, owner, Path::new("/dev/null"), &[])?;
        staged.ok_or_else(|| "building a root of its own ended without a word".to_string())
    }

    /// Makes the store view of a closure (see [`view`]) at `view_dir`.
    pub fn make_view(&self, view_dir: &Path, paths: &[PathBuf]) -> Result<view::View, String> {
        let user = PathBuf::from(format!("/proc/{}/ns/user", self.holder.id()));
        view::make(&user, view_dir, paths)
    }

    /// What mounts, from `view`, each `(source, target)` of `mounts` (the
    /// source in the view's namespace), and each `(source, target,
    /// read_only)` of `staged` from the sandbox's stage (targets as while
    /// bubblewrap sets up), in a sandbox being set up (see
    /// [`view::attach`]); then makes `read_only_root` read-only, when given.
    pub(super) fn view_attach(
        &self,
        view: Arc<view::View>,
        mounts: &[(PathBuf, PathBuf)],
        staged: &[(PathBuf, PathBuf, bool)],
        read_only_root: Option<&Path>,
    ) -> std::io::Result<ViewAttach> {
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::other("a path with a NUL byte"))
        };
        if mounts.len() + staged.len() > view::ATTACH_MOST {
            return Err(std::io::Error::other("too many mounts from one view"));
        }
        Ok(ViewAttach {
            namespaces: self.namespaces.clone(),
            view,
            mounts: mounts
                .iter()
                .map(|(source, target)| Ok((c(source)?, c(target)?)))
                .collect::<std::io::Result<_>>()?,
            staged: staged
                .iter()
                .map(|(source, target, read_only)| {
                    Ok(view::StagedMount {
                        source: c(source)?,
                        target: c(target)?,
                        read_only: *read_only,
                    })
                })
                .collect::<std::io::Result<_>>()?,
            read_only_root: read_only_root.map(c).transpose()?,
        })
    }

    /// Holds a sandbox's network namespace, as its stage reported it.
    pub(super) fn hold_network(&self, namespace: OwnedFd) -> network::Held {
        network::Held::new(namespace, self.networks.clone())
    }

    /// Usage reports of the processes the nest's init reaps.
    pub(super) fn reaped(&self) -> &Arc<Reaped> {
        &self.reaped
    }

    /// Checks that `spec` can be staged, by staging it for a "program" that
    /// cannot run (`/dev/null`): staging succeeds or fails before the exec,
    /// and nothing is started.
    pub fn probe(&self, run_as: Option<(u32, u32)>, spec: &StageSpec) -> Result<(), String> {
        self.stage_and_run(run_as, spec, Path::new("/dev/null"), &[])
            .map(drop)
    }

    /// Checks that bubblewrap at `bwrap` runs (`--version`) in a sandbox
    /// whose root holds only `host_root` of the host's (see [`root`]).
    pub fn probe_host_root(
        &self,
        run_as: Option<(u32, u32)>,
        host_root: Vec<PathBuf>,
        bwrap: &Path,
    ) -> Result<(), String> {
        let spec = StageSpec {
            host_root,
            ..StageSpec::scratch()
        };
        match self.stage_and_run(run_as, &spec, bwrap, &["--version"])? {
            Some(status) if status.exit_status() == Some(0) => Ok(()),
            other => Err(format!("bubblewrap did not run there ({other:?})")),
        }
    }

    /// Stages `spec` for `program` with `args`, and waits for the program:
    /// how it ended, if it started.
    fn stage_and_run(
        &self,
        run_as: Option<(u32, u32)>,
        spec: &StageSpec,
        program: &Path,
        args: &[&str],
    ) -> Result<Option<rustix::process::WaitStatus>, String> {
        let (entry, receipt) = self.entry(Some(spec), run_as).map_err(|e| e.to_string())?;
        self.run_entry(entry, receipt, run_as, program, args)
            .map(|(status, _)| status)
    }

    /// Runs `program` with `args` from a child entering the nest through
    /// `entry`, and waits for it: how it ended, if it started, and the
    /// descriptor its staging reported.
    fn run_entry(
        &self,
        entry: Entry,
        receipt: Receipt,
        run_as: Option<(u32, u32)>,
        program: &Path,
        args: &[&str],
    ) -> Result<(Option<rustix::process::WaitStatus>, Option<OwnedFd>), String> {
        let mut plan = ChildPlan::bare(run_as);
        plan.nest = Some(entry);
        let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        let spawned =
            super::launch::launch(program, &args, &plan, super::launch::Output::Discarded);
        drop(plan);
        let reported = receipt.collect(spawned.as_ref().ok().map(|l| l.pid));
        let status = reported
            .bubblewrap
            .and_then(rustix::process::Pid::from_raw)
            .and_then(|pid| {
                rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
                    .ok()
                    .flatten()
                    .map(|(_, status)| status)
            });
        match (spawned, reported.staged) {
            (_, Some(Ok(staged))) => Ok((status, Some(staged))),
            (_, Some(Err(why))) => Err(why),
            (Ok(_), None) => Err("staging ended without a word".to_string()),
            (Err(e), None) => Err(e.to_string()),
        }
    }
}

impl Drop for Nest {
    fn drop(&mut self) {
        // The holder ends when its stdin closes, taking the nest with it;
        // the nest's init ends only once every process of the nest has
        // been reaped, which includes any bubblewrap (the daemon's child)
        // killed but not yet reaped: reaped here while waiting.
        drop(self.holder.stdin.take());
        let deadline = Instant::now() + START_LIMIT;
        while matches!(self.holder.try_wait(), Ok(None)) {
            super::process::reap_orphans();
            if Instant::now() > deadline {
                let _ = self.holder.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.holder.wait();
    }
}

/// A root holder's user namespace gets every id mapped, as on the host.
fn map_if_root(holder: &mut Child) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    expect_line(holder, holder::MAP_ME, "the nest")?;
    for map in ["uid_map", "gid_map"] {
        std::fs::write(format!("/proc/{}/{map}", holder.id()), "0 0 4294967295")
            .map_err(|e| format!("cannot write the nest's {map}: {e}"))?;
    }
    let stdin = holder.stdin.as_mut().expect("piped");
    std::io::Write::write_all(stdin, b"g").map_err(|e| e.to_string())
}

/// Waits for the holder's ready line.
fn wait_ready(holder: &mut Child) -> Result<(), String> {
    expect_line(holder, holder::READY, "the nest")
}

/// Reads `line` from a helper of the nest (`what`: the holder, a store
/// view's helper), waiting no longer than [`START_LIMIT`].
/// Kills and reaps a helper run from this binary, and returns what it
/// said on its standard error, without its `prefix` (its name).
fn stop_helper(helper: &mut Child, prefix: &str) -> String {
    let _ = helper.kill();
    let mut why = String::new();
    if let Some(mut err) = helper.stderr.take() {
        let _ = err.read_to_string(&mut why);
    }
    let _ = helper.wait();
    why.trim().trim_start_matches(prefix).to_string()
}

fn expect_line(helper: &mut Child, line: &[u8], what: &str) -> Result<(), String> {
    let out = helper.stdout.as_ref().expect("piped");
    let limit = Timespec {
        tv_sec: START_LIMIT.as_secs() as i64,
        tv_nsec: 0,
    };
    let mut got = Vec::with_capacity(line.len());
    while got.len() < line.len() {
        let mut fds = [PollFd::new(out, PollFlags::IN)];
        match poll(&mut fds, Some(&limit)) {
            Ok(0) => return Err(format!("{what} did not start in time")),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.to_string()),
        }
        let mut byte = [0u8; 1];
        match rustix::io::read(out, &mut byte) {
            Ok(1) => got.push(byte[0]),
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    if got == line {
        Ok(())
    } else {
        Err(format!("{what} could not be created"))
    }
}

impl Entry {
    /// In the first child (see `exec::launch`): joins the nest's user
    /// namespace (gaining every capability there) and makes the nest's pid
    /// namespace its children's. A process cannot move itself into a pid
    /// namespace, and bubblewrap creates pid namespaces only from its own:
    /// the process that becomes the program is this one's child, started
    /// as the daemon's (`CLONE_PARENT`). Only system calls.
    pub(super) fn join(&self) -> std::io::Result<()> {
        let fail = |step: stage::Step, e: rustix::io::Errno| {
            stage::report(&self.socket, Err(step));
            std::io::Error::from(e)
        };
        rustix::thread::move_into_link_name_space(
            self.namespaces.user.as_fd(),
            Some(LinkNameSpaceType::User),
        )
        .map_err(|e| fail(stage::Step::UserNamespace, e))?;
        rustix::thread::move_into_link_name_space(
            self.namespaces.pid.as_fd(),
            Some(LinkNameSpaceType::ProcessID),
        )
        .map_err(|e| fail(stage::Step::PidNamespace, e))
    }

    /// In the first child, once its child has started (`Ok(pid)`, in the
    /// host's pid namespace) or could not be: tells the daemon.
    pub(super) fn report_started(&self, started: Result<i32, rustix::io::Errno>) {
        match started {
            Ok(pid) => stage::report_pid(&self.socket, pid),
            Err(_) => stage::report(&self.socket, Err(stage::Step::Fork)),
        }
    }

    /// In the process that becomes the program, inside the nest: its own
    /// process group (as the program's would be: kills reach it), then the
    /// sandbox's filesystems, reported to the daemon.
    pub(super) fn stage(&self) -> std::io::Result<()> {
        rustix::process::setpgid(None, None)?;
        let outcome = match &self.stage {
            None => return Ok(()),
            Some(Staging::Sandbox(plan)) => plan.apply().map(|(dir, network)| match network {
                None => stage::report(&self.socket, Ok(&[dir.as_fd()])),
                Some(network) => stage::report(&self.socket, Ok(&[dir.as_fd(), network.as_fd()])),
            }),
            Some(Staging::Template(template)) => template
                .apply()
                .map(|namespace| stage::report(&self.socket, Ok(&[namespace.as_fd()]))),
        };
        let Err(failed) = outcome else {
            return Ok(());
        };
        let (step, e) = failed;
        stage::report(&self.socket, Err(step));
        Err(e.into())
    }

    /// In the child, once it will die with the daemon: whether the daemon
    /// is still there (its parent is the daemon, which the nest's pid
    /// namespace cannot name).
    pub(super) fn daemon_alive(&self) -> bool {
        let mut fds = [PollFd::new(&self.namespaces.daemon, PollFlags::IN)];
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(poll(&mut fds, Some(&now)), Ok(0))
    }
}

impl Receipt {
    /// Reads what the child reported; call once the spawn has returned
    /// (with `intermediate`, the spawned process, when it succeeded), by
    /// when everything was sent.
    pub(super) fn collect(self, intermediate: Option<u32>) -> Reported {
        // The intermediate process exits at once, after reporting.
        if let Some(pid) = intermediate.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
        stage::receive(&self.0)
    }
}
