//! Recipes: everything a sandbox is fixed to before any call arrives
//! (bubblewrap's options, the command, the seccomp filter, the rlimits and
//! the cgroup limits), and the key under which prepared sandboxes wait.
//! Options are built with placeholder descriptors and paths, so equal calls
//! have equal keys.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::ExecError;
use super::nest::root::HostRoot;
use super::nest::view::View;
use super::nest::{ProjectSpec, StageSpec};
use super::warm::Warm;
use crate::environment::Environment;
use crate::jail::{self, CacheMount, Call, HostLayout, ProjectAccess, ProjectMount};
use crate::limits::{Enforcer, Rlimit};
use crate::seccomp::{self, Program};
use crate::sync::Recover;

/// What distinguishes one kind of prepared sandbox from another.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct RecipeKey {
    options: Vec<u8>,
    pub(super) command: Vec<String>,
    seccomp_allow: Vec<String>,
    rlimits: Vec<(u32, u64)>,
    init_rlimits: Vec<(u32, u64)>,
    memory_bytes: u64,
    pids: u64,
    stage: Option<StageSpec>,
    /// The closure, which a store view hides from the options.
    closure: Vec<std::path::PathBuf>,
}

/// Everything needed to prepare a sandbox for one kind of call.
#[derive(Debug)]
pub(super) struct Recipe {
    pub(super) key: RecipeKey,
    pub(super) env: Environment,
    pub(super) project: Option<ProjectMount>,
    pub(super) inherited: Vec<(String, String)>,
    pub(super) rlimits: Vec<Rlimit>,
    /// Set on the sandbox's init once its user namespace exists.
    pub(super) init_rlimits: Vec<Rlimit>,
    pub(super) program: Arc<Program>,
    /// Where the code file appears in the sandbox; none for a command run
    /// as is, which reads no code file.
    pub(super) code_path: Option<String>,
    /// Where the command starts, when not in the workspace.
    pub(super) workdir: Option<String>,
    /// What the sandbox may reach through the proxy, when it has network.
    pub(super) network: Option<Arc<crate::network::Policy>>,
    /// What the nest stages for it, when the nest stages sandboxes.
    pub(super) stage: Option<StageSpec>,
    /// A read-write project's protected paths that exist (see `jail`).
    pub(super) protected: Vec<String>,
    /// The environment's caches in this project.
    pub(super) caches: Vec<CacheMount>,
    /// The closure's store view, when the sandbox starts from one.
    pub(super) view: Option<Arc<View>>,
    /// The view the /proc masks are mounted from, when they are.
    pub(super) masks: Option<Arc<View>>,
    /// How its interpreter is pre-started, when it can be.
    pub(super) warm: Option<Warm>,
    /// Set when a sandbox of this recipe, let start ahead of its call, ran
    /// the code file anyway: its interpreter skips the hook, and the pool
    /// no longer starts it ahead.
    pub(super) warm_failed: AtomicBool,
}

/// Compiled seccomp filters, once per distinct allow-list.
#[derive(Debug, Default)]
pub(super) struct SeccompCache(Mutex<HashMap<Vec<String>, Arc<Program>>>);

impl SeccompCache {
    pub(super) fn get(&self, allow: &[String]) -> Result<Arc<Program>, seccomp::SeccompError> {
        let mut cache = self.0.lock().recover();
        if let Some(p) = cache.get(allow) {
            return Ok(p.clone());
        }
        let p = Arc::new(seccomp::compile(allow)?);
        cache.insert(allow.to_vec(), p.clone());
        Ok(p)
    }
}

/// What a sandbox mounts from views (see `nest::view`).
pub(super) struct FromViews<'a> {
    /// The closure's store view, and where it is mounted.
    pub(super) store: Option<(Arc<View>, &'a Path)>,
    /// The view the /proc masks come from.
    pub(super) masks: Option<Arc<View>>,
}

/// The inputs of a recipe besides the host's.
pub(super) struct Ingredients<'a> {
    pub(super) env: &'a Environment,
    pub(super) project: Option<&'a ProjectMount>,
    pub(super) inherited: &'a [(String, String)],
    /// Where the code (or a session's agent) file appears in the sandbox.
    pub(super) code_path: String,
    /// Arguments after the interpreter's command (a session agent's descriptors).
    pub(super) extra_args: Vec<String>,
    /// A command to run instead of the interpreter on the code file (a
    /// declared command's argv, run as is: no shell).
    pub(super) command: Option<Vec<String>>,
    /// Where the command starts, when not in the workspace.
    pub(super) workdir: Option<String>,
    /// Whether the interpreter may be pre-started (see `warm`).
    pub(super) prestart: bool,
}

impl<'a> Ingredients<'a> {
    /// A run of code in `env`: the code file at the environment's code
    /// path, run by its interpreter. Calls and the sandboxes kept ready for
    /// them are made from this, so that their keys match.
    pub(super) fn run(
        env: &'a Environment,
        project: Option<&'a ProjectMount>,
        inherited: &'a [(String, String)],
    ) -> Ingredients<'a> {
        Ingredients {
            env,
            project,
            inherited,
            code_path: jail::code_path(env),
            extra_args: Vec::new(),
            command: None,
            workdir: None,
            prestart: true,
        }
    }
}

impl Recipe {
    /// `staging` is where the nest stages sandboxes, when it does, and what
    /// their bubblewrap needs of the host's root when it runs in a root of
    /// its own; `views`, what the sandbox mounts from views.
    pub(super) fn new(
        layout: &HostLayout,
        enforcer: &Enforcer,
        seccomp: &SeccompCache,
        staging: Option<(&Path, Option<&HostRoot>)>,
        views: FromViews,
        caches: Vec<CacheMount>,
        i: Ingredients,
    ) -> Result<Recipe, ExecError> {
        let FromViews { store: view, masks } = views;
        let stage_root = staging.map(|(root, _)| root);
        let program = seccomp
            .get(&i.env.seccomp_allow)
            .map_err(|e| ExecError::Spawn(e.to_string()))?;
        let rlimits = enforcer.rlimits(&i.env.limits);
        let init_rlimits = enforcer.init_rlimits(&i.env.limits);
        let pairs = |rs: &[Rlimit]| rs.iter().map(|r| (r.resource as u32, r.value)).collect();
        let protected = existing_protected(i.project);
        // A command run as is reads no code file, so none is mounted.
        let (mut command, code_path) = match i.command {
            Some(command) => (command, None),
            None => (i.env.command_for(&i.code_path), Some(i.code_path)),
        };
        let warm = (i.prestart && code_path.is_some() && i.extra_args.is_empty())
            .then(|| Warm::plan(i.env, i.inherited, &command, stage_root.is_some()))
            .flatten();
        let hook_vars = warm.as_ref().map(|w| w.vars(0)).unwrap_or_default();
        // A staged sandbox without network gets its network namespace from
        // the stage (see `nest::network`).
        let network_given = stage_root.is_some() && i.env.network.policy().is_none();
        let placeholder = Call {
            env: i.env,
            project: i.project,
            code_file: code_path.as_deref().map(|at| (Path::new("/code"), at)),
            block_fd: Some(0),
            seccomp_fds: vec![0],
            status_fd: Some(0),
            inherited: i.inherited,
            workdir: i.workdir.as_deref(),
            staged: stage_root,
            store_view: view.as_ref().map(|_| 0),
            proc_masks_sync: masks.as_ref().map(|_| 0),
            mounts_from_outside: stage_root.is_some() && masks.is_some(),
            protected: &protected,
            caches: &caches,
            hook_vars: &hook_vars,
            network_given,
        };
        let (options, mut sources) = jail::bwrap_options_and_sources(layout, &placeholder);
        let project = i
            .project
            .filter(|p| p.overlay && p.access != ProjectAccess::ReadWrite)
            .map(|p| ProjectSpec {
                host_path: p.host_path.clone(),
                writable: p.access == ProjectAccess::Overlay,
            });
        // The stage binds the project (its overlay's lower layer) where the
        // sandbox's own root may already be its root (see `nest::stage`).
        sources.extend(project.as_ref().map(|p| p.host_path.clone()));
        let stage = staging.map(|(root, host_root)| StageSpec {
            host_root: host_root
                .map(|h| h.entries(&sources, root))
                .unwrap_or_default(),
            size_bytes: i.env.limits.workspace_bytes,
            files: i.env.limits.workspace_files,
            network: network_given,
            project,
        });
        command.extend(i.extra_args);
        Ok(Recipe {
            key: RecipeKey {
                options: nul_separated(options),
                command,
                seccomp_allow: i.env.seccomp_allow.clone(),
                rlimits: pairs(&rlimits),
                init_rlimits: pairs(&init_rlimits),
                memory_bytes: i.env.limits.memory_bytes,
                pids: i.env.limits.pids,
                stage: stage.clone(),
                closure: match &i.env.root {
                    crate::environment::RootFs::Closure { store_paths, .. } => store_paths.clone(),
                    crate::environment::RootFs::Host { .. } => Vec::new(),
                },
            },
            env: i.env.clone(),
            project: i.project.cloned(),
            inherited: i.inherited.to_vec(),
            rlimits,
            init_rlimits,
            program,
            code_path,
            workdir: i.workdir,
            network: i.env.network.policy().cloned().map(Arc::new),
            stage,
            protected,
            caches,
            view: view.map(|(v, _)| v),
            masks,
            warm,
            warm_failed: AtomicBool::new(false),
        })
    }
}

/// The protected paths of a read-write project that exist on the host as
/// files or directories, in directories that are directories too (a
/// symlink is not followed: binding its target could show the sandbox a
/// host file, and the jail binds each of those directories as well).
fn existing_protected(project: Option<&ProjectMount>) -> Vec<String> {
    let Some(p) = project.filter(|p| p.access == ProjectAccess::ReadWrite) else {
        return Vec::new();
    };
    let real = |rel: &Path, leaf: bool| {
        p.host_path
            .join(rel)
            .symlink_metadata()
            .is_ok_and(|m| m.is_dir() || (leaf && m.is_file()))
    };
    p.protected
        .iter()
        .filter(|rel| {
            real(Path::new(rel.trim_end_matches('/')), true)
                && jail::protected_path_dirs(rel).all(|dir| real(dir, false))
        })
        .cloned()
        .collect()
}

/// bubblewrap's `--args` format.
pub(super) fn nul_separated(args: Vec<OsString>) -> Vec<u8> {
    let mut out = Vec::new();
    for a in args {
        out.extend_from_slice(a.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::environment::RootFs;

    /// A view whose namespace is any descriptor: recipes only hold it.
    fn any_view() -> Arc<View> {
        let namespace = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        Arc::new(View {
            namespace,
            failed: Default::default(),
        })
    }

    fn key(closure: &[&str], view: bool, masks: bool) -> RecipeKey {
        let mut env = crate::app::self_test_env(Default::default());
        env.root = RootFs::Closure {
            store_paths: closure.iter().map(std::path::PathBuf::from).collect(),
            links: Vec::new(),
        };
        let views = FromViews {
            store: view.then(|| (any_view(), Path::new("/run/nsm/store-view"))),
            masks: masks.then(any_view),
        };
        Recipe::new(
            &HostLayout::default(),
            &Enforcer::rlimits_only("test", "unset it"),
            &SeccompCache::default(),
            Some((Path::new("/run/nsm/stage"), None)),
            views,
            Vec::new(),
            Ingredients {
                env: &env,
                project: None,
                inherited: &[],
                code_path: "/workspace/.main.sh".to_string(),
                extra_args: Vec::new(),
                command: None,
                workdir: None,
                prestart: true,
            },
        )
        .unwrap()
        .key
    }

    #[test]
    fn a_sandbox_prepared_for_one_closure_is_never_taken_for_another() {
        let a = ["/nix/store/aaa-bash", "/nix/store/bbb-glibc"];
        let b = ["/nix/store/aaa-bash", "/nix/store/ccc-glibc"];
        for view in [true, false] {
            assert_eq!(key(&a, view, true), key(&a, view, true));
            // Through a view the options are the same for both closures.
            assert_ne!(key(&a, view, true), key(&b, view, true), "view: {view}");
        }
        assert_ne!(key(&a, true, true), key(&a, false, true));
    }

    #[test]
    fn a_sandbox_prepared_with_the_proc_masks_from_their_view_is_never_taken_without() {
        let a = ["/nix/store/aaa-bash"];
        assert_ne!(key(&a, false, true), key(&a, false, false));
    }
}
