//! The input budget: what every connection together may hold of requests not yet complete.
//!
//! Each connection holds up to [`FREE_INPUT`] of an incomplete request on its own (every
//! request a Sentinel client sends is far smaller); past that, up to [`super::MAX_REQUEST`],
//! it draws on one budget shared by all connections ([`INPUT_BUDGET`]). So thousands of
//! connections each holding a large partial request cost [`INPUT_BUDGET`] in all, not
//! thousands of times [`super::MAX_REQUEST`], and a connection that cannot draw on it is told
//! so and closed (the honest client that meets a full budget retries; the budget empties as
//! partial requests complete or reach [`super::REQUEST_TIMEOUT`]).

use std::sync::atomic::{AtomicUsize, Ordering};

/// An incomplete request a connection may hold without drawing on the budget.
pub const FREE_INPUT: usize = 4 * 1024;
/// What all connections together may hold of incomplete requests past [`FREE_INPUT`] each.
pub const INPUT_BUDGET: usize = 16 * 1024 * 1024;

/// The shared budget; owned by the server's shared state.
#[derive(Debug)]
pub struct Budget {
    held: AtomicUsize,
    cap: usize,
}

impl Budget {
    pub fn new(cap: usize) -> Self {
        Self { held: AtomicUsize::new(0), cap }
    }

    /// Bytes drawn on now, by every connection.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// One connection's draw on the budget, given back when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    budget: &'a Budget,
    bytes: usize,
}

impl<'a> Reservation<'a> {
    pub fn new(budget: &'a Budget) -> Self {
        Self { budget, bytes: 0 }
    }

    /// Holds `pending` bytes of incomplete requests: draws on the budget for what is past
    /// [`FREE_INPUT`] (or gives back what it no longer needs). `false`, drawing nothing more,
    /// when the budget cannot cover it.
    pub fn hold(&mut self, pending: usize) -> bool {
        let want = pending.saturating_sub(FREE_INPUT);
        if want <= self.bytes {
            self.budget.held.fetch_sub(self.bytes - want, Ordering::Relaxed);
            self.bytes = want;
            return true;
        }
        let more = want - self.bytes;
        let cap = self.budget.cap;
        let drawn = self.budget.held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            held.checked_add(more).filter(|total| *total <= cap)
        });
        if drawn.is_ok() {
            self.bytes = want;
        }
        drawn.is_ok()
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_is_past_the_free_part_is_drawn_and_the_budget_is_shared() {
        let budget = Budget::new(10_000);
        let mut a = Reservation::new(&budget);
        assert!(a.hold(FREE_INPUT));
        assert_eq!(budget.held(), 0, "a connection's first {FREE_INPUT} bytes are its own");
        assert!(a.hold(FREE_INPUT + 6_000));
        assert_eq!(budget.held(), 6_000);
        let mut b = Reservation::new(&budget);
        assert!(!b.hold(FREE_INPUT + 5_000), "past the cap: refused");
        assert_eq!(budget.held(), 6_000, "a refusal draws nothing");
        assert!(b.hold(FREE_INPUT + 4_000), "what is left");
        assert!(a.hold(10), "a completed request gives its draw back");
        assert_eq!(budget.held(), 4_000);
        drop(b);
        assert_eq!(budget.held(), 0, "and so does a closed connection");
    }
}
