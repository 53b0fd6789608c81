//! Real client libraries behind a caching resolver (docs/tested.md, "Tested with"), in the
//! network-namespace lab: the application host `ap` runs unbound as its system resolver (a stub
//! zone for `redis.test.` pointing at the central polestar's DNS, `/etc/netns/<ns>/resolv.conf`
//! naming it), and ioredis, redis-py and Valkey GLIDE clients that connect to `cache.redis.test` by
//! name through getaddrinfo ([`APPS`]: the libraries' defaults and the settings docs/operating.md
//! gives, each writer one write every 10-20 ms, and BLPOP readers). Beside the defaults: redis-py
//! with the retry of docs/operating.md both with `single_connection_client=True` and with its pool,
//! and ioredis with `disconnectTimeout: 50`, which docs/operating.md says plays no part by name
//! (checked: [`disconnect_timeout_costs_nothing`]). Deployment as docs/operating.md recommends: a
//! central polestar (DNS, drain), a node-side polestar beside the first primary
//! (`sweep.local_ports`) and an agent on the application host (`upstream`, `sweep.remote`). Faults:
//! planned failover, hung primary (SIGSTOP), dark host (link down).
//!
//! The promise checked: 0 acknowledged writes lost and every client back on the new primary
//! within Sentinel's `+switch-master` + the DNS TTL + 0.5 s. The pinned control (clients given
//! the first primary's address, no polestar) shows what the libraries do alone.
//!
//! Each run prints `CLIENTS <fault> <mode> <client>: ...` lines (also appended to
//! `target/clients-recovery.txt`), with the resolver's share: polestar's flip -> unbound's first
//! answer naming the new primary. Needs root and `tests/deps.sh` (node, ioredis, redis-py,
//! unbound).

use crate::client_results;
use crate::dns_support;
use crate::netns;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hickory_proto::rr::{RData, RecordType};
use netns::cluster::{Cluster, HTTP_PORT};
use netns::measure::{SWITCH, SentinelEvents, secs};
use netns::{Host, in_ns, until};
use nix::sys::signal::Signal;
use polestar_lab::Flavor;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const DOWN_AFTER_MS: u64 = 1000;
const NAME: &str = "cache.redis.test";
const TTL: Duration = Duration::from_secs(1);
/// The promise: back on the new primary within the switch + the TTL + this.
const SLACK: Duration = Duration::from_millis(500);
/// ... or within this of the resolver's first answer naming the new primary, if that came
/// later: unbound was measured naming the old primary up to 1.9 s after polestar's flip
/// (docs/decisions.md D13), whatever polestar serves, and a client retrying with a growing
/// backoff (ioredis: 50 ms more at each try, some 450 ms by then) is between two tries when it
/// changes. Found in CI: ioredis back 1.525 s after the switch, 0.57 s after unbound's first
/// new answer, which came 0.95 s after the switch.
const AFTER_RESOLVER: Duration = Duration::from_millis(750);
/// How long the pinned control is watched after the switch.
const CONTROL_WATCH: Duration = Duration::from_secs(8);
const SETUP: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Planned,
    Hung,
    Dark,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// By name through unbound and polestar, with the node-side sweeper and an agent.
    Polestar,
    /// The first primary's address, no polestar: what the library does alone.
    Pinned,
}

/// One client process on the application host.
pub(crate) struct App {
    /// Its label in the lab (log file `<label>.log`) and the key suffix it writes.
    pub(crate) label: &'static str,
    /// Whether its successes are acknowledged writes (RPUSH acked:<label>), checked for loss.
    writes: bool,
    /// Whether the recovery time is held to the promise. redis-py 6's default retry (valkey-py's
    /// too) sleeps a random 0-2 s, then 0-4 s, between reconnects: its time is reported, not
    /// promised.
    timed: bool,
    /// The script in tests/clients (`.js`: node, `.py`: the venv's python), the arguments
    /// before `HOST PORT LABEL` and after them.
    script: &'static str,
    before: &'static [&'static str],
    after: &'static [&'static str],
    /// The client settings, as the "Tested with" table of docs/tested.md names them.
    pub(crate) settings: &'static str,
}

const GLIDE_ADVISED: &str = "request_timeout=500, BackoffStrategy(num_of_retries=4, factor=10, exponent_base=2), connection_timeout=500";

pub(crate) const APPS: [App; 10] = [
    App {
        label: "ioredis",
        writes: true,
        timed: true,
        script: "failover_ioredis.js",
        before: &["writer"],
        after: &[],
        settings: "defaults (disconnectTimeout 2000 ms)",
    },
    App {
        label: "ioredis-disconnect50",
        writes: true,
        timed: true,
        script: "failover_ioredis.js",
        before: &["writer"],
        after: &["disconnect50"],
        settings: "disconnectTimeout=50",
    },
    App {
        label: "redis-py",
        writes: true,
        timed: false,
        script: "failover_redis_py.py",
        before: &[],
        after: &[],
        settings: "single_connection_client=True, defaults (RESP3, 10 retries, ExponentialWithJitterBackoff(base=0.01, cap=1))",
    },
    App {
        label: "redis-py-fast",
        writes: true,
        timed: true,
        script: "failover_redis_py.py",
        before: &[],
        after: &["fast"],
        settings: concat!(
            "single_connection_client=True, ",
            "retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)"
        ),
    },
    App {
        label: "redis-py-fast-pool",
        writes: true,
        timed: true,
        script: "failover_redis_py.py",
        before: &[],
        after: &["fast", "pool"],
        settings: concat!(
            "connection pool (no single_connection_client), ",
            "retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 10)"
        ),
    },
    App {
        label: "ioredis-blpop",
        writes: false,
        timed: true,
        script: "failover_ioredis.js",
        before: &["blpop"],
        after: &[],
        settings: "defaults",
    },
    App {
        label: "glide",
        writes: true,
        timed: true,
        script: "failover_glide.py",
        before: &["writer"],
        after: &["advised"],
        settings: GLIDE_ADVISED,
    },
    App {
        label: "glide-blpop",
        writes: false,
        timed: true,
        script: "failover_glide.py",
        before: &["blpop"],
        after: &["advised"],
        settings: GLIDE_ADVISED,
    },
    App {
        label: "glide-default",
        writes: true,
        timed: false,
        script: "failover_glide.py",
        before: &["writer"],
        after: &["default"],
        settings: "defaults (request_timeout=250)",
    },
    App {
        label: "node-redis",
        writes: true,
        timed: true,
        script: "failover_node_redis.js",
        before: &["writer"],
        after: &[],
        settings: "createClient({socket: {host, port}}) defaults",
    },
];

/// The previous majors, which applications still run, and the Valkey forks, each on its
/// defaults: a run of their own beside the current releases (the same faults, the machine
/// no busier than for [`APPS`]). node-redis 5.9.0 by name can stop for good after a burst of
/// reconnects (its connection's `CLIENT SETINFO` error, or `Socket closed unexpectedly`, is the
/// last thing it does, on Redis 7.0 as on Valkey 8.1): reported, not held to the promise.
pub(crate) const PREVIOUS: [App; 5] = [
    App {
        label: "ioredis5",
        writes: true,
        timed: true,
        script: "failover_ioredis.js",
        before: &["writer"],
        after: &["lib=ioredis5"],
        settings: "defaults (disconnectTimeout 2000 ms)",
    },
    App {
        label: "iovalkey",
        writes: true,
        timed: true,
        script: "failover_ioredis.js",
        before: &["writer"],
        after: &["lib=iovalkey"],
        settings: "defaults (disconnectTimeout 2000 ms)",
    },
    App {
        label: "redis-py6",
        writes: true,
        timed: false,
        script: "failover_redis_py.py",
        before: &[],
        after: &["lib=redis6"],
        settings: "single_connection_client=True, defaults (3 retries, ExponentialWithJitterBackoff(base=1, cap=10))",
    },
    App {
        label: "valkey-py",
        writes: true,
        timed: false,
        script: "failover_redis_py.py",
        before: &[],
        after: &["lib=valkey"],
        settings: "single_connection_client=True, defaults (3 retries, ExponentialWithJitterBackoff(base=1, cap=10))",
    },
    App {
        label: "node-redis5",
        writes: true,
        timed: false,
        script: "failover_node_redis.js",
        before: &["writer"],
        after: &["lib=redis5"],
        settings: "createClient({socket: {host, port}}) defaults",
    },
];

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// `/etc/netns/<ns>/resolv.conf`, which `ip netns exec` mounts over `/etc/resolv.conf`;
/// removed on drop (with any left by runs whose namespace is gone).
struct ResolvConf(PathBuf);

impl ResolvConf {
    fn write(host: &Host) -> anyhow::Result<Self> {
        clean_etc_netns();
        let dir = Path::new("/etc/netns").join(&host.ns);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("resolv.conf"), "nameserver 127.0.0.1\noptions timeout:1\n")?;
        Ok(Self(dir))
    }
}

impl Drop for ResolvConf {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes `/etc/netns/pst*` directories whose namespace no longer exists.
fn clean_etc_netns() {
    let Ok(entries) = std::fs::read_dir("/etc/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("pst") && !Path::new("/run/netns").join(&name).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// unbound on the application host: 127.0.0.1:53, a stub zone for `redis.test.` at `dns`.
fn start_unbound(cluster: &Cluster, dns: SocketAddr) -> anyhow::Result<()> {
    let dir = cluster.net.dir.path().join("unbound");
    std::fs::create_dir_all(&dir)?;
    let conf = format!(
        "server:\n  interface: 127.0.0.1\n  port: 53\n  do-daemonize: no\n  chroot: \"\"\n  \
         username: \"\"\n  directory: \"{d}\"\n  pidfile: \"{d}/unbound.pid\"\n  use-syslog: no\n  \
         logfile: \"\"\n  verbosity: 1\n  do-ip6: no\n  do-not-query-localhost: no\n  \
         access-control: 127.0.0.0/8 allow\n  module-config: \"iterator\"\n  \
         qname-minimisation: no\n  local-zone: \"test.\" nodefault\n  \
         domain-insecure: \"redis.test.\"\n\
         stub-zone:\n  name: \"redis.test.\"\n  stub-addr: {ip}@{port}\n",
        d = dir.display(),
        ip = dns.ip(),
        port = dns.port()
    );
    let path = dir.join("unbound.conf");
    std::fs::write(&path, conf)?;
    let path = path.to_string_lossy().into_owned();
    cluster.net.spawn(&cluster.app, "unbound", "unbound", &["-d", "-c", &path])?;
    Ok(())
}

/// The A records that `server` answers for [`NAME`], asked from inside `host`.
async fn ask_a(server: SocketAddr) -> anyhow::Result<Vec<IpAddr>> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let mut query = dns_support::query(&format!("{NAME}."), RecordType::A);
    // A stub resolver's query: without RD a recursive resolver answers from its cache only.
    query.metadata.recursion_desired = true;
    socket.send_to(&query.to_vec()?, server).await?;
    let mut buf = vec![0u8; 1500];
    let n = tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut buf)).await??;
    let answer = hickory_proto::op::Message::from_vec(&buf[..n])?;
    Ok(answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect())
}

/// What unbound answered, asked every 50 ms as a busy host would (keeping its cache warm).
#[derive(Clone, Default)]
struct Answers(Arc<Mutex<Vec<Answer>>>);

/// When unbound answered, and the addresses it named.
type Answer = (SystemTime, Vec<IpAddr>);

impl Answers {
    fn record(&self, host: &Host, stop: CancellationToken) {
        let answers = self.clone();
        let _probe = in_ns(host, move || async move {
            let unbound: SocketAddr = "127.0.0.1:53".parse()?;
            while !stop.is_cancelled() {
                if let Ok(ips) = ask_a(unbound).await {
                    answers.lock().push((SystemTime::now(), ips));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(())
        });
    }

    /// The first answer at or after `after` that names `ip`.
    fn first_naming(&self, ip: IpAddr, after: SystemTime) -> Option<SystemTime> {
        self.lock().iter().find(|(t, ips)| *t >= after && ips.contains(&ip)).map(|(t, _)| *t)
    }

    /// The last answer that named `ip` (the old primary).
    fn last_naming(&self, ip: IpAddr) -> Option<SystemTime> {
        self.lock().iter().rev().find(|(_, ips)| ips.contains(&ip)).map(|(t, _)| *t)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Answer>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One JSON line of a client's log.
fn events_of(cluster: &Cluster, label: &str) -> Vec<Value> {
    cluster.net.log(label).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn time_of(event: &Value) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(event["t"].as_u64().unwrap_or(0))
}

/// The first success of `label` on `node` at or after `after`.
fn first_ok_on(
    cluster: &Cluster,
    label: &str,
    node: SocketAddr,
    after: SystemTime,
) -> Option<SystemTime> {
    let want = node.to_string();
    events_of(cluster, label)
        .iter()
        .find(|e| e["ev"] == "ok" && e["peer"] == want.as_str() && time_of(e) >= after)
        .map(time_of)
}

/// What a client's `start` event says: `<lib> <version>` and its runtime (`Node.js 20.20.0`).
struct Started {
    version: String,
    runtime: String,
}

/// `(what it started as, acknowledged sequence numbers)` from a client's log.
fn acked(cluster: &Cluster, label: &str) -> (Started, BTreeSet<u64>) {
    let events = events_of(cluster, label);
    let start = events.iter().find(|e| e["ev"] == "start");
    let field = |f: &str| start.and_then(|e| e[f].as_str()).unwrap_or("?").to_string();
    let version = format!("{} {}", field("lib"), field("version"));
    let started = Started { version, runtime: field("runtime") };
    let seqs =
        events.iter().filter(|e| e["ev"] == "ok").filter_map(|e| e["seq"].as_u64()).collect();
    (started, seqs)
}

fn spawn_apps(cluster: &Cluster, target: &str, apps: &[App]) -> anyhow::Result<()> {
    let dir = clients_dir();
    let python = dir.join("venv/bin/python").to_string_lossy().into_owned();
    anyhow::ensure!(
        dir.join("node_modules/ioredis").is_dir() && Path::new(&python).exists(),
        "the client libraries are missing (tests/clients/node_modules/ioredis, \
         tests/clients/venv): run `bash tests/deps.sh`"
    );
    // A library missing from the venv would only show as a client that never wrote.
    let imports = std::process::Command::new(&python)
        .args(["-c", "import redis, valkey, glide"])
        .output()
        .map_err(|e| anyhow::anyhow!("{python}: {e}"))?;
    anyhow::ensure!(
        imports.status.success(),
        "redis-py, valkey-py or Valkey GLIDE is missing from tests/clients/venv ({}): run `bash tests/deps.sh`",
        String::from_utf8_lossy(&imports.stderr).lines().last().unwrap_or("").trim()
    );
    for app in apps {
        let script = dir.join(app.script).to_string_lossy().into_owned();
        let program = if app.script.ends_with(".js") { "node" } else { python.as_str() };
        let mut args = vec![script.as_str()];
        args.extend(app.before);
        args.extend([target, "6379", app.label]);
        args.extend(app.after);
        cluster.net.spawn(&cluster.app, app.label, program, &args)?;
    }
    Ok(())
}

/// The deployment of `mode`; returns the resolv.conf guard (polestar mode).
async fn deploy(cluster: &Cluster, mode: Mode) -> anyhow::Result<Option<ResolvConf>> {
    if mode == Mode::Pinned {
        return Ok(None);
    }
    let dns = SocketAddr::new(cluster.ctl.ip, 53);
    let central = format!(
        "masters:\n  - name: mymaster\n    dns_name: cache\n\
         dns:\n  listen: [\"{dns}\"]\n  zone: redis.test.\n  ttl: {}s\n",
        TTL.as_secs()
    );
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    let src = cluster.sentinels_yaml();
    cluster.polestar(&cluster.ctl, "ctl-polestar", &src, &listen, &central).await?;
    cluster.node_polestar("sweep:\n  local_ports: [6379]\n").await?;
    let upstream = format!(
        "upstream: {{urls: [\"http://{}:{HTTP_PORT}\"], allow_plaintext: true}}\n",
        cluster.ctl.ip
    );
    let (agent_listen, sweep) = (format!("127.0.0.1:{HTTP_PORT}"), "sweep:\n  remote: true\n");
    cluster.polestar(&cluster.app, "app-agent", &upstream, &agent_listen, sweep).await?;
    let resolv = ResolvConf::write(&cluster.app)?;
    start_unbound(cluster, dns)?;
    let first = cluster.db[0].ip;
    let app = cluster.app.clone();
    until("unbound answers the first primary", SETUP, || {
        let app = app.clone();
        async move {
            let answer = in_ns(&app, || ask_a("127.0.0.1:53".parse().expect("addr"))).await;
            answer.ok()?.ok()?.contains(&first).then_some(())
        }
    })
    .await?;
    Ok(Some(resolv))
}

async fn apply(cluster: &Cluster, fault: Fault) -> anyhow::Result<()> {
    match fault {
        Fault::Planned => {
            let reply = cluster.cli(&cluster.db[1], 26379, &["SENTINEL", "FAILOVER", "mymaster"]);
            anyhow::ensure!(reply.trim() == "OK", "SENTINEL FAILOVER: {reply}");
        }
        Fault::Hung => cluster.net.signal("redis-0", Signal::SIGSTOP)?,
        Fault::Dark => cluster.net.go_dark(&cluster.db[0])?,
    }
    Ok(())
}

/// When the central polestar published the switch away from `old` (its flip).
async fn flip_time(cluster: &Cluster) -> Option<SystemTime> {
    let url = format!("http://{}:{HTTP_PORT}/v1/events", cluster.ctl.ip);
    let events = netns::get_json(&cluster.ctl, url).await?;
    events
        .as_array()?
        .iter()
        .filter(|e| e["kind"] == "switch" && !e["from"].is_null())
        .filter_map(|e| e["time_ms"].as_u64())
        .min()
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
}

/// The fault as docs/tested.md's table names it.
fn fault_name(fault: Fault, flavor: &Flavor) -> String {
    let name = match fault {
        Fault::Planned => "planned",
        Fault::Hung => "hung primary",
        Fault::Dark => "dark host",
    };
    match flavor {
        Flavor::Redis => name.to_string(),
        other @ Flavor::Valkey { .. } => format!("{name}, {}", other.name()),
    }
}

fn report(line: &str) {
    eprintln!("{line}");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/target/clients-recovery.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(file) {
        use std::io::Write;
        let _ = writeln!(f, "{line}");
    }
}

async fn scenario(fault: Fault, mode: Mode) {
    scenario_on(fault, mode, Flavor::Redis, &APPS).await;
}

async fn scenario_on(fault: Fault, mode: Mode, flavor: Flavor, apps: &[App]) {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start_on(DOWN_AFTER_MS, flavor).await;
    let cluster = cluster.unwrap_or_else(|e| panic!("{e:#}"));
    let result = run(&cluster, fault, mode, apps).await;
    cluster.net.with_logs(result).unwrap_or_else(|e| panic!("{e:#}"));
}

async fn run(cluster: &Cluster, fault: Fault, mode: Mode, apps: &[App]) -> anyhow::Result<()> {
    let _resolv = deploy(cluster, mode).await?;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let sentinel_events = SentinelEvents::default();
    for host in &cluster.db[1..] {
        let (events, addr, stop) =
            (sentinel_events.clone(), SocketAddr::new(host.ip, 26379), stop.clone());
        let _recording = in_ns(&cluster.ctl, move || events.record(addr, stop));
    }
    let answers = Answers::default();
    if mode == Mode::Polestar {
        answers.record(&cluster.app, stop.clone());
    }
    let old = cluster.primary();
    let target = match mode {
        Mode::Polestar => NAME.to_string(),
        Mode::Pinned => old.ip().to_string(),
    };
    spawn_apps(cluster, &target, apps)?;
    let started = SystemTime::now();
    for app in apps {
        until(&format!("{} on the first primary", app.label), SETUP, || async {
            first_ok_on(cluster, app.label, old, started)
        })
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let fault_at = SystemTime::now();
    apply(cluster, fault).await?;
    let switch = until("Sentinel's +switch-master", Duration::from_secs(30), || async {
        sentinel_events.first(SWITCH, fault_at)
    })
    .await?;
    let reply =
        cluster.cli(&cluster.db[1], 26379, &["SENTINEL", "get-master-addr-by-name", "mymaster"]);
    let new_ip: IpAddr = reply.lines().next().unwrap_or("").trim().parse()?;
    let new = SocketAddr::new(new_ip, 6379);
    anyhow::ensure!(new != old, "Sentinel still names {old}");

    let watch = match mode {
        Mode::Polestar => Duration::from_secs(20),
        Mode::Pinned => CONTROL_WATCH,
    };
    // All clients at once: until every one is back (or the watch ends).
    let back_all = || apps.iter().map(|a| first_ok_on(cluster, a.label, new, fault_at)).collect();
    let all_back = until("every client on the new primary", watch, || async {
        let back: Vec<Option<SystemTime>> = back_all();
        back.iter().all(Option::is_some).then_some(())
    });
    let _ = all_back.await;
    let back: Vec<Option<SystemTime>> = back_all();
    // More writes on the new primary, then the clients stop and the writes are counted there.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for app in apps {
        cluster.net.stop(app.label);
    }
    stop.cancel();

    let flip = if mode == Mode::Polestar { flip_time(cluster).await } else { None };
    let resolver = flip.and_then(|f| answers.first_naming(new_ip, f).map(|a| (f, a)));
    let resolver_text = match resolver {
        Some((f, a)) => format!(
            "flip->unbound's first new answer {:.3}s (last old answer {:.3}s after the flip)",
            secs(f, a),
            answers.last_naming(old.ip()).map_or(f64::NAN, |l| secs(f, l))
        ),
        None => "no resolver (pinned)".to_string(),
    };
    let new_host = cluster.db.iter().find(|h| h.ip == new_ip).cloned().expect("a data host");
    let server = client_results::server_version(&cluster.cli(&new_host, 6379, &["INFO", "server"]));
    let unbound = (mode == Mode::Polestar).then(client_results::unbound_version);
    let base = (TTL + SLACK).as_secs_f64();
    let after_resolver = |(_, answer): (SystemTime, SystemTime)| {
        base.max(secs(switch, answer) + AFTER_RESOLVER.as_secs_f64())
    };
    let limit = resolver.map_or(base, after_resolver);
    let mut failures = Vec::new();
    for (app, at) in apps.iter().zip(&back) {
        let (started, seqs) = acked(cluster, app.label);
        let version = &started.version;
        let lost = if app.writes {
            let stored = cluster.cli(
                &new_host,
                6379,
                &["LRANGE", &format!("acked:{}", app.label), "0", "-1"],
            );
            let stored: BTreeSet<u64> =
                stored.lines().filter_map(|l| l.trim().parse().ok()).collect();
            let after: BTreeSet<u64> =
                seqs.iter().copied().filter(|s| !stored.contains(s)).collect();
            Some((after.len(), seqs.len()))
        } else {
            None
        };
        let back_text = match (at, flip) {
            (Some(at), Some(flip)) => format!(
                "switch->back {:.3}s (flip->back {:.3}s)",
                secs(switch, *at),
                secs(flip, *at)
            ),
            (Some(at), None) => format!("switch->back {:.3}s", secs(switch, *at)),
            (None, _) => format!("not back within {watch:?} of the switch"),
        };
        let lost_text = match lost {
            Some((lost, of)) => format!("lost {lost} of {of} acked"),
            None => "(BLPOP)".to_string(),
        };
        report(&format!(
            "CLIENTS {fault:?} {mode:?} {} [{version}, {}]: {back_text} (fault->switch {:.3}s), {lost_text}; {resolver_text}",
            app.label,
            cluster.flavor.name(),
            secs(fault_at, switch),
        ));
        client_results::append(
            "dns.jsonl",
            &serde_json::json!({
                "client": app.label, "version": version, "settings": app.settings,
                "runtime": started.runtime, "server": server, "resolver": unbound,
                "path": match mode {
                    Mode::Polestar => "DNS through unbound (TTL 1 s)",
                    Mode::Pinned => "pinned address, no polestar",
                },
                "fault": fault_name(fault, &cluster.flavor),
                "back_s": at.map(|at| (secs(switch, at) * 1000.0).round() / 1000.0),
                "lost": lost.map(|(l, _)| l), "acked": lost.map(|(_, of)| of),
            }),
        );
        if mode == Mode::Polestar && app.timed {
            match at {
                Some(at) if secs(switch, *at) <= limit => {}
                _ => failures.push(format!(
                    "{}: {back_text}, promised {limit:.1}s; its log's last lines:\n{}",
                    app.label,
                    last_lines(&cluster.net.log(app.label), 12)
                )),
            }
        }
        if let Some((lost, _)) = lost.filter(|(l, _)| *l > 0 && mode == Mode::Polestar) {
            failures.push(format!("{}: {lost} acknowledged writes lost", app.label));
        }
    }
    if mode == Mode::Polestar {
        failures.extend(disconnect_timeout_costs_nothing(apps, &back, switch));
    }
    anyhow::ensure!(failures.is_empty(), "{}", failures.join("\n"));
    if mode == Mode::Pinned {
        // The control must show a difference, or it shows nothing.
        let promised = back.iter().all(|at| at.is_some_and(|at| secs(switch, at) <= limit));
        anyhow::ensure!(!promised, "every pinned client was back within {limit}s without polestar");
    }
    Ok(())
}

/// The last `n` lines of `text` that are not one more success (what a client did when it
/// stopped succeeding).
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.contains(r#""ev":"ok""#)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// docs/operating.md: by name, nothing makes ioredis close a connection itself (no
/// `+switch-master`, no `reconnectOnError` by default): polestar's kill and sweeps close it, so its
/// `disconnectTimeout` (2 s by default, the wait for a FIN after its own close) costs nothing. The
/// default must be back within 1 s of `disconnectTimeout: 50` (where it plays a part, on the
/// Sentinel endpoint, it costs its whole 2 s: `clients_sentinel::ioredis_waits_...`).
fn disconnect_timeout_costs_nothing(
    apps: &[App],
    back: &[Option<SystemTime>],
    switch: SystemTime,
) -> Option<String> {
    let at = |label: &str| {
        let i = apps.iter().position(|a| a.label == label)?;
        back[i].map(|at| secs(switch, at))
    };
    let (default, low) = (at("ioredis")?, at("ioredis-disconnect50")?);
    (default > low + 1.0).then(|| {
        format!(
            "ioredis by name: back {default:.3}s with the default disconnectTimeout, {low:.3}s \
             with 50 ms: docs/operating.md says it plays no part by name"
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_planned_failover_through_unbound_lose_nothing() {
    scenario(Fault::Planned, Mode::Polestar).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_hung_primary_through_unbound_are_back_within_ttl() {
    scenario(Fault::Hung, Mode::Polestar).await;
}

/// Also the end-to-end check of the agent's sweep through `drain.window` (docs/failover.md, "Socket
/// sweeping", client side): unbound names the dark old primary after the grace, and connections
/// opened then must be aborted, not left to the library's connect timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_dark_primary_through_unbound_are_back_within_ttl() {
    scenario(Fault::Dark, Mode::Polestar).await;
}

/// Valkey 8: the node-side sweeper reads Valkey's `CLIENT LIST` to spare Sentinels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_real_clients_hung_primary_through_unbound_are_back_within_ttl() {
    scenario_on(Fault::Hung, Mode::Polestar, crate::common::valkey(), &APPS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_majors_and_forks_planned_failover_through_unbound_lose_nothing() {
    scenario_on(Fault::Planned, Mode::Polestar, Flavor::Redis, &PREVIOUS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_majors_and_forks_hung_primary_through_unbound_are_back_within_ttl() {
    scenario_on(Fault::Hung, Mode::Polestar, Flavor::Redis, &PREVIOUS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_majors_and_forks_dark_primary_through_unbound_are_back_within_ttl() {
    scenario_on(Fault::Dark, Mode::Polestar, Flavor::Redis, &PREVIOUS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_real_clients_pinned_planned_failover() {
    scenario(Fault::Planned, Mode::Pinned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_real_clients_pinned_hung_primary() {
    scenario(Fault::Hung, Mode::Pinned).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_real_clients_pinned_dark_primary() {
    scenario(Fault::Dark, Mode::Pinned).await;
}

/// Found with ioredis behind unbound (docs/decisions.md D13): the agent stopped sweeping at
/// `drain.grace` (1.5 s then), unbound still named the dark old primary until 1.9 s after the
/// flip, and the connections opened in that gap hung for the library's connect timeout. Here a
/// connection to the dark old primary is opened well after the grace (2.5 s by default now), as
/// from a stale cache: it must be aborted at once, not left to retransmit SYNs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_stopped_sweeping_a_dark_old_primary_before_the_resolver_forgot_it() {
    let _serial = netns::SERIAL.lock().await;
    let cluster = Cluster::start(DOWN_AFTER_MS).await.unwrap_or_else(|e| panic!("{e:#}"));
    let result = late_connect_to_dark_primary(&cluster).await;
    cluster.net.with_logs(result).unwrap_or_else(|e| panic!("{e:#}"));
}

async fn late_connect_to_dark_primary(cluster: &Cluster) -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_millis(2500);
    let listen = format!("{}:{HTTP_PORT}", cluster.ctl.ip);
    cluster.polestar(&cluster.ctl, "ctl-polestar", &cluster.sentinels_yaml(), &listen, "").await?;
    let upstream = format!(
        "upstream: {{urls: [\"http://{}:{HTTP_PORT}\"], allow_plaintext: true}}\n",
        cluster.ctl.ip
    );
    let (agent_listen, sweep) = (format!("127.0.0.1:{HTTP_PORT}"), "sweep:\n  remote: true\n");
    cluster.polestar(&cluster.app, "app-agent", &upstream, &agent_listen, sweep).await?;
    let old = cluster.primary();
    cluster.net.go_dark(&cluster.db[0])?;
    let url = format!("http://127.0.0.1:{HTTP_PORT}/v1/events");
    let flip = until("the agent's switch", Duration::from_secs(30), || async {
        let events = netns::get_json(&cluster.app, url.clone()).await?;
        let switch =
            events.as_array()?.iter().find(|e| e["kind"] == "switch" && !e["from"].is_null());
        switch?["time_ms"].as_u64().map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    })
    .await?;
    let late = flip + GRACE + Duration::from_millis(700);
    tokio::time::sleep(late.duration_since(SystemTime::now()).unwrap_or_default()).await;
    let connect = in_ns(&cluster.app, move || async move {
        let started = std::time::Instant::now();
        let outcome =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(old)).await;
        Ok((started.elapsed(), format!("{outcome:?}")))
    });
    let (took, outcome) = connect.await??;
    eprintln!(
        "CLIENTS late connect to the dark old primary {:.3}s after the flip: {outcome} after {took:?}",
        secs(flip, SystemTime::now()) - took.as_secs_f64()
    );
    anyhow::ensure!(
        took < Duration::from_secs(2) && outcome.contains("Err"),
        "a connection opened after the grace to the dark old primary was not aborted: {outcome} after {took:?}"
    );
    Ok(())
}
