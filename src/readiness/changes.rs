//! How changes of the readiness verdict reach the log: one line per master that changed when
//! a few change at once, one summary line when many do (the first round at start-up judges
//! every master; a lost Sentinel blocks all of them at once). At 1,000 masters without
//! replicas the start-up used to log 1,000 `failover not possible` warnings; the API,
//! `polestar status`, the status page and the series still say it per master.

use std::collections::BTreeMap;

use super::{Reason, Verdict};

/// Up to this many masters changing in one publication are logged one line each; more make
/// one summary line, each master's own line then at debug.
pub const LINES_PER_PUBLISH: usize = 5;

/// Names shown per reason in a summary (the API lists them all).
const EXAMPLES: usize = 3;

/// What one publication logs, decided from the masters whose reasons changed.
#[derive(Debug, PartialEq)]
pub enum Lines<'a> {
    /// Each master's line, at info (possible) or warn (not possible).
    Each(Vec<(&'a str, &'a Verdict)>),
    /// One line for all of them; each master's line at debug.
    Summary(Summary<'a>),
}

/// Counts of a summary: how many became possible, how many not, by reason (a master with two
/// reasons counts under both), with the first few names of each.
#[derive(Debug, Default, PartialEq)]
pub struct Summary<'a> {
    pub possible: Vec<&'a str>,
    pub not_possible: usize,
    pub by_reason: BTreeMap<Reason, Vec<&'a str>>,
}

pub fn plan<'a>(changed: Vec<(&'a str, &'a Verdict)>) -> Lines<'a> {
    if changed.len() <= LINES_PER_PUBLISH {
        return Lines::Each(changed);
    }
    let mut summary = Summary::default();
    for (master, verdict) in changed {
        if verdict.ready {
            summary.possible.push(master);
            continue;
        }
        summary.not_possible += 1;
        for blocker in &verdict.blockers {
            summary.by_reason.entry(blocker.reason).or_default().push(master);
        }
    }
    Lines::Summary(summary)
}

impl Summary<'_> {
    /// `1000 masters: 50 possible (m0, m1, m2, ...), 950 not possible: no_promotable_replica
    /// 950 (m50, m51, m52, ...)`.
    pub fn text(&self) -> String {
        let total = self.possible.len() + self.not_possible;
        let mut text = format!("{total} masters: {} possible", self.possible.len());
        if !self.possible.is_empty() {
            text.push_str(&format!(" ({})", examples(&self.possible)));
        }
        text.push_str(&format!(", {} not possible", self.not_possible));
        let reasons = self
            .by_reason
            .iter()
            .map(|(reason, masters)| format!("{reason} {} ({})", masters.len(), examples(masters)));
        let reasons: Vec<String> = reasons.collect();
        if !reasons.is_empty() {
            text.push_str(&format!(": {}", reasons.join(", ")));
        }
        text
    }
}

fn examples(masters: &[&str]) -> String {
    let mut shown = masters.iter().take(EXAMPLES).copied().collect::<Vec<_>>().join(", ");
    if masters.len() > EXAMPLES {
        shown.push_str(", ...");
    }
    shown
}

/// Logs what [`plan`] decided.
pub fn log(changed: Vec<(&str, &Verdict)>) {
    let each = changed.clone();
    match plan(changed) {
        Lines::Each(each) => each.into_iter().for_each(|(m, v)| log_one(m, v, false)),
        Lines::Summary(summary) => {
            if tracing::enabled!(tracing::Level::DEBUG) {
                each.into_iter().for_each(|(m, v)| log_one(m, v, true));
            }
            if summary.not_possible > 0 {
                tracing::warn!(changes = %summary.text(), "failover readiness changed (each master at debug)");
            } else {
                tracing::info!(changes = %summary.text(), "failover readiness changed (each master at debug)");
            }
        }
    }
}

/// One master's line; `quiet` when a summary stands for it.
pub fn log_one(master: &str, verdict: &Verdict, quiet: bool) {
    let blockers = || {
        let each = verdict.blockers.iter().map(|b| format!("{}: {}", b.reason, b.detail));
        each.collect::<Vec<_>>().join(" | ")
    };
    match (verdict.ready, quiet) {
        (true, false) => tracing::info!(%master, "failover possible"),
        (true, true) => tracing::debug!(%master, "failover possible"),
        (false, false) => tracing::warn!(%master, blockers = %blockers(), "failover not possible"),
        (false, true) => tracing::debug!(%master, blockers = %blockers(), "failover not possible"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readiness::Blocker;

    fn ready() -> Verdict {
        Verdict { ready: true, blockers: vec![] }
    }

    fn blocked(reasons: &[Reason]) -> Verdict {
        let blockers = reasons.iter().map(|r| Blocker { reason: *r, detail: "x".into() });
        Verdict { ready: false, blockers: blockers.collect() }
    }

    #[test]
    fn a_few_changes_are_logged_one_line_each() {
        let (r, b) = (ready(), blocked(&[Reason::Ckquorum]));
        let names: Vec<String> = (0..LINES_PER_PUBLISH).map(|i| format!("m{i}")).collect();
        let changed: Vec<(&str, &Verdict)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), if i == 0 { &r } else { &b }))
            .collect();
        assert_eq!(plan(changed.clone()), Lines::Each(changed));
        assert_eq!(plan(vec![]), Lines::Each(vec![]));
    }

    /// The start-up flood: 1,000 masters judged at once, most without a replica.
    #[test]
    fn many_changes_make_one_summary_with_counts_by_reason() {
        let (r, none) = (ready(), blocked(&[Reason::NoPromotableReplica]));
        let both = blocked(&[Reason::Ckquorum, Reason::NoPromotableReplica]);
        let names: Vec<String> = (0..1000).map(|i| format!("m{i}")).collect();
        let verdict = |i: usize| match i {
            0..50 => &r,
            50..60 => &both,
            _ => &none,
        };
        let changed = names.iter().enumerate().map(|(i, n)| (n.as_str(), verdict(i))).collect();
        let Lines::Summary(summary) = plan(changed) else { panic!("one summary expected") };
        assert_eq!((summary.possible.len(), summary.not_possible), (50, 950));
        assert_eq!(summary.by_reason[&Reason::NoPromotableReplica].len(), 950);
        assert_eq!(summary.by_reason[&Reason::Ckquorum].len(), 10);
        assert_eq!(
            summary.text(),
            "1000 masters: 50 possible (m0, m1, m2, ...), 950 not possible: \
             ckquorum 10 (m50, m51, m52, ...), no_promotable_replica 950 (m50, m51, m52, ...)"
        );
    }

    #[test]
    fn a_summary_names_every_master_when_there_are_few() {
        let (r, b) = (ready(), blocked(&[Reason::SentinelsUnreachable]));
        let changed = vec![("a", &b), ("b", &b), ("c", &r), ("d", &r), ("e", &r), ("f", &r)];
        let Lines::Summary(summary) = plan(changed) else { panic!("one summary expected") };
        assert_eq!(
            summary.text(),
            "6 masters: 4 possible (c, d, e, ...), 2 not possible: sentinels_unreachable 2 (a, b)"
        );
        let all_ok = vec![("a", &r); 6];
        let Lines::Summary(summary) = plan(all_ok) else { panic!("one summary expected") };
        assert_eq!(summary.text(), "6 masters: 6 possible (a, a, a, ...), 0 not possible");
    }
}
