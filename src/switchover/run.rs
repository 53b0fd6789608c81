//! The switchover itself, the I/O shell around [`super::choose`] and [`super::catchup`]:
//! ask a Sentinel what it would promote, fence the primary, wait for the candidates, fail over.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use redis::Value;
use serde_json::json;
use tokio::time::{Instant, sleep};

use super::Deps;
use super::catchup::{Reading, Verdict, judge};
use super::choose::{Choice, Replica, choose, handed_off_candidate};
use super::fence::Fence;
use super::info;
use super::link::{NODE_DEADLINE, SentinelLink, open_node};
use super::version::{Server, coordinated};
use crate::control::{ControlError, Switched, SwitchoverError, SwitchoverOptions};
use crate::events::Kind;
use crate::metrics as m;
use crate::node::{Endpoint, Link};
use crate::sentinel::message::{record, records};

/// How often the offsets are read while the primary is fenced.
const POLL: Duration = Duration::from_millis(20);
/// How long the fence is kept after Sentinel accepted the failover, at most, waiting for the
/// new primary to be published (the drain side fences from the leader's `+selected-slave` on).
const HOLD_AFTER: Duration = Duration::from_secs(10);

/// What the Sentinel that will fail over says about the master.
struct Plan {
    sentinel: SentinelLink,
    primary: SocketAddr,
    down_after: Duration,
    /// Sentinel's `failover-timeout` for the master.
    failover_timeout: Duration,
    choice: Choice,
}

/// `handed_off`: the replicas of `master` being handed off now (about to be stopped): the
/// switchover is refused if Sentinel could promote one of them.
pub async fn switchover(
    deps: &Deps,
    master: &str,
    primary: SocketAddr,
    handed_off: &[SocketAddr],
    options: SwitchoverOptions,
) -> Result<Switched, SwitchoverError> {
    let result = attempt(deps, master, primary, handed_off, options).await;
    report(deps, master, primary, &result);
    result
}

/// [`switchover`] in a task of its own, which keeps `busy`: a caller that goes away (an HTTP
/// client that disconnects) does not stop it halfway, the fence renewed or the drain's
/// coordinated mark set with nobody left to lift them. It runs to its end, which lifts or
/// releases both, and frees the master then.
pub async fn to_the_end(
    busy: impl Send + 'static,
    deps: &Deps,
    master: &str,
    primary: SocketAddr,
    handed_off: Vec<SocketAddr>,
    options: SwitchoverOptions,
) -> Result<Switched, SwitchoverError> {
    let (deps, name) = (deps.clone(), master.to_string());
    let task = tokio::spawn(async move {
        let _busy = busy;
        switchover(&deps, &name, primary, &handed_off, options).await
    });
    task.await.unwrap_or_else(|e| {
        Err(SwitchoverError::Fence { node: primary, why: format!("the switchover failed: {e}") })
    })
}

async fn attempt(
    deps: &Deps,
    master: &str,
    primary: SocketAddr,
    handed_off: &[SocketAddr],
    options: SwitchoverOptions,
) -> Result<Switched, SwitchoverError> {
    let mut plan = plan(deps, master, primary).await?;
    if let Some(replica) = handed_off_candidate(&plan.choice, handed_off) {
        return Err(SwitchoverError::HandedOff { master: master.to_string(), replica });
    }
    let (mut links, lag_bytes) = open_offsets(deps, master, &plan, options.max_lag).await?;
    // Asked before the fence: every round trip under it is a pause for the writers.
    let sentinel = Server::parse(&plan.sentinel.info("server").await.unwrap_or_default());
    let coordinated = coordinated(sentinel, &links.servers().await);
    let max_wait = fence_bound(options.max_wait, plan.down_after);
    let (fence, waited) = fence_caught_up(deps, master, &mut plan, &mut links, max_wait).await?;
    let fence = if !coordinated {
        Some(fence)
    } else if coordinated_failover(deps, master, &mut plan, fence).await? {
        None
    } else {
        // Refused: fenced again, and the replicas caught up again, before the plain one.
        Some(fence_caught_up(deps, master, &mut plan, &mut links, max_wait).await?.0)
    };
    let coordinated = fence.is_none();
    if let Some(fence) = fence {
        plain_failover(deps, master, &mut plan, fence).await?;
    }
    let switched = Switched {
        sentinel: plan.sentinel.name().to_string(),
        primary: Some(primary),
        replicas: plan.choice.wait_for.clone(),
        lag_bytes,
        waited_ms: waited.as_millis() as u64,
        coordinated,
    };
    Ok(switched)
}

/// The drain's mark of a coordinated failover ends once the new primary is published, or
/// after `mark` at the latest.
fn unmark_when_published(deps: &Deps, master: &str, primary: SocketAddr, mark: Duration) {
    let Some(drain) = deps.drain.clone() else { return };
    let (name, published) = (master.to_string(), published(deps, master, primary));
    // Ends by itself within `mark`.
    crate::supervise::detached("a coordinated failover's mark", async move {
        let _ = tokio::time::timeout(mark, published).await;
        drain.coordinated_done(&name);
    });
}

/// Opens the links that read the replicas' offsets; refused when the furthest behind is more
/// than `max_lag` bytes behind. The links, and how far behind that one is.
async fn open_offsets(
    deps: &Deps,
    master: &str,
    plan: &Plan,
    max_lag: Option<u64>,
) -> Result<(Offsets, u64), SwitchoverError> {
    let fence_error = |why: String| SwitchoverError::Fence { node: plan.primary, why };
    let mut links = Offsets::open(deps, master, plan.primary, &plan.choice.wait_for)
        .await
        .map_err(fence_error)?;
    let first = links.read().await.map_err(fence_error)?;
    let (worst, lag_bytes) = first.furthest().unwrap_or((plan.choice.likely, 0));
    if let Some(max_lag) = max_lag.filter(|max| lag_bytes > *max) {
        return Err(SwitchoverError::TooFarBehind { replica: worst, lag_bytes, max_lag });
    }
    Ok((links, lag_bytes))
}

/// Fences the primary and waits until the replicas have caught up under the fence (lifted
/// when they do not); how long they took.
async fn fence_caught_up(
    deps: &Deps,
    master: &str,
    plan: &mut Plan,
    links: &mut Offsets,
    max_wait: Duration,
) -> Result<(Fence, Duration), SwitchoverError> {
    let primary = plan.primary;
    let fence_error = |why: String| SwitchoverError::Fence { node: primary, why };
    let limit = max_wait + HOLD_AFTER;
    let fence =
        Fence::start(primary, &deps.nodes, deps.interval, limit).await.map_err(fence_error)?;
    let started = Instant::now();
    if let Err(e) = wait_caught_up(links, started, max_wait).await {
        lift(deps, fence, master, &mut plan.sentinel).await;
        return Err(e);
    }
    Ok((fence, started.elapsed()))
}

/// Sentinel's plain `FAILOVER`, under the fence: released once the new primary is
/// published (and [`HOLD_AFTER`]), lifted when Sentinel refuses.
async fn plain_failover(
    deps: &Deps,
    master: &str,
    plan: &mut Plan,
    fence: Fence,
) -> Result<(), SwitchoverError> {
    if let Err(e) = ask(&mut plan.sentinel, master, false).await {
        let e = refused(&plan.sentinel, e);
        lift(deps, fence, master, &mut plan.sentinel).await;
        return Err(e);
    }
    fence.release_when(published(deps, master, plan.primary), HOLD_AFTER);
    Ok(())
}

/// Resolves once the published primary of `master` is another node than `primary`.
fn published(
    deps: &Deps,
    master: &str,
    primary: SocketAddr,
) -> impl Future<Output = ()> + Send + 'static {
    let mut topology = deps.topology.clone();
    let name = master.to_string();
    async move {
        let moved = |s: &crate::topology::Snapshot| {
            s.master(&name).and_then(|m| m.primary.as_ref()).is_some_and(|p| p.addr() != primary)
        };
        let _ = topology.wait_for(|s| moved(s)).await;
    }
}

/// Valkey's coordinated failover, the replicas caught up under our fence: the fence is lifted
/// first, and the drain side told to set none at the promotion, since a paused primary holds
/// the Sentinels' hello `PUBLISH` and everything queued behind it on their command links,
/// the leader's `CLIENT PAUSE WRITE` + `FAILOVER TO` included: with our pause in place the
/// primary never runs `FAILOVER`, and Sentinel aborts (`-failover-abort-slave-timeout`) after
/// its `failover-timeout`. Lossless without our fence: `FAILOVER TO` pauses the writes
/// itself and hands over only once the replica has the primary's whole offset (the few
/// writes since the lift are a short catch-up); if it cannot, nothing fails over.
/// `Ok(true)`: Sentinel accepted it. `Ok(false)`: Sentinel refused `COORDINATED` with an
/// error reply (it cannot coordinate this primary), so a plain failover is to follow, fenced
/// again.
async fn coordinated_failover(
    deps: &Deps,
    master: &str,
    plan: &mut Plan,
    fence: Fence,
) -> Result<bool, SwitchoverError> {
    if let Err(error) = fence.lift().await {
        tracing::warn!(master, %error, "could not lift the switchover's fence before the coordinated failover: it lapses by itself");
    }
    let mark = plan.failover_timeout * 2 + HOLD_AFTER;
    if let Some(drain) = &deps.drain {
        drain.coordinated(master, mark);
    }
    let done = |deps: &Deps| {
        if let Some(drain) = &deps.drain {
            drain.coordinated_done(master);
        }
    };
    match ask(&mut plan.sentinel, master, true).await {
        Ok(()) => {
            unmark_when_published(deps, master, plan.primary, mark);
            Ok(true)
        }
        Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_) | redis::ErrorKind::Extension) => {
            done(deps);
            tracing::warn!(master, error = %e, "SENTINEL FAILOVER COORDINATED refused; asking for a plain failover");
            Ok(false)
        }
        Err(e) => {
            done(deps);
            Err(refused(&plan.sentinel, e))
        }
    }
}

/// `max_wait`, but at most 40% of Sentinel's `down-after-milliseconds`: a fenced primary holds
/// Sentinel's hello `PUBLISH` and the pings queued behind it on the same link, so a fence held
/// for about `down-after` makes the Sentinels find the primary down and fail over on their own,
/// to a replica that has not caught up (measured: `+sdown` 6.8 s into a fence with
/// `down-after-milliseconds 5000`).
pub fn fence_bound(max_wait: Duration, down_after: Duration) -> Duration {
    max_wait.min(down_after * 2 / 5)
}

/// The first configured Sentinel that answers, is not in TILT and has a replica it could
/// promote: what it knows of the master (no failover under way, the same primary as
/// published) and whom it would promote. It is the one asked to fail over, and a Sentinel
/// fails over by its own view: one that still has a replica `disconnected` (its link not back
/// yet after a restart, as in a rolling restart) is passed over for the next. With no such
/// Sentinel, the first one's reason is the answer.
async fn plan(deps: &Deps, master: &str, primary: SocketAddr) -> Result<Plan, SwitchoverError> {
    let mut failures = Vec::new();
    let mut no_candidate = None;
    for address in &deps.sentinels.addresses {
        let endpoint = Endpoint::new(address.host.clone(), address.port, &deps.sentinels.auth);
        let mut sentinel = match SentinelLink::open(&endpoint).await {
            Ok(link) => link,
            Err(why) => {
                failures.push(why);
                continue;
            }
        };
        if sentinel
            .info("sentinel")
            .await
            .is_ok_and(|i| i.lines().any(|l| l.trim() == "sentinel_tilt:1"))
        {
            failures.push(format!("{}: in TILT mode", endpoint.name()));
            continue;
        }
        match plan_with(sentinel, master, primary).await {
            Err(SwitchoverError::NoCandidate { master, why }) => {
                let why = format!("{}: {why}", endpoint.name());
                no_candidate.get_or_insert(SwitchoverError::NoCandidate { master, why });
            }
            planned => return planned,
        }
    }
    Err(no_candidate.unwrap_or_else(|| ControlError::Unreachable(failures.join("; ")).into()))
}

async fn plan_with(
    mut sentinel: SentinelLink,
    master: &str,
    primary: SocketAddr,
) -> Result<Plan, SwitchoverError> {
    let busy = |why: String| SwitchoverError::Busy { master: master.to_string(), why };
    let state = sentinel_master(&mut sentinel, master).await?;
    let flags = state.get("flags").cloned().unwrap_or_default();
    if flags.split(',').any(|f| f == "failover_in_progress") {
        return Err(busy(format!("Sentinel {} reports a failover in progress", sentinel.name())));
    }
    let theirs = format!(
        "{}:{}",
        state.get("ip").cloned().unwrap_or_default(),
        state.get("port").cloned().unwrap_or_default()
    );
    if theirs.parse::<SocketAddr>().ok() != Some(primary) {
        return Err(busy(format!(
            "Sentinel {} names {theirs} as the primary, polestar publishes {primary}",
            sentinel.name()
        )));
    }
    let down_after =
        state.get("down-after-milliseconds").and_then(|v| v.parse().ok()).unwrap_or(30_000);
    let down_after = Duration::from_millis(down_after);
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("REPLICAS").arg(master);
    let reply: Value = sentinel.query(cmd).await.map_err(|e| unreachable(&sentinel, e))?;
    let replicas: Vec<Replica> = records(&reply).iter().filter_map(Replica::from_record).collect();
    let choice = choose(&replicas, down_after)
        .map_err(|why| SwitchoverError::NoCandidate { master: master.to_string(), why })?;
    let failover_timeout =
        state.get("failover-timeout").and_then(|v| v.parse().ok()).unwrap_or(180_000);
    let failover_timeout = Duration::from_millis(failover_timeout);
    Ok(Plan { sentinel, primary, down_after, failover_timeout, choice })
}

async fn sentinel_master(
    sentinel: &mut SentinelLink,
    master: &str,
) -> Result<HashMap<String, String>, SwitchoverError> {
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("MASTER").arg(master);
    match sentinel.query::<Value>(cmd).await {
        Ok(reply) => record(&reply).ok_or_else(|| {
            ControlError::Refused {
                sentinel: sentinel.name().into(),
                message: "unreadable SENTINEL MASTER".into(),
            }
            .into()
        }),
        Err(e) if e.to_string().contains("No such master") => {
            Err(ControlError::UnknownMaster(master.to_string()).into())
        }
        Err(e) => Err(unreachable(sentinel, e)),
    }
}

fn unreachable(sentinel: &SentinelLink, e: redis::RedisError) -> SwitchoverError {
    ControlError::Unreachable(format!("{}: {e}", sentinel.name())).into()
}

/// `SENTINEL FAILOVER <master>` on the Sentinel that planned it, with `COORDINATED` if
/// `coordinated` ([`coordinated`] says every part runs Valkey 9).
async fn ask(
    sentinel: &mut SentinelLink,
    master: &str,
    coordinated: bool,
) -> Result<(), redis::RedisError> {
    sentinel.query::<Value>(failover_cmd(master, coordinated)).await.map(|_| ())
}

fn failover_cmd(master: &str, coordinated: bool) -> redis::Cmd {
    let mut cmd = redis::cmd("SENTINEL");
    cmd.arg("FAILOVER").arg(master);
    if coordinated {
        cmd.arg("COORDINATED");
    }
    cmd
}

fn refused(sentinel: &SentinelLink, e: redis::RedisError) -> SwitchoverError {
    ControlError::Refused { sentinel: sentinel.name().to_string(), message: e.to_string() }.into()
}

/// The fence lifted after a switchover that did not happen, unless a failover started
/// meanwhile (then the drain side holds the node, and our pause only lapses).
async fn lift(deps: &Deps, fence: Fence, master: &str, sentinel: &mut SentinelLink) {
    let failing = deps.failing_over(master)
        || sentinel_master(sentinel, master).await.map_or(true, |s| {
            s.get("flags").is_some_and(|f| f.split(',').any(|f| f == "failover_in_progress"))
        });
    if failing {
        tracing::warn!(
            master,
            "a failover started during the switchover: the fence is left to lapse"
        );
        fence.release().await;
    } else if let Err(error) = fence.lift().await {
        tracing::warn!(master, %error, "could not lift the switchover's fence: it lapses by itself");
    }
}

async fn wait_caught_up(
    links: &mut Offsets,
    started: Instant,
    max_wait: Duration,
) -> Result<(), SwitchoverError> {
    loop {
        let reading = links
            .read()
            .await
            .map_err(|why| SwitchoverError::Fence { node: links.primary_addr, why })?;
        match judge(&reading, started.elapsed(), max_wait) {
            Verdict::CaughtUp => return Ok(()),
            Verdict::Wait { .. } => sleep(POLL).await,
            Verdict::GiveUp { replica, lag } => {
                let waited_ms = started.elapsed().as_millis() as u64;
                return Err(SwitchoverError::NotCaughtUp { replica, lag_bytes: lag, waited_ms });
            }
        }
    }
}

/// Connections to the primary and to every replica waited for that polestar publishes: the
/// node credentials go to no other (the chosen Sentinel alone may list any node); the offset
/// of one without a connection is what the primary's `INFO` says it acknowledged.
struct Offsets {
    primary_addr: SocketAddr,
    primary: Link,
    replicas: Vec<(SocketAddr, Option<Link>)>,
    deps_auth: crate::config::Auth,
}

impl Offsets {
    async fn open(
        deps: &Deps,
        master: &str,
        primary: SocketAddr,
        replicas: &[SocketAddr],
    ) -> Result<Self, String> {
        let link = open_node(primary, &deps.nodes).await?;
        let published = published_replicas(deps, master);
        let mut open = Vec::new();
        for addr in replicas {
            let link = match published.contains(addr) {
                true => open_node(*addr, &deps.nodes).await.ok(),
                false => None,
            };
            open.push((*addr, link));
        }
        Ok(Self {
            primary_addr: primary,
            primary: link,
            replicas: open,
            deps_auth: deps.nodes.clone(),
        })
    }

    /// The primary's offset, every replica's best known one, and the primary's again.
    async fn read(&mut self) -> Result<Reading, String> {
        let before = self.primary_info().await?;
        let mut replicas = Vec::new();
        for (addr, link) in &mut self.replicas {
            let own = match link {
                Some(link) => link
                    .info("replication", NODE_DEADLINE)
                    .await
                    .ok()
                    .and_then(|i| info::replica_offset(&i)),
                None => None,
            };
            if own.is_none() && link.is_some() {
                *link = open_node(*addr, &self.deps_auth).await.ok();
            }
            let acked = before.acked.get(addr).copied();
            replicas.push((*addr, own.max(acked)));
        }
        let after = self.primary_info().await?;
        Ok(Reading { primary_before: before.offset, primary_after: after.offset, replicas })
    }

    /// What the primary and every replica waited for run (`INFO server`); one that does not
    /// answer is [`Server::Other`].
    async fn servers(&mut self) -> Vec<Server> {
        let mut servers = vec![Server::parse(
            &self.primary.info("server", NODE_DEADLINE).await.unwrap_or_default(),
        )];
        for (_, link) in &mut self.replicas {
            let info = match link {
                Some(link) => link.info("server", NODE_DEADLINE).await.unwrap_or_default(),
                None => String::new(),
            };
            servers.push(Server::parse(&info));
        }
        servers
    }

    async fn primary_info(&mut self) -> Result<info::Primary, String> {
        let text =
            self.primary.info("replication", NODE_DEADLINE).await.map_err(|e| e.to_string())?;
        let parsed = info::Primary::parse(&text).ok_or("unreadable INFO replication")?;
        if !parsed.role_master {
            return Err("it is no longer a master".into());
        }
        Ok(parsed)
    }
}

/// The `outcome` of a switchover (one of [`m::SWITCHOVER_OUTCOMES`]), and how long its
/// primary was fenced for the replicas, when it was: until they caught up, or in vain.
fn outcome(result: &Result<Switched, SwitchoverError>) -> (&'static str, Option<u64>) {
    match result {
        Ok(s) => ("failed_over", Some(s.waited_ms)),
        Err(SwitchoverError::NotCaughtUp { waited_ms, .. }) => ("not_caught_up", Some(*waited_ms)),
        Err(SwitchoverError::TooFarBehind { .. }) => ("too_far_behind", None),
        Err(_) => ("refused", None),
    }
}

/// The replicas polestar publishes for `master`: those a majority of the configured Sentinels
/// list (the rule of `sentinel::core`).
fn published_replicas(deps: &Deps, master: &str) -> Vec<SocketAddr> {
    let topology = deps.topology.borrow();
    let replicas = topology.master(master).map_or(&[][..], |m| &m.replicas);
    replicas.iter().map(|r| SocketAddr::new(r.ip, r.port)).collect()
}

/// The event and the metrics of one switchover, whatever its outcome.
fn report(
    deps: &Deps,
    master: &str,
    primary: SocketAddr,
    result: &Result<Switched, SwitchoverError>,
) {
    let (outcome, waited_ms) = outcome(result);
    metrics::counter!(m::SWITCHOVERS, "master" => master.to_string(), "outcome" => outcome)
        .increment(1);
    if let Some(waited_ms) = waited_ms {
        metrics::histogram!(m::SWITCHOVER_WAIT, "master" => master.to_string())
            .record(waited_ms as f64 / 1000.0);
    }
    match result {
        Ok(s) => {
            tracing::info!(master, %primary, lag_bytes = s.lag_bytes, waited_ms = s.waited_ms, coordinated = s.coordinated, "switchover: the replicas caught up; Sentinel fails over");
            let mut data = serde_json::to_value(s).unwrap_or_default();
            data["outcome"] = json!(outcome);
            deps.events.push(Kind::Switchover, Some(master), data);
        }
        Err(e) => {
            tracing::warn!(master, %primary, error = %e, "switchover refused");
            let mut data =
                json!({ "primary": primary, "outcome": outcome, "error": e.to_string() });
            if let Some((replica, lag)) = e.lag() {
                data["replica"] = json!(replica);
                data["lag_bytes"] = json!(lag);
            }
            if let SwitchoverError::NotCaughtUp { waited_ms, .. } = e {
                data["waited_ms"] = json!(waited_ms);
            }
            deps.events.push(Kind::Switchover, Some(master), data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_a_registered_series_and_every_fenced_wait_is_recorded() {
        let replica = SocketAddr::from(([10, 0, 0, 2], 6379));
        let switched = Switched { waited_ms: 1200, ..Switched::default() };
        type Row = (Result<Switched, SwitchoverError>, (&'static str, Option<u64>));
        let table: [Row; 5] = [
            (Ok(switched), ("failed_over", Some(1200))),
            (
                Err(SwitchoverError::NotCaughtUp { replica, lag_bytes: 9, waited_ms: 5000 }),
                ("not_caught_up", Some(5000)),
            ),
            (
                Err(SwitchoverError::TooFarBehind { replica, lag_bytes: 9, max_lag: 1 }),
                ("too_far_behind", None),
            ),
            (Err(SwitchoverError::NoPrimary("m".into())), ("refused", None)),
            (Err(SwitchoverError::HandedOff { master: "m".into(), replica }), ("refused", None)),
        ];
        for (result, expected) in table {
            let got = outcome(&result);
            assert_eq!(got, expected, "{result:?}");
            assert!(m::SWITCHOVER_OUTCOMES.contains(&got.0), "{} is not registered", got.0);
        }
    }

    #[test]
    fn a_fence_is_never_held_long_enough_for_sentinel_to_find_the_primary_down() {
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        assert_eq!(fence_bound(s(5), s(30)), s(5));
        assert_eq!(fence_bound(s(5), s(5)), s(2));
        assert_eq!(fence_bound(s(30), ms(20_000)), s(8));
    }
}
