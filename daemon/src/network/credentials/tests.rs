//! Tests of credentials and request rules as written, and of the decision
//! on each request.

use super::*;
use crate::network::NetworkSetting;

fn setting(toml_text: &str) -> Result<NetworkSetting, String> {
    #[derive(Deserialize)]
    struct Wrapper {
        network: NetworkSetting,
    }
    toml::from_str::<Wrapper>(toml_text)
        .map(|w| w.network)
        .map_err(|e| e.message().to_string())
}

fn interception(toml_text: &str) -> Interception {
    match setting(toml_text).unwrap() {
        NetworkSetting::Proxied(p) => p.interception,
        NetworkSetting::Off => panic!("off"),
    }
}

const RULES: &str = r#"
[network]
allow = ["api.example.com", "*.registry.example"]
[[network.credentials]]
host = "api.example.com"
scheme = "Bearer"
value_from = { env = "NSM_UNIT_TEST_TOKEN" }
paths = ["/v1/"]
[[network.requests]]
host = "api.example.com"
methods = ["post", "DELETE"]
paths = ["/v1/admin/"]
action = "deny"
[[network.requests]]
host = "api.example.com"
paths = ["/v1/", "/public/"]
[[network.requests]]
host = "*.registry.example"
methods = ["GET", "HEAD"]
"#;

#[test]
fn the_first_matching_rule_decides_and_credentials_follow_their_scope() {
    let i = interception(RULES);
    let get = Method::GET;
    let post = Method::POST;
    assert_eq!(
        i.decide("api.example.com", &get, "/v1/repos")
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        i.decide("api.example.com", &post, "/v1/repos")
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        i.decide("api.example.com", &get, "/public/x")
            .unwrap()
            .len(),
        0
    );
    assert!(matches!(
        i.decide("api.example.com", &post, "/v1/admin/users"),
        Err(RequestRefusal::DeniedBy(_))
    ));
    assert!(i.decide("api.example.com", &get, "/v1/admin/users").is_ok());
    assert!(matches!(
        i.decide("api.example.com", &get, "/elsewhere"),
        Err(RequestRefusal::NoRule(_))
    ));
    assert!(i.decide("a.registry.example", &get, "/pkg").is_ok());
    assert!(
        i.decide("a.registry.example", &Method::PUT, "/pkg")
            .is_err()
    );
    // A host without rules or credentials is not looked at.
    assert!(!i.intercepts("other.example.com"));
    assert!(i.intercepts("deep.a.registry.example"));
    assert_eq!(i.hosts(), vec!["*.registry.example", "api.example.com"]);
}

#[test]
fn paths_that_could_mean_another_path_are_refused_where_paths_matter() {
    let i = interception(RULES);
    for path in [
        "/v1/../v1/admin/users",
        "/v1/./admin/users",
        "/v1/%2e%2e/admin",
        "/v1/%2E./admin",
        "/v1/a%2fb",
        "/v1\\admin",
        "/v1/%5cadmin",
    ] {
        assert_eq!(
            i.decide("api.example.com", &Method::POST, path),
            Err(RequestRefusal::AmbiguousPath),
            "{path}"
        );
    }
    // A host whose rules name no path is not affected.
    assert!(
        i.decide("a.registry.example", &Method::GET, "/a/../b")
            .is_ok()
    );
}

#[test]
fn the_header_value_is_read_by_the_daemon_and_never_printed() {
    // SAFETY: tests in this module are the only readers of this variable.
    unsafe { std::env::set_var("NSM_UNIT_TEST_TOKEN", "tok-123\n") };
    let i = interception(RULES);
    let source = i.sources().next().unwrap();
    source.load().unwrap();
    let creds = i.decide("api.example.com", &Method::GET, "/v1/x").unwrap();
    let (name, value) = creds[0].header().unwrap();
    assert_eq!(name, header::AUTHORIZATION);
    assert_eq!(value.as_bytes(), b"Bearer tok-123");
    assert!(value.is_sensitive());
    let shown = format!("{i:?} {source} {:?}", creds[0]);
    assert!(!shown.contains("tok-123"), "{shown}");
    assert!(shown.contains("NSM_UNIT_TEST_TOKEN"), "{shown}");
}

#[test]
fn a_file_is_read_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "first\n").unwrap();
    let source = SecretSource::new(ValueFrom::File(file.clone()));
    source.load().unwrap();
    assert_eq!(source.value().unwrap().0, b"first");
    std::fs::write(dir.path().join("new"), "second").unwrap();
    std::fs::rename(dir.path().join("new"), &file).unwrap();
    assert_eq!(source.value().unwrap().0, b"second");
    std::fs::remove_file(&file).unwrap();
    let e = source.value().unwrap_err();
    assert!(e.contains("token") && !e.contains("second"), "{e}");
}

#[test]
fn bad_values_are_refused_with_the_source_not_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [("a\nb", "line break"), ("", "empty"), ("\n", "empty")];
    for (text, why) in cases {
        let file = dir.path().join("v");
        std::fs::write(&file, text).unwrap();
        let e = SecretSource::new(ValueFrom::File(file)).load().unwrap_err();
        assert!(e.contains(why) && e.contains("credential file"), "{e}");
    }
    let e = SecretSource::new(ValueFrom::Command(vec!["false".into()]))
        .load()
        .unwrap_err();
    assert!(e.contains("failed"), "{e}");
    let ok = SecretSource::new(ValueFrom::Command(vec![
        "printf".into(),
        "from-command".into(),
    ]));
    ok.load().unwrap();
    assert_eq!(ok.value().unwrap().0, b"from-command");
    let e = SecretSource::new(ValueFrom::Env("NSM_UNIT_TEST_UNSET".into()))
        .load()
        .unwrap_err();
    assert!(e.contains("does not set it"), "{e}");
}

#[test]
fn hostile_tables_are_refused_with_the_reason() {
    let base =
        "[network]\nallow = [\"api.example.com\", \"10.0.0.0/8\"]\n[[network.credentials]]\n";
    let cases = [
        (
            "host = \"evil.example\"\nvalue_from = { env = \"T\" }",
            "not admitted by the allowlist",
        ),
        (
            "host = \"10.1.2.3\"\nvalue_from = { env = \"T\" }",
            "not an address",
        ),
        (
            "host = \"*\"\nvalue_from = { env = \"T\" }",
            "not every host",
        ),
        (
            "host = \"api.example.com\"\nheader = \"Host\"\nvalue_from = { env = \"T\" }",
            "cannot add host",
        ),
        (
            "host = \"api.example.com\"\nheader = \"Transfer-Encoding\"\nvalue_from = { env = \"T\" }",
            "cannot add transfer-encoding",
        ),
        (
            "host = \"api.example.com\"\nheader = \"bad header\"\nvalue_from = { env = \"T\" }",
            "not a header name",
        ),
        (
            "host = \"api.example.com\"\nscheme = \"Bearer x\"\nvalue_from = { env = \"T\" }",
            "one word",
        ),
        (
            "host = \"api.example.com\"\nvalue_from = { file = \"relative/path\" }",
            "absolute path",
        ),
        (
            "host = \"api.example.com\"\nvalue_from = { command = [] }",
            "command is empty",
        ),
        (
            "host = \"api.example.com\"\nvalue_from = { env = \"A=B\" }",
            "not a variable name",
        ),
        (
            "host = \"api.example.com\"\nvalue_from = { file = \"/a\", env = \"T\" }",
            "",
        ),
        (
            "host = \"api.example.com\"\nvalue_from = { env = \"T\" }\npaths = [\"v1\"]",
            "starting with '/'",
        ),
        (
            "host = \"api.example.com\"\nvalue_from = { env = \"T\" }\npaths = [\"/v1/../x\"]",
            "segments",
        ),
        (
            "host = \"api.example.com\"\nvalue_from = { env = \"T\" }\nmethods = [\"G T\"]",
            "not an HTTP method",
        ),
        (
            "host = \"api.example.com\"\nvalue = \"inline\"",
            "unknown field",
        ),
    ];
    for (table, why) in cases {
        let e = setting(&format!("{base}{table}\n")).unwrap_err();
        assert!(e.contains(why), "{table}: {e}");
    }
}
