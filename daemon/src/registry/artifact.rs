//! Sandbox artifacts: the contract between the Nix side and the daemon. An
//! artifact is a directory holding `manifest.json` (schema in
//! docs/manifest.md); this module reads and checks it and turns it into an
//! environment whose root filesystem is exactly the listed store closure.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::config::{LimitSettings, is_valid_env_name};
use crate::environment::{Environment, InterpreterKind, Origin, RootFs};
use crate::limits::Limits;

pub const MANIFEST: &str = "manifest.json";
/// The manifest versions this daemon understands.
pub const MANIFEST_VERSION: u32 = 1;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub interpreter: ManifestInterpreter,
    pub closure: Vec<PathBuf>,
    #[serde(default)]
    pub path: Vec<PathBuf>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub links: BTreeMap<PathBuf, PathBuf>,
    #[serde(default)]
    pub limits: LimitSettings,
    #[serde(default)]
    pub network: crate::network::NetworkSetting,
    #[serde(default)]
    pub tools: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestInterpreter {
    pub argv: Vec<String>,
    #[serde(default = "default_file_name")]
    pub file_name: String,
    /// `bash`, `python` or `node` when the interpreter is one of those.
    #[serde(default)]
    pub kind: Option<String>,
}

fn default_file_name() -> String {
    ".main".to_string()
}

/// Where symlinks into the closure may be created.
const LINK_DIRS: &[&str] = &[
    "/bin",
    "/usr/bin",
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/usr/share",
];

/// The Nix store (`NIX_STORE_DIR`, else /nix/store).
pub(crate) fn store_dir() -> PathBuf {
    std::env::var_os("NIX_STORE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/nix/store"))
}

/// Reads the artifact in `dir`; `defaults` is the config's `[defaults]` layer,
/// which the manifest's own limits override.
pub fn load(dir: &Path, defaults: LimitSettings) -> Result<Environment, String> {
    let file = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let m = parse(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    to_environment(m, real, defaults)
}

/// Parses a manifest, naming the key of any error.
pub fn parse(text: &str) -> Result<Manifest, String> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let m: Manifest = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.into_inner().to_string()
        } else {
            format!("key `{path}`: {}", e.into_inner())
        }
    })?;
    if m.version != MANIFEST_VERSION {
        return Err(format!(
            "manifest version {} is not supported (this server reads version {MANIFEST_VERSION}); rebuild the artifact with the matching nix-sandbox-mcp flake",
            m.version
        ));
    }
    Ok(m)
}

fn to_environment(
    m: Manifest,
    artifact: PathBuf,
    defaults: LimitSettings,
) -> Result<Environment, String> {
    if !is_valid_env_name(&m.name) {
        return Err(format!(
            "key `name`: {:?} is not a valid environment name",
            m.name
        ));
    }
    let store = store_dir();
    if m.closure.is_empty() {
        return Err("key `closure`: the closure is empty".to_string());
    }
    for p in &m.closure {
        if !is_clean_absolute(p) || !p.starts_with(&store) || p == &store {
            return Err(format!(
                "key `closure`: {} is not a path inside {}",
                p.display(),
                store.display()
            ));
        }
        if !p.exists() {
            return Err(format!(
                "key `closure`: {} does not exist (garbage-collected? rebuild the artifact)",
                p.display()
            ));
        }
    }
    let in_closure = |p: &Path| is_clean_absolute(p) && m.closure.iter().any(|c| p.starts_with(c));
    let program = m
        .interpreter
        .argv
        .first()
        .ok_or("key `interpreter.argv`: empty")?;
    if !in_closure(Path::new(program)) {
        return Err(format!(
            "key `interpreter.argv`: {program} is not inside the closure"
        ));
    }
    for p in &m.path {
        if !in_closure(p) {
            return Err(format!(
                "key `path`: {} is not inside the closure",
                p.display()
            ));
        }
    }
    for (link, target) in &m.links {
        if !is_clean_absolute(link)
            || !LINK_DIRS
                .iter()
                .any(|d| link.parent() == Some(Path::new(d)))
        {
            return Err(format!(
                "key `links`: {} must be a file directly in one of {}",
                link.display(),
                LINK_DIRS.join(", ")
            ));
        }
        if !in_closure(target) {
            return Err(format!(
                "key `links`: target {} is not inside the closure",
                target.display()
            ));
        }
    }
    for k in m.env.keys() {
        let valid = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid || crate::config::RESERVED_VARS.contains(&k.as_str()) {
            return Err(format!(
                "key `env.{k}`: not a variable the artifact may set"
            ));
        }
    }
    // A manifest may come from a project's flake: it names no credentials
    // (it could point one at any file the server reads) and no request rules.
    if m.network
        .policy()
        .is_some_and(|p| !p.interception.is_empty())
    {
        return Err(
            "key `network`: an artifact cannot hold credentials or request rules; the server's \
             configuration sets them ([environments.NAME.network])"
                .to_string(),
        );
    }
    if m.interpreter.file_name.is_empty() || m.interpreter.file_name.contains('/') {
        return Err("key `interpreter.file_name`: must be a plain file name".to_string());
    }
    let kind =
        match &m.interpreter.kind {
            None => None,
            Some(k) => Some(InterpreterKind::parse(k).ok_or_else(|| {
                format!("key `interpreter.kind`: {k:?} is not bash, python or node")
            })?),
        };
    let settings = defaults.overlay(m.limits);
    Ok(Environment {
        description: if m.description.is_empty() {
            m.name.clone()
        } else {
            m.description
        },
        name: m.name,
        origin: Origin::Artifact { path: artifact },
        interpreter: m.interpreter.argv,
        file_name: m.interpreter.file_name,
        root: RootFs::Closure {
            store_paths: m.closure,
            links: m.links.into_iter().collect(),
        },
        path: m.path.iter().map(|p| p.display().to_string()).collect(),
        vars: m.env,
        limits: Limits::resolve(settings),
        settings,
        network: m.network,
        seccomp_allow: Vec::new(),
        caches: Vec::new(),
        cache_bytes: crate::caches::DEFAULT_BYTES,
        tools: m.tools,
        kind,
    })
}

fn is_clean_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(closure: &str, extra: &str) -> String {
        format!(
            r#"{{"version": 1, "name": "py", "description": "Python", "interpreter": {{"argv": ["{closure}/bin/python3", "{{file}}"], "file_name": ".main.py", "kind": "python"}},
               "closure": ["{closure}"], "path": ["{closure}/bin"], "env": {{"LANG": "C.UTF-8"}},
               "links": {{"/bin/sh": "{closure}/bin/sh"}}, "limits": {{"timeout_ms": 5000}}, "tools": ["python3"] {extra}}}"#
        )
    }

    fn fake_store() -> (tempfile::TempDir, PathBuf) {
        let store = tempfile::tempdir().unwrap();
        let pkg = store.path().join("abc-python");
        std::fs::create_dir_all(pkg.join("bin")).unwrap();
        (store, pkg)
    }

    fn load_with_store(text: &str, store: &Path) -> Result<Environment, String> {
        // The store dir is read from the environment; tests pass it explicitly.
        let m = parse(text)?;
        temp_env(store, || {
            to_environment(m, PathBuf::from("/art"), LimitSettings::default())
        })
    }

    fn temp_env<T>(store: &Path, f: impl FnOnce() -> T) -> T {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _g = LOCK.lock().unwrap();
        // SAFETY: serialized by LOCK; no other test reads NIX_STORE_DIR.
        unsafe { std::env::set_var("NIX_STORE_DIR", store) };
        let r = f();
        // SAFETY: as above.
        unsafe { std::env::remove_var("NIX_STORE_DIR") };
        r
    }

    #[test]
    fn valid_manifest_becomes_a_closure_environment() {
        let (store, pkg) = fake_store();
        let env = load_with_store(&manifest(pkg.to_str().unwrap(), ""), store.path()).unwrap();
        assert_eq!(env.name, "py");
        assert_eq!(env.kind, Some(InterpreterKind::Python));
        assert_eq!(env.limits.timeout.as_millis(), 5000);
        match env.root {
            RootFs::Closure { store_paths, links } => {
                assert_eq!(store_paths, vec![pkg.clone()]);
                assert_eq!(links[0].0, PathBuf::from("/bin/sh"));
            }
            _ => panic!("closure expected"),
        }
    }

    #[test]
    fn rejects_unknown_keys_and_versions() {
        let (store, pkg) = fake_store();
        let e = load_with_store(
            &manifest(pkg.to_str().unwrap(), r#", "extra": 1"#),
            store.path(),
        )
        .unwrap_err();
        assert!(e.contains("unknown field `extra`"), "{e}");
        let e =
            parse(r#"{"version": 2, "name": "x", "interpreter": {"argv": ["a"]}, "closure": []}"#)
                .unwrap_err();
        assert!(e.contains("version 2"), "{e}");
    }

    #[test]
    fn rejects_paths_outside_the_closure() {
        let (store, pkg) = fake_store();
        let good = manifest(pkg.to_str().unwrap(), "");
        let bad = good.replace(
            &format!("\"{}/bin/python3\"", pkg.display()),
            "\"/usr/bin/python3\"",
        );
        assert!(
            load_with_store(&bad, store.path())
                .unwrap_err()
                .contains("interpreter.argv")
        );
        let bad = good.replace(
            &format!("\"closure\": [\"{}\"]", pkg.display()),
            "\"closure\": [\"/home\"]",
        );
        assert!(
            load_with_store(&bad, store.path())
                .unwrap_err()
                .contains("closure")
        );
        let bad = good.replace("\"/bin/sh\"", "\"/etc/passwd\"");
        assert!(
            load_with_store(&bad, store.path())
                .unwrap_err()
                .contains("links")
        );
        let bad = good.replace("\"LANG\"", "\"PATH\"");
        assert!(
            load_with_store(&bad, store.path())
                .unwrap_err()
                .contains("env.PATH")
        );
    }
}
