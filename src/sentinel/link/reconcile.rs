//! Reconciliation: what one Sentinel knows of the masters in scope (`SENTINEL MASTERS` or
//! `MASTER`, and `REPLICAS`, `SENTINELS`, the address during a failover) in one pipeline,
//! paced by the number of masters (docs/decisions.md D21).

use super::*;

/// The full reconciliation runs every `RECONCILE_PER_MASTER` × masters, within these bounds.
pub(super) const RECONCILE_MIN: Duration = Duration::from_secs(1);

pub(super) const RECONCILE_MAX: Duration = Duration::from_secs(30);

pub(super) const RECONCILE_PER_MASTER: Duration = Duration::from_millis(10);

/// Every this many full reconciliations a link asks every master's peers, changed or not.
pub(super) const PEERS_EVERY: u32 = 6;

/// What this Sentinel knows of the masters in `scope`: their primaries and replicas, and for
/// a full reconciliation every master it monitors and the peers it knows; with `keep`, also
/// its records as the readiness poll reads them.
pub(super) async fn reconcile(
    from: SentinelId,
    scope: Scope,
    only: Option<Arc<HashSet<String>>>,
    raw: Arc<Mutex<RawConn>>,
    keep: bool,
    peers: Option<PeerCounts>,
) -> Result<(Report, Read), LinkError> {
    let mut raw = raw.lock().await;
    let full = scope == Scope::All;
    let masters = master_records(&mut raw, &scope, only.as_deref(), keep).await?;
    let mut peers = peers.filter(|_| full).map(PeerCounts::next_round);
    let asks: Vec<Asks> = masters.iter().map(|(m, _)| Asks::of(m, peers.as_ref())).collect();
    let commands = pipeline(&masters, &asks);
    let replies = match commands.is_empty() {
        true => Replies::default(),
        false => raw.ask(&commands).await?,
    };
    // As a pipeline of the redis crate fails at its first refused command: a master removed
    // since its record was read fails the reconciliation, and the next one reads without it.
    if let Some(refused) = replies.iter().find_map(|r| refusal(&r)) {
        return Err(LinkError::Refused(refused));
    }
    let mut report = Report { from, scope: scope.clone(), masters: Vec::new(), with_peers: full };
    let mut read = Read { scope, masters: HashMap::new(), peers: None };
    let mut replies = replies.iter();
    let none = Value::Array(Vec::new());
    for ((m, facts), asked) in masters.into_iter().zip(asks) {
        let answers = Answers::take(&mut replies, &asked);
        let replicas = answers.replicas.as_ref().unwrap_or(&none);
        if let (Some(p), Some(listed)) = (&mut peers, &answers.peers) {
            p.asked.insert(m.name.clone(), listed.len());
        }
        if let Some(master) = facts {
            let replicas = readiness::parse::replicas(replicas);
            read.masters.insert(m.name.clone(), Records { master: Ok(master), replicas });
        }
        let addr = answers.addr.as_ref();
        if let Some(master) = master_report(&m, addr, replicas, answers.peers).await {
            report.masters.push(master);
        }
    }
    read.peers = peers;
    Ok((report, read))
}

/// The text of a refused command.
fn refusal(reply: &Reply<'_>) -> Option<String> {
    match reply {
        Reply::Error(e) => Some(String::from_utf8_lossy(e).into_owned()),
        _ => None,
    }
}

/// One master of `SENTINEL MASTERS`/`MASTER`, read in place, and with `keep` its facts for the
/// readiness poll (the same fields: every record that reads has them).
pub(super) fn read_master(
    r: &impl Fields,
    keep: bool,
) -> Option<(MasterRecord, Option<MasterFacts>)> {
    let m = MasterRecord::from_record(r)?;
    let facts = if keep { Some(readiness::parse::master_record(r)?) } else { None };
    Some((m, facts))
}

/// The records of the masters in `scope`, of those this polestar serves (`only`; `None`:
/// all) when it is every master.
async fn master_records(
    raw: &mut RawConn,
    scope: &Scope,
    only: Option<&HashSet<String>>,
    keep: bool,
) -> Result<Vec<(MasterRecord, Option<MasterFacts>)>, LinkError> {
    let served = |m: &MasterRecord| only.is_none_or(|names| names.contains(&m.name));
    Ok(match scope {
        Scope::All => {
            let replies = raw.ask(&[vec!["SENTINEL", "MASTERS"]]).await?;
            let masters = replies.iter().next().unwrap_or(Reply::Nil);
            if let Some(refused) = refusal(&masters) {
                return Err(LinkError::Refused(refused));
            }
            let records = masters.items().filter_map(|r| read_master(&r.record()?, keep));
            records.filter(|(m, _)| served(m)).collect()
        }
        Scope::Masters(names) => {
            // A master this Sentinel no longer monitors answers an error: it is left out of
            // the report, which the scope tells the decider is news.
            let commands: Vec<Vec<&str>> =
                names.iter().map(|name| vec!["SENTINEL", "MASTER", name.as_str()]).collect();
            let replies = raw.ask(&commands).await?;
            let records = replies.iter().filter_map(|r| r.record());
            records.filter_map(|r| read_master(&r, keep)).collect()
        }
    })
}

/// One master's replies to what was asked of it besides its record ([`Asks`]).
struct Answers {
    addr: Option<Value>,
    replicas: Option<Value>,
    peers: Option<Vec<PeerRecord>>,
}

impl Answers {
    /// Takes them from the pipeline's replies, in the order [`pipeline`] asked. The address
    /// and the replicas (a few masters' at most) become values for the code that reads those;
    /// the peers (every master's, every few rounds) are read in place.
    fn take<'a>(replies: &mut impl Iterator<Item = Reply<'a>>, asked: &Asks) -> Self {
        let mut next = |asked: bool| if asked { replies.next() } else { None };
        let addr = next(asked.addr).map(|r| r.to_value());
        let replicas = next(asked.replicas).map(|r| r.to_value());
        let listed = next(asked.peers).map(|r| r.items());
        let peers = listed
            .map(|items| items.filter_map(|r| PeerRecord::from_record(&r.record()?)).collect());
        Self { addr, replicas, peers }
    }
}

/// What a reconciliation asks of one master besides its record.
pub(super) struct Asks {
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME`: only while the record shows a failover in
    /// progress. Sentinel answers it with the record's own address except while it leads a
    /// failover past the promotion (`sentinelGetCurrentMasterAddress`: the promoted replica
    /// from `RECONF_SLAVES` on, when the record already holds the new epoch and still the old
    /// address), and only a Sentinel with `failover_in_progress` is in that state. Otherwise the
    /// record's address and epoch are one reading, changed together by Sentinel
    /// (`sentinelResetMasterAndChangeAddress` on a switch, a hello's configuration). Asking it
    /// of every master was a third of a full reconciliation's commands at 1,000 masters.
    pub(super) addr: bool,
    /// `SENTINEL REPLICAS`: unless `num-slaves` says there are none.
    pub(super) replicas: bool,
    /// `SENTINEL SENTINELS`: in a full reconciliation, when [`PeerCounts`] says so.
    pub(super) peers: bool,
}

impl Asks {
    pub(super) fn of(m: &MasterRecord, peers: Option<&PeerCounts>) -> Self {
        Self {
            addr: m.failover_in_progress,
            replicas: m.replicas != Some(0),
            peers: peers.is_some_and(|p| p.due(m)),
        }
    }
}

/// The commands `asks` calls for, in the order [`reconcile`] reads their replies.
pub(super) fn pipeline<'a>(
    masters: &'a [(MasterRecord, Option<MasterFacts>)],
    asks: &[Asks],
) -> Vec<Vec<&'a str>> {
    let mut commands = Vec::new();
    for ((m, _), asked) in masters.iter().zip(asks) {
        let subs = [
            (asked.addr, "GET-MASTER-ADDR-BY-NAME"),
            (asked.replicas, "REPLICAS"),
            (asked.peers, "SENTINELS"),
        ];
        for (_, sub) in subs.into_iter().filter(|(ask, _)| *ask) {
            commands.push(vec!["SENTINEL", sub, m.name.as_str()]);
        }
    }
    commands
}

/// One reconciliation's records for the readiness poll (empty unless asked to keep them),
/// and the peer counts a full one was given back.
pub(super) struct Read {
    pub(super) scope: Scope,
    pub(super) masters: HashMap<String, Records>,
    pub(super) peers: Option<PeerCounts>,
}

/// A full reconciliation asks a master's peers (`SENTINEL SENTINELS`, a record per peer) only
/// when its `num-other-sentinels` differs from the number listed last time, and every
/// [`PEERS_EVERY`]th full reconciliation: peers are shown, never trusted, and at 1,000 masters
/// asking them every time was a third of a link's commands and most of what it parsed.
#[derive(Default)]
pub(super) struct PeerCounts {
    /// Peers listed for each master when last asked.
    pub(super) asked: HashMap<String, usize>,
    pub(super) rounds: u32,
}

impl PeerCounts {
    /// Counted for one more full reconciliation.
    fn next_round(mut self) -> Self {
        self.rounds = self.rounds.wrapping_add(1);
        self
    }

    pub(super) fn due(&self, m: &MasterRecord) -> bool {
        self.rounds % PEERS_EVERY == 1
            || m.peers.is_none()
            || self.asked.get(&m.name) != m.peers.as_ref()
    }
}

/// A session's reconciliations: the one running, what events asked for since, when the next
/// full one is due and the peer counts it compares against.
pub(super) struct Reconciling {
    pub(super) running: Option<InFlight<(Report, Read)>>,
    pub(super) due: Due,
    pub(super) pace: Pace,
    pub(super) peers: Option<PeerCounts>,
}

/// When the next full reconciliation is due: [`full_every`] for the masters the last full one
/// found, counted from the start of the last full one.
pub(super) struct Pace {
    period: Duration,
    timer: tokio::time::Interval,
}

impl Pace {
    pub(super) fn new(masters: usize) -> Self {
        let period = full_every(masters);
        let mut timer = interval(period);
        timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        timer.reset();
        Self { period, timer }
    }

    /// Paced again for a full reconciliation that found `masters`, if that changes the period.
    pub(super) fn follow(&mut self, masters: usize) {
        if full_every(masters) != self.period {
            *self = Self::new(masters);
        }
    }

    /// A full reconciliation starts: the next one is a period from now.
    pub(super) fn restart(&mut self) {
        self.timer.reset();
    }

    pub(super) async fn tick(&mut self) {
        self.timer.tick().await;
    }
}

/// The full reconciliation's period for a Sentinel that monitors `masters` masters.
pub(super) fn full_every(masters: usize) -> Duration {
    let masters = u32::try_from(masters).unwrap_or(u32::MAX);
    RECONCILE_PER_MASTER.saturating_mul(masters).clamp(RECONCILE_MIN, RECONCILE_MAX)
}

/// The config epoch this Sentinel holds for `master` (`SENTINEL MASTER <name>`).
/// Whether this Sentinel runs the failover of `master` as Valkey 9's coordinated one
/// ([`coordinated_failover`]). An error or an odd reply counts as a plain failover: its
/// promotion is fenced, as every failover's was before Valkey 9. The events behind it wait
/// for it at most the connection's response timeout (a Sentinel answers in a round trip;
/// its `+selected-slave` comes an election or a timer tick after `+try-failover`).
pub(super) async fn coordinated(conn: &mut MultiplexedConnection, master: &str) -> bool {
    let reply = redis::cmd("SENTINEL").arg("MASTER").arg(master).query_async::<Value>(conn).await;
    let record = reply.ok().as_ref().and_then(crate::sentinel::message::record);
    record.is_some_and(|r| coordinated_failover(&r))
}

pub(super) async fn config_epoch(
    conn: &mut MultiplexedConnection,
    master: &str,
) -> Result<u64, LinkError> {
    let reply: Value = redis::cmd("SENTINEL").arg("MASTER").arg(master).query_async(conn).await?;
    let epoch = crate::sentinel::message::record(&reply)
        .and_then(|r| r.get("config-epoch").and_then(|e| e.parse().ok()));
    epoch.ok_or_else(|| {
        LinkError::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "no config-epoch in SENTINEL MASTER reply",
        )))
    })
}

pub(super) async fn master_report(
    m: &MasterRecord,
    addr: Option<&Value>,
    replicas: &Value,
    peers: Option<Vec<PeerRecord>>,
) -> Option<MasterReport> {
    // During a failover the address comes from get-master-addr-by-name, read after the epoch:
    // it already names the promoted replica, never the old primary with the new epoch (see
    // [`Asks::addr`]); otherwise the record's own address is the one it would answer.
    let primary = addr.and_then(master_addr).unwrap_or_else(|| m.addr.clone());
    let primary = resolve(&primary).await?;
    let (mut nodes, mut followers) = (Vec::new(), Vec::new());
    for r in records(replicas).iter().filter_map(ReplicaRecord::from_record) {
        if let Some(n) = resolve(&r.addr).await {
            if let Some(upstream) = r.follows(&m.addr) {
                followers.push(Follower { node: n.clone(), upstream });
            }
            nodes.push(Replica {
                ip: n.ip,
                port: n.port,
                hostname: n.hostname,
                healthy: r.healthy,
                down: r.down,
            });
        }
    }
    nodes.sort_by_key(|r| (r.ip, r.port));
    Some(MasterReport {
        name: m.name.clone(),
        primary,
        epoch: m.epoch,
        failover_in_progress: m.failover_in_progress,
        replicas: nodes,
        followers,
        peers,
    })
}
