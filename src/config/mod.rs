//! The configuration file: read, checked as a whole (every problem with its path), and turned
//! into typed values that the rest of polestar uses without further checks.
//!
//! Secrets are read from their files here and kept in [`Secret`], whose `Debug` hides them.

pub mod duration;
pub mod readiness;
pub mod sentinel_api;
mod shape;
pub mod size;
mod walk;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde_yaml::Value;

use crate::topology::label_for;
use walk::{Problems, Section};

pub const DEFAULT_PATH: &str = "/etc/polestar/polestar.yaml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: not valid YAML: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: {} problem(s):\n  {}", problems.len(), problems.join("\n  "))]
    Invalid { path: PathBuf, problems: Vec<String> },
}

impl ConfigError {
    /// Each problem on its own line, prefixed with the file.
    pub fn problems(&self) -> Vec<String> {
        match self {
            Self::Invalid { path, problems } => {
                problems.iter().map(|p| format!("{}: {p}", path.display())).collect()
            }
            other => vec![other.to_string()],
        }
    }
}

/// A secret read from a file; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// `host:port` where host is an IP address or a DNS name (resolved at connect time).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl HostPort {
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(Self { host: addr.ip().to_string(), port: addr.port() });
        }
        let bad = || format!("{text:?} is not host:port");
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
        if host.is_empty() || !host.chars().all(valid) || port == 0 {
            return Err(bad());
        }
        Ok(Self { host: host.to_string(), port })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tls {
    pub enabled: bool,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Credentials (and TLS) for one kind of Redis endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Auth {
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub tls: Tls,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sentinels {
    pub addresses: Vec<HostPort>,
    pub auth: Auth,
}

/// Where the truth comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Sentinels(Sentinels),
    /// Other polestars' HTTP APIs, followed through their event streams.
    Upstream(Upstream),
}

/// `upstream:`: the polestars an agent follows, and how it proves who it is to them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    /// `http://` or `https://` base URLs, without a trailing `/`; every one is followed.
    pub urls: Vec<String>,
    /// Verify https upstreams against it (default: the system roots).
    pub ca_file: Option<PathBuf>,
    /// Sent as `Authorization: Bearer` on every request (`upstream.token_file`).
    pub token: Option<Secret>,
    /// `upstream.allow_plaintext`: an `http://` URL may carry the token, or feed
    /// `sweep.remote`, anyway (a trusted network; refused by default, see [`plaintext`]).
    pub allow_plaintext: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterConfig {
    pub name: String,
    pub label: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dns {
    pub listen: Vec<SocketAddr>,
    /// Lower case, with the trailing dot.
    pub zone: String,
    pub ttl: Duration,
    pub nameservers: Vec<String>,
    pub transfer_allow: Vec<IpNet>,
    pub notify: Vec<SocketAddr>,
    /// UDP answers a second per client prefix, name and type (response-rate limiting);
    /// 0 turns it off.
    pub rate_limit: u32,
    /// `replicas.<label>` leaves out replicas lagging more than this many bytes (`None`: lag
    /// does not matter).
    pub replica_max_lag: Option<u64>,
    /// Past the rate, one answer in this many is sent truncated, the others dropped
    /// (`dns.rate_limit_slip`); 1: every one truncated, 0: every one dropped.
    pub rate_limit_slip: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Http {
    pub listen: SocketAddr,
    /// Without it the POST endpoints answer 403.
    pub admin_token: Option<Secret>,
    /// Agents presenting it get stream slots of their own; a wrong one is refused with 401.
    pub agent_token: Option<Secret>,
    /// Serve HTTPS only, with this certificate.
    pub tls: Option<ServerTls>,
}

/// A server certificate and its key (PEM files), as `http.tls` names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// When each file was last modified, as read with the configuration: a certificate renewed
    /// in place makes a reload see a change, and the HTTPS server loads it again.
    pub stamp: Option<(std::time::SystemTime, std::time::SystemTime)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spare {
    pub names: Vec<String>,
    pub users: Vec<String>,
    pub cidrs: Vec<IpNet>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drain {
    pub enabled: bool,
    pub grace: Duration,
    pub interval: Duration,
    pub window: Duration,
    pub rate: u32,
    pub spare: Spare,
}

/// `sentinel_api:`: answer Sentinel-aware clients as if polestar were a Sentinel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelApi {
    pub listen: Vec<SocketAddr>,
    /// `AUTH`/`HELLO AUTH` password; without it every client is served (reloadable).
    pub password: Option<Secret>,
    /// The other polestars, answered to `SENTINEL SENTINELS` (reloadable).
    pub peers: Vec<HostPort>,
    /// Connections served at once; the next ones are told so and closed.
    pub max_connections: usize,
    /// A client subscribed to nothing that sends nothing this long is disconnected.
    pub idle_timeout: Duration,
}

/// `readiness:`: what counts against a failover being possible (see [`crate::readiness`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// A replica lagging more than this (bytes) is not promotable.
    pub max_lag: u64,
    /// A replica entry `s_down` longer than this is stale.
    pub stale_after: Duration,
    /// How often the Sentinels (and the nodes they name) are asked.
    pub interval: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep {
    pub local_ports: Vec<u16>,
    pub remote: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub source: Source,
    /// `None`: every master the Sentinels monitor.
    pub masters: Option<Vec<MasterConfig>>,
    pub nodes: Auth,
    pub dns: Option<Dns>,
    pub http: Option<Http>,
    pub drain: Drain,
    pub sweep: Option<Sweep>,
    pub sentinel_api: Option<SentinelApi>,
    pub readiness: Readiness,
    /// The file it was loaded from (`None` when parsed from text): what SIGHUP reloads.
    pub file: Option<PathBuf>,
    /// What works but should be fixed, each as `path: message` (`polestar check` prints them,
    /// `run` logs them).
    pub warnings: Vec<String>,
}

pub const DEFAULT_TTL: Duration = Duration::from_secs(1);
/// `drain.grace` defaults to `dns.ttl` plus this: caching resolvers count whole seconds
/// (unbound with a 1 s TTL was measured naming the old primary 1.9 s after the flip).
pub const DEFAULT_GRACE_OVER_TTL: Duration = Duration::from_millis(1500);

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let config = Self::parse(&text, base).map_err(|e| match e {
            ParseError::Yaml(message) => ConfigError::Yaml { path: path.to_owned(), message },
            ParseError::Invalid(problems) => {
                ConfigError::Invalid { path: path.to_owned(), problems }
            }
        })?;
        Ok(Self { file: Some(path.to_owned()), ..config })
    }

    /// Parses YAML text; relative secret files are read relative to `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, ParseError> {
        let value: Value =
            serde_yaml::from_str(text).map_err(|e| ParseError::Yaml(e.to_string()))?;
        let mut problems = Problems::default();
        let config = build(value, base, &mut problems);
        match config {
            Some(c) if problems.errors.is_empty() => Ok(Self { warnings: problems.warnings, ..c }),
            _ => Err(ParseError::Invalid(problems.errors)),
        }
    }

    /// The sentinel settings, when the truth comes from Sentinels.
    pub fn sentinels(&self) -> Option<&Sentinels> {
        match &self.source {
            Source::Sentinels(s) => Some(s),
            Source::Upstream(_) => None,
        }
    }

    /// The label a master is served under: configured, or derived from its name.
    pub fn label_of(&self, master: &str) -> String {
        self.masters
            .iter()
            .flatten()
            .find(|m| m.name == master)
            .map(|m| m.label.clone())
            .unwrap_or_else(|| label_for(master))
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

#[derive(Debug)]
pub enum ParseError {
    Yaml(String),
    Invalid(Vec<String>),
}

fn build(value: Value, base: &Path, p: &mut Problems) -> Option<Config> {
    let mut top = Section::new("", value, p);
    let sentinels = top.raw("sentinels").map(|v| sentinels(v, base, p));
    let upstream = top.raw("upstream").and_then(|v| upstream(v, base, p));
    let masters = top.raw("masters").map(|v| masters(v, p));
    let nodes = top.raw("nodes").map(|v| {
        let section = Section::new("nodes", v, p);
        let own_tls = section.has("tls");
        (auth(section, base, p, false), own_tls)
    });
    let dns = top.raw("dns").map(|v| dns(v, p));
    let http = top.raw("http").map(|v| http(v, base, p));
    let ttl = dns.as_ref().and_then(|d| d.as_ref().map(|d| d.ttl)).unwrap_or(DEFAULT_TTL);
    let drain = drain(top.raw("drain").unwrap_or(Value::Null), ttl, p);
    let sweep = top.raw("sweep").map(|v| sweep(v, p));
    let sentinel_api = top.raw("sentinel_api").map(|v| sentinel_api::parse(v, base, p));
    let readiness = top.raw("readiness").map(|v| readiness::parse(v, p)).unwrap_or_default();
    top.finish(p);

    let nodes = nodes_auth(nodes, sentinels.as_ref().and_then(|s| s.as_ref()));
    if let Some(u) = &upstream {
        plaintext(u, sweep.as_ref().and_then(|s| s.as_ref()), p);
    }
    let source = source(sentinels, upstream, p)?;
    let config = Config {
        source,
        masters: masters.flatten(),
        nodes,
        dns: dns.flatten(),
        http: http.flatten(),
        drain: drain?,
        sweep: sweep.flatten(),
        sentinel_api: sentinel_api.flatten(),
        readiness,
        file: None,
        warnings: Vec::new(),
    };
    shape::check(&config, p);
    Some(config)
}

/// `nodes`' credentials, `nodes.tls` defaulting to `sentinels.tls` (when `nodes` has no `tls`
/// of its own): data nodes and Sentinels of one deployment usually share a CA, and a node
/// polestar cannot reach is a fence that cannot happen.
fn nodes_auth(nodes: Option<(Auth, bool)>, sentinels: Option<&Sentinels>) -> Auth {
    let sentinel_tls = || sentinels.map(|s| s.auth.tls.clone()).unwrap_or_default();
    match nodes {
        Some((auth, true)) => auth,
        Some((auth, false)) => Auth { tls: sentinel_tls(), ..auth },
        None => Auth { tls: sentinel_tls(), ..Auth::default() },
    }
}

/// Where the truth comes from: `sentinels` or `upstream`, exactly one of them.
fn source(
    sentinels: Option<Option<Sentinels>>,
    upstream: Option<Upstream>,
    p: &mut Problems,
) -> Option<Source> {
    match (sentinels, upstream) {
        (Some(s), None) => Some(Source::Sentinels(s?)),
        (None, Some(u)) => Some(Source::Upstream(u)),
        (Some(_), Some(_)) => {
            p.push("upstream", "give either `sentinels` or `upstream`, not both");
            None
        }
        (None, None) => {
            p.push("sentinels", "missing: give the Sentinel addresses (or `upstream`)");
            None
        }
    }
}

fn sentinels(value: Value, base: &Path, p: &mut Problems) -> Option<Sentinels> {
    let mut s = Section::new("sentinels", value, p);
    let path = s.path("addresses");
    let addresses = s.take_list("addresses", p, |a: String| HostPort::parse(&a));
    if let Some(a) = &addresses {
        let items: Vec<(String, String)> =
            a.iter().map(|h| (h.to_string().to_ascii_lowercase(), h.to_string())).collect();
        twice(&path, &items, "each configured Sentinel counts once towards a majority", p);
    }
    let auth = auth(s, base, p, true);
    match addresses {
        Some(a) if !a.is_empty() => Some(Sentinels { addresses: a, auth }),
        Some(_) => {
            p.push_unless_reported(&path, "must list at least one Sentinel");
            None
        }
        None => {
            p.push_unless_reported(&path, "missing");
            None
        }
    }
}

/// `username`, `password_file` and `tls` of a section; `finish`es the section.
fn auth(mut s: Section, base: &Path, p: &mut Problems, tls_allowed: bool) -> Auth {
    let username = s.take::<String>("username", p);
    let password_path = s.path("password_file");
    let password = s
        .take::<PathBuf>("password_file", p)
        .and_then(|f| secret_file(&base.join(f), &password_path, p));
    let tls = if tls_allowed || s.has("tls") {
        s.raw("tls").map(|v| tls(Section::new(&s.path("tls"), v, p), base, p)).unwrap_or_default()
    } else {
        Tls::default()
    };
    s.finish(p);
    Auth { username, password, tls }
}

fn tls(mut s: Section, base: &Path, p: &mut Problems) -> Tls {
    let enabled = s.take("enabled", p).unwrap_or(false);
    let mut file = |key: &str, p: &mut Problems| {
        let path = s.path(key);
        s.take::<PathBuf>(key, p).map(|f| base.join(f)).filter(|f| {
            let exists = f.is_file();
            if !exists {
                p.push(&path, format!("{} does not exist", f.display()));
            }
            exists
        })
    };
    let ca_file = file("ca_file", p);
    let cert_file = file("cert_file", p);
    let key_file = file("key_file", p);
    let paired = cert_file.is_some() == key_file.is_some();
    if !paired {
        p.push(&s.path("cert_file"), "cert_file and key_file go together");
    }
    let errors = p.errors.len();
    let path = s.path("");
    s.finish(p);
    let tls = Tls { enabled, ca_file, cert_file, key_file };
    // Built as every connection will build it, so that a bad PEM is found here, by name.
    if tls.enabled
        && paired
        && p.errors.len() == errors
        && let Err(e) = crate::tls::client_config(&tls)
    {
        p.push(path.trim_end_matches('.'), e);
    }
    tls
}

/// The secret of the file named at `key`; a problem when it cannot be read, a warning when
/// every user of the host can read it.
fn secret_file(file: &Path, key: &str, p: &mut Problems) -> Option<Secret> {
    let secret = read_secret(file).map_err(|e| p.push(key, e)).ok()?;
    if world_readable(file) {
        let advice = "readable by every user of this host; make it private (chmod 600, or 640 \
                      with the polestar group)";
        p.warn(key, format!("{} is {advice}", file.display()));
    }
    Some(secret)
}

fn world_readable(file: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(file).is_ok_and(|m| m.permissions().mode() & 0o004 != 0)
}

/// Reads a secret file: the first line, trimmed; an empty secret is an error.
pub fn read_secret(path: &Path) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let secret = text.lines().next().unwrap_or("").trim();
    if secret.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(Secret::new(secret))
}

/// `upstream: URL` (one URL, no token) or `upstream: {urls, ca_file, token_file}`.
fn upstream(value: Value, base: &Path, p: &mut Problems) -> Option<Upstream> {
    if let Value::String(url) = value {
        let url = parse_upstream(url).map_err(|e| p.push("upstream", e)).ok()?;
        return Some(Upstream {
            urls: vec![url],
            ca_file: None,
            token: None,
            allow_plaintext: false,
        });
    }
    let mut s = Section::new("upstream", value, p);
    let urls_path = s.path("urls");
    let urls = s.take_list("urls", p, parse_upstream);
    if let Some(urls) = &urls {
        let items: Vec<(String, String)> =
            urls.iter().map(|u| (upstream_key(u), u.clone())).collect();
        twice(&urls_path, &items, "each configured upstream counts once towards a majority", p);
    }
    let ca_path = s.path("ca_file");
    let ca_file = s.take::<PathBuf>("ca_file", p).map(|f| base.join(f));
    let token_path = s.path("token_file");
    let token =
        s.take::<PathBuf>("token_file", p).and_then(|f| secret_file(&base.join(f), &token_path, p));
    let allow_plaintext = s.take("allow_plaintext", p).unwrap_or(false);
    s.finish(p);
    if let Some(ca) = &ca_file
        && let Err(e) = crate::tls::roots(Some(ca))
    {
        p.push(&ca_path, e);
    }
    match urls {
        Some(urls) if !urls.is_empty() => Some(Upstream { urls, ca_file, token, allow_plaintext }),
        Some(_) => {
            p.push(&urls_path, "must list at least one polestar URL");
            None
        }
        None => {
            p.push(&urls_path, "missing");
            None
        }
    }
}

/// An `http://` upstream is refused when the agent sends it the token (anyone on the path
/// reads it) or acts on its answers with `sweep.remote` (anyone on the path can forge one and
/// have this host's sockets destroyed), unless `upstream.allow_plaintext` says so.
fn plaintext(upstream: &Upstream, sweep: Option<&Sweep>, p: &mut Problems) {
    if upstream.allow_plaintext {
        return;
    }
    let why = match (&upstream.token, sweep.is_some_and(|s| s.remote)) {
        (Some(_), _) => "upstream.token_file would be sent in clear",
        (None, true) => {
            "sweep.remote would destroy sockets on an answer anyone on the path can forge"
        }
        (None, false) => return,
    };
    for (i, url) in upstream.urls.iter().enumerate().filter(|(_, u)| u.starts_with("http://")) {
        p.push(
            &format!("upstream.urls[{i}]"),
            format!(
                "{url:?} is plain http and {why}: use https, or set upstream.allow_plaintext: true"
            ),
        );
    }
}

/// A problem at `path[i]` for every item (`(key, as given)`) whose key an earlier item has: a
/// Sentinel or an upstream listed twice would count twice towards a majority (`why`).
fn twice(path: &str, items: &[(String, String)], why: &str, p: &mut Problems) {
    let mut first = std::collections::HashMap::new();
    for (i, (key, given)) in items.iter().enumerate() {
        match first.get(key.as_str()) {
            Some(earlier) => p.push(
                &format!("{path}[{i}]"),
                format!("{given:?} is already {path}[{earlier}]: {why}"),
            ),
            None => {
                first.insert(key.as_str(), i);
            }
        }
    }
}

/// What makes two upstream URLs the same polestar: the host and port (whatever the scheme:
/// one port serves one of them) and the path, the host in lower case.
fn upstream_key(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    format!("{}/{path}", authority.to_ascii_lowercase())
}

fn parse_upstream(url: String) -> Result<String, String> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    let rest = rest.ok_or_else(|| {
        format!("{url:?} must be an http:// or https:// URL of another polestar's API")
    })?;
    let authority = rest.split('/').next().unwrap_or("");
    HostPort::parse(authority).map_err(|_| format!("{url:?} must be http(s)://host:port"))?;
    Ok(url.trim_end_matches('/').to_string())
}

fn masters(value: Value, p: &mut Problems) -> Option<Vec<MasterConfig>> {
    let Value::Sequence(items) = value else {
        p.push("masters", "expected a list of {name, dns_name}");
        return None;
    };
    let mut out: Vec<MasterConfig> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let mut s = Section::new(&format!("masters[{i}]"), item, p);
        let name = s.take::<String>("name", p);
        let label_path = s.path("dns_name");
        let label = s.take_with("dns_name", p, |l: String| check_label(&l));
        if name.is_none() {
            p.push_unless_reported(&s.path("name"), "missing");
        }
        s.finish(p);
        let Some(name) = name else { continue };
        let label = label.unwrap_or_else(|| label_for(&name));
        if out.iter().any(|m| m.name == name) {
            p.push(&format!("masters[{i}].name"), format!("{name:?} is listed twice"));
        } else if let Some(other) = out.iter().find(|m| m.label == label) {
            p.push(&label_path, format!("label {label:?} is already used by {:?}", other.name));
        }
        out.push(MasterConfig { name, label });
    }
    Some(out)
}

fn check_label(label: &str) -> Result<String, String> {
    let ok = !label.is_empty()
        && label.len() <= 63
        && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !label.starts_with('-')
        && !label.ends_with('-');
    if ok {
        Ok(label.to_string())
    } else {
        Err(format!("{label:?} is not a DNS label (a-z, 0-9 and inner '-', at most 63)"))
    }
}

/// `dns.rate_limit` by default: far above what a resolver asks of one name (once per TTL),
/// far below a reflected flood.
pub const DEFAULT_RATE_LIMIT: u32 = 100;
/// `dns.rate_limit_slip` by default: every answer past the rate is sent truncated, so every
/// client that can retry over TCP gets its answer (a fleet's reconnect storm included), and a
/// forged flood is reflected past the rate with answers no larger than its queries.
pub const DEFAULT_SLIP: u32 = 1;

fn dns(value: Value, p: &mut Problems) -> Option<Dns> {
    let mut s = Section::new("dns", value, p);
    let listen = s.take_list("listen", p, |a: String| parse_addr(&a));
    let zone = s.take_with("zone", p, |z: String| parse_zone(&z));
    let ttl_path = s.path("ttl");
    let ttl = s.take_with("ttl", p, |t: String| duration::parse(&t)).unwrap_or(DEFAULT_TTL);
    let nameservers = s.take_list("nameservers", p, |n: String| parse_zone(&n));
    let transfer_allow = s.take_list("transfer_allow", p, |c: String| parse_cidr(&c));
    let notify = s.take_list("notify", p, |a: String| parse_addr(&a));
    let rate_limit = s.take::<u32>("rate_limit", p).unwrap_or(DEFAULT_RATE_LIMIT);
    let replica_max_lag = s.take_with("replica_max_lag", p, readiness::size_value);
    let rate_limit_slip = s.take::<u32>("rate_limit_slip", p).unwrap_or(DEFAULT_SLIP);
    let (listen_path, zone_path) = (s.path("listen"), s.path("zone"));
    s.finish(p);
    if ttl.is_zero() || ttl.subsec_nanos() != 0 {
        p.push(&ttl_path, "must be a whole number of seconds, at least 1s");
    }
    let listen = listen.filter(|l| !l.is_empty());
    if listen.is_none() {
        p.push_unless_reported(&listen_path, "missing: give at least one address to serve DNS on");
    }
    if zone.is_none() {
        p.push_unless_reported(&zone_path, "missing");
    }
    Some(Dns {
        listen: listen?,
        zone: zone?,
        ttl,
        nameservers: nameservers.unwrap_or_default(),
        transfer_allow: transfer_allow.unwrap_or_default(),
        notify: notify.unwrap_or_default(),
        rate_limit,
        replica_max_lag,
        rate_limit_slip,
    })
}

fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| format!("{text:?} is not ip:port"))
}

fn parse_cidr(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{text:?} is not an address or CIDR"))
}

fn parse_zone(text: &str) -> Result<String, String> {
    let name = text.trim().to_ascii_lowercase();
    let name = if name.ends_with('.') { name } else { format!("{name}.") };
    let labels: Vec<&str> = name.trim_end_matches('.').split('.').collect();
    let valid = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    // What the DNS server will parse it with: `check` must not pass a name `run` then refuses
    // (such as a label `-`).
    let hickory_accepts = hickory_proto::rr::Name::from_ascii(&name).is_ok();
    if name.len() > 254 || !labels.iter().all(valid) || !hickory_accepts {
        return Err(format!("{text:?} is not a domain name"));
    }
    Ok(name)
}

fn http(value: Value, base: &Path, p: &mut Problems) -> Option<Http> {
    let mut s = Section::new("http", value, p);
    let listen_path = s.path("listen");
    let listen = s.take_with("listen", p, |a: String| parse_addr(&a));
    let agent_path = s.path("agent_token_file");
    let mut token = |key: &str, p: &mut Problems| {
        let path = s.path(key);
        s.take::<PathBuf>(key, p).and_then(|f| secret_file(&base.join(f), &path, p))
    };
    let admin_token = token("admin_token_file", p);
    let agent_token = token("agent_token_file", p);
    let tls = s.raw("tls").and_then(|v| server_tls(Section::new(&s.path("tls"), v, p), base, p));
    s.finish(p);
    if listen.is_none() {
        p.push_unless_reported(&listen_path, "missing");
    }
    if let (Some(admin), Some(agent)) = (&admin_token, &agent_token)
        && admin.expose() == agent.expose()
    {
        p.push(
            &agent_path,
            "holds the same token as http.admin_token_file: every agent (and every host it \
             runs on) could fail over, drain and hand off; give agents a token of their own",
        );
    }
    Some(Http { listen: listen?, admin_token, agent_token, tls })
}

fn server_tls(mut s: Section, base: &Path, p: &mut Problems) -> Option<ServerTls> {
    let mut file = |key: &str, p: &mut Problems| {
        let path = s.path(key);
        let file = s.take::<PathBuf>(key, p).map(|f| base.join(f));
        match file {
            Some(f) if f.is_file() => Some(f),
            Some(f) => {
                p.push(&path, format!("{} does not exist", f.display()));
                None
            }
            None => {
                p.push_unless_reported(&path, "missing");
                None
            }
        }
    };
    let cert_file = file("cert_file", p);
    let key_file = file("key_file", p);
    let path = s.path("");
    s.finish(p);
    let (cert_file, key_file) = (cert_file?, key_file?);
    let modified = |f: &Path| std::fs::metadata(f).and_then(|m| m.modified()).ok();
    let stamp = modified(&cert_file).zip(modified(&key_file));
    let tls = ServerTls { cert_file, key_file, stamp };
    if let Err(e) = crate::tls::server_config(&tls) {
        p.push(path.trim_end_matches('.'), e);
        return None;
    }
    Some(tls)
}

fn drain(value: Value, ttl: Duration, p: &mut Problems) -> Option<Drain> {
    let mut s = Section::new("drain", value, p);
    let enabled = s.take("enabled", p).unwrap_or(true);
    let positive = |d: String| {
        let d = duration::parse(&d)?;
        if d.is_zero() { Err("must be > 0".to_string()) } else { Ok(d) }
    };
    let grace = s.take_with("grace", p, positive).unwrap_or(ttl + DEFAULT_GRACE_OVER_TTL);
    let interval = s.take_with("interval", p, |d| positive(d).and_then(at_most_interval));
    let interval = interval.unwrap_or(Duration::from_millis(250));
    let window = s.take_with("window", p, positive).unwrap_or(Duration::from_secs(60));
    let rate_path = s.path("rate");
    let rate = s.take::<i64>("rate", p).unwrap_or(2000);
    let spare = s.raw("spare").map(|v| spare(v, p)).unwrap_or_default();
    s.finish(p);
    if rate <= 0 || rate > u32::MAX as i64 {
        p.push(&rate_path, "must be > 0");
    }
    Some(Drain {
        enabled,
        grace,
        interval,
        window,
        rate: rate.clamp(1, u32::MAX as i64) as u32,
        spare,
    })
}

/// The longest `drain.interval`: a pause lasts two intervals and a half second, so a polestar
/// that dies while fencing leaves a pause of at most ~10 s behind.
pub const MAX_DRAIN_INTERVAL: Duration = Duration::from_secs(5);

fn at_most_interval(d: Duration) -> Result<Duration, String> {
    if d > MAX_DRAIN_INTERVAL {
        return Err(format!("must be at most {}s", MAX_DRAIN_INTERVAL.as_secs()));
    }
    Ok(d)
}

fn spare(value: Value, p: &mut Problems) -> Spare {
    let mut s = Section::new("drain.spare", value, p);
    let names = s.take("names", p).unwrap_or_default();
    let users = s.take("users", p).unwrap_or_default();
    let cidrs = s.take_list("cidrs", p, |c: String| parse_cidr(&c)).unwrap_or_default();
    s.finish(p);
    Spare { names, users, cidrs }
}

fn sweep(value: Value, p: &mut Problems) -> Option<Sweep> {
    let mut s = Section::new("sweep", value, p);
    let ports_path = s.path("local_ports");
    let local_ports: Vec<u16> = s.take("local_ports", p).unwrap_or_default();
    let remote = s.take("remote", p).unwrap_or(false);
    s.finish(p);
    if local_ports.contains(&0) {
        p.push(&ports_path, "0 is not a port");
    }
    Some(Sweep { local_ports, remote })
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
