//! Certificates for a TLS lab, made with `openssl` in the lab's directory: a CA, a certificate
//! for the processes (`127.0.0.1` and `localhost`, usable as server and as client, since a
//! Sentinel and a replica present it when they dial), one for polestar as a client, one for
//! the HTTPS API, and a second CA that signed none of them (for the "wrong CA" tests).
//!
//! In a TLS lab every process listens with `port 0` and `tls-port`, requires client
//! certificates and replicates over TLS; [`query`](crate::query) dials the ports registered
//! here over TLS, with polestar's client certificate.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, bail, ensure};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

#[derive(Clone, Debug)]
pub struct Certs {
    pub ca: PathBuf,
    /// The processes' certificate and key (server and client use).
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    /// polestar's client certificate and key.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
}

impl Certs {
    /// Makes every certificate in `dir` (created if missing).
    pub fn generate(dir: &Path) -> anyhow::Result<Certs> {
        std::fs::create_dir_all(dir)?;
        let path = |name: &str| dir.join(name);
        make_ca(dir, "ca", "polestar lab CA")?;
        make_ca(dir, "other-ca", "some other CA")?;
        let san = "subjectAltName=IP:127.0.0.1,DNS:localhost";
        sign(dir, "node", "redis node", Some(san), "serverAuth,clientAuth")?;
        sign(dir, "client", "polestar", None, "clientAuth")?;
        Ok(Certs {
            ca: path("ca.crt"),
            node_cert: path("node.crt"),
            node_key: path("node.key"),
            client_cert: path("client.crt"),
            client_key: path("client.key"),
            other_ca: path("other-ca.crt"),
        })
    }

    /// A server certificate signed by the CA that [`Certs::generate`] made in `dir`, naming
    /// `ips` (an HTTPS API on other hosts than loopback): `(<name>.crt, <name>.key)`.
    pub fn server(
        dir: &Path,
        name: &str,
        ips: &[std::net::IpAddr],
    ) -> anyhow::Result<(PathBuf, PathBuf)> {
        let names: Vec<String> = ips.iter().map(|ip| format!("IP:{ip}")).collect();
        let san = format!("subjectAltName={}", names.join(","));
        sign(dir, name, "polestar API", Some(&san), "serverAuth")?;
        Ok((dir.join(format!("{name}.crt")), dir.join(format!("{name}.key"))))
    }

    /// A client of the lab's processes: trusts the lab's CA, presents polestar's certificate
    /// (ring, the provider polestar uses).
    pub fn client_config(&self) -> anyhow::Result<Arc<ClientConfig>> {
        let mut roots = RootCertStore::empty();
        for cert in certificates(&self.ca)? {
            roots.add(cert).with_context(|| format!("{}: not a CA", self.ca.display()))?;
        }
        let chain = certificates(&self.client_cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.client_key)
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.client_key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        Ok(Arc::new(config))
    }

    /// The `redis.conf` / `sentinel.conf` lines of a TLS-only process on `port`.
    pub fn conf_lines(&self, port: u16) -> String {
        format!(
            "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
             tls-ca-cert-file {}\ntls-auth-clients yes\ntls-replication yes\n",
            self.node_cert.display(),
            self.node_key.display(),
            self.ca.display(),
        )
    }
}

fn certificates(file: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let all = CertificateDer::pem_file_iter(file).and_then(|certs| certs.collect());
    all.map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))
}

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("cannot run openssl")?;
    ensure!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn make_ca(dir: &Path, name: &str, subject: &str) -> anyhow::Result<()> {
    let (key, crt, subj) = (format!("{name}.key"), format!("{name}.crt"), format!("/CN={subject}"));
    openssl(dir, &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &key])?;
    let args = ["req", "-x509", "-new", "-key", &key, "-sha256", "-days", "2", "-subj", &subj];
    openssl(
        dir,
        &[&args[..], &["-out", &crt, "-addext", "basicConstraints=critical,CA:TRUE"]].concat(),
    )
}

fn sign(
    dir: &Path,
    name: &str,
    subject: &str,
    san: Option<&str>,
    usage: &str,
) -> anyhow::Result<()> {
    let (key, csr, crt) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"));
    let ext = format!("{name}.ext");
    // PKCS#8, which both rustls and OpenSSL read.
    openssl(
        dir,
        &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", &key],
    )?;
    openssl(dir, &["req", "-new", "-key", &key, "-subj", &format!("/CN={subject}"), "-out", &csr])?;
    let mut extensions = format!("extendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n");
    if let Some(san) = san {
        extensions.push_str(san);
        extensions.push('\n');
    }
    std::fs::write(dir.join(&ext), extensions)?;
    let args = ["x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key"];
    openssl(
        dir,
        &[&args[..], &["-CAcreateserial", "-days", "2", "-sha256", "-extfile", &ext, "-out", &crt]]
            .concat(),
    )?;
    if !dir.join(&crt).is_file() {
        bail!("openssl made no {crt}");
    }
    Ok(())
}

/// Ports of the running TLS labs, with the certificates to dial them.
static TLS_PORTS: Mutex<Option<HashMap<u16, Certs>>> = Mutex::new(None);

fn ports() -> MutexGuard<'static, Option<HashMap<u16, Certs>>> {
    // Only map operations under the lock: a poisoned map is still consistent.
    TLS_PORTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `port` is a TLS lab process's: [`query`](crate::query) dials it with `certs`.
pub fn register(port: u16, certs: Certs) {
    ports().get_or_insert_with(HashMap::new).insert(port, certs);
}

pub fn unregister(port: u16) {
    if let Some(map) = ports().as_mut() {
        map.remove(&port);
    }
}

/// How to dial `port`, if it is a TLS lab process's.
pub fn for_port(port: u16) -> Option<Certs> {
    ports().as_ref()?.get(&port).cloned()
}
