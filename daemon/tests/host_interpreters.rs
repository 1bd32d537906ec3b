//! Host interpreters as users have them: a version manager's shim, a
//! virtualenv or an nvm install first on PATH. Each test builds the real
//! layout (real interpreters copied or linked into it) and runs the real
//! binary, as root and, where the answer differs, as the user
//! [`TEST_USER`]. Where that cannot be done (not root, or no such user),
//! the test says it skipped, on stderr and in `NSM_SKIP_LOG`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::skip::skip;

const BIN: &str = env!("CARGO_BIN_EXE_nix-sandbox-mcp");

/// The non-root user the test suite creates (test-local.sh:
/// `useradd --create-home nsm-tester`).
const TEST_USER: &str = "nsm-tester";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn is_root() -> bool {
    rustix_uid() == 0
}

fn rustix_uid() -> u32 {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap())
}

/// A directory outside /tmp (which every sandbox replaces with its own)
/// that every user can enter.
fn scratch() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("nsm-host-")
        .tempdir_in("/var/tmp")
        .unwrap();
    chmod(d.path(), 0o755);
    d
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn write_executable(p: &Path, content: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
    chmod(p, 0o755);
}

/// PATH with `first` in front of the system directories only, so the
/// machine's own shims do not interfere.
fn path_with(first: &Path) -> String {
    format!("{}:/usr/local/bin:/usr/bin:/bin", first.display())
}

/// The binary with `home` as HOME and `path` as PATH.
fn nsm(home: &Path, path: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .env("HOME", home)
        .env("PATH", path)
        .env("PROJECT_DIR", env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

/// The same, run as [`TEST_USER`].
fn nsm_as_tester(home: &Path, path: &str, args: &[&str]) -> Output {
    let mut words = vec![
        "env".to_string(),
        format!("HOME={}", home.display()),
        format!("PATH={path}"),
        format!("PROJECT_DIR={}", env!("CARGO_MANIFEST_DIR")),
        BIN.to_string(),
    ];
    words.extend(args.iter().map(|a| a.to_string()));
    as_tester(&words)
}

fn as_tester(words: &[String]) -> Output {
    let quoted: Vec<String> = words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
        .collect();
    Command::new("su")
        .args([TEST_USER, "-s", "/bin/sh", "-c", &quoted.join(" ")])
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// [`TEST_USER`]'s home directory, or why the test cannot run the
/// server as that user here.
fn test_user_home() -> Result<PathBuf, String> {
    if !is_root() {
        return Err(format!("needs root, to run the server as {TEST_USER}"));
    }
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split(':').collect();
            (fields.len() >= 7 && fields[0] == TEST_USER).then(|| PathBuf::from(fields[5]))
        })
        .ok_or_else(|| {
            format!(
                "no user {TEST_USER} (test-local.sh creates it: useradd --create-home {TEST_USER})"
            )
        })
}

/// `chown -R` to [`TEST_USER`].
fn give_to_test_user(path: &Path) {
    let o = Command::new("chown")
        .arg("-R")
        .arg(format!("{TEST_USER}:{TEST_USER}"))
        .arg(path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
}

/// `envs --json` as (environment name → source) and the warnings.
fn envs(o: &Output) -> (Vec<(String, String)>, String) {
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o.stderr)));
    let envs = v["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (envs, v["warnings"].to_string())
}

fn source_of(envs: &[(String, String)], name: &str) -> String {
    envs.iter()
        .find(|(n, _)| n == name)
        .map(|(_, s)| s.clone())
        .unwrap_or_else(|| panic!("no {name} in {envs:?}"))
}

/// The system Python's real binary and version directory name (python3.11).
fn system_python() -> (PathBuf, String) {
    let real = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let name = real.file_name().unwrap().to_str().unwrap().to_string();
    (real, name)
}

/// A pyenv root as pyenv lays it out: a `shims/python3` script that runs
/// `pyenv exec`, and `versions/3.99.0`, a Python install prefix (the
/// system's interpreter copied in, its standard library linked).
fn fake_pyenv(root: &Path) -> PathBuf {
    let (python, name) = system_python();
    let version = root.join("versions/3.99.0");
    std::fs::create_dir_all(version.join("bin")).unwrap();
    std::fs::create_dir_all(version.join("lib")).unwrap();
    std::fs::copy(&python, version.join("bin").join(&name)).unwrap();
    std::os::unix::fs::symlink(&name, version.join("bin/python3")).unwrap();
    std::os::unix::fs::symlink(
        Path::new("/usr/lib").join(&name),
        version.join("lib").join(&name),
    )
    .unwrap();
    write_executable(
        &root.join("libexec/pyenv"),
        &format!(
            "#!/bin/sh\ncase \"$1\" in\n  which) echo \"{v}/bin/$2\" ;;\n  exec) shift; p=$1; shift; exec \"{v}/bin/$p\" \"$@\" ;;\nesac\n",
            v = version.display()
        ),
    );
    write_executable(
        &root.join("shims/python3"),
        &format!(
            "#!/usr/bin/env bash\nset -e\nprogram=\"${{0##*/}}\"\nexport PYENV_ROOT=\"{r}\"\nexec \"{r}/libexec/pyenv\" exec \"$program\" \"$@\"\n",
            r = root.display()
        ),
    );
    version
}

const WHERE_AM_I: &str = "import sys; print(sys.executable); print(sys.prefix)";

/// `o`, the output of WHERE_AM_I, says it ran the python installed at `version`.
fn assert_ran_python_of(o: &Output, version: &Path) {
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{}/bin/python3", version.display())),
        "{out}"
    );
    assert_eq!(lines[1], version.display().to_string(), "{out}");
}

#[test]
fn a_pyenv_shim_first_on_path_serves_the_python_pyenv_names() {
    let d = scratch();
    let home = d.path().join("home");
    let version = fake_pyenv(&home.join(".pyenv"));
    let path = path_with(&home.join(".pyenv/shims"));
    let o = nsm(&home, &path, &["envs", "--json"]);
    let (list, warnings) = envs(&o);
    assert!(
        source_of(&list, "python").starts_with(&format!("host {}/bin/python3", version.display())),
        "{list:?}"
    );
    assert_eq!(warnings, "[]");
    let o = nsm(&home, &path, &["run", "-e", "python", WHERE_AM_I]);
    assert_ran_python_of(&o, &version);
}

/// A pyenv install under a home only its owner may enter.
fn private_pyenv() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let d = scratch();
    let home = d.path().join("home");
    let version = fake_pyenv(&home.join(".pyenv"));
    chmod(&home, 0o700);
    (d, home, version)
}

#[test]
fn a_pyenv_install_the_sandbox_cannot_read_is_passed_over_with_the_path_and_the_fix() {
    if !is_root() {
        skip(
            "a_pyenv_install_the_sandbox_cannot_read_is_passed_over_with_the_path_and_the_fix",
            "needs root (only a root server runs sandboxes as another uid)",
        );
        return;
    }
    // As root, sandboxes run as uid 65534: a prefix under a private
    // directory cannot be bound, so the next python3 on PATH is served.
    let (_d, home, version) = private_pyenv();
    let o = nsm(
        &home,
        &path_with(&home.join(".pyenv/shims")),
        &["envs", "--json"],
    );
    let (list, warnings) = envs(&o);
    assert_eq!(source_of(&list, "python"), "host /usr/bin/python3");
    for s in [
        format!("{}/.pyenv/shims/python3", home.display()),
        format!("pyenv runs {}/bin/python3", version.display()),
        "uid 65534".to_string(),
        "fix: run the server as the user whose interpreter this is".to_string(),
    ] {
        assert!(warnings.contains(&s), "{s}: {warnings}");
    }
    // `run` names the problem for the environment it runs, and only then.
    let shims = path_with(&home.join(".pyenv/shims"));
    let o = nsm(&home, &shims, &["run", "-e", "python", "print(6 * 7)"]);
    assert_eq!(text(&o.stdout), "42\n");
    assert!(
        text(&o.stderr)
            .starts_with("nix-sandbox-mcp: warning: environment python uses /usr/bin/python3"),
        "{}",
        text(&o.stderr)
    );
    let o = nsm(&home, &shims, &["run", "-e", "bash", "echo hi"]);
    assert_eq!(
        (text(&o.stdout), text(&o.stderr)),
        ("hi\n".into(), "".into())
    );
}

#[test]
fn a_pyenv_install_in_a_private_home_is_served_to_its_owner() {
    // The same tree as above, the server run by its owner: served.
    if let Err(why) = test_user_home() {
        skip(
            "a_pyenv_install_in_a_private_home_is_served_to_its_owner",
            &why,
        );
        return;
    }
    let (_d, home, version) = private_pyenv();
    give_to_test_user(&home);
    let o = nsm_as_tester(
        &home,
        &path_with(&home.join(".pyenv/shims")),
        &["run", "-e", "python", WHERE_AM_I],
    );
    assert_ran_python_of(&o, &version);
}

#[test]
fn the_machines_own_python3_is_served_or_passed_over_with_the_fix() {
    // This machine's PATH may start with a real pyenv or asdf shim; whatever
    // it holds, python is served, and a passed-over entry is explained.
    let o = Command::new(BIN)
        .args(["envs", "--json"])
        .env("PROJECT_DIR", env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let (list, warnings) = envs(&o);
    let source = source_of(&list, "python");
    let first = std::env::var("PATH")
        .unwrap()
        .split(':')
        .map(|d| Path::new(d).join("python3"))
        .find(|p| p.is_file())
        .unwrap();
    if !source.contains(&*first.to_string_lossy()) && !first.starts_with("/usr") {
        assert!(
            warnings.contains(&*first.to_string_lossy()) && warnings.contains("; fix: "),
            "{source} is served, {} comes first on PATH: {warnings}",
            first.display()
        );
    }
    let o = Command::new(BIN)
        .args(["run", "-e", "python", "print(6 * 7)"])
        .env("PROJECT_DIR", env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout), "42\n", "{}", text(&o.stderr));
}

/// A virtualenv made by `python3 -m venv`, with a module of its own.
fn make_venv(venv: &Path, run: impl Fn(&[String]) -> Output) {
    let o = run(&[
        "/usr/bin/python3".to_string(),
        "-m".to_string(),
        "venv".to_string(),
        "--without-pip".to_string(),
        venv.display().to_string(),
    ]);
    assert!(o.status.success(), "python3 -m venv: {}", text(&o.stderr));
    let site = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("site-packages");
    let o = run(&[
        "/bin/sh".to_string(),
        "-c".to_string(),
        format!(
            "echo 'WORD = \"from the venv\"' > '{}/nsm_marker.py'",
            site.display()
        ),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

const IN_THE_VENV: &str = "import sys, nsm_marker, os\nprint(nsm_marker.WORD, sys.prefix != sys.base_prefix)\ntry:\n    open(os.path.join(os.path.dirname(nsm_marker.__file__), 'x.py'), 'w')\nexcept OSError as e:\n    print('site-packages:', e.strerror)\n";

#[test]
fn a_virtualenv_on_path_is_served_with_its_site_packages_read_only() {
    let d = scratch();
    let venv = d.path().join("project/.venv");
    make_venv(&venv, |argv| {
        Command::new(&argv[0]).args(&argv[1..]).output().unwrap()
    });
    let path = path_with(&venv.join("bin"));
    let o = nsm(d.path(), &path, &["run", "-e", "python", IN_THE_VENV]);
    assert_eq!(
        text(&o.stdout),
        "from the venv True\nsite-packages: Read-only file system\n",
        "{}",
        text(&o.stderr)
    );
    let (list, _) = envs(&nsm(d.path(), &path, &["envs", "--json"]));
    assert_eq!(
        source_of(&list, "python"),
        format!("host {}/bin/python3", venv.display())
    );
}

#[test]
fn a_normal_users_private_virtualenv_is_served_to_that_user_only() {
    let user_home = match test_user_home() {
        Ok(h) => h,
        Err(why) => {
            skip(
                "a_normal_users_private_virtualenv_is_served_to_that_user_only",
                &why,
            );
            return;
        }
    };
    let d = scratch();
    let private = d.path().join("private");
    std::fs::create_dir(&private).unwrap();
    give_to_test_user(&private);
    chmod(&private, 0o700);
    let venv = private.join("venv");
    make_venv(&venv, as_tester);
    let path = path_with(&venv.join("bin"));
    // The user's server: its sandboxes run as that user and see the venv.
    let o = nsm_as_tester(&user_home, &path, &["run", "-e", "python", IN_THE_VENV]);
    assert_eq!(
        text(&o.stdout),
        "from the venv True\nsite-packages: Read-only file system\n",
        "{}",
        text(&o.stderr)
    );
    // root's server: sandboxes run as uid 65534, which cannot enter it.
    let o = nsm(d.path(), &path, &["envs", "--json"]);
    let (list, warnings) = envs(&o);
    assert_eq!(source_of(&list, "python"), "host /usr/bin/python3");
    assert!(
        warnings.contains(&format!("not {}/bin/python3", venv.display()))
            && warnings.contains("uid 65534"),
        "{warnings}"
    );
}

/// node copied into an nvm-style prefix under `home`.
fn fake_nvm(home: &Path) -> PathBuf {
    let prefix = home.join(".nvm/versions/node/v99.0.0");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::copy(
        std::fs::canonicalize("/usr/bin/node").unwrap(),
        prefix.join("bin/node"),
    )
    .unwrap();
    std::fs::write(prefix.join("LICENSE"), "").unwrap();
    prefix
}

#[test]
fn an_nvm_install_inside_home_is_bound_but_never_the_home_itself() {
    let d = scratch();
    let home = d.path().join("home");
    let prefix = fake_nvm(&home);
    let path = path_with(&prefix.join("bin"));
    let o = nsm(
        &home,
        &path,
        &["run", "-e", "node", "console.log(process.execPath)"],
    );
    assert_eq!(
        text(&o.stdout),
        format!("{}/bin/node\n", prefix.display()),
        "{}",
        text(&o.stderr)
    );
    // node straight in ~/bin: binding its prefix would bind the home.
    std::fs::create_dir_all(home.join("bin")).unwrap();
    std::fs::copy(prefix.join("bin/node"), home.join("bin/node")).unwrap();
    std::fs::create_dir_all(home.join(".ssh")).unwrap();
    let o = nsm(&home, &path_with(&home.join("bin")), &["envs", "--json"]);
    let (list, warnings) = envs(&o);
    assert_eq!(source_of(&list, "node"), "host /usr/bin/node");
    assert!(
        warnings.contains(&format!("not {}/bin/node", home.display()))
            && warnings.contains("is a home directory")
            && warnings.contains("; fix: "),
        "{warnings}"
    );
}

#[test]
fn asdf_and_mise_shims_are_resolved_by_asking_the_manager() {
    let d = scratch();
    let home = d.path().join("home");
    let prefix = fake_nvm(&home);
    let node = prefix.join("bin/node");
    // asdf: a script `exec asdf exec "node" "$@"`, asdf found on PATH.
    let asdf = home.join(".asdf");
    write_executable(
        &asdf.join("bin/asdf"),
        &format!("#!/bin/sh\n[ \"$1\" = which ] && echo {}\n", node.display()),
    );
    write_executable(
        &asdf.join("shims/node"),
        "#!/usr/bin/env bash\n# asdf-plugin: nodejs 99.0.0\nexec asdf exec \"node\" \"$@\"\n",
    );
    let path = format!(
        "{}:{}:/usr/bin:/bin",
        asdf.join("shims").display(),
        asdf.join("bin").display()
    );
    let (list, warnings) = envs(&nsm(&home, &path, &["envs", "--json"]));
    assert_eq!(
        source_of(&list, "node"),
        format!("host {}", node.display()),
        "{warnings}"
    );
    // mise: shims are links to the mise binary itself.
    let mise = home.join(".local/share/mise");
    write_executable(
        &mise.join("bin/mise"),
        &format!("#!/bin/sh\n[ \"$1\" = which ] && echo {}\n", node.display()),
    );
    std::fs::create_dir_all(mise.join("shims")).unwrap();
    std::os::unix::fs::symlink("../bin/mise", mise.join("shims/node")).unwrap();
    let (list, warnings) = envs(&nsm(
        &home,
        &path_with(&mise.join("shims")),
        &["envs", "--json"],
    ));
    assert_eq!(
        source_of(&list, "node"),
        format!("host {}", node.display()),
        "{warnings}"
    );
    // A manager that names nothing: passed over, with what it said.
    write_executable(
        &mise.join("bin/mise"),
        "#!/bin/sh\necho 'mise ERROR node is not installed' >&2\nexit 1\n",
    );
    let (list, warnings) = envs(&nsm(
        &home,
        &path_with(&mise.join("shims")),
        &["envs", "--json"],
    ));
    assert_eq!(source_of(&list, "node"), "host /usr/bin/node");
    assert!(
        warnings.contains("`mise which node` failed: mise ERROR node is not installed"),
        "{warnings}"
    );
}
