//! What this host offers the sandbox, probed once at start-up: the bubblewrap
//! binary and its features (which one, and why: `bwrap.rs`), the layout of
//! the system directories, a prepared
//! `/etc`, and the host identity bubblewrap runs as. Owns the server's
//! runtime directory, and removes those of servers that were killed.
//! Produces the jail's [`HostLayout`]; runs nothing inside a sandbox itself.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::jail::{HostLayout, SANDBOX_GID, SANDBOX_UID, SANDBOX_USER};

pub mod bwrap;

/// Host uid and gid bubblewrap runs as when the daemon itself is root. Root's
/// uid would otherwise stay 0 on the host side of the user namespace, where the
/// kernel still grants it owner access to files such as /proc/sys/*.
pub const UNPRIVILEGED_ID: u32 = 65534;

#[derive(Debug)]
pub struct Platform {
    pub bwrap: PathBuf,
    pub bwrap_version: String,
    /// Why that bubblewrap, and which were passed over (`bwrap.rs`).
    pub bwrap_chosen: bwrap::Chosen,
    pub layout: HostLayout,
    /// `(uid, gid)` to switch to before starting bubblewrap, when running as root.
    pub run_as: Option<(u32, u32)>,
    /// An empty directory: where the nest mounts each sandbox's staged
    /// tmpfs, every one in a mount namespace of its own.
    pub stage_dir: PathBuf,
    /// An empty directory: where each store view's tmpfs is mounted, every
    /// one in a mount namespace of its own (see `exec::nest::view`).
    pub view_dir: PathBuf,
    /// An empty, read-only directory: what covers the /proc directories a
    /// sandbox must not see, when the masks come from a view (see
    /// `exec::nest::view`).
    pub empty_dir: PathBuf,
    /// Where the code of each run is written (mode 0700, owned by the uid
    /// bubblewrap runs as): the file is bound into the sandbox read-only.
    code_dir: PathBuf,
    _runtime_dir: tempfile::TempDir,
    /// Locked for the server's life: the runtime directory is in use.
    _owner: Option<fs::File>,
}

/// Runtime directories are `$TMPDIR/nix-sandbox-mcp-*`.
const RUNTIME_PREFIX: &str = "nix-sandbox-mcp-";

/// The file in a runtime directory that its server holds an exclusive
/// `flock` on while it lives. The lock goes with the server however it
/// ends, so a directory whose lock can be taken was left by a server that
/// was killed outright (SIGKILL, a crash) and is removed by the next one.
const OWNER_LOCK: &str = "owner.lock";

#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error(
        "bubblewrap (bwrap) is not installed: none on PATH, beside this binary or in a Nix profile"
    )]
    NoBwrap,
    #[error("cannot run {path}: {error}")]
    BwrapBroken { path: PathBuf, error: String },
    #[error("cannot prepare the sandbox's runtime directory: {0}")]
    RuntimeDir(std::io::Error),
}

impl PlatformError {
    /// A concrete next step for the operator.
    pub fn fix(&self) -> String {
        match self {
            PlatformError::NoBwrap => "install bubblewrap: `apt install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` (Fedora), `pacman -S bubblewrap` (Arch); without root, `nix profile install nixpkgs#bubblewrap` (found in ~/.nix-profile/bin), or run the Nix package, which brings its own".to_string(),
            PlatformError::BwrapBroken { .. } => format!("reinstall bubblewrap, put a working `bwrap` first on PATH, or name one with {}=PATH (without root: `nix profile install nixpkgs#bubblewrap`)", bwrap::BWRAP_VAR),
            PlatformError::RuntimeDir(_) => "make sure $TMPDIR (or /tmp) exists and is writable".to_string(),
        }
    }
}

impl Platform {
    /// Adds a file to the `/etc` sandboxes see (`at` is its path there),
    /// readable by every sandbox: never anything secret.
    pub fn add_etc_file(&self, at: &str, text: &str) -> std::io::Result<()> {
        let inside = Path::new(at)
            .strip_prefix("/etc")
            .map_err(|_| std::io::Error::other(format!("{at} is not under /etc")))?;
        let target = self.layout.etc_dir.join(inside);
        let mut dir = target.parent();
        if let Some(parent) = dir {
            fs::create_dir_all(parent)?;
        }
        fs::write(&target, text)?;
        fs::set_permissions(&target, fs::Permissions::from_mode(0o644))?;
        while let Some(d) = dir.filter(|d| d.starts_with(&self.layout.etc_dir)) {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
            dir = d.parent();
        }
        Ok(())
    }

    /// Probes the host, with the bubblewrap `bwrap` when one is named
    /// (`NIX_SANDBOX_BWRAP`), else the first fit (see [`bwrap::choose`]).
    pub fn probe(bwrap: Option<&Path>) -> Result<Platform, PlatformError> {
        let chosen = bwrap::choose(bwrap)?;
        let (bwrap, bwrap_version, help) = (
            chosen.path.clone(),
            chosen.version.clone(),
            chosen.help.clone(),
        );

        remove_stale_runtime_dirs(&std::env::temp_dir());
        let runtime_dir = tempfile::Builder::new()
            .prefix(RUNTIME_PREFIX)
            .tempdir()
            .map_err(PlatformError::RuntimeDir)?;
        let owner = lock_owner(runtime_dir.path());
        let mut layout = probe_layout();
        layout.features.disable_userns = help.contains("--disable-userns");
        layout.features.add_seccomp_fd = help.contains("--add-seccomp-fd");
        layout.features.json_status_fd = help.contains("--json-status-fd");
        layout.etc_dir =
            prepare_etc(runtime_dir.path(), &layout).map_err(PlatformError::RuntimeDir)?;
        layout.empty_file = runtime_dir.path().join("empty");
        fs::write(&layout.empty_file, b"")
            .and_then(|()| {
                fs::set_permissions(&layout.empty_file, fs::Permissions::from_mode(0o444))
            })
            .map_err(PlatformError::RuntimeDir)?;
        let run_as = rustix::process::geteuid()
            .is_root()
            .then_some((UNPRIVILEGED_ID, UNPRIVILEGED_ID));
        let stage_dir = runtime_dir.path().join("stage");
        fs::create_dir(&stage_dir).map_err(PlatformError::RuntimeDir)?;
        let view_dir = runtime_dir.path().join("store-view");
        fs::create_dir(&view_dir).map_err(PlatformError::RuntimeDir)?;
        let empty_dir = runtime_dir.path().join("empty-dir");
        fs::create_dir(&empty_dir)
            .and_then(|()| fs::set_permissions(&empty_dir, fs::Permissions::from_mode(0o555)))
            .map_err(PlatformError::RuntimeDir)?;
        let code_dir = runtime_dir.path().join("code");
        fs::create_dir(&code_dir).map_err(PlatformError::RuntimeDir)?;
        fs::set_permissions(&code_dir, fs::Permissions::from_mode(0o700))
            .map_err(PlatformError::RuntimeDir)?;
        if let Some((uid, gid)) = run_as {
            let owner = (
                rustix::process::Uid::from_raw(uid),
                rustix::process::Gid::from_raw(gid),
            );
            rustix::fs::chown(&code_dir, Some(owner.0), Some(owner.1))
                .map_err(|e| PlatformError::RuntimeDir(e.into()))?;
        }
        Ok(Platform {
            bwrap,
            bwrap_version,
            bwrap_chosen: chosen,
            layout,
            run_as,
            stage_dir,
            view_dir,
            empty_dir,
            code_dir,
            _runtime_dir: runtime_dir,
            _owner: owner,
        })
    }

    /// A new, empty file for one run's code, readable by the sandbox only;
    /// removed when the returned value is dropped.
    pub fn code_file(&self) -> std::io::Result<tempfile::NamedTempFile> {
        let file = tempfile::Builder::new()
            .prefix("code-")
            .permissions(fs::Permissions::from_mode(0o600))
            .tempfile_in(&self.code_dir)?;
        if let Some((uid, gid)) = self.run_as {
            rustix::fs::fchown(
                file.as_file(),
                Some(rustix::process::Uid::from_raw(uid)),
                Some(rustix::process::Gid::from_raw(gid)),
            )?;
        }
        Ok(file)
    }
}

/// Takes the owner lock of a new runtime directory. The lock file gets its
/// name only once locked, so no other server finds it unlocked; where the
/// filesystem has no `flock`, there is none, and the directory is never
/// taken for a killed server's.
fn lock_owner(dir: &Path) -> Option<fs::File> {
    use rustix::fs::{FlockOperation, flock};
    let pending = dir.join(format!("{OWNER_LOCK}.new"));
    let file = fs::File::create(&pending).ok()?;
    let locked = flock(&file, FlockOperation::NonBlockingLockExclusive)
        .map_err(std::io::Error::from)
        .and_then(|()| fs::rename(&pending, dir.join(OWNER_LOCK)));
    match locked {
        Ok(()) => Some(file),
        Err(e) => {
            tracing::debug!("no owner lock in {}: {e}", dir.display());
            let _ = fs::remove_file(&pending);
            None
        }
    }
}

/// Removes the runtime directories in `parent` that killed servers of this
/// uid left: those whose owner lock nobody holds, and with nothing mounted
/// in them.
fn remove_stale_runtime_dirs(parent: &Path) {
    use rustix::fs::{FlockOperation, flock};
    use std::os::unix::fs::MetadataExt;
    let Ok(parent) = fs::canonicalize(parent) else {
        return;
    };
    let Ok(entries) = fs::read_dir(&parent) else {
        return;
    };
    let me = rustix::process::geteuid().as_raw();
    let mut mount_points: Option<Vec<PathBuf>> = None;
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(RUNTIME_PREFIX)
        {
            continue;
        }
        let dir = entry.path();
        let Ok(meta) = fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        let Ok(lock) = fs::File::open(dir.join(OWNER_LOCK)) else {
            continue;
        };
        // Held (by its server, alive) or not ours to take.
        if flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        let points = mount_points.get_or_insert_with(|| {
            crate::mountinfo::mounts()
                .into_iter()
                .map(|m| m.point)
                .collect()
        });
        if points.iter().any(|p| p.starts_with(&dir)) {
            tracing::warn!(
                "{} was left by a killed server but has mounts in it; leaving it",
                dir.display()
            );
            continue;
        }
        match remove_on_one_filesystem(&dir, meta.dev()) {
            Ok(()) => tracing::debug!("removed {}, left by a killed server", dir.display()),
            Err(e) => tracing::debug!("cannot remove {}: {e}", dir.display()),
        }
    }
}

/// Removes `dir` and what it holds, but nothing on another filesystem: a
/// mount point in it stops the removal there.
fn remove_on_one_filesystem(dir: &Path, device: u64) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    // Ours: let us list and empty directories that were made read-only.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let meta = fs::symlink_metadata(&path)?;
        if !meta.is_dir() {
            fs::remove_file(&path)?;
        } else if meta.dev() == device {
            remove_on_one_filesystem(&path, device)?;
        } else {
            return Err(std::io::Error::other(format!(
                "{} is a mount point",
                path.display()
            )));
        }
    }
    fs::remove_dir(dir)
}

/// True when every directory from / down to `path` lets others in and list
/// it: what a sandbox started as [`UNPRIVILEGED_ID`] needs to bind `path`.
pub fn world_readable_dir(path: &Path) -> bool {
    path.ancestors().enumerate().all(|(depth, p)| {
        let need = if depth == 0 { 0o005 } else { 0o001 };
        fs::metadata(p)
            .map(|m| m.permissions().mode() & need == need)
            .unwrap_or(false)
    })
}

const SYSTEM_TOP_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
/// Host `/etc` entries every host-mode program needs: the loader cache, the
/// alternatives links, the time zone. Bound, so they stay current.
const ETC_HOST: &[&str] = &["/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"];
/// Host `/etc` entries a sandbox with network needs: certificates for TLS
/// through the proxy's tunnels (end to end), and the service and protocol
/// tables. No resolver configuration: the proxy resolves names, and nothing
/// inside should try DNS.
const ETC_NETWORK: &[&str] = &[
    "/etc/services",
    "/etc/protocols",
    // Certificates and the TLS configuration, never the private keys kept
    // beside them (/etc/ssl/private, /etc/pki/tls/private).
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/pki/ca-trust",
    "/etc/pki/tls/certs",
    "/etc/pki/tls/openssl.cnf",
];

/// Host-identifying files under `/proc`, masked in every sandbox: Docker's
/// masked files, plus what names this boot and this kernel's build.
const PROC_MASKED_FILES: &[&str] = &[
    "/proc/cmdline",
    "/proc/config.gz",
    "/proc/sys/kernel/random/boot_id",
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/kallsyms",
    "/proc/modules",
    "/proc/interrupts",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
];
/// Hardware directories under `/proc`, emptied in every sandbox (Docker's).
const PROC_MASKED_DIRS: &[&str] = &["/proc/acpi", "/proc/asound", "/proc/scsi"];

/// System directories as they are on this host (merged /usr or not).
pub fn probe_layout() -> HostLayout {
    let mut layout = HostLayout::default();
    for d in SYSTEM_TOP_DIRS {
        let p = Path::new(d);
        match fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = fs::read_link(p) {
                    layout.system_links.push((target, p.to_path_buf()));
                }
            }
            Ok(m) if m.is_dir() => layout.system_dirs.push(p.to_path_buf()),
            _ => {}
        }
    }
    let existing = |list: &[&str]| {
        list.iter()
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .collect()
    };
    layout.etc_host = existing(ETC_HOST);
    layout.etc_network = existing(ETC_NETWORK);
    // The sandbox's /proc is a new procfs of the same kernel: what exists
    // here exists there.
    layout.proc_masked_files = existing(PROC_MASKED_FILES);
    layout.proc_masked_dirs = existing(PROC_MASKED_DIRS);
    layout
}

/// Writes the sandbox's `/etc`: its own passwd, group and hosts, and empty
/// mount points for the host entries bound on top.
fn prepare_etc(runtime: &Path, layout: &HostLayout) -> std::io::Result<PathBuf> {
    fs::set_permissions(runtime, fs::Permissions::from_mode(0o755))?;
    let etc = runtime.join("etc");
    fs::create_dir(&etc)?;
    let files = [
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/bin/sh\n{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_GID}:{SANDBOX_USER}:{}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
                crate::jail::WORKSPACE
            ),
        ),
        (
            "group",
            format!("root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            format!(
                "127.0.0.1 localhost {0}\n::1 localhost {0}\n",
                crate::jail::HOSTNAME
            ),
        ),
    ];
    for (name, text) in files {
        fs::write(etc.join(name), text)?;
    }
    for host in layout.etc_host.iter().chain(&layout.etc_network) {
        let Ok(inside) = host.strip_prefix("/etc") else {
            continue;
        };
        let target = etc.join(inside);
        if target.exists() {
            continue;
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        if host.is_dir() {
            fs::create_dir(&target)?;
        } else {
            fs::write(&target, "")?;
        }
    }
    set_modes(&etc)?;
    Ok(etc)
}

/// Makes the prepared /etc readable by the sandbox: directories 0755, files 0644.
fn set_modes(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            set_modes(&path)?;
        } else {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
        }
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_etc_has_identity_and_mount_points() {
        let dir = tempfile::tempdir().unwrap();
        let layout = HostLayout {
            etc_host: vec!["/etc/ld.so.cache".into()],
            etc_network: vec!["/etc/ssl/certs".into()],
            ..Default::default()
        };
        let etc = prepare_etc(dir.path(), &layout).unwrap();
        let passwd = fs::read_to_string(etc.join("passwd")).unwrap();
        assert!(passwd.contains("sandbox:x:1000:1000:sandbox:/workspace:"));
        assert!(etc.join("hosts").is_file());
        assert!(etc.join("ld.so.cache").is_file());
        if Path::new("/etc/ssl/certs").is_dir() {
            assert!(etc.join("ssl/certs").is_dir());
            assert!(!etc.join("ssl/private").exists());
        }
    }

    /// Everything the layout binds into a sandbox, in host mode and networked.
    fn bound(l: &HostLayout) -> Vec<&Path> {
        l.system_dirs
            .iter()
            .chain(&l.etc_host)
            .chain(&l.etc_network)
            .map(PathBuf::as_path)
            .collect()
    }

    #[test]
    fn layout_never_includes_secrets() {
        let l = probe_layout();
        if Path::new("/usr").is_dir() {
            assert!(l.system_dirs.contains(&PathBuf::from("/usr")));
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let secrets = [
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/sudoers",
            "/etc/ssh",
            "/root",
            "/home",
            "/var",
            "/run",
            "/tmp",
        ];
        for p in bound(&l) {
            assert!(p.exists(), "{} is bound but missing", p.display());
            for s in secrets.iter().map(Path::new).chain(home.as_deref()) {
                assert!(
                    !s.starts_with(p),
                    "binding {} exposes {}",
                    p.display(),
                    s.display()
                );
            }
        }
        for p in l.etc_host.iter().chain(&l.etc_network) {
            assert!(p.starts_with("/etc"), "{}", p.display());
        }
    }

    /// Files under the bound /etc entries that not everyone may read: a
    /// sandbox running as a user who may read them would see them too.
    fn private_entries(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(meta) = fs::symlink_metadata(dir) else {
            return;
        };
        if meta.file_type().is_symlink() {
            return;
        }
        if meta.permissions().mode() & 0o004 == 0 {
            found.push(dir.to_path_buf());
        }
        if meta.is_dir()
            && let Ok(entries) = fs::read_dir(dir)
        {
            for e in entries.flatten() {
                private_entries(&e.path(), found);
            }
        }
    }

    #[test]
    fn a_sandbox_with_network_gets_no_resolver_configuration() {
        // The proxy resolves names; nothing inside should try DNS.
        for f in &probe_layout().etc_network {
            assert!(
                !["resolv.conf", "nsswitch.conf", "host.conf", "gai.conf"]
                    .iter()
                    .any(|r| f.ends_with(r)),
                "{}",
                f.display()
            );
        }
    }

    #[test]
    fn bound_etc_entries_hold_nothing_private() {
        let l = probe_layout();
        let mut found = Vec::new();
        for p in l.etc_host.iter().chain(&l.etc_network) {
            private_entries(p, &mut found);
        }
        assert!(found.is_empty(), "bound but private: {found:?}");
    }
}
