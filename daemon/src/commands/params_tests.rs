//! Tests of declared parameters: their checks, and the values a call may
//! and may not give them.

use super::*;

fn param(toml_text: &str) -> Result<Param, DeclProblem> {
    let d: ParamDecl = toml::from_str(toml_text).unwrap();
    Param::from_decl("p", &d)
}

fn ok(p: &Param, v: Value) -> String {
    p.check(&v, None)
        .unwrap_or_else(|e| panic!("{v}: {}", e.message))
}

fn refused(p: &Param, v: Value) -> String {
    let e = p.check(&v, None).expect_err(&v.to_string());
    assert_eq!(e.param, "p");
    assert!(e.message.starts_with("`p` "), "{}", e.message);
    e.message
}

#[test]
fn strings_refuse_nul_empty_and_a_leading_dash_by_default() {
    let p = param("type = \"string\"").unwrap();
    assert_eq!(ok(&p, json!("main")), "main");
    assert_eq!(ok(&p, json!("a b; rm -rf / $(id)")), "a b; rm -rf / $(id)");
    assert!(refused(&p, json!("--upload-pack=touch /tmp/x")).contains("'-'"));
    assert!(refused(&p, json!("-rf")).contains("'-'"));
    assert!(refused(&p, json!("a\u{0}b")).contains("NUL"));
    assert!(refused(&p, json!("")).contains("empty"));
    assert!(refused(&p, json!(5)).contains("must be a string, not a number"));
    assert!(refused(&p, json!("x".repeat(MAX_VALUE_BYTES + 1))).contains("longer"));
}

#[test]
fn an_explicit_pattern_replaces_the_default_and_matches_the_whole_value() {
    let p = param("type = \"string\"\npattern = \"-[a-z]+\"").unwrap();
    assert_eq!(ok(&p, json!("-v")), "-v");
    assert!(refused(&p, json!("-v; x")).contains("pattern ^(?:-[a-z]+)$"));
    let p = param("type = \"string\"\npattern = \"[a-z]+\"").unwrap();
    assert!(refused(&p, json!("abc\nrm")).contains("pattern"));
    assert!(refused(&p, json!("nul\u{0}")).contains("NUL"));
}

#[test]
fn patterns_are_compiled_with_bounds_and_without_backtracking_features() {
    assert!(
        param("type = \"string\"\npattern = \"(a\"")
            .unwrap_err()
            .message
            .contains("invalid pattern")
    );
    assert!(param("type = \"string\"\npattern = \"(?=a)\"").is_err());
    assert!(param("type = \"string\"\npattern = \"(a)\\\\1\"").is_err());
    let huge = format!("type = \"string\"\npattern = \"{}\"", "a{1000}{1000}");
    assert!(param(&huge).is_err());
    // Catastrophic for a backtracking engine; linear here.
    let p = param("type = \"string\"\npattern = \"(a+)+b\"").unwrap();
    let started = std::time::Instant::now();
    refused(&p, json!("a".repeat(4000)));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn integers_and_numbers_are_strict_finite_and_in_range() {
    let p = param("type = \"integer\"\nmin = 1\nmax = 100").unwrap();
    assert_eq!(ok(&p, json!(42)), "42");
    assert!(refused(&p, json!(0)).contains("at least 1"));
    assert!(refused(&p, json!(101)).contains("at most 100"));
    assert!(refused(&p, json!(1.5)).contains("integer"));
    assert!(refused(&p, json!("5")).contains("must be an integer, not a string"));
    let p = param("type = \"integer\"").unwrap();
    assert!(refused(&p, json!(-1)).contains("negative"));
    let p = param("type = \"integer\"\nmin = -5").unwrap();
    assert_eq!(ok(&p, json!(-5)), "-5");
    let p = param("type = \"number\"\nmax = 2.5").unwrap();
    assert_eq!(ok(&p, json!(0.25)), "0.25");
    assert_eq!(ok(&p, json!(1e-7)), "0.0000001");
    assert!(refused(&p, json!(3)).contains("at most 2.5"));
    assert!(refused(&p, json!(-0.5)).contains("negative"));
    let p = param("type = \"number\"").unwrap();
    assert_eq!(ok(&p, json!(1e21)), "1000000000000000000000");
    assert!(param("type = \"integer\"\nmin = 1.5").is_err());
    assert!(param("type = \"integer\"\nmin = 5\nmax = 1").is_err());
}

#[test]
fn booleans_are_json_booleans_only() {
    let p = param("type = \"boolean\"").unwrap();
    assert_eq!(ok(&p, json!(true)), "true");
    assert_eq!(ok(&p, json!(false)), "false");
    for v in [json!("true"), json!(1), json!(0), json!("yes")] {
        assert!(refused(&p, v).contains("true or false"));
    }
}

#[test]
fn enums_take_only_their_values() {
    let p = param("type = \"enum\"\nvalues = [\"debug\", \"--release\"]").unwrap();
    assert_eq!(ok(&p, json!("--release")), "--release");
    assert!(refused(&p, json!("--other")).contains("one of: debug, --release"));
    assert!(param("type = \"enum\"").is_err());
    assert!(param("type = \"enum\"\nvalues = [\"a\", \"a\"]").is_err());
}

#[test]
fn declarations_refuse_keys_that_do_not_apply_and_bad_defaults() {
    let e = param("type = \"boolean\"\npattern = \"x\"").unwrap_err();
    assert_eq!(e.key, "pattern");
    assert_eq!(param("type = \"string\"\nmin = 1").unwrap_err().key, "min");
    assert_eq!(
        param("type = \"string\"\nvalues = [\"a\"]")
            .unwrap_err()
            .key,
        "values"
    );
    assert_eq!(
        param("type = \"string\"\ndefault = \"-x\"")
            .unwrap_err()
            .key,
        "default"
    );
    assert_eq!(
        param("type = \"integer\"\ndefault = \"3\"")
            .unwrap_err()
            .key,
        "default"
    );
    assert_eq!(
        param("type = \"string\"\ndefault = \"x\"\nrequired = true")
            .unwrap_err()
            .key,
        "required"
    );
    assert!(Param::from_decl("bad-name", &toml::from_str("type = \"string\"").unwrap()).is_err());
}

#[test]
fn the_schema_says_type_range_values_and_default() {
    let p = param("type = \"integer\"\nmin = 1\nmax = 9\ndefault = 3\ndescription = \"How many\"")
        .unwrap();
    assert_eq!(
        p.schema(),
        json!({"type": "integer", "minimum": 1, "maximum": 9, "default": 3, "description": "How many"})
    );
    let e = param("type = \"enum\"\nvalues = [\"a\"]").unwrap();
    assert_eq!(e.schema(), json!({"type": "string", "enum": ["a"]}));
    let s = input_schema(&[
        Param {
            required: true,
            ..param("type = \"string\"").unwrap()
        },
        Param {
            name: "q".into(),
            ..param("type = \"boolean\"").unwrap()
        },
    ]);
    assert_eq!(
        Value::Object(s),
        json!({"type": "object", "properties": {"p": {"type": "string"}, "q": {"type": "boolean"}, "background": {"type": "boolean", "description": "Return a job id at once"}}, "required": ["p"], "additionalProperties": false})
    );
}

#[test]
fn background_is_every_tool_s_and_no_parameter_s() {
    let e =
        Param::from_decl(BACKGROUND, &toml::from_str("type = \"boolean\"").unwrap()).unwrap_err();
    assert!(e.message.contains("reserved"), "{}", e.message);
}

fn project() -> (tempfile::TempDir, ProjectMount) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("proj");
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::write(root.join("src/main.rs"), "").unwrap();
    std::fs::write(dir.path().join("secret"), "").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret"), root.join("secret-link")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("etc-link")).unwrap();
    std::os::unix::fs::symlink("src/main.rs", root.join("inner-link")).unwrap();
    let mount = ProjectMount {
        host_path: root.canonicalize().unwrap(),
        mount_point: "/project".into(),
        access: crate::jail::ProjectAccess::ReadOnly,
        overlay: false,
        downgraded: false,
        protected: Vec::new(),
    };
    (dir, mount)
}

#[test]
fn paths_resolve_inside_the_project_and_are_given_as_the_sandbox_sees_them() {
    let (_dir, project) = project();
    let p = param("type = \"path\"").unwrap();
    let check = |v: &str| p.check(&json!(v), Some(&project)).map_err(|e| e.message);
    assert_eq!(check("src/main.rs").unwrap(), "/project/src/main.rs");
    assert_eq!(
        check("/project/src/../src/main.rs").unwrap(),
        "/project/src/main.rs"
    );
    assert_eq!(check("inner-link").unwrap(), "/project/src/main.rs");
    assert_eq!(
        check("src/new/out.txt").unwrap(),
        "/project/src/new/out.txt"
    );
    assert_eq!(check(".").unwrap(), "/project");
    assert_eq!(check("/project").unwrap(), "/project");
    for bad in [
        "../secret",
        "src/../../secret",
        "secret-link",
        "etc-link/passwd",
        "/etc/passwd",
        "/projectx/a",
        "src/missing/../../../secret",
        "-rf",
    ] {
        let e = check(bad).expect_err(bad);
        assert!(e.starts_with("`p` "), "{bad}: {e}");
    }
    assert!(
        p.check(&json!("src"), None)
            .unwrap_err()
            .message
            .contains("project")
    );
}

#[test]
fn a_directory_must_exist_for_a_working_directory() {
    let (_dir, project) = project();
    assert_eq!(
        resolve_in_project(&project, "src/deep", true).unwrap(),
        "/project/src/deep"
    );
    assert!(resolve_in_project(&project, "src/main.rs", true).is_err());
    assert!(resolve_in_project(&project, "src/none", true).is_err());
    assert!(resolve_in_project(&project, "etc-link", true).is_err());
}
