//! How long each phase of a failover took, as `polestar_failover_seconds{phase}` histograms:
//! `odown_to_flip` (the old primary's `+odown` to the flip), `selected_to_flip` (the leader's
//! `+selected-slave` to the flip) and `flip_to_drained` (the flip to the end of the first
//! drain pass of the old primary that reached every client it had: the last old-primary client
//! gone). The flip is the moment polestar's answers changed.
//!
//! A neutral module: the Sentinel side knows the first two phases (it sees the events and makes
//! the flip), the drain side the third; neither imports the other. The arithmetic is the pure
//! [`decide`] over a [`Timeline`] per master; the shells only record what it returns.

use std::time::{Duration, Instant};

use crate::metrics::FAILOVER_SECONDS;

/// The histogram's buckets, in seconds: from a drain of a few milliseconds to an election
/// that took a minute (Sentinel's `failover-timeout` is 3 minutes by default).
pub const BUCKETS: [f64; 15] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    OdownToFlip,
    SelectedToFlip,
    FlipToDrained,
}

impl Phase {
    pub const ALL: [Phase; 3] = [Self::OdownToFlip, Self::SelectedToFlip, Self::FlipToDrained];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::OdownToFlip => "odown_to_flip",
            Self::SelectedToFlip => "selected_to_flip",
            Self::FlipToDrained => "flip_to_drained",
        }
    }
}

/// What the Sentinel side has seen of the failover under way of one master.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// The published primary's first `+odown` not ended yet.
    odown: Option<Instant>,
    /// The first promotion event (`+selected-slave`, or a later one when it was lost) of the
    /// current leader's attempt, and that leader.
    selected: Option<(usize, Instant)>,
}

/// One moment of a failover, as the Sentinel side learns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A configured Sentinel announced `+odown` of the primary.
    Odown { at: Instant },
    /// `-odown`: the primary is back before any flip.
    OdownEnded,
    /// Configured Sentinel `leader` announced the promotion of a replica.
    Selected { leader: usize, at: Instant },
    /// The attempt was aborted, or polestar gave it up: the next one starts afresh.
    Aborted,
    /// The published primary changed at `at`. `first`: a first publication (no old primary);
    /// `old_odown`: the `+odown` was of the old primary.
    Flipped { at: Instant, first: bool, old_odown: bool },
}

/// The next timeline and the phases that ended with `mark`.
pub fn decide(timeline: Timeline, mark: Mark) -> (Timeline, Vec<(Phase, Duration)>) {
    let mut t = timeline;
    match mark {
        Mark::Odown { at } => t.odown = t.odown.or(Some(at)),
        Mark::OdownEnded => t.odown = None,
        Mark::Selected { leader, at } => {
            t.selected = t.selected.filter(|(l, _)| *l == leader).or(Some((leader, at)));
        }
        Mark::Aborted => t.selected = None,
        Mark::Flipped { at, first, old_odown } => {
            let mut ended = Vec::new();
            if !first {
                if let Some(odown) = t.odown.filter(|_| old_odown) {
                    ended.push((Phase::OdownToFlip, at.saturating_duration_since(odown)));
                }
                if let Some((_, selected)) = t.selected {
                    ended.push((Phase::SelectedToFlip, at.saturating_duration_since(selected)));
                }
            }
            return (Timeline::default(), ended);
        }
    }
    (t, Vec::new())
}

/// The drain side's phase: from the flip to the end of the pass that left no client.
pub fn drained(flipped: Instant, at: Instant) -> (Phase, Duration) {
    (Phase::FlipToDrained, at.saturating_duration_since(flipped))
}

/// Records each phase in its histogram.
pub fn record(ended: &[(Phase, Duration)]) {
    for (phase, took) in ended {
        metrics::histogram!(FAILOVER_SECONDS, "phase" => phase.as_str()).record(took.as_secs_f64());
    }
}

/// Creates every phase's histogram (empty), so that the series exist before any failover.
pub fn register() {
    for phase in Phase::ALL {
        drop(metrics::histogram!(FAILOVER_SECONDS, "phase" => phase.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A name, the marks in order, the phases they end.
    type Case = (&'static str, Vec<Mark>, Vec<(Phase, Duration)>);

    /// Runs `marks` from an empty timeline; returns every phase ended.
    fn run(marks: &[Mark]) -> Vec<(Phase, Duration)> {
        let mut t = Timeline::default();
        let mut ended = Vec::new();
        for mark in marks {
            let (next, out) = decide(t, *mark);
            t = next;
            ended.extend(out);
        }
        ended
    }

    #[test]
    fn each_phase_is_the_time_from_its_mark_to_the_flip() {
        let t0 = Instant::now();
        let at = |n| t0 + ms(n);
        let flip = |n, old_odown| Mark::Flipped { at: at(n), first: false, old_odown };
        use Mark::*;
        use Phase::*;
        let table: Vec<Case> = vec![
            (
                "a planned failover: no odown",
                vec![Selected { leader: 1, at: at(0) }, flip(300, false)],
                vec![(SelectedToFlip, ms(300))],
            ),
            (
                "a crash: odown, then the leader's selection",
                vec![Odown { at: at(0) }, Selected { leader: 2, at: at(1200) }, flip(1500, true)],
                vec![(OdownToFlip, ms(1500)), (SelectedToFlip, ms(300))],
            ),
            (
                "a second odown (another Sentinel) keeps the first",
                vec![Odown { at: at(0) }, Odown { at: at(400) }, flip(1000, true)],
                vec![(OdownToFlip, ms(1000))],
            ),
            (
                "an odown that ended before the flip counts from the next one",
                vec![Odown { at: at(0) }, OdownEnded, Odown { at: at(5000) }, flip(6000, true)],
                vec![(OdownToFlip, ms(1000))],
            ),
            (
                "the odown of another node than the old primary is not this flip's",
                vec![Odown { at: at(0) }, flip(1000, false)],
                vec![],
            ),
            (
                "the same leader's later promotion event keeps its first",
                vec![
                    Selected { leader: 0, at: at(0) },
                    Selected { leader: 0, at: at(20) },
                    flip(100, false),
                ],
                vec![(SelectedToFlip, ms(100))],
            ),
            (
                "another leader's attempt starts afresh",
                vec![
                    Selected { leader: 0, at: at(0) },
                    Selected { leader: 1, at: at(9000) },
                    flip(9100, false),
                ],
                vec![(SelectedToFlip, ms(100))],
            ),
            (
                "an aborted attempt: the retry counts",
                vec![
                    Selected { leader: 0, at: at(0) },
                    Aborted,
                    Selected { leader: 0, at: at(7000) },
                    flip(7250, false),
                ],
                vec![(SelectedToFlip, ms(250))],
            ),
            (
                "a flip with nothing seen before (a majority's reports): no phase",
                vec![flip(100, false)],
                vec![],
            ),
            (
                "a first publication ends nothing",
                vec![
                    Odown { at: at(0) },
                    Selected { leader: 0, at: at(0) },
                    Flipped { at: at(100), first: true, old_odown: true },
                ],
                vec![],
            ),
            (
                "each failover is counted once: the next flip starts empty",
                vec![Selected { leader: 0, at: at(0) }, flip(100, false), flip(200, false)],
                vec![(SelectedToFlip, ms(100))],
            ),
            (
                "a mark after the flip's instant (out of order) is zero, not a panic",
                vec![Selected { leader: 0, at: at(500) }, flip(100, false)],
                vec![(SelectedToFlip, ms(0))],
            ),
        ];
        for (name, marks, want) in table {
            assert_eq!(run(&marks), want, "{name}");
        }
    }

    #[test]
    fn the_drain_phase_is_from_the_flip_to_the_clean_pass() {
        let t0 = Instant::now();
        assert_eq!(drained(t0, t0 + ms(12)), (Phase::FlipToDrained, ms(12)));
        assert_eq!(drained(t0 + ms(5), t0), (Phase::FlipToDrained, ms(0)));
    }
}
