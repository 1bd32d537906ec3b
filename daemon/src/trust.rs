//! The certificate authorities the server trusts: the system's store, read
//! once, for the server's own TLS clients (an OAuth issuer, the hosts the
//! proxy reaches for sandboxes) and, as PEM, for sandboxes that need a
//! bundle of their own. A test build may add roots (`NIX_SANDBOX_TEST_TRUST`,
//! see `config::knobs`), so that local servers with a test authority stand
//! in for public hosts.

use std::sync::{Arc, OnceLock};

use base64::Engine;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// The trusted roots, as DER certificates.
pub fn roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!("a system CA certificate could not be read: {e}");
        }
        let mut certs = found.certs;
        if certs.is_empty() {
            tracing::warn!(
                "no system CA certificates were found: TLS servers cannot be verified (set SSL_CERT_FILE)"
            );
        }
        certs.extend(test_roots());
        certs
    })
}

/// A TLS client configuration verifying servers against [`roots`], offering
/// the ALPN protocols given.
pub fn client_config(alpn: &[&[u8]]) -> ClientConfig {
    let mut store = RootCertStore::empty();
    store.add_parsable_certificates(roots().iter().cloned());
    let mut config = ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default protocol versions")
    .with_root_certificates(store)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// Certificates as PEM, one after the other.
pub fn pem(certs: &[CertificateDer<'_>]) -> String {
    let mut out = String::new();
    for cert in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// Roots trusted besides the system's: only ever set by a test build.
static EXTRA: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();

fn test_roots() -> Vec<CertificateDer<'static>> {
    EXTRA.get().cloned().unwrap_or_default()
}

/// Trusts the authorities in the PEM file `path` too (a test build's
/// `NIX_SANDBOX_TEST_TRUST`); before anything asks for [`roots`].
#[cfg(any(test, feature = "test-knobs"))]
pub fn trust_for_tests(path: &std::path::Path) -> Result<usize, String> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect())
        .map_err(|e| format!("not a PEM file of certificates: {e}"))?;
    let n = certs.len();
    let _ = EXTRA.set(certs);
    Ok(n)
}
