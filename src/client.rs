//! `polestar status`, `wait` and `failover`: thin clients of a running daemon's HTTP API, so
//! scripts and operators get the same answers as every other client, and the same errors.
//!
//! Every error names the URL it was about and, when the daemon answered, its JSON error.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use reqwest::{Client, Method, RequestBuilder, Response, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::config::duration;
use crate::http::view::MasterView;
use crate::readiness::Verdict;

pub const DEFAULT_API: &str = "http://127.0.0.1:8053";

/// A daemon that does not accept a connection within this is reported as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// For requests the server answers at once.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// One long-poll asks the server to hold at most this long; `wait` chains them.
const POLL: Duration = Duration::from_secs(60);
/// How long `failover --wait` asks the server to wait for the new primary.
const FAILOVER_WAIT: Duration = Duration::from_secs(30);

/// Prints every master as a table: primary, epoch, state, replicas and Sentinels.
pub async fn status(api: &str) -> anyhow::Result<()> {
    print!("{}", status_table(api).await?);
    Ok(())
}

/// Blocks until `master`'s epoch exceeds `after` (by default its epoch now), then prints the
/// primary as `ip:port`. Fails once `timeout` has passed.
pub async fn wait(
    api: &str,
    master: &str,
    after: Option<u64>,
    timeout: Duration,
) -> anyhow::Result<()> {
    println!("{}", wait_for_primary(api, master, after, timeout).await?);
    Ok(())
}

/// Asks for a planned failover; with `wait`, prints the new primary once it is published.
pub async fn failover(
    api: &str,
    master: &str,
    wait: bool,
    token: Option<String>,
    limits: Limits,
) -> anyhow::Result<()> {
    match request_failover_with(api, master, wait, token, limits).await? {
        Failover::Accepted { sentinel } => {
            println!("Sentinel {sentinel} accepted the failover of {master}")
        }
        Failover::Done(state) => match state.primary {
            Some(primary) => println!("{}", primary.addr()),
            None => bail!("{master} has no confirmed primary after the failover"),
        },
    }
    Ok(())
}

/// What `status` prints.
pub async fn status_table(api: &str) -> anyhow::Result<String> {
    let api = Api::new(api)?;
    let masters: Vec<MasterView> = api.get(&["v1", "masters"], &[], None).await?;
    let mut verdicts = Vec::new();
    for m in &masters {
        verdicts.push((m.name.clone(), api.readiness(&m.name).await));
    }
    Ok(table(&masters) + &readiness_lines(&verdicts))
}

/// Below the table, whether each master can fail over now and what blocks it.
fn readiness_lines(verdicts: &[(String, Result<Verdict, String>)]) -> String {
    let width = verdicts.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let mut out = String::from("\nFAILOVER\n");
    for (name, verdict) in verdicts {
        let said = match verdict {
            Ok(v) if v.ready => "possible".to_owned(),
            Ok(v) => {
                let why: Vec<String> =
                    v.blockers.iter().map(|b| format!("{}: {}", b.reason, b.detail)).collect();
                format!("NOT POSSIBLE: {}", why.join(" | "))
            }
            Err(e) => format!("unknown: {e}"),
        };
        let _ = writeln!(out, "{name:<width$}  {said}");
    }
    out
}

/// What `wait` prints: the primary once the epoch has passed the floor.
pub async fn wait_for_primary(
    api: &str,
    master: &str,
    after: Option<u64>,
    timeout: Duration,
) -> anyhow::Result<SocketAddr> {
    let api = Api::new(api)?;
    let deadline = Instant::now() + timeout;
    let floor = match after {
        Some(after) => Some(after),
        None => api.master(master, &[], None).await?.epoch,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let state = api.poll(master, floor, left.min(POLL)).await?;
        if let Some(primary) = state.primary.as_ref().filter(|_| state.epoch > floor) {
            return Ok(primary.addr());
        }
        if Instant::now() >= deadline {
            bail!("{}", still_at(&state, timeout));
        }
        if state.epoch > floor {
            // A new epoch without a confirmed primary yet: the server would answer at once.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// How a failover request ended.
#[derive(Debug)]
pub enum Failover {
    /// A Sentinel accepted it (without `wait`).
    Accepted { sentinel: String },
    /// The new state, once published (with `wait`).
    Done(Box<MasterView>),
}

/// What a switchover may cost (`--max-wait`, `--max-lag`); the server's defaults when unset.
#[derive(Clone, Debug, Default)]
pub struct Limits {
    pub max_wait: Option<Duration>,
    /// As the operator wrote it (`1MB`): the server checks it.
    pub max_lag: Option<String>,
}

impl Limits {
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut query = Vec::new();
        query.extend(self.max_wait.map(|w| ("max_wait", duration::format(w))));
        query.extend(self.max_lag.clone().map(|l| ("max_lag", l)));
        query
    }

    /// How long the server may hold the request for the switchover's own wait.
    fn hold(&self) -> Duration {
        self.max_wait.unwrap_or(crate::control::DEFAULT_MAX_WAIT)
    }
}

/// `POST /v1/masters/{master}/failover`, with `?wait=` when `wait`.
pub async fn request_failover(
    api: &str,
    master: &str,
    wait: bool,
    token: Option<String>,
) -> anyhow::Result<Failover> {
    request_failover_with(api, master, wait, token, Limits::default()).await
}

/// The same with the switchover's `limits`.
pub async fn request_failover_with(
    api: &str,
    master: &str,
    wait: bool,
    token: Option<String>,
    limits: Limits,
) -> anyhow::Result<Failover> {
    let api = Api::new(api)?.with_token(token);
    let path = ["v1", "masters", master, "failover"];
    let mut query = limits.query();
    if !wait {
        let accepted: Accepted = api.post(&path, &query, Some(limits.hold())).await?;
        return Ok(Failover::Accepted { sentinel: accepted.sentinel });
    }
    query.push(("wait", duration::format(FAILOVER_WAIT)));
    let hold = FAILOVER_WAIT + limits.hold();
    Ok(Failover::Done(Box::new(api.post(&path, &query, Some(hold)).await?)))
}

/// A handoff asked for: the node (`ip:port`), the master it must be a node of (if given), and
/// how long to wait for its blockers to clear and for a new primary.
pub struct Handoff<'a> {
    pub node: &'a str,
    pub master: Option<&'a str>,
    pub wait: Duration,
}

/// `POST /v1/nodes/{node}/handoff?wait=[&master=]`: prints what was done (JSON) once the node
/// is safe to stop.
pub async fn handoff(
    api: &str,
    handoff: Handoff<'_>,
    token: Option<String>,
    limits: Limits,
) -> anyhow::Result<()> {
    let answer = request_handoff(api, handoff, token, limits).await?;
    println!("{answer}");
    Ok(())
}

/// The handoff's answer.
pub async fn request_handoff(
    api: &str,
    handoff: Handoff<'_>,
    token: Option<String>,
    limits: Limits,
) -> anyhow::Result<serde_json::Value> {
    let Handoff { node, master, wait } = handoff;
    let api = Api::new(api)?.with_token(token);
    let mut query = limits.query();
    query.push(("wait", duration::format(wait.max(Duration::from_millis(1)))));
    if let Some(master) = master {
        query.push(("master", master.to_string()));
    }
    // The blockers' wait, then the new primary's.
    let hold = wait * 2 + limits.hold();
    api.post(&["v1", "nodes", node, "handoff"], &query, Some(hold)).await
}

/// The 202 answer of a failover without `?wait=`.
#[derive(Deserialize)]
struct Accepted {
    sentinel: String,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: String,
}

fn still_at(state: &MasterView, timeout: Duration) -> String {
    let epoch = state.epoch.map_or("none".to_owned(), |e| e.to_string());
    let primary = state.primary.as_ref().map_or("none".to_owned(), |p| p.addr().to_string());
    let waited = duration::format(timeout);
    format!(
        "timed out after {waited}: {} is still at epoch {epoch} (primary {primary})",
        state.name
    )
}

/// The columns of `polestar status`. REPLICAS is healthy/listed, SENTINELS reachable/configured.
fn table(masters: &[MasterView]) -> String {
    let header = ["MASTER", "PRIMARY", "EPOCH", "STATE", "REPLICAS", "SENTINELS"].map(String::from);
    let rows: Vec<[String; 6]> = std::iter::once(header).chain(masters.iter().map(row)).collect();
    let widths: Vec<usize> =
        (0..6).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &rows {
        let cells = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}"));
        let line = cells.collect::<Vec<_>>().join("  ");
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

fn row(m: &MasterView) -> [String; 6] {
    let healthy = m.replicas.iter().filter(|r| r.healthy).count();
    [
        m.name.clone(),
        m.primary.as_ref().map_or("-".to_owned(), |p| p.addr().to_string()),
        m.epoch.map_or("-".to_owned(), |e| e.to_string()),
        m.state.clone(),
        format!("{healthy}/{}", m.replicas.len()),
        format!("{}/{}", m.sentinels.reachable, m.sentinels.configured),
    ]
}

/// One daemon's API: its base URL, an HTTP client with timeouts, and the admin token if any.
struct Api {
    base: Url,
    http: Client,
    token: Option<String>,
}

impl Api {
    /// `base` is a URL; a bare `host:port` is taken as `http://host:port`.
    fn new(base: &str) -> anyhow::Result<Self> {
        let full = if base.contains("://") { base.to_owned() } else { format!("http://{base}") };
        let base = Url::parse(&full).with_context(|| format!("--api {base:?} is not a URL"))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            bail!("--api {base}: not an http:// URL");
        }
        let http = Client::builder().connect_timeout(CONNECT_TIMEOUT).build();
        let http = http.context("cannot set up an HTTP client")?;
        Ok(Self { base, http, token: None })
    }

    fn with_token(self, token: Option<String>) -> Self {
        Self { token, ..self }
    }

    async fn master(
        &self,
        name: &str,
        query: &[(&str, String)],
        hold: Option<Duration>,
    ) -> anyhow::Result<MasterView> {
        self.get(&["v1", "masters", name], query, hold).await
    }

    /// One long-poll: the master once its epoch passes `floor`, or as it is after `hold`.
    async fn poll(
        &self,
        name: &str,
        floor: Option<u64>,
        hold: Duration,
    ) -> anyhow::Result<MasterView> {
        // At least 1ms: `wait=0s` would not wait at all.
        let mut query = vec![("wait", duration::format(hold.max(Duration::from_millis(1))))];
        query.extend(floor.map(|f| ("after", f.to_string())));
        self.master(name, &query, Some(hold)).await
    }

    /// The readiness verdict, which comes with 200 (possible) or 503 (not possible).
    async fn readiness(&self, name: &str) -> Result<Verdict, String> {
        let url = self.url(&["v1", "masters", name, "readiness"], &[]);
        let request = self.http.get(url.clone()).timeout(REQUEST_TIMEOUT);
        let response = request.send().await.map_err(|e| unreachable(&url, e).to_string())?;
        let body = response.text().await.map_err(|e| unreachable(&url, e).to_string())?;
        serde_json::from_str::<Verdict>(&body).map_err(|_| {
            match serde_json::from_str::<ErrorBody>(&body) {
                Ok(error) => error.error,
                Err(_) => body.trim().chars().take(200).collect(),
            }
        })
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &[&str],
        query: &[(&str, String)],
        hold: Option<Duration>,
    ) -> anyhow::Result<T> {
        self.call(Method::GET, path, query, hold).await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &[&str],
        query: &[(&str, String)],
        hold: Option<Duration>,
    ) -> anyhow::Result<T> {
        self.call(Method::POST, path, query, hold).await
    }

    /// Sends one request; `hold` is how long the server may keep it open on purpose.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        hold: Option<Duration>,
    ) -> anyhow::Result<T> {
        let url = self.url(path, query);
        let timeout = REQUEST_TIMEOUT + hold.unwrap_or_default();
        let mut request = self.http.request(method, url.clone()).timeout(timeout);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = send(request, &url).await?;
        let body = response.text().await.map_err(|e| unreachable(&url, e))?;
        serde_json::from_str(&body)
            .with_context(|| format!("polestar API at {url} answered something else than JSON"))
    }

    fn url(&self, path: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(path);
        }
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }
}

/// The response if it is a success; otherwise an error with the server's own message.
async fn send(request: RequestBuilder, url: &Url) -> anyhow::Result<Response> {
    let response = request.send().await.map_err(|e| unreachable(url, e))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let message = match serde_json::from_str::<ErrorBody>(&body) {
        Ok(error) => error.error,
        Err(_) => body.trim().to_owned(),
    };
    bail!("polestar API at {url} answered {status}: {message}")
}

fn unreachable(url: &Url, error: reqwest::Error) -> anyhow::Error {
    // The URL is said once, in front; reqwest would repeat it inside its own message.
    anyhow!("cannot reach polestar API at {url}: {}", causes(&error.without_url()))
}

/// An error and its sources on one line, e.g. `error sending request: tcp connect error: ...`.
fn causes(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::view::{NodeView, ReplicaView, SentinelsView};

    fn view(name: &str, primary: Option<NodeView>, healthy: [bool; 2]) -> MasterView {
        let replica =
            |healthy| ReplicaView { ip: [10, 0, 0, 2].into(), port: 6379, hostname: None, healthy };
        MasterView {
            withdrawn: None,
            name: name.into(),
            dns_name: name.into(),
            epoch: primary.as_ref().map(|_| 12),
            primary,
            since: None,
            state: "ok".into(),
            replicas: healthy.map(replica).into(),
            sentinels: SentinelsView {
                configured: 3,
                reachable: 2,
                agreeing: 2,
                discovered: Vec::new(),
            },
        }
    }

    #[test]
    fn the_status_table_aligns_its_columns() {
        let primary = NodeView { ip: [10, 0, 0, 1].into(), port: 6379, hostname: None };
        let masters = [view("mymaster", Some(primary), [true, false]), view("x", None, [true; 2])];
        let expected = "\
MASTER    PRIMARY        EPOCH  STATE  REPLICAS  SENTINELS
mymaster  10.0.0.1:6379  12     ok     1/2       2/3
x         -              -      ok     2/2       2/3
";
        assert_eq!(table(&masters), expected);
    }

    #[test]
    fn the_failover_lines_say_what_blocks_each_master() {
        use crate::readiness::{Blocker, Reason};
        let blocked = Verdict {
            ready: false,
            blockers: vec![Blocker {
                reason: Reason::SentinelTilt,
                detail: "s1 is in TILT mode".into(),
            }],
        };
        let verdicts = [
            ("mymaster".to_owned(), Ok(Verdict { ready: true, blockers: vec![] })),
            ("x".to_owned(), Ok(blocked)),
            ("y".to_owned(), Err("not judged yet".to_owned())),
        ];
        let expected = "
FAILOVER
mymaster  possible
x         NOT POSSIBLE: sentinel_tilt: s1 is in TILT mode
y         unknown: not judged yet
";
        assert_eq!(readiness_lines(&verdicts), expected);
    }

    #[test]
    fn urls_are_built_from_encoded_segments() {
        let api = Api::new("http://127.0.0.1:8053/").expect("a valid URL");
        let url = api.url(&["v1", "masters", "a b/c"], &[("wait", "2s".into())]);
        assert_eq!(url.as_str(), "http://127.0.0.1:8053/v1/masters/a%20b%2Fc?wait=2s");
    }

    #[test]
    fn api_urls_default_to_http_and_bad_ones_are_named() {
        let api = Api::new("127.0.0.1:8053").map(|a| a.base.to_string());
        assert_eq!(api.ok().as_deref(), Some("http://127.0.0.1:8053/"));
        let error = Api::new("ftp://h/").err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("ftp://h/")));
        assert!(Api::new("http://[::1").is_err());
    }
}
