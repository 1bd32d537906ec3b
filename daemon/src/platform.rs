//! What this host offers the sandbox, probed once at start-up: the bubblewrap
//! binary and its features, the layout of the system directories, a prepared
//! `/etc`, and the host identity bubblewrap runs as. Produces the jail's
//! [`HostLayout`]; runs nothing inside a sandbox itself.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::jail::{HostLayout, SANDBOX_GID, SANDBOX_UID, SANDBOX_USER};

/// Host uid and gid bubblewrap runs as when the daemon itself is root. Root's
/// uid would otherwise stay 0 on the host side of the user namespace, where the
/// kernel still grants it owner access to files such as /proc/sys/*.
pub const UNPRIVILEGED_ID: u32 = 65534;

#[derive(Debug)]
pub struct Platform {
    pub bwrap: PathBuf,
    pub bwrap_version: String,
    pub layout: HostLayout,
    /// `(uid, gid)` to switch to before starting bubblewrap, when running as root.
    pub run_as: Option<(u32, u32)>,
    /// The copied host `/etc` entries and the modification time of each when copied.
    etc_copied: std::sync::Mutex<Vec<(PathBuf, Option<std::time::SystemTime>)>>,
    _runtime_dir: tempfile::TempDir,
}

#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error("bubblewrap (bwrap) is not installed or not on PATH")]
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
            PlatformError::NoBwrap => "install bubblewrap: `apt install bubblewrap` (Debian/Ubuntu), `dnf install bubblewrap` (Fedora), `pacman -S bubblewrap` (Arch), or run the Nix package, which brings its own".to_string(),
            PlatformError::BwrapBroken { .. } => "reinstall bubblewrap, or put a working `bwrap` first on PATH".to_string(),
            PlatformError::RuntimeDir(_) => "make sure $TMPDIR (or /tmp) exists and is writable".to_string(),
        }
    }
}

impl Platform {
    pub fn probe() -> Result<Platform, PlatformError> {
        let bwrap = which::which("bwrap").map_err(|_| PlatformError::NoBwrap)?;
        let run = |arg: &str| {
            Command::new(&bwrap)
                .arg(arg)
                .output()
                .map_err(|e| PlatformError::BwrapBroken {
                    path: bwrap.clone(),
                    error: e.to_string(),
                })
        };
        let version = run("--version")?;
        let bwrap_version = String::from_utf8_lossy(&version.stdout)
            .trim()
            .trim_start_matches("bubblewrap ")
            .to_string();
        let help = run("--help")?;
        let help = String::from_utf8_lossy(&help.stdout).into_owned()
            + &String::from_utf8_lossy(&help.stderr);

        let runtime_dir = tempfile::Builder::new()
            .prefix("nix-sandbox-mcp-")
            .tempdir()
            .map_err(PlatformError::RuntimeDir)?;
        let mut layout = probe_layout();
        layout.disable_userns = help.contains("--disable-userns");
        layout.add_seccomp_fd = help.contains("--add-seccomp-fd");
        layout.json_status_fd = help.contains("--json-status-fd");
        layout.etc_dir =
            prepare_etc(runtime_dir.path(), &layout).map_err(PlatformError::RuntimeDir)?;
        let run_as = rustix::process::geteuid()
            .is_root()
            .then_some((UNPRIVILEGED_ID, UNPRIVILEGED_ID));
        let etc_copied = ETC_COPIED
            .iter()
            .map(|p| (PathBuf::from(p), modified(Path::new(p))))
            .collect();
        Ok(Platform {
            bwrap,
            bwrap_version,
            layout,
            run_as,
            etc_copied: std::sync::Mutex::new(etc_copied),
            _runtime_dir: runtime_dir,
        })
    }

    /// Re-copies the host `/etc` entries that changed since they were copied
    /// (a package installed while the server runs). Blocking file I/O.
    pub fn refresh_etc(&self) {
        let mut copied = self.etc_copied.lock().unwrap_or_else(|p| p.into_inner());
        for (src, when) in copied.iter_mut() {
            let now = modified(src);
            if now == *when {
                continue;
            }
            match copy_entry(src, &self.layout.etc_dir) {
                Ok(()) => *when = now,
                Err(e) => tracing::warn!(
                    "cannot refresh the sandbox's copy of {}: {e}",
                    src.display()
                ),
            }
        }
    }

    /// The host uid whose processes count against the sandbox's process limit.
    pub fn sandbox_host_uid(&self) -> u32 {
        self.run_as
            .map(|(u, _)| u)
            .unwrap_or_else(|| rustix::process::geteuid().as_raw())
    }
}

const SYSTEM_TOP_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
/// Host `/etc` entries copied into the sandbox's `/etc` (one bind instead of
/// three; each bind costs about 0.15 ms per run) and refreshed while running.
const ETC_COPIED: &[&str] = &["/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"];
const ETC_NETWORK: &[&str] = &[
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
];

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
    layout.etc_network = ETC_NETWORK
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect();
    layout
}

/// Writes the sandbox's `/etc`: its own passwd, group and hosts, copies of
/// the host entries every host-mode program needs, and empty mount points for
/// the network entries bound on top.
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
    for host in &layout.etc_network {
        let Some(name) = host.file_name() else {
            continue;
        };
        let target = etc.join(name);
        if target.exists() {
            continue;
        }
        if host.is_dir() {
            fs::create_dir(&target)?;
        } else {
            fs::write(&target, "")?;
        }
    }
    for entry in fs::read_dir(&etc)? {
        let entry = entry?;
        let mode = if entry.path().is_dir() { 0o755 } else { 0o644 };
        fs::set_permissions(entry.path(), fs::Permissions::from_mode(mode))?;
    }
    fs::set_permissions(&etc, fs::Permissions::from_mode(0o755))?;
    for src in ETC_COPIED {
        copy_entry(Path::new(src), &etc)?;
    }
    Ok(etc)
}

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    fs::symlink_metadata(p).and_then(|m| m.modified()).ok()
}

/// Copies one host `/etc` entry into `dir`, replacing the previous copy
/// atomically: a file or symlink as such, a directory with its files and
/// symlinks (not subdirectories). A missing source is skipped.
fn copy_entry(src: &Path, dir: &Path) -> std::io::Result<()> {
    let (Some(name), Ok(meta)) = (src.file_name(), fs::symlink_metadata(src)) else {
        return Ok(());
    };
    let dest = dir.join(name);
    let fresh = dir.join(format!(".{}.new", name.to_string_lossy()));
    let _ = fs::remove_dir_all(&fresh).or_else(|_| fs::remove_file(&fresh));
    if meta.is_dir() {
        fs::create_dir(&fresh)?;
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let to = fresh.join(entry.file_name());
            if kind.is_symlink() {
                std::os::unix::fs::symlink(fs::read_link(entry.path())?, &to)?;
            } else if kind.is_file() {
                fs::copy(entry.path(), &to)?;
            }
        }
        fs::set_permissions(&fresh, fs::Permissions::from_mode(0o755))?;
    } else if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, &fresh)?;
    } else {
        fs::copy(src, &fresh)?;
        fs::set_permissions(&fresh, fs::Permissions::from_mode(0o644))?;
    }
    if dest.symlink_metadata().is_ok() {
        // Swap, so a sandbox starting meanwhile sees the old or the new copy, never none.
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &fresh,
            rustix::fs::CWD,
            &dest,
            rustix::fs::RenameFlags::EXCHANGE,
        )?;
        fs::remove_dir_all(&fresh).or_else(|_| fs::remove_file(&fresh))?;
    } else {
        fs::rename(&fresh, &dest)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_etc_has_identity_copies_and_mount_points() {
        let dir = tempfile::tempdir().unwrap();
        let layout = HostLayout {
            etc_network: vec!["/etc/ssl".into()],
            ..Default::default()
        };
        let etc = prepare_etc(dir.path(), &layout).unwrap();
        let passwd = fs::read_to_string(etc.join("passwd")).unwrap();
        assert!(passwd.contains("sandbox:x:1000:1000:sandbox:/workspace:"));
        assert!(etc.join("hosts").is_file());
        if Path::new("/etc/ld.so.cache").is_file() {
            assert_eq!(
                fs::read(etc.join("ld.so.cache")).unwrap(),
                fs::read("/etc/ld.so.cache").unwrap()
            );
        }
        if Path::new("/etc/ssl").is_dir() {
            assert!(etc.join("ssl").is_dir());
        }
    }

    #[test]
    fn copies_are_replaced_whole() {
        let src = tempfile::tempdir().unwrap();
        let alt = src.path().join("alternatives");
        fs::create_dir(&alt).unwrap();
        std::os::unix::fs::symlink("/usr/bin/mawk", alt.join("awk")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/vim", alt.join("editor")).unwrap();
        let dest = tempfile::tempdir().unwrap();
        copy_entry(&alt, dest.path()).unwrap();
        assert_eq!(
            fs::read_link(dest.path().join("alternatives/awk")).unwrap(),
            Path::new("/usr/bin/mawk")
        );
        fs::remove_file(alt.join("editor")).unwrap();
        fs::remove_file(alt.join("awk")).unwrap();
        std::os::unix::fs::symlink("/usr/bin/gawk", alt.join("awk")).unwrap();
        copy_entry(&alt, dest.path()).unwrap();
        assert_eq!(
            fs::read_link(dest.path().join("alternatives/awk")).unwrap(),
            Path::new("/usr/bin/gawk")
        );
        assert!(!dest.path().join("alternatives/editor").exists());
        assert_eq!(
            fs::read_dir(dest.path()).unwrap().count(),
            1,
            "no leftovers"
        );
    }

    #[test]
    fn layout_never_includes_secrets() {
        let l = probe_layout();
        if Path::new("/usr").is_dir() {
            assert!(l.system_dirs.contains(&PathBuf::from("/usr")));
        }
        for p in ETC_COPIED
            .iter()
            .map(Path::new)
            .chain(l.etc_network.iter().map(PathBuf::as_path))
        {
            assert!(
                !p.ends_with("shadow") && !p.ends_with("sudoers") && !p.starts_with("/etc/ssh"),
                "{}",
                p.display()
            );
        }
    }
}
