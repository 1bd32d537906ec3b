//! Tests of command declarations: what is accepted, and how each problem
//! is named with its fix.

use std::path::Path;

use super::*;
use crate::network::NetworkSetting;

fn envs() -> Vec<String> {
    vec!["bash".into(), "python".into()]
}

fn check(text: &str) -> Result<Checked, Diagnostic> {
    check_in(text, None)
}

fn check_in(text: &str, project: Option<&ProjectMount>) -> Result<Checked, Diagnostic> {
    let file = Path::new("/p/.nix-sandbox-mcp/commands.toml");
    let decls = parse_project_file(text, file)?;
    let source = Source {
        file: file.to_path_buf(),
        text: text.to_string(),
    };
    let (name, decl) = decls.iter().next().expect("one command");
    let envs = envs();
    validate(
        name,
        decl,
        &source,
        Context {
            envs: &envs,
            project,
        },
    )
}

fn err(text: &str) -> String {
    check(text).unwrap_err().to_string()
}

const GOOD: &str = r#"
[commands.test]
description = "Run the tests"
env = "bash"
argv = ["cargo", "test", "{{filter}}"]
[commands.test.params.filter]
type = "string"
"#;

#[test]
fn a_good_declaration_is_accepted_without_warnings() {
    let c = check(GOOD).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.command.name, "test");
    assert_eq!(c.command.danger, Danger::Moderate);
    assert!(c.command.enabled);
    assert_eq!(c.command.network, NetworkSetting::Off);
}

#[test]
fn errors_name_file_line_key_and_fix() {
    let e = err(&GOOD.replace("{{filter}}", "{{filtr}}"));
    assert!(
        e.starts_with("/p/.nix-sandbox-mcp/commands.toml:5: key `commands.test.argv`"),
        "{e}"
    );
    assert!(
        e.contains("{{filtr}} names no parameter") && e.contains("fix: declare it"),
        "{e}"
    );

    let e = err(&GOOD.replace("env = \"bash\"", "env = \"ruby\""));
    assert!(
        e.contains(":4: key `commands.test.env`") && e.contains("bash, python"),
        "{e}"
    );

    let e = err(&GOOD.replace("type = \"string\"", "type = \"string\"\nmin = 3"));
    assert!(e.contains("key `commands.test.params.filter.min`"), "{e}");
    assert!(e.contains(":8:"), "{e}");
}

#[test]
fn syntax_and_unknown_keys_are_reported_with_their_line() {
    let e =
        err("[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"ls\"]\nshell = true\n");
    assert!(e.contains(":5") && e.contains("shell"), "{e}");
    let e = err("[commands.\"bad name\"]\n");
    assert!(e.contains("not a valid command name"), "{e}");
    let e = err(
        "[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"ls\"]\ndanger = \"extreme\"\n",
    );
    assert!(e.contains(":5") && e.contains("danger"), "{e}");
    let e = err("[other]\n");
    assert!(e.contains("other"), "{e}");
}

#[test]
fn argv_zero_must_be_literal_and_argv_not_empty() {
    let e = err(
        "[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"{{p}}\"]\n[commands.t.params.p]\ntype = \"string\"\n",
    );
    assert!(e.contains("argv[0]") && e.contains("literal"), "{e}");
    let e = err("[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = []\n");
    assert!(e.contains("empty"), "{e}");
}

#[test]
fn a_parameter_inside_a_shell_script_is_refused() {
    for argv in [
        r#"["sh", "-c", "echo {{p}}"]"#,
        r#"["/bin/bash", "-ec", "grep {{p}} f"]"#,
        r#"["python3.12", "-c", "print('{{p}}')"]"#,
        r#"["node", "-e", "{{p}}"]"#,
    ] {
        let e = err(&format!(
            "[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = {argv}\n[commands.t.params.p]\ntype = \"string\"\n"
        ));
        assert!(e.contains("inject"), "{argv}: {e}");
    }
    // As a positional parameter it is data: allowed, with a warning.
    let c = check("[commands.t]\ndescription = \"x\"\nenv = \"bash\"\nargv = [\"sh\", \"-c\", \"echo \\\"$1\\\"\", \"sh\", \"{{p}}\"]\n[commands.t.params.p]\ntype = \"string\"\n").unwrap();
    assert_eq!(c.warnings.len(), 1);
    assert!(
        c.warnings[0].message.contains("can run a script"),
        "{}",
        c.warnings[0]
    );
}

#[test]
fn unused_parameters_are_warned_about() {
    let c = check(&format!(
        "{GOOD}[commands.test.params.extra]\ntype = \"boolean\"\n"
    ))
    .unwrap();
    assert_eq!(c.warnings.len(), 1);
    let w = c.warnings[0].to_string();
    assert!(
        w.contains("commands.test.params.extra") && w.contains("not used"),
        "{w}"
    );
    assert!(w.contains(":8:"), "{w}");
}

#[test]
fn loader_and_path_variables_cannot_be_set() {
    for var in [
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "DYLD_INSERT_LIBRARIES",
        "HOME",
    ] {
        let e = err(&format!("{GOOD}[commands.test.vars]\n{var} = \"/tmp\"\n"));
        assert!(e.contains(&format!("commands.test.vars.{var}")), "{e}");
    }
    let c = check(&format!(
        "{GOOD}[commands.test.vars]\nRUST_BACKTRACE = \"1\"\n"
    ))
    .unwrap();
    assert_eq!(c.command.vars, vec![("RUST_BACKTRACE".into(), "1".into())]);
}

#[test]
fn network_accepts_false_true_and_an_allowlist() {
    let with =
        |n: &str| check(&GOOD.replace("env = \"bash\"", &format!("env = \"bash\"\nnetwork = {n}")));
    assert_eq!(
        with("true").unwrap().command.network,
        NetworkSetting::Proxied(crate::network::Policy::any_public())
    );
    assert_eq!(with("false").unwrap().command.network, NetworkSetting::Off);
    assert_eq!(
        with("{ allow = [\"crates.io\"] }").unwrap().command.network,
        NetworkSetting::Proxied(
            crate::network::Policy::from_entries(&["crates.io"], Default::default()).unwrap()
        )
    );
    assert!(with("{ deny = [] }").is_err());
    assert!(with("\"yes\"").is_err());
    assert!(with("{ allow = [\"a b\"] }").is_err());
}

#[test]
fn commands_needing_a_project_are_withheld_without_one() {
    let c = check(&GOOD.replace("argv", "workdir = \"src\"\nargv")).unwrap();
    assert!(!c.command.enabled);
    assert!(
        c.warnings[0].message.contains("no project"),
        "{}",
        c.warnings[0]
    );
}

#[test]
fn workdir_is_checked_after_resolving_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("proj");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::os::unix::fs::symlink(dir.path(), root.join("up")).unwrap();
    let project = ProjectMount {
        host_path: root.canonicalize().unwrap(),
        mount_point: "/project".into(),
        access: crate::jail::ProjectAccess::ReadOnly,
        overlay: false,
        downgraded: false,
        protected: Vec::new(),
    };
    let with = |w: &str| {
        check_in(
            &GOOD.replace("argv", &format!("workdir = {w:?}\nargv")),
            Some(&project),
        )
    };
    assert!(with("src").unwrap().command.enabled);
    for bad in ["up", "up/proj/../..", "../", "missing", "/etc"] {
        let e = with(bad).unwrap_err().to_string();
        assert!(e.contains("commands.test.workdir"), "{bad}: {e}");
    }
}

#[test]
fn the_project_file_is_read_only_when_it_is_a_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let decl = dir.path().join(".nix-sandbox-mcp");
    assert_eq!(
        read_project_file(&decl.join("commands.toml")).unwrap(),
        None
    );
    std::fs::create_dir(&decl).unwrap();
    std::fs::write(dir.path().join("elsewhere.toml"), GOOD).unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("elsewhere.toml"),
        decl.join("commands.toml"),
    )
    .unwrap();
    let e = read_project_file(&decl.join("commands.toml")).unwrap_err();
    assert!(e.message.contains("symlink"), "{e}");
    std::fs::remove_file(decl.join("commands.toml")).unwrap();
    std::fs::write(decl.join("commands.toml"), GOOD).unwrap();
    assert_eq!(
        read_project_file(&decl.join("commands.toml"))
            .unwrap()
            .as_deref(),
        Some(GOOD)
    );
}
