//! Certificates for a TLS lab, made with `openssl` in the lab's directory: a CA, a certificate
//! for the processes (`127.0.0.1` and `localhost`, usable as server and as client, since a
//! Sentinel and a replica present it when they dial), one for polestar as a client, one for
//! the HTTPS API, and a second CA that signed none of them (for the "wrong CA" tests).
//!
//! In a TLS lab every process listens with `port 0` and `tls-port`, requires client
//! certificates and replicates over TLS; [`query`](super::query) dials the ports registered
//! here over TLS.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

use anyhow::{Context, bail, ensure};

use crate::config::Tls;

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

    /// What polestar's config says to talk to the lab: the CA and the client certificate.
    pub fn client_tls(&self) -> Tls {
        Tls {
            enabled: true,
            ca_file: Some(self.ca.clone()),
            cert_file: Some(self.client_cert.clone()),
            key_file: Some(self.client_key.clone()),
        }
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

/// Ports of the running TLS labs, with how to dial them.
static TLS_PORTS: Mutex<Option<HashMap<u16, Tls>>> = Mutex::new(None);

fn ports() -> MutexGuard<'static, Option<HashMap<u16, Tls>>> {
    // Only map operations under the lock: a poisoned map is still consistent.
    TLS_PORTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `port` is a TLS lab process's: [`query`](super::query) dials it with `tls`.
pub fn register(port: u16, tls: Tls) {
    ports().get_or_insert_with(HashMap::new).insert(port, tls);
}

pub fn unregister(port: u16) {
    if let Some(map) = ports().as_mut() {
        map.remove(&port);
    }
}

/// How to dial `port`, if it is a TLS lab process's.
pub fn for_port(port: u16) -> Option<Tls> {
    ports().as_ref()?.get(&port).cloned()
}
