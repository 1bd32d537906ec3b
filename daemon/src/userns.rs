//! What keeps this host from making the user namespaces every sandbox needs
//! (the nest's and bubblewrap's), and the fix for each. Read from /proc and
//! /sys under a root a test replaces with a tree of its own, so each case
//! is tested without the host it describes.
//!
//! | obstacle | how it shows | fix |
//! |---|---|---|
//! | AppArmor's restriction (Ubuntu 23.10 and later) | `kernel/apparmor_restrict_unprivileged_userns` = 1, no `nix-sandbox-mcp` profile loaded | load `deploy/apparmor/nix-sandbox-mcp`, or turn the restriction off |
//! | Debian's switch (kernels before 6.x) | `kernel/unprivileged_userns_clone` = 0 | the sysctl, persisted |
//! | no user namespaces at all | `user/max_user_namespaces` = 0 | the sysctl; in a container, the runtime's setting |
//! | a seccomp filter (a container runtime's default profile, a service's `SystemCallFilter=`) | this process runs under one (`Seccomp: 2`) | the runtime's flags (Docker, Podman, Kubernetes, devcontainer.json), or the filter's allowing `unshare`, `clone` and `mount` |
//!
//! Only what stops user namespaces is listed: the last is read only where
//! a sandbox failed to start (a filter that allows them is no obstacle).
//!
//! docs/security.md ("User namespaces: AppArmor and containers") shows the
//! same table, the profile and each runtime's flags; a test holds the two
//! to the same words.

use std::path::{Path, PathBuf};

/// Where the shipped AppArmor profile lives in the source tree.
pub const APPARMOR_PROFILE: &str = "deploy/apparmor/nix-sandbox-mcp";
/// The section of docs/security.md the fixes point to.
pub const DOC_SECTION: &str = "User namespaces: AppArmor and containers";
/// The name the shipped profile loads under.
const PROFILE_NAME: &str = "nix-sandbox-mcp";

/// A container runtime, as far as it can be told from inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Docker,
    Podman,
    Kubernetes,
    /// A container of another runtime (containerd, LXC, …).
    Other,
}

/// One thing that stops user namespaces here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obstacle {
    AppArmor,
    UsernsCloneOff,
    NoUserNamespaces,
    /// This process runs under a seccomp filter, as containers do (in the
    /// runtime, when one can be told).
    Seccomp(Option<Runtime>),
}

impl Obstacle {
    /// What is in the way, in a sentence.
    pub fn why(&self) -> String {
        match self {
            Obstacle::AppArmor => "AppArmor lets only programs with a profile create user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1, as on Ubuntu 23.10 and later), and no nix-sandbox-mcp profile is loaded".to_string(),
            Obstacle::UsernsCloneOff => "unprivileged user namespaces are switched off (kernel.unprivileged_userns_clone = 0)".to_string(),
            Obstacle::NoUserNamespaces => "user namespaces are switched off (user.max_user_namespaces = 0)".to_string(),
            Obstacle::Seccomp(Some(r)) => format!(
                "this runs in a container ({}) under a seccomp filter, and such a runtime's default profile refuses the user namespaces and mounts a sandbox needs",
                r.name()
            ),
            Obstacle::Seccomp(None) => "this process runs under a seccomp filter (Seccomp: 2 in /proc/self/status) that refuses the user namespaces a sandbox needs, as a container runtime's default profile does".to_string(),
        }
    }

    /// The step that removes it.
    pub fn fix(&self) -> String {
        match self {
            Obstacle::AppArmor => format!(
                "load the AppArmor profile the repository ships, which lets this binary and bubblewrap create user namespaces and nothing else: `sudo install -m 644 {APPARMOR_PROFILE} /etc/apparmor.d/ && sudo apparmor_parser -r /etc/apparmor.d/nix-sandbox-mcp`; or, for every program, `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` (docs/security.md, \"{DOC_SECTION}\")"
            ),
            Obstacle::UsernsCloneOff => "`sudo sysctl -w kernel.unprivileged_userns_clone=1`, and persist it in /etc/sysctl.d/".to_string(),
            Obstacle::NoUserNamespaces => "`sudo sysctl -w user.max_user_namespaces=15000`, and persist it in /etc/sysctl.d/ (in a container, the limit is the container's: set it where the container is started)".to_string(),
            Obstacle::Seccomp(Some(r)) => r.fix(),
            Obstacle::Seccomp(None) => format!(
                "start the server without that filter, or with one that allows unshare, clone and mount with namespace flags (for a systemd service, SystemCallFilter= must not deny @mount or the namespace calls; for a container, see {:?} in docs/security.md)",
                DOC_SECTION
            ),
        }
    }
}

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Docker => "Docker",
            Runtime::Podman => "Podman",
            Runtime::Kubernetes => "Kubernetes",
            Runtime::Other => "a container runtime",
        }
    }

    /// The runtime's way to give the container user namespaces, mounts and
    /// its own /proc; the sandbox's own seccomp filter still applies inside.
    pub fn fix(self) -> String {
        let runtime = match self {
            Runtime::Docker => {
                "start the container with `docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined …` (in devcontainer.json: \"runArgs\": [\"--security-opt\", \"seccomp=unconfined\", \"--security-opt\", \"apparmor=unconfined\", \"--security-opt\", \"systempaths=unconfined\"])"
            }
            Runtime::Podman => {
                "start the container with `podman run --security-opt seccomp=unconfined --security-opt label=disable --security-opt unmask=ALL …`"
            }
            Runtime::Kubernetes => {
                "give the pod `hostUsers: false` and the container `securityContext: {procMount: Unmasked, seccompProfile: {type: Unconfined}, appArmorProfile: {type: Unconfined}}`"
            }
            Runtime::Other => {
                "start the container with its runtime's default seccomp and AppArmor profiles off for it and /proc unmasked, or run the server outside the container"
            }
        };
        format!(
            "{runtime}; the sandbox's own seccomp filter and namespaces still apply inside (docs/security.md, \"{DOC_SECTION}\")"
        )
    }
}

/// The host as seen under `root` ("/" outside tests).
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
}

impl Default for Host {
    fn default() -> Host {
        Host::at("/")
    }
}

impl Host {
    pub fn at(root: impl Into<PathBuf>) -> Host {
        Host { root: root.into() }
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(path.trim_start_matches('/')))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn exists(&self, path: &str) -> bool {
        self.root.join(path.trim_start_matches('/')).exists()
    }

    /// What stops user namespaces here by the host's settings, most
    /// specific first.
    pub fn obstacles(&self) -> Vec<Obstacle> {
        let mut found = Vec::new();
        if self
            .read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
            .as_deref()
            == Some("1")
            && !self.apparmor_profile_loaded()
        {
            found.push(Obstacle::AppArmor);
        }
        if self
            .read("/proc/sys/kernel/unprivileged_userns_clone")
            .as_deref()
            == Some("0")
        {
            found.push(Obstacle::UsernsCloneOff);
        }
        if self.read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
            found.push(Obstacle::NoUserNamespaces);
        }
        found
    }

    /// What stopped a sandbox whose bubblewrap said `stderr`: the host's
    /// settings, else a seccomp filter this process runs under.
    pub fn obstacles_after_failure(&self) -> Vec<Obstacle> {
        let mut found = self.obstacles();
        if found.is_empty() && self.under_seccomp() {
            found.push(Obstacle::Seccomp(self.container()));
        }
        found
    }

    /// Whether the shipped profile (or one of its name) is loaded.
    fn apparmor_profile_loaded(&self) -> bool {
        self.read("/sys/kernel/security/apparmor/profiles")
            .is_some_and(|list| {
                list.lines()
                    .any(|l| l.split_whitespace().next() == Some(PROFILE_NAME))
            })
    }

    /// Whether this process runs under a seccomp filter (mode 2).
    fn under_seccomp(&self) -> bool {
        self.read("/proc/self/status").is_some_and(|s| {
            s.lines()
                .any(|l| l.strip_prefix("Seccomp:").is_some_and(|v| v.trim() == "2"))
        })
    }

    /// The container runtime this process runs under, if any.
    pub fn container(&self) -> Option<Runtime> {
        let cgroup = self.read("/proc/1/cgroup").unwrap_or_default();
        if self.exists("/var/run/secrets/kubernetes.io") || cgroup.contains("kubepods") {
            return Some(Runtime::Kubernetes);
        }
        if self.exists("/run/.containerenv") {
            return Some(Runtime::Podman);
        }
        if self.exists("/.dockerenv") || cgroup.contains("/docker") {
            return Some(Runtime::Docker);
        }
        let init_env = std::fs::read(self.root.join("proc/1/environ")).unwrap_or_default();
        if init_env
            .split(|b| *b == 0)
            .any(|v| v.starts_with(b"container="))
        {
            return Some(Runtime::Other);
        }
        None
    }

    /// The fix for a sandbox that could not start with bubblewrap's
    /// message `stderr`: the first obstacle's, else a container's, else
    /// the general word.
    pub fn fix_for(&self, stderr: &str) -> String {
        // bubblewrap names the sandbox's hostname in the UTS namespace it
        // made; only a seccomp filter refuses that (systemd's
        // ProtectHostname= installs one that every child inherits).
        if stderr.contains("Can't set hostname") {
            return "a seccomp filter this process runs under refuses sethostname(), which bubblewrap calls in every sandbox's own UTS namespace; for a systemd service, remove ProtectHostname= (its filter is inherited by every sandbox; docs/nix.md lists the options a service cannot use)".to_string();
        }
        if let Some(o) = self.obstacles_after_failure().first() {
            return format!("{}: {}", o.why(), o.fix());
        }
        let refused = [
            "Operation not permitted",
            "Permission denied",
            "No permissions",
            "namespaces exceeded",
        ]
        .iter()
        .any(|m| stderr.contains(m));
        match (refused, self.container()) {
            (true, Some(r)) => format!("the kernel refused to create namespaces in this container: {}", r.fix()),
            (true, None) => "the kernel refused to create namespaces; run `nix-sandbox-mcp doctor` for what is in the way".to_string(),
            _ => "check that bubblewrap can run (`bwrap --unshare-all --ro-bind / / true`), and run `nix-sandbox-mcp doctor` for details; bubblewrap's message is above".to_string(),
        }
    }
}

/// A path in the source tree, for tests that hold docs and code together.
pub fn source_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake host: `files` as (path under root, contents).
    fn host(files: &[(&str, &str)]) -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let h = Host::at(dir.path());
        (dir, h)
    }

    const APPARMOR_ON: (&str, &str) = (
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
        "1\n",
    );

    #[test]
    fn ubuntus_apparmor_restriction_is_found_until_the_profile_is_loaded() {
        let (_d, h) = host(&[
            APPARMOR_ON,
            (
                "/sys/kernel/security/apparmor/profiles",
                "firefox (enforce)\nbwrap (unconfined)\n",
            ),
        ]);
        assert_eq!(h.obstacles(), [Obstacle::AppArmor]);
        let fix = h.fix_for("bwrap: setting up uid map: Permission denied");
        assert!(
            fix.contains(APPARMOR_PROFILE) && fix.contains("apparmor_parser -r"),
            "{fix}"
        );
        assert!(
            fix.contains("apparmor_restrict_unprivileged_userns=0"),
            "{fix}"
        );
        let (_d, h) = host(&[
            APPARMOR_ON,
            (
                "/sys/kernel/security/apparmor/profiles",
                "nix-sandbox-mcp (unconfined)\n",
            ),
        ]);
        assert_eq!(h.obstacles(), []);
        let (_d, h) = host(&[(
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "0\n",
        )]);
        assert_eq!(h.obstacles(), []);
    }

    #[test]
    fn switched_off_user_namespaces_are_found_with_their_sysctl() {
        let (_d, h) = host(&[
            ("/proc/sys/kernel/unprivileged_userns_clone", "0\n"),
            ("/proc/sys/user/max_user_namespaces", "0\n"),
        ]);
        assert_eq!(
            h.obstacles(),
            [Obstacle::UsernsCloneOff, Obstacle::NoUserNamespaces]
        );
        assert!(h.fix_for("").contains("unprivileged_userns_clone=1"));
    }

    #[test]
    fn each_container_runtime_is_told_apart_and_gets_its_own_flags() {
        let seccomp = (
            "/proc/self/status",
            "Name:\tx\nSeccomp:\t2\nSeccomp_filters:\t1\n",
        );
        for (marker, runtime, flag) in [
            (
                ("/.dockerenv", ""),
                Runtime::Docker,
                "--security-opt seccomp=unconfined",
            ),
            (("/run/.containerenv", ""), Runtime::Podman, "podman run"),
            (
                ("/var/run/secrets/kubernetes.io/token", "x"),
                Runtime::Kubernetes,
                "procMount: Unmasked",
            ),
            (
                ("/proc/1/environ", "container=lxc\0"),
                Runtime::Other,
                "unmasked",
            ),
        ] {
            let (_d, h) = host(&[marker, seccomp]);
            assert_eq!(h.container(), Some(runtime), "{marker:?}");
            assert_eq!(h.obstacles(), []);
            assert_eq!(
                h.obstacles_after_failure(),
                [Obstacle::Seccomp(Some(runtime))]
            );
            assert!(
                h.fix_for("Operation not permitted").contains(flag),
                "{runtime:?}"
            );
        }
        // A container without a seccomp filter is not an obstacle in itself.
        let (_d, h) = host(&[("/.dockerenv", "")]);
        assert_eq!(h.obstacles_after_failure(), []);
        assert!(
            h.fix_for("unshare: Operation not permitted")
                .contains("systempaths=unconfined")
        );
        // A filter outside any container: said, with what it must allow.
        let (_d, h) = host(&[seccomp]);
        assert_eq!(h.container(), None);
        assert_eq!(h.obstacles_after_failure(), [Obstacle::Seccomp(None)]);
        let fix = h.fix_for("bwrap: Can't set hostname to sandbox: Operation not permitted");
        assert!(fix.contains("remove ProtectHostname="), "{fix}");
        assert!(h.fix_for("").contains("SystemCallFilter="));
    }

    #[test]
    fn the_docs_and_the_shipped_profile_say_what_the_fixes_say() {
        let doc = std::fs::read_to_string(source_path("docs/security.md")).unwrap();
        assert!(
            doc.contains(&format!("## {DOC_SECTION}")),
            "docs/security.md has no section {DOC_SECTION:?}"
        );
        let section = doc.split(&format!("## {DOC_SECTION}")).nth(1).unwrap();
        let section = section.split("\n## ").next().unwrap();
        for words in [
            "apparmor_restrict_unprivileged_userns",
            APPARMOR_PROFILE,
            "apparmor_parser -r /etc/apparmor.d/nix-sandbox-mcp",
            "unprivileged_userns_clone",
            "max_user_namespaces",
            "--security-opt seccomp=unconfined",
            "systempaths=unconfined",
            "podman run",
            "procMount: Unmasked",
            "runArgs",
        ] {
            assert!(section.contains(words), "the section lacks {words:?}");
        }
        let profile = std::fs::read_to_string(source_path(APPARMOR_PROFILE)).unwrap();
        assert!(
            profile.contains(&format!("profile {PROFILE_NAME} ")),
            "{profile}"
        );
        assert!(
            profile.contains("bin/bwrap") && profile.contains("bin/nix-sandbox-mcp"),
            "{profile}"
        );
        assert!(profile.matches("userns,").count() >= 2, "{profile}");
    }
}
