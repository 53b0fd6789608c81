//! The verdict: can this master fail over now, and if not, why. A pure function of the facts
//! one poll gathered ([`Facts`]) and the settings; the poller only gathers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::facts::{Facts, ReplicaFacts, SentinelAnswer};
use super::{Blocker, Reason, Verdict};
use crate::config::{Readiness, size};

/// Sentinels disagree for a moment after every failover: the leader switches first and the
/// others learn the new configuration from its hello messages (every 2 s). A disagreement is a
/// blocker once it has lasted this long.
pub const DISAGREE_GRACE: Duration = Duration::from_secs(5);

/// Judges the facts: every blocker found, in [`Reason::ALL`] order, at most one per reason.
pub fn judge(facts: &Facts, settings: &Readiness) -> Verdict {
    let answers: Vec<(&str, &SentinelAnswer)> = facts
        .sentinels
        .iter()
        .filter_map(|s| s.answer.as_ref().ok().map(|a| (s.addr.as_str(), a)))
        .collect();
    let found = [
        (Reason::SentinelsUnreachable, unreachable(facts, answers.len())),
        (Reason::Ckquorum, ckquorum(&answers)),
        (Reason::SentinelTilt, tilt(&answers)),
        (Reason::SentinelsDisagree, disagree(&answers).filter(|_| lasting(facts))),
        (Reason::NoPromotableReplica, no_promotable(&answers, facts, settings)),
        (Reason::StaleReplicas, stale(&answers, settings)),
    ];
    let blockers: Vec<Blocker> = found
        .into_iter()
        .filter_map(|(reason, detail)| detail.map(|detail| Blocker { reason, detail }))
        .collect();
    Verdict { ready: blockers.is_empty(), blockers }
}

fn unreachable(facts: &Facts, reachable: usize) -> Option<String> {
    let majority = facts.configured / 2 + 1;
    if reachable >= majority {
        return None;
    }
    let why: Vec<String> = facts
        .sentinels
        .iter()
        .filter_map(|s| s.answer.as_ref().err().map(|e| format!("{}: {e}", s.addr)))
        .collect();
    let counts = format!(
        "{reachable} of {} configured Sentinels reachable (a majority is {majority})",
        facts.configured
    );
    Some(join_detail(counts, &why))
}

fn ckquorum(answers: &[(&str, &SentinelAnswer)]) -> Option<String> {
    let failing: Vec<String> = answers
        .iter()
        .filter_map(|(addr, a)| a.ckquorum.as_ref().err().map(|e| format!("{addr}: {e}")))
        .collect();
    (!failing.is_empty()).then(|| failing.join("; "))
}

fn tilt(answers: &[(&str, &SentinelAnswer)]) -> Option<String> {
    let tilted: Vec<String> = answers
        .iter()
        .filter_map(|(addr, a)| match &a.tilt {
            Ok(false) => None,
            Ok(true) => Some(format!("{addr} is in TILT mode")),
            Err(e) => Some(format!("{addr}: cannot tell whether it is in TILT mode: {e}")),
        })
        .collect();
    (!tilted.is_empty()).then(|| tilted.join("; "))
}

fn lasting(facts: &Facts) -> bool {
    facts.disagreeing_for >= DISAGREE_GRACE
}

/// Whether the reachable Sentinels of these facts disagree (what the poller times).
pub fn disagreeing(facts: &Facts) -> bool {
    let answers: Vec<(&str, &SentinelAnswer)> = facts
        .sentinels
        .iter()
        .filter_map(|s| s.answer.as_ref().ok().map(|a| (s.addr.as_str(), a)))
        .collect();
    disagree(&answers).is_some()
}

/// The reachable Sentinels do not all name the same primary at the same epoch (one that
/// cannot say which primary it follows counts as disagreeing).
fn disagree(answers: &[(&str, &SentinelAnswer)]) -> Option<String> {
    let mut views: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (addr, a) in answers {
        let view = match &a.master {
            Ok(m) => format!("{} at epoch {}", m.primary, m.epoch),
            Err(e) => format!("no primary ({e})"),
        };
        views.entry(view).or_default().push(addr);
    }
    if views.len() <= 1 {
        return None;
    }
    let said: Vec<String> =
        views.iter().map(|(view, who)| format!("{} say {view}", who.join(", "))).collect();
    Some(said.join("; "))
}

/// Every replica any reachable Sentinel lists, with why it cannot be promoted (`None`: it can).
/// A replica one Sentinel sees as promotable is promotable: the leader may be that one.
fn no_promotable(
    answers: &[(&str, &SentinelAnswer)],
    facts: &Facts,
    settings: &Readiness,
) -> Option<String> {
    let mut verdicts: BTreeMap<&str, Option<String>> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for (addr, a) in answers {
        match &a.replicas {
            Ok(replicas) => {
                for r in replicas {
                    let why = unpromotable(r, facts.lags.get(&r.addr), settings.max_lag);
                    let entry = verdicts.entry(r.addr.as_str()).or_insert_with(|| why.clone());
                    if why.is_none() {
                        *entry = None;
                    }
                }
            }
            Err(e) => unreadable.push(format!("{addr}: {e}")),
        }
    }
    if verdicts.values().any(Option::is_none) || answers.is_empty() {
        return None;
    }
    let mut why: Vec<String> =
        verdicts.into_iter().filter_map(|(addr, w)| w.map(|w| format!("{addr} {w}"))).collect();
    why.extend(unreadable);
    Some(if why.is_empty() { "no replicas".to_string() } else { why.join("; ") })
}

fn unpromotable(r: &ReplicaFacts, lag: Option<&u64>, max_lag: u64) -> Option<String> {
    if r.down() {
        let flags: Vec<&str> =
            r.flags.iter().map(String::as_str).filter(|f| *f != "slave").collect();
        return Some(format!("is down ({})", flags.join(",")));
    }
    if !r.link_ok {
        return Some("has master-link-status err".to_string());
    }
    if r.priority == 0 {
        return Some("has replica-priority 0".to_string());
    }
    match lag {
        Some(&lag) if lag > max_lag => {
            Some(format!("lags {lag} bytes (readiness.max_lag is {})", size::format(max_lag)))
        }
        _ => None,
    }
}

fn stale(answers: &[(&str, &SentinelAnswer)], settings: &Readiness) -> Option<String> {
    let mut stale = BTreeSet::new();
    for (_, a) in answers {
        for r in a.replicas.iter().flatten() {
            if r.flagged("s_down") && r.down_for.is_some_and(|d| d >= settings.stale_after) {
                let secs = r.down_for.map(|d| d.as_secs()).unwrap_or_default();
                stale.insert(format!("{} has been s_down for {secs}s", r.addr));
            }
        }
    }
    (!stale.is_empty()).then(|| stale.into_iter().collect::<Vec<_>>().join("; "))
}

fn join_detail(head: String, parts: &[String]) -> String {
    if parts.is_empty() { head } else { format!("{head}: {}", parts.join("; ")) }
}

#[cfg(test)]
mod tests;
