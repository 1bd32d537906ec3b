//! Recipes: everything a sandbox is fixed to before any call arrives: its
//! [`Plan`] (see `jail`), the compiled seccomp filter, the rlimits, what the
//! nest stages and the views it mounts from. The pool keeps prepared
//! sandboxes under their plan ([`RecipeKey`]): equal plans, interchangeable
//! sandboxes.

use std::collections::HashMap;
use std::ffi::OsString;
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use super::nest::StageSpec;
use super::nest::root::HostRoot;
use super::nest::view::View;
use super::warm::Warm;
use super::{ExecError, SpawnStep};
use crate::environment::Environment;
use crate::jail::{self, CacheMount, HostLayout, Plan, ProcMasks, ProjectAccess, ProjectMount};
use crate::limits::{Enforcer, Rlimit};
use crate::seccomp::{self, Program};
use crate::sync::Recover;

/// The pool's key: a recipe's plan, hashed once. Two keys are equal
/// exactly when their plans are.
#[derive(Debug, Clone)]
pub(super) struct RecipeKey {
    hash: u64,
    plan: Arc<Plan>,
}

impl RecipeKey {
    fn of(plan: Arc<Plan>) -> RecipeKey {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        plan.hash(&mut hasher);
        RecipeKey {
            hash: hasher.finish(),
            plan,
        }
    }
}

impl PartialEq for RecipeKey {
    fn eq(&self, other: &RecipeKey) -> bool {
        self.hash == other.hash && (Arc::ptr_eq(&self.plan, &other.plan) || self.plan == other.plan)
    }
}

impl Eq for RecipeKey {}

impl Hash for RecipeKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Everything needed to prepare a sandbox for one kind of call.
#[derive(Debug)]
pub(super) struct Recipe {
    pub(super) key: RecipeKey,
    pub(super) plan: Arc<Plan>,
    pub(super) env: Environment,
    pub(super) rlimits: Vec<Rlimit>,
    /// Set on the sandbox's init once its user namespace exists.
    pub(super) init_rlimits: Vec<Rlimit>,
    pub(super) program: Arc<Program>,
    /// What the sandbox may reach through the proxy, when it has network.
    pub(super) network: Option<Arc<crate::network::Policy>>,
    /// What the nest stages for it, when the nest stages sandboxes.
    pub(super) stage: Option<StageSpec>,
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
pub(super) struct FromViews {
    /// The closure's store view.
    pub(super) store: Option<Arc<View>>,
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
            .map_err(|e| SpawnStep::Seccomp.failed(std::io::Error::other(e)))?;
        let protected = existing_protected(i.project);
        // A command run as is reads no code file.
        let (mut command, code_at) = match i.command {
            Some(command) => (command, None),
            None => (i.env.command_for(&i.code_path), Some(i.code_path)),
        };
        let warm = (i.prestart && code_at.is_some() && i.extra_args.is_empty())
            .then(|| Warm::plan(i.env, i.inherited, &command, stage_root.is_some()))
            .flatten();
        let hook_vars = warm.as_ref().map(Warm::vars).unwrap_or_default();
        command.extend(i.extra_args);
        let plan = Arc::new(jail::plan(
            layout,
            &jail::Sandbox {
                env: i.env,
                project: i.project,
                code_at: code_at.as_deref(),
                inherited: i.inherited,
                workdir: i.workdir.as_deref(),
                staged: stage_root,
                store_view: view.is_some(),
                proc_masks: match (&masks, stage_root) {
                    (Some(_), Some(_)) => ProcMasks::FromOutside,
                    _ => ProcMasks::Bubblewrap,
                },
                // A staged sandbox without network gets its network
                // namespace from the stage (see `nest::network`).
                network_given: stage_root.is_some(),
                protected: &protected,
                caches: &caches,
                hook_vars: &hook_vars,
                command: &command,
            },
        ));
        let stage = match (staging, &plan.stage) {
            (Some((_, host_root)), Some(stage)) => {
                let mut sources = jail::sources(&plan);
                // The stage binds the project (its overlay's lower layer)
                // where the sandbox's own root may already be its root
                // (see `nest::stage`).
                sources.extend(stage.project.as_ref().map(|p| p.host_path.clone()));
                Some(StageSpec {
                    host_root: host_root
                        .map(|h| h.entries(&sources, &stage.root))
                        .unwrap_or_default(),
                    size_bytes: stage.size_bytes,
                    files: stage.files,
                    network: plan.network == jail::NetworkNamespace::Given,
                    project: stage.project.clone(),
                })
            }
            _ => None,
        };
        Ok(Recipe {
            key: RecipeKey::of(plan.clone()),
            plan,
            env: i.env.clone(),
            rlimits: enforcer.rlimits(&i.env.limits),
            init_rlimits: enforcer.init_rlimits(&i.env.limits),
            program,
            network: i.env.network.policy().cloned().map(Arc::new),
            stage,
            view,
            masks: masks.filter(|_| stage_root.is_some()),
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
            store: view.then(any_view),
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
    fn a_change_to_any_part_of_the_plan_is_another_key() {
        let base = (*key(&["/nix/store/aaa-bash"], true, true).plan).clone();
        let key_of = |plan: &Plan| RecipeKey::of(Arc::new(plan.clone()));
        assert_eq!(key_of(&base), key_of(&base));
        // Destructured without `..`: a field added to the plan must be
        // added here, with a change that must make another key.
        let Plan {
            network,
            uid,
            gid,
            hostname,
            refuse_nested_userns,
            vars,
            ops,
            workdir,
            outside,
            stage,
            code,
            seccomp_allow,
            limits,
            command,
        } = base.clone();
        let push = |mut v: Vec<String>| {
            v.push("x".into());
            v
        };
        let changed = [
            Plan {
                network: match network {
                    jail::NetworkNamespace::Own => jail::NetworkNamespace::Given,
                    jail::NetworkNamespace::Given => jail::NetworkNamespace::Own,
                },
                ..base.clone()
            },
            Plan {
                uid: uid + 1,
                ..base.clone()
            },
            Plan {
                gid: gid + 1,
                ..base.clone()
            },
            Plan {
                hostname: hostname + "x",
                ..base.clone()
            },
            Plan {
                refuse_nested_userns: !refuse_nested_userns,
                ..base.clone()
            },
            Plan {
                vars: [vars, vec![("X".into(), jail::Value::GoPipe)]].concat(),
                ..base.clone()
            },
            Plan {
                ops: ops[1..].to_vec(),
                ..base.clone()
            },
            Plan {
                workdir: workdir + "/sub",
                ..base.clone()
            },
            Plan {
                outside: jail::OutsideMounts {
                    read_only_root: !outside.read_only_root,
                    ..outside
                },
                ..base.clone()
            },
            Plan {
                stage: stage.map(|s| jail::Stage {
                    files: s.files + 1,
                    ..s
                }),
                ..base.clone()
            },
            Plan {
                code: match code {
                    jail::Code::None => jail::Code::Bound { at: "/x".into() },
                    _ => jail::Code::None,
                },
                ..base.clone()
            },
            Plan {
                seccomp_allow: push(seccomp_allow),
                ..base.clone()
            },
            Plan {
                limits: crate::limits::Limits {
                    pids: limits.pids + 1,
                    ..limits
                },
                ..base.clone()
            },
            Plan {
                command: push(command),
                ..base.clone()
            },
        ];
        for plan in &changed {
            assert_ne!(plan, &base);
            assert_ne!(key_of(plan), key_of(&base), "{plan:?}");
        }
    }

    #[test]
    fn a_sandbox_prepared_with_the_proc_masks_from_their_view_is_never_taken_without() {
        let a = ["/nix/store/aaa-bash"];
        assert_ne!(key(&a, false, true), key(&a, false, false));
    }
}
