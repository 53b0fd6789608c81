//! TLS for every connection polestar makes (Sentinels, data nodes, upstream polestars) or
//! accepts (the HTTPS API), built here and nowhere else.
//!
//! One crypto provider, ring, for the whole process: redis' `tokio-rustls-comp` compiles
//! rustls with none, and rustls panics at the first handshake of a process that has not
//! installed one ("Could not automatically determine the process-level CryptoProvider").
//! Every configuration here is built with [`provider`] explicitly, and [`install`] makes it the
//! process default as well, for any library that asks rustls for the default.
//!
//! Certificates are read and checked when a configuration is built: `polestar check`, start
//! and every reload build each one, so a missing, unreadable, malformed or mismatched PEM is a
//! configuration problem naming its file, never a connection that fails later for a reason
//! nobody reads. Connections build their configuration afresh from the files (sub-millisecond,
//! the system roots are read once), so a certificate renewed in place is used from the next
//! connection on.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::config::{ServerTls, Tls};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: cannot read: {source}", file.display())]
    Read { file: PathBuf, source: io::Error },
    #[error("{}: no PEM certificate in it", file.display())]
    NoCertificate { file: PathBuf },
    #[error("{}: not a valid PEM certificate file: {message}", file.display())]
    BadCertificate { file: PathBuf, message: String },
    #[error("{}: no valid PEM private key in it: {message}", file.display())]
    BadKey { file: PathBuf, message: String },
    #[error("{}: not a usable CA certificate: {message}", file.display())]
    BadCa { file: PathBuf, message: String },
    #[error("{} and {} do not go together: {message}", cert.display(), key.display())]
    Mismatch { cert: PathBuf, key: PathBuf, message: String },
    #[error("no system root certificates (give a ca_file): {0}")]
    NoSystemRoots(String),
    #[error("cannot build the TLS configuration: {0}")]
    Build(String),
}

/// The one crypto provider of the process.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone()
}

/// Makes [`provider`] the process default (idempotent; a provider installed before is kept,
/// and this process installs no other).
pub fn install() {
    let _ = CryptoProvider::install_default((*provider()).clone());
}

/// What a client connection trusts and presents: `ca_file` (or the system roots) and an
/// optional client certificate.
pub fn client_config(tls: &Tls) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = roots(tls.ca_file.as_deref())?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Build(e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert)?;
            let private = private_key(key)?;
            builder.with_client_auth_cert(chain, private).map_err(|e| TlsError::Mismatch {
                cert: cert.clone(),
                key: key.clone(),
                message: e.to_string(),
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// What an agent trusts for https upstreams: `ca_file` or the system roots; HTTP/1.1.
pub fn https_client_config(ca_file: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Build(e.to_string()))?
        .with_root_certificates(roots(ca_file)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The HTTPS API's certificate and key.
pub fn server_config(tls: &ServerTls) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(&tls.cert_file)?;
    let key = private_key(&tls.key_file)?;
    let mismatch = |message: String| TlsError::Mismatch {
        cert: tls.cert_file.clone(),
        key: tls.key_file.clone(),
        message,
    };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Build(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| mismatch(e.to_string()))?;
    // HTTP/1.1 only, as the server speaks.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The roots to verify servers against: the CA file, or the system's.
pub fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let Some(file) = ca_file else { return system_roots() };
    let mut store = RootCertStore::empty();
    for cert in certificates(file)? {
        store
            .add(cert)
            .map_err(|e| TlsError::BadCa { file: file.to_owned(), message: e.to_string() })?;
    }
    Ok(store)
}

/// The system's trust store, read once per process.
fn system_roots() -> Result<RootCertStore, TlsError> {
    static SYSTEM: OnceLock<Result<RootCertStore, String>> = OnceLock::new();
    let loaded = SYSTEM.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut store = RootCertStore::empty();
        let (added, _) = store.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found.errors.first().map(ToString::to_string);
            return Err(why.unwrap_or_else(|| "the trust store is empty".into()));
        }
        Ok(store)
    });
    loaded.clone().map_err(TlsError::NoSystemRoots)
}

fn read(file: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(file).map_err(|source| TlsError::Read { file: file.to_owned(), source })
}

fn certificates(file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(file)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCertificate { file: file.to_owned(), message: e.to_string() })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { file: file.to_owned() });
    }
    Ok(chain)
}

fn private_key(file: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(file)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| TlsError::BadKey { file: file.to_owned(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("temp dir is writable");
        path
    }

    #[test]
    fn a_file_that_is_not_pem_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = write(dir.path(), "ca.pem", "not a certificate\n");
        let tls = Tls { enabled: true, ca_file: Some(ca.clone()), ..Tls::default() };
        let error = client_config(&tls).expect_err("no certificate in it").to_string();
        assert!(error.contains(&ca.display().to_string()), "{error}");
        assert!(error.contains("no PEM certificate"), "{error}");
    }

    #[test]
    fn a_missing_key_file_is_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let tls = ServerTls {
            cert_file: dir.path().join("c.pem"),
            key_file: dir.path().join("k"),
            stamp: None,
        };
        let error = server_config(&tls).expect_err("nothing there").to_string();
        assert!(error.contains("c.pem: cannot read"), "{error}");
    }

    #[test]
    fn install_is_idempotent() {
        install();
        install();
        assert!(CryptoProvider::get_default().is_some());
    }
}
