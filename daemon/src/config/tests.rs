//! Tests of the configuration file: what it accepts, what it refuses and
//! how each refusal names the file, line and key.

use super::*;

fn parse_str(text: &str) -> Result<Config, ConfigError> {
    parse(text, Path::new("/etc/test.toml"))
}

#[test]
fn empty_file_gives_defaults() {
    let c = parse_str("").unwrap();
    assert!(c.environments.is_none());
    assert_eq!(c.project.mount_point.0, "/project");
    assert_eq!(c.project.mode, ProjectMode::Overlay);
}

#[test]
fn full_example_parses() {
    let c = parse_str(
        r#"
[server]
max_concurrent_runs = 4
[defaults]
timeout_ms = 5000
output_bytes = 4096
[project]
path = "src"
mount_point = "/code/"
mode = "readwrite"
[project.inherit_env]
vars = ["DATABASE_URL"]
[environments.py]
preset = "python"
description = "Python"
timeout_ms = 100
[environments.rb]
interpreter = "ruby {file}"
file_name = "main.rb"
"#,
    )
    .unwrap();
    assert_eq!(c.defaults.timeout_ms, Some(Millis(5000)));
    assert_eq!(c.project.path, Some(PathBuf::from("src")));
    assert_eq!(c.project.mount_point.0, "/code");
    assert_eq!(c.project.mode, ProjectMode::Readwrite);
    assert_eq!(c.project.inherit_env[0].0, "DATABASE_URL");
    let envs = c.environments.unwrap();
    assert_eq!(envs["py"].limits().timeout_ms, Some(Millis(100)));
    assert_eq!(
        envs["rb"].interpreter.as_ref().unwrap().0,
        vec!["ruby", "{file}"]
    );
}

fn err_text(text: &str) -> String {
    parse_str(text).unwrap_err().to_string()
}

#[test]
fn unknown_key_names_key_and_line() {
    let e = err_text("[defaults]\ntimeout_ms = 5\n\n[project]\nmount = \"/x\"\n");
    assert!(e.contains("/etc/test.toml:5"), "{e}");
    assert!(e.contains("unknown field `mount`"), "{e}");
    assert!(e.contains("project"), "{e}");
}

#[test]
fn the_first_problem_in_the_file_is_reported() {
    // Serde visits keys sorted by name: `bogus` before `servr`.
    let e = err_text("servr = 1\nbogus = 2\n");
    assert!(e.starts_with("/etc/test.toml:1:1: key `servr`"), "{e}");
    let e = err_text("[defaults]\ntimeot_ms = 1\nmemroy_mb = 2\n");
    assert!(
        e.starts_with("/etc/test.toml:2:1: key `defaults.timeot_ms`"),
        "{e}"
    );
    // Across tables, and a table that comes back later in the file.
    let e = err_text(
        "[environments.a]\npreset = \"python\"\n[defaults]\ntimeout_ms = 0\n[environments.b]\npresett = \"x\"\n",
    );
    assert!(
        e.starts_with("/etc/test.toml:4:14: key `defaults.timeout_ms`"),
        "{e}"
    );
    let e = err_text("[project]\nmoun = \"/x\"\n[defaults]\ntimeout_ms = 0\n");
    assert!(
        e.starts_with("/etc/test.toml:2:1: key `project.moun`"),
        "{e}"
    );
}

#[test]
fn errors_have_line_and_column() {
    let e = err_text("[project]\nmode  =  \"sometimes\"\n");
    assert!(
        e.starts_with("/etc/test.toml:2:10: key `project.mode`"),
        "{e}"
    );
    let e = err_text("[defaults]\n  pids = \"many\"\n");
    assert!(e.starts_with("/etc/test.toml:2:10:"), "{e}");
}

#[test]
fn unknown_keys_and_values_suggest_the_nearest_valid_one() {
    let e = err_text("[defaults]\ntimeot_ms = 1\n");
    assert!(e.ends_with("; did you mean `timeout_ms`?"), "{e}");
    let e = err_text("[server]\nmax_concurent_runs = 1\n");
    assert!(e.ends_with("did you mean `max_concurrent_runs`?"), "{e}");
    let e = err_text("[environments.x]\npreset = \"bash\"\nmemroy_mb = 5\n");
    assert!(e.ends_with("did you mean `memory_mb`?"), "{e}");
    let e = err_text("[project]\nmode = \"readonyl\"\n");
    assert!(e.ends_with("did you mean `readonly`?"), "{e}");
    let e = err_text("[project]\nmount = \"/x\"\n");
    assert!(e.ends_with("did you mean `mount_point`?"), "{e}");
    // Nothing near: no guess.
    let e = err_text("[defaults]\ncolour = \"blue\"\n");
    assert!(!e.contains("did you mean"), "{e}");
}

#[test]
fn edit_distance_counts_swaps_as_one() {
    assert_eq!(edit_distance("memroy_mb", "memory_mb"), 1);
    assert_eq!(edit_distance("timeot_ms", "timeout_ms"), 1);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("pids", "pids"), 0);
}

#[test]
fn bad_value_names_key_and_line() {
    let e = err_text("[environments.py]\npreset = \"python\"\ntimeout_ms = 0\n");
    assert!(e.contains(":3"), "{e}");
    assert!(e.contains("environments.py.timeout_ms"), "{e}");
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn wrong_type_is_reported() {
    let e = err_text("[defaults]\ntimeout_ms = \"soon\"\n");
    assert!(e.contains("defaults.timeout_ms"), "{e}");
    assert!(e.contains(":2"), "{e}");
}

#[test]
fn syntax_error_has_line() {
    let e = err_text("[defaults]\ntimeout_ms = = 3\n");
    assert!(e.contains(":2"), "{e}");
}

#[test]
fn environment_needs_exactly_one_source() {
    let e = err_text("[environments.x]\ndescription = \"nothing\"\n");
    assert!(e.contains("environments.x") && e.contains(":1"), "{e}");
    let e = err_text("[environments.x]\npreset = \"bash\"\ninterpreter = \"sh\"\n");
    assert!(e.contains("alternatives"), "{e}");
    parse_str("[environments.x]\nflake = \"github:o/r#a\"\ninterpreter = \"sh\"\n").unwrap();
}

#[test]
fn mount_point_rules() {
    assert!(MountPoint::new("relative").is_err());
    assert!(MountPoint::new("/").is_err());
    assert!(MountPoint::new("/usr/src").is_err());
    assert!(MountPoint::new("/workspace").is_err());
    assert!(MountPoint::new("/a/../b").is_err());
    assert_eq!(MountPoint::new("/workspace/p/").unwrap().0, "/workspace/p");
}

#[test]
fn bad_env_name_and_var_rejected() {
    assert!(
        err_text("[environments.\"a b\"]\npreset = \"bash\"\n")
            .contains("not a valid environment name")
    );
    assert!(err_text("[project.inherit_env]\nvars = [\"PATH\"]\n").contains("set by the sandbox"));
    assert!(err_text("[project.inherit_env]\nvars = [\"1X\"]\n").contains("not a valid variable"));
}

#[test]
fn env_overrides_apply() {
    let mut c = Config::default();
    apply_env_overrides(&mut c, |k| match k {
        "PROJECT_DIR" => Some("/srv/p".into()),
        "PROJECT_MOUNT" => Some("/src".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.project.path, Some(PathBuf::from("/srv/p")));
    assert!(c.project.path_is_explicit);
    assert_eq!(c.project.mount_point.0, "/src");
    let e = apply_env_overrides(&mut c, |k| (k == "PROJECT_MOUNT").then(|| "/proc".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("PROJECT_MOUNT"), "{e}");
}

#[test]
fn example_config_parses_and_documents_every_key() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.example.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    parse(&text, &path).unwrap();
    // Every key of the schema, which is generated from the types that read
    // the file, at any depth: in definitions, alternatives (`anyOf`, as a
    // network setting's table) and items too.
    fn keys(schema: &serde_json::Value, out: &mut Vec<String>) {
        match schema {
            serde_json::Value::Object(map) => {
                for (name, sub) in map {
                    if name == "properties"
                        && let Some(props) = sub.as_object()
                    {
                        out.extend(props.keys().cloned());
                    }
                    keys(sub, out);
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| keys(i, out)),
            _ => {}
        }
    }
    let mut keys_found = Vec::new();
    keys(&json_schema(), &mut keys_found);
    let tables = [
        "server",
        "defaults",
        "project",
        "environments",
        "inherit_env",
        "grants",
        "projects",
        "commands",
        "params",
        "http",
        "oauth",
        "per_principal",
        "principals",
    ];
    let keys: Vec<&str> = keys_found
        .iter()
        .map(String::as_str)
        .filter(|k| !tables.contains(k))
        .collect();
    assert!(keys.contains(&"memory_budget_mb") && keys.contains(&"cpus"));
    assert!(keys.contains(&"max_connections") && keys.contains(&"transfer_mb"));
    for k in keys {
        assert!(
            text.contains(&format!("{k} ="))
                || text.contains(&format!("{k}  ="))
                || text.contains(&format!("{k}    =")),
            "{k} undocumented"
        );
    }
}

#[test]
fn overlay_prefers_upper_layer() {
    let low = LimitSettings {
        timeout_ms: Some(Millis(1)),
        pids: Some(Positive(5)),
        ..Default::default()
    };
    let high = LimitSettings {
        timeout_ms: Some(Millis(2)),
        ..Default::default()
    };
    let m = low.overlay(high);
    assert_eq!(m.timeout_ms, Some(Millis(2)));
    assert_eq!(m.pids, Some(Positive(5)));
}

#[test]
fn projects_are_named_and_absolute() {
    let c = parse(
        "[projects.api]\npath = \"/srv/api\"\n[projects.web-2]\npath = \"/srv/web\"\n",
        Path::new("c.toml"),
    )
    .unwrap();
    assert_eq!(
        c.projects
            .iter()
            .map(|(n, p)| (n.as_str(), p.to_str().unwrap()))
            .collect::<Vec<_>>(),
        [("api", "/srv/api"), ("web-2", "/srv/web")]
    );
    let e = err_text("[projects.api]\npath = \"src/api\"\n");
    assert!(
        e.contains("projects.api.path") && e.contains("relative"),
        "{e}"
    );
    let e = err_text("[projects.\"../x\"]\npath = \"/srv\"\n");
    assert!(e.contains("not a valid project name"), "{e}");
    let e = err_text("[projects.api]\npth = \"/srv\"\n");
    assert!(e.contains("unknown field `pth`"), "{e}");
}
