//! A primary's own down states (`+sdown`, `+odown` and their ends), recorded once per
//! transition however many Sentinels announce it: the `primary_down` event and the failover
//! timeline's marks.

use super::*;

impl Decider {
    /// A master's own `+sdown`/`-sdown`/`+odown`/`-odown`, from a configured Sentinel: into
    /// the event log (once per transition) for the Sentinel API's subscribers, nowhere else.
    pub(super) fn master_down(&mut self, link: SentinelId, master: &str, node: &Addr, down: &Down) {
        let Some(entry) = self.entry_mut(master) else { return };
        if !entry.downs.note(node, down) {
            return;
        }
        if down.objective {
            let mark =
                if down.began { Mark::Odown { at: Instant::now() } } else { Mark::OdownEnded };
            entry.phases = phases::decide(entry.phases, mark).0;
        }
        let (event, node) = (down.channel(), format!("{}:{}", node.host, node.port));
        let sentinel = self.links.get(link).map(|l| l.addr.to_string());
        tracing::info!(%master, %node, sentinel = sentinel.as_deref().unwrap_or("-"), "{event} of the primary");
        let mut data = json!({ "event": event, "node": node, "sentinel": sentinel });
        if let Some(q) = &down.quorum {
            data["quorum"] = json!(q);
        }
        self.events.push(Kind::PrimaryDown, Some(master), data);
    }
}

/// Which node's `+sdown` and `+odown` are recorded and not yet ended, so that a transition
/// several Sentinels announce is recorded once (`+odown` once per episode).
#[derive(Default)]
pub(super) struct Downs {
    sdown: Option<Addr>,
    odown: Option<Addr>,
}

impl Downs {
    /// Whether `down` of `node` is a transition not recorded yet (and notes it if so).
    pub(super) fn note(&mut self, node: &Addr, down: &Down) -> bool {
        let slot = if down.objective { &mut self.odown } else { &mut self.sdown };
        match (down.began, slot.as_ref() == Some(node)) {
            (true, false) => *slot = Some(node.clone()),
            (false, true) => *slot = None,
            _ => return false,
        }
        true
    }

    /// Whether the recorded `+odown` is of `node`.
    pub(super) fn odown_of(&self, node: &Node) -> bool {
        self.odown.as_ref().is_some_and(|a| names(node, a))
    }

    /// `node` is published as the primary (again): its next down is a new episode, even if
    /// Sentinel never said the last one ended (after a failover it names it as a replica).
    pub(super) fn primary_is(&mut self, node: &Node) {
        for slot in [&mut self.sdown, &mut self.odown] {
            if slot.as_ref().is_some_and(|a| names(node, a)) {
                *slot = None;
            }
        }
    }
}
