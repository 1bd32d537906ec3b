//! Tests of host mode: presets, and which directories of the host a
//! sandbox is shown for an interpreter (never a home or a secret).

use std::path::Path;

use super::find::*;
use super::*;
use std::os::unix::fs::PermissionsExt;

#[test]
fn preset_aliases() {
    assert_eq!(preset_for("shell"), Some("bash"));
    assert_eq!(preset_for("python3"), Some("python"));
    assert_eq!(preset_for("ruby"), None);
}

/// A directory outside /tmp (the sandbox's own) that others can read.
fn scratch() -> tempfile::TempDir {
    let d = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

fn host(homes: &[&Path], sandbox_is_other_user: bool) -> Host {
    Host {
        homes: homes.iter().map(|h| h.to_path_buf()).collect(),
        sandbox_is_other_user,
    }
}

fn prefix_with(root: &Path, name: &str, entries: &[&str]) -> PathBuf {
    let prefix = root.join(name);
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    for e in entries {
        std::fs::write(prefix.join(e), "").unwrap();
    }
    prefix
}

#[test]
fn homes_their_ancestors_and_what_the_sandbox_owns_are_never_bound() {
    let d = scratch();
    let home = d.path().join("home/me");
    std::fs::create_dir_all(&home).unwrap();
    let h = host(&[&home], false);
    for refused in [
        Path::new("/"),
        Path::new("/opt"),
        &home,
        &d.path().join("home"),
        d.path(),
    ] {
        assert!(h.check_bindable(refused).is_err(), "{}", refused.display());
    }
    let e = h.check_bindable(&home).unwrap_err();
    assert!(e.why.contains("is a home directory"), "{e:?}");
    let t = tempfile::tempdir().unwrap();
    let in_tmp = prefix_with(t.path(), "py", &[]);
    assert!(
        h.check_bindable(&in_tmp)
            .unwrap_err()
            .why
            .contains("which the sandbox replaces")
    );
}

#[test]
fn a_prefix_inside_home_is_bound_when_it_holds_nothing_secrets_like() {
    let d = scratch();
    let home = d.path().join("home");
    let h = host(&[&home], false);
    let versions = home.join(".pyenv/versions");
    let clean = prefix_with(
        &versions,
        "3.11.7",
        &["pyvenv.cfg", ".gitignore", ".lock", "LICENSE"],
    );
    assert_eq!(h.check_bindable(&clean), Ok(()));
    for secret in [
        ".env",
        ".git",
        "id_ed25519",
        "aws-credentials",
        "server.pem",
    ] {
        let p = prefix_with(&versions, &format!("with{secret}"), &[secret]);
        let e = h.check_bindable(&p).unwrap_err();
        assert!(e.why.contains(secret), "{secret}: {e:?}");
    }
}

#[test]
fn a_root_server_binds_only_what_others_may_read() {
    let d = scratch();
    let private = d.path().join("private");
    let prefix = prefix_with(&private, "node", &[]);
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(host(&[], false).check_bindable(&prefix), Ok(()));
    let e = host(&[], true).check_bindable(&prefix).unwrap_err();
    assert!(
        e.why.contains("uid 65534") && e.fix.contains("/opt"),
        "{e:?}"
    );
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(host(&[], true).check_bindable(&prefix), Ok(()));
}

#[test]
fn a_link_to_a_system_program_runs_the_system_program() {
    // A link outside the bound directories would not exist in the sandbox.
    let d = scratch();
    let link = d.path().join("sh");
    std::os::unix::fs::symlink("/bin/sh", &link).unwrap();
    let (program, binds) = host(&[], false).examine(&link).unwrap();
    assert!(in_system_dirs(&program), "{}", program.display());
    assert!(binds.is_empty());
}

#[test]
fn scripts_that_are_not_shims_are_passed_over() {
    let d = scratch();
    let bin = d.path().join("tool/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("python3");
    std::fs::write(&script, "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n").unwrap();
    assert_eq!(shim_manager(&script), None);
    let e = host(&[], false).examine(&script).unwrap_err();
    assert!(e.why.contains("is a script"), "{e:?}");
}

#[test]
fn shims_name_their_version_manager() {
    let d = scratch();
    let tool = d.path().join("libexec/pyenv");
    std::fs::create_dir_all(tool.parent().unwrap()).unwrap();
    std::fs::write(&tool, "#!/bin/sh\n").unwrap();
    let shim = d.path().join("python3");
    std::fs::write(
        &shim,
        format!("#!/usr/bin/env bash\nset -e\nprogram=\"${{0##*/}}\"\nexec \"{}\" exec \"$program\" \"$@\"\n", tool.display()),
    )
    .unwrap();
    assert_eq!(shim_manager(&shim), Some(Manager { tool: tool.clone() }));
    assert_eq!(Manager { tool }.display_name(), "pyenv");
    // mise's shims are links to mise itself.
    let mise = d.path().join("mise");
    std::fs::copy("/bin/true", &mise).unwrap();
    let node = d.path().join("node");
    std::os::unix::fs::symlink(&mise, &node).unwrap();
    assert_eq!(
        shim_manager(&node).map(|m| m.display_name()).as_deref(),
        Some("mise")
    );
    assert_eq!(shim_manager(Path::new("/bin/sh")), None);
}

#[test]
fn a_virtualenv_is_known_by_its_pyvenv_cfg() {
    let d = scratch();
    let venv = prefix_with(d.path(), "venv", &["pyvenv.cfg"]);
    assert_eq!(virtualenv_of(&venv.join("bin/python3")), Some(venv));
    assert_eq!(virtualenv_of(Path::new("/usr/bin/python3")), None);
}

#[test]
fn install_prefix_of_bin_program() {
    assert_eq!(
        install_prefix(Path::new("/opt/node/v20/bin/node")),
        Some(PathBuf::from("/opt/node/v20"))
    );
    assert_eq!(install_prefix(Path::new("/opt/node/node")), None);
}

#[test]
fn description_from_probe() {
    let env = host_environment(
        "python",
        "/usr/bin/python3".into(),
        vec![],
        ".main.py",
        Some(InterpreterKind::Python),
        vec![],
        Default::default(),
    );
    let env = describe_from_probe(env, "3.11.2\nrequests pytest\n");
    assert_eq!(env.description, "Python 3.11.2 with requests, pytest");
}

#[test]
fn a_store_interpreter_brings_its_closure_never_the_whole_store() {
    let valid = std::fs::read_dir("/nix/store").ok().and_then(|entries| {
        entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .find_map(|p| {
                store_closure(&p.join("bin/interpreter"))
                    .ok()
                    .map(|c| (p, c))
            })
    });
    let Some((top, closure)) = valid else {
        crate::skip::skip(
            "registry::host::a_store_interpreter_brings_its_closure_never_the_whole_store",
            "no valid Nix store path and nix-store here",
        );
        return;
    };
    assert!(closure.contains(&top), "{closure:?}");
    assert!(
        closure
            .iter()
            .all(|p| p.starts_with("/nix/store/") && p != Path::new("/nix/store"))
    );
    let e = store_closure(Path::new(
        "/nix/store/00000000000000000000000000000000-absent/bin/x",
    ))
    .unwrap_err();
    assert!(e.contains("nix-store --query --requisites"), "{e}");
}
