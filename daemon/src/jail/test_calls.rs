//! The calls the jail's tests plan: a host layout, an environment, and
//! `Call`, the inputs of one sandbox as the tests spell them, with helpers
//! that plan it and render the argv.

use super::*;
use crate::environment::{Origin, RootFs};
use crate::limits::Limits;
use crate::network::NetworkSetting;

pub(super) fn layout() -> HostLayout {
    HostLayout {
        system_dirs: vec!["/usr".into()],
        system_links: vec![("usr/bin".into(), "/bin".into())],
        etc_host: vec!["/etc/ld.so.cache".into()],
        etc_network: vec!["/etc/ssl/certs".into()],
        proc_masked_files: vec!["/proc/cmdline".into()],
        proc_masked_dirs: vec!["/proc/acpi".into()],
        empty_file: "/run/nsm/empty".into(),
        etc_dir: "/run/nsm/etc".into(),
        features: Features {
            disable_userns: true,
            add_seccomp_fd: true,
            json_status_fd: true,
        },
    }
}

pub(super) fn env() -> Environment {
    Environment {
        name: "python".into(),
        description: "Python".into(),
        origin: Origin::Host {
            program: "/usr/bin/python3".into(),
        },
        interpreter: vec!["python3".into(), "{file}".into()],
        file_name: ".main.py".into(),
        root: RootFs::Host { extra: vec![] },
        path: vec!["/usr/bin".into(), "/bin".into()],
        vars: [("PYTHONUNBUFFERED".to_string(), "1".to_string())].into(),
        limits: Limits::resolve(Default::default()),
        settings: Default::default(),
        network: NetworkSetting::Off,
        seccomp_allow: vec![],
        caches: vec![],
        cache_bytes: 0,
        tools: vec![],
        kind: None,
    }
}

/// One sandbox and its wiring, as the tests write them: a [`Sandbox`]
/// whose pipes are given as the descriptors bubblewrap reads them from.
#[derive(Clone)]
pub(super) struct Call<'a> {
    pub(super) env: &'a Environment,
    pub(super) project: Option<&'a ProjectMount>,
    /// The host's code file and where it appears.
    pub(super) code_file: Option<(&'a Path, &'a str)>,
    pub(super) block_fd: Option<i32>,
    pub(super) seccomp_fds: Vec<i32>,
    pub(super) status_fd: Option<i32>,
    pub(super) inherited: &'a [(String, String)],
    pub(super) workdir: Option<&'a str>,
    pub(super) staged: Option<&'a Path>,
    /// A store view's pipe.
    pub(super) store_view: Option<i32>,
    /// The /proc masks' pipe ([`ProcMasks::FromOutside`]).
    pub(super) proc_masks_sync: Option<i32>,
    pub(super) protected: &'a [String],
    pub(super) caches: &'a [CacheMount],
    pub(super) hook_vars: &'a [(String, Value)],
    pub(super) network_given: bool,
}

pub(super) fn argv(
    env: &Environment,
    project: Option<&ProjectMount>,
    inherited: &[(String, String)],
) -> Vec<String> {
    argv_staged(env, project, inherited, None)
}

pub(super) fn argv_staged(
    env: &Environment,
    project: Option<&ProjectMount>,
    inherited: &[(String, String)],
    staged: Option<&Path>,
) -> Vec<String> {
    options(&Call {
        code_file: Some((Path::new("/run/nsm/code/1"), "/workspace/.main.py")),
        block_fd: Some(11),
        seccomp_fds: vec![8, 9],
        status_fd: Some(10),
        inherited,
        staged,
        ..bare_call(env, project)
    })
}

/// A call with nothing but an environment and a project.
pub(super) fn bare_call<'a>(env: &'a Environment, project: Option<&'a ProjectMount>) -> Call<'a> {
    Call {
        env,
        project,
        code_file: None,
        block_fd: None,
        seccomp_fds: vec![],
        status_fd: None,
        inherited: &[],
        workdir: None,
        staged: None,
        store_view: None,
        proc_masks_sync: None,
        protected: &[],
        caches: &[],
        hook_vars: &[],
        network_given: false,
    }
}

const COMMAND: &[String] = &[];

fn plan_of(call: &Call) -> Plan {
    plan(
        &layout(),
        &Sandbox {
            env: call.env,
            project: call.project,
            code_at: call.code_file.map(|(_, at)| at),
            inherited: call.inherited,
            workdir: call.workdir,
            staged: call.staged,
            store_view: call.store_view.is_some(),
            proc_masks: match call.proc_masks_sync {
                Some(_) => ProcMasks::FromOutside,
                None => ProcMasks::Bubblewrap,
            },
            network_given: call.network_given,
            protected: call.protected,
            caches: call.caches,
            hook_vars: call.hook_vars,
            command: COMMAND,
        },
    )
}

pub(super) fn wiring<'a>(call: &Call<'a>) -> Wiring<'a> {
    Wiring {
        code_file: call.code_file.map(|(file, _)| file),
        block: call.block_fd,
        seccomp: call.seccomp_fds.clone(),
        status: call.status_fd,
        proc_masks: call.proc_masks_sync,
        store_view: call.store_view,
        go: None,
    }
}

pub(super) fn options(call: &Call) -> Vec<String> {
    super::options(&plan_of(call), layout().features, &wiring(call))
        .into_iter()
        .map(|s| s.into_string().unwrap())
        .collect()
}

pub(super) fn outside_mounts(call: &Call) -> OutsideMounts {
    plan_of(call).outside
}

/// Every bind's source in the options, then every mount from outside's.
pub(super) fn bind_sources(call: &Call) -> Vec<PathBuf> {
    sources(&plan_of(call))
}

/// True when `needle` appears in `hay` as consecutive arguments.
pub(super) fn has(hay: &[String], needle: &[&str]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.iter().zip(needle).all(|(a, b)| a == b))
}

pub(super) fn pos(hay: &[String], needle: &[&str]) -> usize {
    hay.windows(needle.len())
        .position(|w| w.iter().zip(needle).all(|(a, b)| a == b))
        .unwrap_or_else(|| panic!("{needle:?} not in {hay:?}"))
}

/// A staged call whose /etc and staged filesystems are mounted from
/// outside at the masks' sync (descriptor 12), its code written into the
/// staged /workspace.
pub(super) fn outside_call<'a>(
    env: &'a Environment,
    project: Option<&'a ProjectMount>,
) -> Call<'a> {
    Call {
        staged: Some(Path::new("/run/nsm/stage")),
        proc_masks_sync: Some(12),
        ..bare_call(env, project)
    }
}

pub(super) fn overlay_project() -> ProjectMount {
    ProjectMount {
        access: ProjectAccess::Overlay,
        overlay: true,
        ..read_write_project(&[])
    }
}

/// /home/u/proj read-write at /project, with `protected` protected.
pub(super) fn read_write_project(protected: &[String]) -> ProjectMount {
    ProjectMount {
        host_path: "/home/u/proj".into(),
        mount_point: "/project".into(),
        access: ProjectAccess::ReadWrite,
        overlay: false,
        downgraded: false,
        protected: protected.to_vec(),
    }
}
