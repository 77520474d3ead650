//! Background jobs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ledger::{Maintain, Maintained};

use crate::detector::Detector;
use crate::task::Background;
use store::forwarding::Handing;
use store::{Engine, Load, Store, StoreError};

/// Work done per maintenance command: bounded, so the ledger lock is never held long. Each
/// expiry is about as much work as a commit; at 1 000 per command a mass expiry (the holds
/// of a burst of abandoned reservations, 60 s later) held the lock and the journal for
/// milliseconds at a time, and requests queued behind it (BENCHMARKS.md).
const SWEEP_BATCH: usize = 128;

/// What the sweeper has done since the start, for `/metrics`.
#[derive(Debug, Default)]
pub struct SweepCounters {
    /// Reservations past their grace that the sweep expired (holds returned).
    pub expired: AtomicU64,
    /// Idempotency records removed past their retention.
    pub evicted: AtomicU64,
    /// Settled reservations archived to the history store.
    pub archived: AtomicU64,
}

/// Expires reservations past their grace (returning their holds), evicts records past
/// their retention and archives reservations settled `archive_after` ago, through the
/// store like any other command, so replays are deterministic. Every `interval`; what it
/// did is added to `counters`.
pub fn spawn_sweeper(
    store: Arc<Engine>,
    counters: Arc<SweepCounters>,
    detector: Arc<Detector>,
    interval: Duration,
    archive_after: Duration,
) -> Background {
    let archive_after_ms = i64::try_from(archive_after.as_millis()).unwrap_or(i64::MAX);
    Background::spawn(|mut stopped| async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stopped.changed() => return,
            }
            // Keep going while whole batches come back: a backlog drains in one tick, one
            // batch at a time, with requests served in between.
            loop {
                tokio::task::yield_now().await;
                let maintain = Maintain {
                    limit: SWEEP_BATCH,
                    archive_after_ms,
                };
                // On the Redis engine, while a peer holds the writer's lease and takes this
                // instance's writes, its own sweeper does the work: this one does not take
                // the lease from it.
                let reply = store::forwarding::allow(
                    Handing::IfItWrites,
                    store.execute(maintain, Load::Busy),
                )
                .await;
                match reply.map(|r| r.result) {
                    Ok(Ok(Maintained {
                        expired,
                        expired_by_tenant,
                        keys_expired,
                        evicted,
                        archived,
                    })) => {
                        for (tenant, n) in &expired_by_tenant {
                            detector.settled(tenant, *n, 0);
                        }
                        counters
                            .expired
                            .fetch_add(expired as u64, Ordering::Relaxed);
                        counters
                            .evicted
                            .fetch_add(evicted as u64, Ordering::Relaxed);
                        counters
                            .archived
                            .fetch_add(archived as u64, Ordering::Relaxed);
                        if expired.max(keys_expired).max(evicted).max(archived) < SWEEP_BATCH {
                            break;
                        }
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "maintenance refused");
                        break;
                    }
                    Err(StoreError::Forward(_)) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "maintenance failed");
                        break;
                    }
                }
            }
        }
    })
}
