//! Tests of the allowlist: how entries parse and which hosts and ports
//! they let through.

use super::*;

fn policy(entries: &[&str]) -> Policy {
    Policy::from_entries(entries, Bounds::default()).unwrap()
}

fn name(s: &str) -> Host {
    Host::parse(s).unwrap()
}

fn admits(p: &Policy, host: &str) -> bool {
    p.admits(&name(host)).is_ok()
}

#[test]
fn exact_names_match_case_insensitively_without_trailing_dot() {
    let p = policy(&["PyPI.org."]);
    assert!(admits(&p, "pypi.org"));
    assert!(admits(&p, "PYPI.ORG"));
    assert!(admits(&p, "pypi.org."));
    assert!(!admits(&p, "files.pypi.org"));
    assert!(!admits(&p, "pypi.org.evil.com"));
    assert!(!admits(&p, "notpypi.org"));
}

#[test]
fn wildcards_match_subdomains_only() {
    let p = policy(&["*.example.com"]);
    assert!(admits(&p, "a.example.com"));
    assert!(admits(&p, "a.b.example.com"));
    assert!(admits(&p, "A.Example.COM."));
    assert!(!admits(&p, "example.com"));
    assert!(!admits(&p, "badexample.com"));
    assert!(!admits(&p, "a.badexample.com"));
    assert!(!admits(&p, "example.com.evil.net"));
    assert!(Host::parse(".example.com").is_err());
    let both = policy(&["example.com", "*.example.com"]);
    assert!(admits(&both, "example.com"));
    assert!(admits(&both, "www.example.com"));
}

#[test]
fn ip_literals_only_when_listed() {
    let p = policy(&["pypi.org", "10.1.2.0/24", "127.0.0.1", "[::1]"]);
    assert!(p.admits(&name("10.1.2.3")).is_ok());
    assert!(p.admits(&name("127.0.0.1")).is_ok());
    assert!(p.admits(&name("[::1]")).is_ok());
    assert!(p.admits(&name("::ffff:127.0.0.1")).is_ok());
    assert!(p.admits(&name("127.0.0.2")).is_err());
    assert!(p.admits(&name("10.1.3.1")).is_err());
    assert!(p.admits(&name("8.8.8.8")).is_err());
    // A range lets no name through by itself.
    assert!(p.admits(&name("internal.example")).is_err());
}

#[test]
fn any_public_host_still_refuses_internal_addresses() {
    let p = Policy::any_public();
    assert!(admits(&p, "anything.example"));
    assert!(p.admits(&name("8.8.8.8")).is_ok());
    for internal in [
        "127.0.0.1",
        "10.0.0.1",
        "169.254.169.254",
        "[::1]",
        "[fe80::1]",
    ] {
        assert!(p.admits(&name(internal)).is_err(), "{internal}");
    }
    let host = name("pypi.org");
    let err = p
        .check_addresses(&host, &["127.0.0.1".parse().unwrap()])
        .unwrap_err();
    assert_eq!(err.rule(), "refused-address");
    assert_eq!(p.summary(), "any public host");
}

#[test]
fn every_resolved_address_is_checked() {
    let p = policy(&["mixed.test"]);
    let host = name("mixed.test");
    let public: IpAddr = "151.101.0.223".parse().unwrap();
    let lan: IpAddr = "192.168.1.5".parse().unwrap();
    assert!(p.check_addresses(&host, &[public]).is_ok());
    for order in [[public, lan], [lan, public]] {
        let err = p.check_addresses(&host, &order).unwrap_err();
        assert!(matches!(err, Denial::Address { addr, .. } if addr == lan));
    }
    let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
    let err = p.check_addresses(&host, &[mapped]).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("mixed.test resolves to 127.0.0.1, a loopback address (127.0.0.0/8)"),
        "{text}"
    );
    assert!(
        err.remedy()
            .starts_with("To allow it, add \"127.0.0.0/8\" to")
    );
}

#[test]
fn listed_ranges_let_allowed_names_into_refused_space() {
    let p = policy(&["registry.internal", "10.1.2.0/24", "::ffff:127.0.0.0/104"]);
    let host = name("registry.internal");
    assert!(
        p.check_addresses(&host, &["10.1.2.9".parse().unwrap()])
            .is_ok()
    );
    assert!(
        p.check_addresses(&host, &["10.1.3.9".parse().unwrap()])
            .is_err()
    );
    assert!(
        p.check_addresses(&host, &["127.0.0.1".parse().unwrap()])
            .is_ok()
    );
}

#[test]
fn denials_name_the_host_and_the_rule() {
    let p = policy(&["pypi.org", "*.pythonhosted.org"]);
    let err = p.admits(&name("evil.example")).unwrap_err();
    assert_eq!(err.rule(), "not-on-allowlist");
    assert_eq!(
        err.to_string(),
        "evil.example is not on this environment's network allowlist (allowed: pypi.org, *.pythonhosted.org)"
    );
    assert!(
        err.remedy()
            .starts_with("To allow it, add \"evil.example\" to")
    );
    let err = p.admits(&name("1.2.3.4")).unwrap_err();
    assert!(err.to_string().starts_with("1.2.3.4 is an IP address"));
}

#[test]
fn bad_entries_say_how_to_write_them() {
    for (entry, hint) in [
        ("https://pypi.org", "without a scheme"),
        ("pypi.org:443", "ports are not part"),
        ("foo.*.com", "whole first label"),
        ("*example.com", "whole first label"),
        ("10.1.2.3/8", "did you mean \"10.0.0.0/8\""),
        ("bücher.de", "xn--"),
        ("a..b", "empty or over-long label"),
        ("exa mple.com", "only letters"),
        (" pypi.org", "without spaces"),
        ("127.1", "numeric address"),
        ("0x7f000001", "numeric address"),
        ("10.0.0.0/33", "CIDR range"),
    ] {
        let err = Policy::from_entries(&[entry], Bounds::default()).unwrap_err();
        assert!(err.contains(hint), "{entry}: {err}");
        assert!(err.contains(&format!("{entry:?}")), "{entry}: {err}");
    }
    assert!(Policy::from_entries(&["xn--bcher-kva.de"], Bounds::default()).is_ok());
}

#[test]
fn request_hosts_in_numeric_disguise_are_not_names() {
    for h in [
        "127.1",
        "2130706433",
        "0x7f.1",
        "0x7f000001",
        "bücher.de",
        "a b",
    ] {
        assert!(Host::parse(h).is_err(), "{h}");
    }
    assert_eq!(Host::parse("[::1]"), Ok(Host::Ip("::1".parse().unwrap())));
    assert_eq!(
        Host::parse("[::ffff:10.0.0.1]"),
        Ok(Host::Ip("10.0.0.1".parse().unwrap()))
    );
    assert_eq!(Host::parse("PyPI.org."), Ok(Host::Name("pypi.org".into())));
}

#[derive(Debug, Deserialize)]
struct Env {
    #[serde(default)]
    network: NetworkSetting,
}

fn toml_env(text: &str) -> Result<NetworkSetting, String> {
    toml::from_str::<Env>(text)
        .map(|e| e.network)
        .map_err(|e| e.to_string())
}

#[test]
fn the_setting_reads_false_true_and_a_table() {
    assert_eq!(toml_env("").unwrap(), NetworkSetting::Off);
    assert_eq!(toml_env("network = false").unwrap(), NetworkSetting::Off);
    assert_eq!(
        toml_env("network = true").unwrap(),
        NetworkSetting::Proxied(Policy::any_public())
    );
    let s = toml_env(
        "network = { allow = [\"pypi.org\", \"*.pythonhosted.org\"], max_connections = 8, transfer_mb = 100 }",
    )
    .unwrap();
    let p = s.policy().unwrap();
    assert_eq!(p.summary(), "pypi.org, *.pythonhosted.org");
    assert_eq!(p.bounds.max_connections, 8);
    assert_eq!(p.bounds.max_transfer_bytes, 100 << 20);
    let s = toml_env("[network]\nallow = [\"10.0.0.0/8\", \"*\"]").unwrap();
    assert_eq!(s.policy().unwrap().summary(), "10.0.0.0/8, any public host");
    // The same value in a JSON manifest.
    let j: Env = serde_json::from_str(r#"{"network": {"allow": ["pypi.org"]}}"#).unwrap();
    assert_eq!(j.network.policy().unwrap().summary(), "pypi.org");
    let j: Env = serde_json::from_str(r#"{"network": true}"#).unwrap();
    assert!(j.network.policy().is_some());
}

#[test]
fn setting_errors_are_specific() {
    for (text, hint) in [
        ("network = \"yes\"", "false, true, or a table"),
        ("network = { allow = [] }", "allow is empty"),
        ("network = { hosts = [\"a.b\"] }", "unknown field `hosts`"),
        (
            "network = { allow = [\"a.b\"], max_connections = 0 }",
            "out of range",
        ),
        (
            "network = { allow = [\"a.b\"], transfer_mb = 0 }",
            "out of range",
        ),
        (
            "network = { allow = [\"https://a.b\"] }",
            "without a scheme",
        ),
    ] {
        let err = toml_env(text).unwrap_err();
        assert!(err.contains(hint), "{text}: {err}");
    }
}

#[test]
fn the_schema_accepts_both_forms() {
    let schema = schemars::schema_for!(NetworkSetting);
    let text = serde_json::to_string(&schema).unwrap();
    assert!(text.contains("\"anyOf\""), "{text}");
    assert!(text.contains("\"boolean\""), "{text}");
    assert!(text.contains("\"allow\""), "{text}");
    assert!(text.contains("transfer_mb"), "{text}");
    assert!(text.contains("\"maximum\":1024"), "{text}");
}

#[test]
fn a_policy_within_another_reaches_nothing_more() {
    let p = |entries: &[&str]| Policy::from_entries(entries, Bounds::default()).unwrap();
    let bound = p(&["pypi.org", "*.pythonhosted.org", "10.1.0.0/16"]);
    assert_eq!(p(&["pypi.org"]).exceeds(&bound), None);
    assert_eq!(p(&["files.pythonhosted.org"]).exceeds(&bound), None);
    assert_eq!(p(&["*.a.pythonhosted.org"]).exceeds(&bound), None);
    assert_eq!(p(&["10.1.2.0/24"]).exceeds(&bound), None);
    assert_eq!(
        p(&["pythonhosted.org"]).exceeds(&bound).as_deref(),
        Some("pythonhosted.org")
    );
    assert_eq!(
        p(&["evil.example"]).exceeds(&bound).as_deref(),
        Some("evil.example")
    );
    assert_eq!(
        p(&["*"]).exceeds(&bound).as_deref(),
        Some("any public host")
    );
    assert_eq!(
        p(&["10.0.0.0/8"]).exceeds(&bound).as_deref(),
        Some("10.0.0.0/8")
    );
    // Any public host covers names, not ranges the filter refuses.
    let any = Policy::any_public();
    assert_eq!(p(&["evil.example", "*.x.y"]).exceeds(&any), None);
    assert_eq!(
        p(&["127.0.0.0/8"]).exceeds(&any).as_deref(),
        Some("127.0.0.0/8")
    );
    let wide = Policy::from_entries(
        &["pypi.org"],
        Bounds {
            max_connections: 500,
            ..Bounds::default()
        },
    )
    .unwrap();
    assert!(wide.exceeds(&bound).unwrap().contains("max_connections"));
}
