//! The load a request runs under: how many requests are in flight, and whether the caller is
//! alone (see [`LoadTracker::current`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use store::Load;

/// How long requests must have come one at a time before one counts as alone: long enough
/// that a steady stream from several clients never does (their requests overlap every few
/// hundred microseconds), short enough that a sequential client is alone from its second
/// request on.
const QUIET: Duration = Duration::from_millis(10);

/// Counts the requests in flight and remembers when two last overlapped.
pub struct LoadTracker {
    /// Requests being answered right now.
    in_flight: AtomicUsize,
    /// When a request last arrived while another was in flight, in microseconds since
    /// `epoch`.
    last_overlap_us: AtomicU64,
    epoch: Instant,
}

impl Default for LoadTracker {
    fn default() -> Self {
        LoadTracker {
            in_flight: AtomicUsize::new(0),
            last_overlap_us: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl LoadTracker {
    /// The load the caller's command runs under: a request alone in the server may have its
    /// write synced on its own thread.
    pub fn current(&self) -> Load {
        if self.alone() {
            Load::Alone
        } else {
            Load::Busy
        }
    }

    /// Requests being answered right now, the caller's included.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Whether the caller is the only request in flight and requests have come one at a
    /// time for a while (see [`QUIET`]).
    fn alone(&self) -> bool {
        // The counter first: under load the clock is never read.
        self.in_flight() <= 1 && self.alone_at(Instant::now())
    }

    fn alone_at(&self, now: Instant) -> bool {
        self.in_flight() <= 1
            && self.since_epoch_us(now)
                >= self.last_overlap_us.load(Ordering::Relaxed) + QUIET.as_micros() as u64
    }

    fn since_epoch_us(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// Counts a request that arrived `at` in until the returned guard drops, noting when it
    /// overlaps another.
    pub fn enter(&self, at: Instant) -> InFlight<'_> {
        let before = self.in_flight.fetch_add(1, Ordering::Relaxed);
        if before > 0 {
            self.last_overlap_us
                .fetch_max(self.since_epoch_us(at), Ordering::Relaxed);
        }
        InFlight {
            counter: &self.in_flight,
            position: before + 1,
        }
    }
}

/// Counts a request in flight until it is answered or dropped (a client that hangs up).
pub struct InFlight<'a> {
    counter: &'a AtomicUsize,
    position: usize,
}

impl InFlight<'_> {
    /// The requests in flight when this one arrived, itself included.
    pub fn position(&self) -> usize {
        self.position
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_alone_only_after_a_quiet_period_without_overlaps() {
        let load = LoadTracker::default();
        let t0 = load.epoch + QUIET;
        let first = load.enter(t0);
        assert_eq!(load.in_flight(), 1);
        assert!(load.alone_at(t0), "one request, nothing overlapped yet");

        let t1 = t0 + Duration::from_millis(1);
        let second = load.enter(t1);
        assert_eq!(load.in_flight(), 2);
        assert!(!load.alone_at(t1), "two in flight");
        drop(second);
        let t2 = t1 + QUIET / 2;
        assert!(
            !load.alone_at(t2),
            "one in flight, but requests overlapped just now"
        );
        assert!(
            load.alone_at(t1 + QUIET),
            "one in flight after a quiet period"
        );
        drop(first);
        assert_eq!(load.in_flight(), 0);
    }
}
