//! Flow control of one Sentinel's link: its pushes go into a bounded queue the connection's
//! reader never waits on, the observations of events pass within a budget and in the order of
//! the events, and what is dropped is logged once per interval and answered with a full
//! reconciliation (docs/decisions.md D20).

use super::*;

/// Pushes read from the connection but not yet handled; a flood past it is dropped.
pub(super) const PUSH_QUEUE: usize = 1024;

/// Events waiting for a lookup (a hostname, an epoch) before they are passed on.
pub(super) const MAX_PENDING: usize = 64;

/// Observations of events passed on per second on average (and in a burst).
pub(super) const EVENT_BUDGET: u16 = 1000;

/// Dropped events are logged at most this often per Sentinel.
pub(super) const DROP_LOG_EVERY: Duration = Duration::from_secs(10);

/// What the events since the last reconciliation ask to look at again.
#[derive(Default)]
pub(super) struct Due(Option<Scope>);

impl Due {
    pub(super) fn add(&mut self, scope: Scope) {
        self.0 = Some(match (self.0.take(), scope) {
            (None, s) => s,
            (Some(Scope::All), _) | (_, Scope::All) => Scope::All,
            (Some(Scope::Masters(mut a)), Scope::Masters(b)) => {
                a.extend(b);
                Scope::Masters(a)
            }
        });
    }

    pub(super) fn take(&mut self) -> Option<Scope> {
        self.0.take()
    }
}

/// Events dropped in a session, logged at most every [`DROP_LOG_EVERY`] (a flood must not
/// become a flood of log lines).
#[derive(Default)]
pub(super) struct Drops {
    pub(super) count: u64,
    pub(super) logged: Option<Instant>,
}

impl Drops {
    pub(super) fn note(&mut self, endpoint: &Endpoint, why: &str) {
        self.count += 1;
        if self.logged.is_some_and(|at| at.elapsed() < DROP_LOG_EVERY) {
            return;
        }
        self.logged = Some(Instant::now());
        let (sentinel, dropped) = (endpoint.name(), std::mem::take(&mut self.count));
        tracing::warn!(%sentinel, dropped, "Sentinel {why}: events dropped, reconciling instead");
    }
}

/// A command in flight beside the event loop.
pub(super) type InFlight<T> = Pin<Box<dyn Future<Output = Result<T, LinkError>> + Send>>;

/// What an event tells the decider once its lookups are done (`None`: nothing, e.g. a
/// hostname that does not resolve).
pub(super) type Telling = InFlight<Option<Observation>>;

pub(super) fn ready(observation: Observation) -> Telling {
    Box::pin(std::future::ready(Ok(Some(observation))))
}

/// The observations of events, in the order of the events, within a budget: at most
/// [`MAX_PENDING`] waiting for a lookup and [`EVENT_BUDGET`] a second on average (bursts of as
/// many), so that a Sentinel flooding events can neither grow this queue nor the decider's.
/// What does not fit is dropped and a full reconciliation is asked for instead.
pub(super) struct Pending {
    pub(super) queue: FuturesOrdered<Telling>,
    pub(super) tokens: f64,
    pub(super) refilled: Instant,
    pub(super) dropped: bool,
}

impl Default for Pending {
    fn default() -> Self {
        let tokens = f64::from(EVENT_BUDGET);
        Self { queue: FuturesOrdered::new(), tokens, refilled: Instant::now(), dropped: false }
    }
}

impl Pending {
    pub(super) fn push(&mut self, telling: Telling) {
        let now = Instant::now();
        let budget = f64::from(EVENT_BUDGET);
        let refill = now.duration_since(self.refilled).as_secs_f64() * budget;
        self.tokens = (self.tokens + refill).min(budget);
        self.refilled = now;
        if self.tokens < 1.0 || self.queue.len() >= MAX_PENDING {
            self.dropped = true;
            return;
        }
        self.tokens -= 1.0;
        self.queue.push_back(telling);
    }

    /// Whether events were dropped since the last call.
    pub(super) fn overflowed(&mut self) -> bool {
        std::mem::take(&mut self.dropped)
    }
}

/// The receiving end of a connection's pushes: at most [`PUSH_QUEUE`] of them wait. The
/// connection's reader never waits on it: a push that does not fit is dropped and `lost` is
/// notified (once for any number of drops), which the link answers with a full
/// reconciliation; a disconnection that did not fit also sets `disconnected`.
pub(super) struct Pushes {
    /// The connection's push sink holds the sender; it closes with the connection.
    pub(super) rx: mpsc::Receiver<PushInfo>,
    pub(super) lost: Arc<Notify>,
    pub(super) disconnected: Arc<AtomicBool>,
}

pub(super) fn push_queue() -> (PushSink, Pushes) {
    let (tx, rx) = mpsc::channel(PUSH_QUEUE);
    let lost = Arc::new(Notify::new());
    let disconnected = Arc::new(AtomicBool::new(false));
    let pushes = Pushes { rx, lost: lost.clone(), disconnected: disconnected.clone() };
    let sink: PushSink = Box::new(move |push: PushInfo| {
        let is_disconnection = push.kind == PushKind::Disconnection;
        match tx.try_send(push) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                if is_disconnection {
                    disconnected.store(true, Ordering::Relaxed);
                }
                lost.notify_one();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
        }
    });
    (sink, pushes)
}
