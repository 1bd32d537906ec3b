//! The proxy's certificate authority, for hosts whose requests it looks at
//! (credentials, request rules): a key and a self-signed certificate kept
//! in the server's state directory, and a certificate per host made on
//! first use and kept in memory.
//!
//! The authority may vouch only for the hosts the configuration names (an
//! X.509 name constraint), so that even its key, if it leaked, could not
//! impersonate any other site to a client that checks constraints; when the
//! configuration names a host the stored authority does not cover, a new
//! one is made. `nix-sandbox-mcp ca rotate` makes a new one at any time.
//! The key file is the server user's alone (0600, in a 0700 directory); a
//! key others can read is refused. Sandboxes trust the authority through a
//! bundle of the system's roots and this certificate ([`Authority::bundle_pem`]),
//! which the server puts in the `/etc` its sandboxes see.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How long an authority is valid; it is replaced when less than
/// [`RENEW_BEFORE`] remains.
const CA_LIFETIME: Duration = Duration::days(365);
const RENEW_BEFORE: Duration = Duration::days(30);
/// How long a host's certificate is valid; it is made again a day before.
const LEAF_LIFETIME: Duration = Duration::days(7);
/// Clocks of the sandbox and the server are one, but allow for skew in
/// validity checks made elsewhere.
const BACKDATE: Duration = Duration::hours(1);
/// Hosts whose certificates are kept at once: a `*.suffix` rule lets a
/// sandbox ask for any number of names, and each must not cost memory for
/// the server's life.
const MAX_LEAVES: usize = 256;

const KEY_FILE: &str = "ca.key";
const CERT_FILE: &str = "ca.pem";
const META_FILE: &str = "ca.toml";

/// Why the authority cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} can be read by other users (mode {mode:o}); the proxy's key must be the server user's alone: chmod 600 it, or make a new one with `nix-sandbox-mcp ca rotate`"
    )]
    Exposed { path: PathBuf, mode: u32 },
    #[error("{path}: {why}; make a new authority with `nix-sandbox-mcp ca rotate`")]
    Invalid { path: PathBuf, why: String },
    #[error("making a certificate failed: {0}")]
    Make(#[from] rcgen::Error),
}

/// What is stored beside the key: enough to sign with it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    common_name: String,
    /// Unix seconds.
    not_after: i64,
    /// The host patterns it may vouch for, as configured.
    hosts: Vec<String>,
}

/// The authority, ready to make certificates for hosts.
pub struct Authority {
    dir: PathBuf,
    meta: Meta,
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    /// Host → its TLS configuration and when to make it again.
    leaves: Mutex<HashMap<String, (Arc<ServerConfig>, OffsetDateTime)>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("dir", &self.dir)
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// Where the authority is kept: `$XDG_STATE_HOME/nix-sandbox-mcp/ca`
    /// (`~/.local/state/…`), or `/var/lib/nix-sandbox-mcp/ca` for root
    /// without XDG_STATE_HOME.
    pub fn default_dir() -> PathBuf {
        let state = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute());
        if rustix::process::geteuid().is_root() && state.is_none() {
            return PathBuf::from("/var/lib/nix-sandbox-mcp/ca");
        }
        state
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join("nix-sandbox-mcp/ca")
    }

    /// The authority in `dir` when it covers `hosts` and is not near its
    /// end; a new one otherwise.
    pub fn open(dir: &Path, hosts: &[String]) -> Result<Authority, CaError> {
        match Authority::existing(dir)? {
            Some(ca) if ca.covers(hosts) => Ok(ca),
            Some(_) => {
                tracing::info!(
                    "the proxy's certificate authority in {} does not cover every host with \
                     credentials or request rules, or is near its end: making a new one",
                    dir.display()
                );
                Authority::create(dir, hosts)
            }
            None => Authority::create(dir, hosts),
        }
    }

    /// A new authority in `dir`, replacing any there.
    pub fn create(dir: &Path, hosts: &[String]) -> Result<Authority, CaError> {
        make_private_dir(dir)?;
        let key = KeyPair::generate()?;
        let mut id = [0u8; 6];
        getrandom::fill(&mut id).map_err(|e| CaError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let now = OffsetDateTime::now_utc();
        let meta = Meta {
            common_name: format!("nix-sandbox-mcp proxy {id}"),
            not_after: (now + CA_LIFETIME).unix_timestamp(),
            hosts: hosts.to_vec(),
        };
        let mut params = issuer_params(&meta);
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_LIFETIME;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: hosts
                .iter()
                .map(|h| GeneralSubtree::DnsName(h.trim_start_matches("*.").to_string()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let cert = params.self_signed(&key)?;
        write_file(&dir.join(KEY_FILE), key.serialize_pem().as_bytes(), 0o600)?;
        write_file(&dir.join(CERT_FILE), cert.pem().as_bytes(), 0o644)?;
        let meta_text = toml::to_string(&meta).map_err(|e| CaError::Invalid {
            path: dir.join(META_FILE),
            why: e.to_string(),
        })?;
        write_file(&dir.join(META_FILE), meta_text.as_bytes(), 0o644)?;
        Ok(Authority {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(issuer_params(&meta), key),
            meta,
            cert: cert.der().clone(),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// Its name, as the certificate's subject says it.
    pub fn common_name(&self) -> &str {
        &self.meta.common_name
    }

    /// When it expires (UTC, RFC 3339).
    pub fn expires(&self) -> String {
        OffsetDateTime::from_unix_timestamp(self.meta.not_after)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| self.meta.not_after.to_string())
    }

    /// The host patterns it may vouch for.
    pub fn hosts(&self) -> &[String] {
        &self.meta.hosts
    }

    /// The stored authority as it is, `None` when there is none yet.
    pub fn existing(dir: &Path) -> Result<Option<Authority>, CaError> {
        let key_path = dir.join(KEY_FILE);
        let key_pem = match std::fs::read_to_string(&key_path) {
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CaError::Io {
                    path: key_path,
                    source,
                });
            }
        };
        let mode = std::fs::metadata(&key_path)
            .map_err(|source| CaError::Io {
                path: key_path.clone(),
                source,
            })?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(CaError::Exposed {
                path: key_path,
                mode: mode & 0o7777,
            });
        }
        let invalid = |path: PathBuf, why: String| CaError::Invalid { path, why };
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| invalid(key_path.clone(), format!("not a private key: {e}")))?;
        let meta_path = dir.join(META_FILE);
        let meta: Meta = std::fs::read_to_string(&meta_path)
            .map_err(|e| e.to_string())
            .and_then(|t| toml::from_str(&t).map_err(|e| e.to_string()))
            .map_err(|why| invalid(meta_path.clone(), why))?;
        let cert_path = dir.join(CERT_FILE);
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        let cert = CertificateDer::from_pem_file(&cert_path)
            .map_err(|e| invalid(cert_path.clone(), format!("not a PEM certificate: {e}")))?;
        Ok(Some(Authority {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(issuer_params(&meta), key),
            meta,
            cert,
            leaves: Mutex::new(HashMap::new()),
        }))
    }

    /// Whether this authority may vouch for every one of `hosts` for a while yet.
    fn covers(&self, hosts: &[String]) -> bool {
        let fresh = OffsetDateTime::now_utc() + RENEW_BEFORE
            < OffsetDateTime::from_unix_timestamp(self.meta.not_after)
                .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        fresh && hosts.iter().all(|h| self.meta.hosts.contains(h))
    }

    /// This authority's certificate file.
    pub fn certificate(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }

    /// What sandboxes trust: the system's roots and this authority, as PEM.
    pub fn bundle_pem(&self) -> String {
        let mut pem = crate::trust::pem(crate::trust::roots());
        pem.push_str(&crate::trust::pem(std::slice::from_ref(&self.cert)));
        pem
    }

    /// The TLS configuration that presents a certificate for `host`, made
    /// on first use.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, String> {
        let now = OffsetDateTime::now_utc();
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((config, renew)) = leaves.get(host)
            && now < *renew
        {
            return Ok(config.clone());
        }
        let config = Arc::new(self.make_leaf(host, now)?);
        if leaves.len() >= MAX_LEAVES {
            leaves.retain(|_, (_, renew)| now < *renew);
            if leaves.len() >= MAX_LEAVES {
                leaves.clear();
            }
        }
        leaves.insert(
            host.to_string(),
            (config.clone(), now + LEAF_LIFETIME - Duration::days(1)),
        );
        Ok(config)
    }

    fn make_leaf(&self, host: &str, now: OffsetDateTime) -> Result<ServerConfig, String> {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params =
            CertificateParams::new(vec![host.to_string()]).map_err(|e| e.to_string())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host);
        params.not_before = now - BACKDATE;
        params.not_after = now + LEAF_LIFETIME;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone(), self.cert.clone()], key)
        .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The parameters an issuer signs with: the same at creation and at every
/// load, so that certificates made later chain to the stored one.
fn issuer_params(meta: &Meta) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, meta.common_name.as_str());
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn make_private_dir(dir: &Path) -> Result<(), CaError> {
    let io = |source| CaError::Io {
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io)
}

/// Writes `bytes` to `path` through a new file renamed over it, so that a
/// reader sees the old file or the new one, and the key is never briefly
/// readable by others.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
    let io = |source| CaError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".new-")
        .tempfile_in(dir)
        .map_err(io)?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode)).map_err(io)?;
    tmp.write_all(bytes).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_private_and_a_new_host_makes_a_new_authority() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let hosts = vec!["api.example.com".to_string()];
        let a = Authority::open(&ca_dir, &hosts).unwrap();
        let mode = |f: &str| {
            std::fs::metadata(ca_dir.join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(KEY_FILE), 0o600);
        assert_eq!(mode(""), 0o700);
        let bundle = a.bundle_pem();
        let own = std::fs::read_to_string(a.certificate()).unwrap();
        assert!(
            bundle.contains(own.trim()),
            "the bundle holds the authority"
        );
        a.server_config("api.example.com").unwrap();
        for i in 0..(MAX_LEAVES + 10) {
            a.server_config(&format!("h{i}.example.com")).unwrap();
        }
        assert!(a.leaves.lock().unwrap().len() <= MAX_LEAVES);

        let same = Authority::open(&ca_dir, &hosts).unwrap();
        assert_eq!(same.meta, a.meta, "kept while it covers the hosts");
        let more = Authority::open(&ca_dir, &["other.example.com".to_string()]).unwrap();
        assert_ne!(more.meta.common_name, a.meta.common_name);

        std::fs::set_permissions(
            ca_dir.join(KEY_FILE),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        let e = Authority::open(&ca_dir, &["other.example.com".to_string()]).unwrap_err();
        assert!(e.to_string().contains("ca rotate"), "{e}");
        std::fs::write(ca_dir.join(KEY_FILE), "nonsense").unwrap();
        std::fs::set_permissions(
            ca_dir.join(KEY_FILE),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let e = Authority::open(&ca_dir, &hosts).unwrap_err();
        assert!(matches!(e, CaError::Invalid { .. }), "{e}");
    }
}
