//! `polestar demo`: a real local cluster (3 `redis-server`, 3 `redis-sentinel` on loopback;
//! Valkey with `POLESTAR_VALKEY_SERVER=/path/to/valkey-server`) and the daemon serving it, so
//! that anyone can watch a failover move the DNS name and the API within a minute of cloning
//! the repository. Ctrl-C stops everything it started.
//!
//! A module of the binary (`src/main.rs`), not of the library, behind the default `demo`
//! feature: the cluster is the lab crate's (`crates/lab`), which the library never uses.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

use polestar::config::Config;
use polestar::log_output::say;
use polestar_lab::{Flavor, Lab, LabOptions, VALKEY_ENV};

/// Preferred listeners; a free port is taken when one is busy.
const DNS_PORT: u16 = 5353;
const HTTP_PORT: u16 = 8053;
const ZONE: &str = "redis.internal.";
/// The DNS label of the demo master (`cache.redis.internal`).
const LABEL: &str = "cache";
/// The admin token for the POST endpoints, written into the lab directory.
const TOKEN_FILE: &str = "admin.token";
const INSTALL: &str = "apt-get install -y redis-server redis-sentinel";

/// Runs the demo until `shutdown` is cancelled.
pub async fn demo(shutdown: CancellationToken) -> anyhow::Result<()> {
    let opts = LabOptions::default();
    require_programs(&opts.flavor)?;
    let what = match &opts.flavor {
        Flavor::Redis => "3 redis-server and 3 redis-sentinel".to_string(),
        Flavor::Valkey { server } => format!("3 {} (data nodes) and 3 Sentinels", server.display()),
    };
    say(&format!("starting {what} on 127.0.0.1..."));
    let lab = tokio::select! {
        lab = Lab::start(opts) => lab.context("cannot start the demo cluster")?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    close_hellos(&lab).await.context("cannot apply the recommended ACL to the demo cluster")?;
    let listeners = Listeners::choose()?;
    let path = write_config(&lab, &listeners)?;
    let config = Config::load(&path)?;
    say(&guide(&lab, &listeners, &path).await);
    let result = polestar::daemon::run(config, shutdown.clone()).await;
    // The cluster goes first thing after the daemon, whatever its result.
    drop(lab);
    say("demo stopped; every process it started is gone");
    result
}

/// The Sentinels' own user on the demo's data nodes (docs/operating.md's list), with this
/// password: a loopback demo's, never a deployment's.
const SENTINEL_USER: &str = "sentinel";
const SENTINEL_PASSWORD: &str = "demo-sentinel-node-pw";
const SENTINEL_RULES: &str = "allchannels -@all +multi +exec +ping +info +role +subscribe \
    +publish +slaveof +replicaof +config|rewrite +client|setname +client|kill +script|kill \
    +client|pause +failover";

/// The ACL the README recommends, applied to the demo's own cluster so that its first screen
/// has no warning about the demo itself: the Sentinels get a user of their own on the data
/// nodes, then the `default` user keeps only the application's channels (`resetchannels
/// &app:*`), so no client of the demo may publish a Sentinel hello. Connections the Sentinels
/// opened as `default` are closed; they reconnect with their user before the daemon starts.
async fn close_hellos(lab: &Lab) -> anyhow::Result<()> {
    use polestar_lab::query;
    let acl = |args: &[&str]| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg(args);
        cmd
    };
    let password = format!(">{SENTINEL_PASSWORD}");
    let mut sentinel_user = vec!["SETUSER", SENTINEL_USER, "reset", "on", &password];
    sentinel_user.extend(SENTINEL_RULES.split_whitespace());
    for node in lab.node_addrs() {
        query::<String>(node, &acl(&sentinel_user)).await?;
    }
    let master = lab.master_name().to_string();
    for sentinel in lab.sentinel_addrs() {
        let set = ["SET", &master, "auth-user", SENTINEL_USER, "auth-pass", SENTINEL_PASSWORD];
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg(&set[..]);
        query::<String>(sentinel, &cmd).await?;
    }
    for node in lab.node_addrs() {
        query::<String>(node, &acl(&["SETUSER", "default", "resetchannels", "&app:*"])).await?;
        // The Sentinels' links (command and pub/sub), not replication: a replica resyncing
        // would be a blocker on the first screen.
        for kind in ["normal", "pubsub"] {
            let mut kill = redis::cmd("CLIENT");
            kill.arg(&["KILL", "USER", "default", "TYPE", kind, "SKIPME", "yes"][..]);
            let _: redis::Value = query(node, &kill).await?;
        }
    }
    // Every Sentinel sees every replica and Sentinel again before polestar asks.
    lab.wait_converged(std::time::Duration::from_secs(30)).await
}

/// Fails with the install command when a program the lab runs is missing.
fn require_programs(flavor: &Flavor) -> anyhow::Result<()> {
    if let Flavor::Valkey { server } = flavor {
        if !is_executable(server) {
            bail!("{VALKEY_ENV}={}: not an executable", server.display());
        }
        return Ok(());
    }
    for program in ["redis-server", "redis-sentinel"] {
        if find_on_path(program).is_none() {
            bail!("{program} not found: {INSTALL}");
        }
    }
    Ok(())
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where the demo's daemon listens.
struct Listeners {
    dns: SocketAddr,
    http: SocketAddr,
}

impl Listeners {
    fn choose() -> anyhow::Result<Self> {
        let dns = port_or_free(DNS_PORT, dns_port_free)?;
        let http = port_or_free(HTTP_PORT, |p| TcpListener::bind(("127.0.0.1", p)).is_ok())?;
        Ok(Self {
            dns: SocketAddr::from(([127, 0, 0, 1], dns)),
            http: ([127, 0, 0, 1], http).into(),
        })
    }
}

/// `preferred` if `free(preferred)`, else a port the kernel hands out that is also `free`.
fn port_or_free(preferred: u16, free: impl Fn(u16) -> bool) -> anyhow::Result<u16> {
    if free(preferred) {
        return Ok(preferred);
    }
    for _ in 0..20 {
        let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        if free(port) {
            return Ok(port);
        }
    }
    bail!("no free port found on 127.0.0.1 (wanted {preferred})")
}

/// DNS listens on UDP and TCP: both must be free.
fn dns_port_free(port: u16) -> bool {
    UdpSocket::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Writes `polestar.yaml` and an admin token into the lab directory.
fn write_config(lab: &Lab, listeners: &Listeners) -> anyhow::Result<PathBuf> {
    let token = lab.dir().join(TOKEN_FILE);
    std::fs::write(&token, "demo-token\n").context("cannot write the demo admin token")?;
    let sentinels: Vec<String> = lab.sentinel_addrs().iter().map(|a| format!("\"{a}\"")).collect();
    let yaml = format!(
        "sentinels:\n  addresses: [{sentinels}]\nmasters:\n  - name: {master}\n    dns_name: {LABEL}\n\
         dns:\n  listen: [\"{dns}\"]\n  zone: {ZONE}\n  ttl: 1s\n\
         http:\n  listen: \"{http}\"\n  admin_token_file: {token}\n\
         drain:\n  enabled: true\n",
        sentinels = sentinels.join(", "),
        master = lab.master_name(),
        dns = listeners.dns,
        http = listeners.http,
        token = token.display(),
    );
    let path = lab.dir().join("polestar.yaml");
    std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// What to try, printed once the cluster is up.
async fn guide(lab: &Lab, listeners: &Listeners, config: &Path) -> String {
    let primary = lab.primary().await.ok();
    let dir = lab.dir().display();
    let mut out = format!("\ncluster ready in {dir} (config {})\n", config.display());
    out += &processes(lab, primary);
    let bin = command_name();
    out += &api_lines(lab, listeners, &bin);
    out += &dns_lines(listeners);
    out += &failover_lines(lab, listeners, primary, &bin);
    out += "\nCtrl-C stops the daemon and every process the demo started.\n";
    out
}

fn processes(lab: &Lab, primary: Option<SocketAddr>) -> String {
    let (server, sentinel) = match lab.options().flavor {
        Flavor::Redis => ("redis-server  ", "redis-sentinel"),
        Flavor::Valkey { .. } => ("valkey-server ", "valkey sentinel"),
    };
    let mut out = String::new();
    for (i, addr) in lab.node_addrs().iter().enumerate() {
        let pid = lab.node_pid(i).map(|p| p.to_string()).unwrap_or_default();
        let role = if Some(*addr) == primary { "primary" } else { "replica" };
        let _ = writeln!(out, "  {server} {addr}  pid {pid}  ({role})");
    }
    for (i, addr) in lab.sentinel_addrs().iter().enumerate() {
        let pid = lab.sentinel_pid(i).map(|p| p.to_string()).unwrap_or_default();
        let _ = writeln!(out, "  {sentinel} {addr}  pid {pid}");
    }
    out
}

/// How to call this binary from a shell: `polestar` when that name on the PATH is this very
/// file, else its full path (after `cargo run` there is no `polestar` on the PATH).
fn command_name() -> String {
    let Ok(exe) = std::env::current_exe().and_then(|p| p.canonicalize()) else {
        return "polestar".to_string();
    };
    let on_path = find_on_path("polestar").and_then(|p| p.canonicalize().ok());
    if on_path.as_deref() == Some(exe.as_path()) {
        "polestar".to_string()
    } else {
        exe.display().to_string()
    }
}

fn api_lines(lab: &Lab, listeners: &Listeners, bin: &str) -> String {
    let (api, m) = (format!("http://{}", listeners.http), lab.master_name());
    format!(
        "\nAsk the API:\n  curl -s {api}/v1/masters\n  curl -s {api}/v1/masters/{m}/primary\n  \
         curl -s '{api}/v1/masters/{m}?wait=30s&after=EPOCH'   # blocks until the epoch passes EPOCH\n  \
         curl -sN {api}/v1/events/stream                       # live events\n  \
         {bin} status --api {api}\n"
    )
}

fn dns_lines(listeners: &Listeners) -> String {
    let (ip, port, name) = (listeners.dns.ip(), listeners.dns.port(), format!("{LABEL}.{ZONE}"));
    format!(
        "\nAsk DNS:\n  dig @{ip} -p {port} {name} +short\n  \
         dig @{ip} -p {port} _redis._tcp.{name} SRV +short\n  \
         dig @{ip} -p {port} replicas.{name} +short\n"
    )
}

fn failover_lines(
    lab: &Lab,
    listeners: &Listeners,
    primary: Option<SocketAddr>,
    bin: &str,
) -> String {
    let (api, m) = (format!("http://{}", listeners.http), lab.master_name());
    let sentinel = lab.sentinel_addrs()[0].port();
    let mut out = format!(
        "\nTrigger a failover (and watch the answers above change):\n  \
         redis-cli -p {sentinel} sentinel failover {m}\n  \
         {bin} failover {m} --wait --api {api} --token-file {token}\n",
        token = lab.dir().join(TOKEN_FILE).display(),
    );
    if let Some(pid) = primary.and_then(|p| lab.index_of(p)).and_then(|i| lab.node_pid(i)) {
        let _ = writeln!(
            out,
            "  kill -STOP {pid}    # hang the primary: Sentinel fails over in ~2 s (then kill -CONT {pid})"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_port_is_replaced_by_a_free_one() {
        let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = busy.local_addr().expect("addr").port();
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        let chosen = port_or_free(port, free).expect("some port is free");
        assert_ne!(chosen, port);
    }

    #[test]
    fn guide_names_polestar_by_a_path_that_runs_it() {
        // The test binary is not on the PATH: the guide must name it by its full path.
        let name = command_name();
        let exe = std::env::current_exe().expect("exe").canonicalize().expect("canonical");
        assert!(name == "polestar" || Path::new(&name) == exe, "{name}");
        if find_on_path("polestar").is_none() {
            assert_eq!(Path::new(&name), exe);
        }
    }

    #[test]
    fn missing_programs_are_not_found() {
        assert!(find_on_path("polestar-no-such-program").is_none());
    }
}
