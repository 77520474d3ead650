//! The dispatcher: takes the due deliveries from the store, sends them and records every
//! attempt through the store, so an attempt is as durable as any other change, and a
//! restart resumes exactly the deliveries still due. It never blocks a request: requests
//! only stage deliveries, in the journal record of the change that caused them.
//!
//! Deliveries to one subscription are sent one after another, in the order they were
//! queued (the spec's "ordered within a tenant for first attempts"): a subscription has at
//! most one lane at a time, and its later deliveries wait for the lane to end. Different
//! subscriptions are served concurrently, so a slow or hanging receiver holds up only its
//! own deliveries, for at most the request timeout each.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ledger::{
    Actor, Attempt, ClaimDelivery, Delivery, DueDeliveries, DueDelivery, Event, GetWebhookSecurity,
    RecordAttempt, WebhookSubscription,
};
use protocol::webhook::EventResponse;
use store::{Engine, Load, Store, StoreError};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinSet;

use crate::task::Background;

use super::{unsent, Outbound, Webhooks, REQUEST_TIMEOUT};

/// Deliveries taken per look at the store.
const BATCH: usize = 1024;
/// Receivers served at once.
const CONCURRENT_SUBSCRIPTIONS: usize = 64;
/// How often the store is asked for due deliveries when the last look found none.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// How long a claimed delivery is held from the other instances: twice what an attempt can
/// take (the URL's lookup and the request share [`REQUEST_TIMEOUT`]), so the claim's reply
/// and the attempt's record fit too and it is recorded first; if this instance dies with it
/// claimed, another sends it once this has passed. (A stop lets its sends finish:
/// [`finish_sending`].)
const CLAIM_HOLD: Duration = Duration::from_secs(60);
/// How long a stop waits for the sends under way to be answered and recorded: most take
/// milliseconds; a receiver slower than this has its delivery sent again later.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The first pause after the store could not give the dispatcher its work; it doubles with
/// each failure in a row up to [`OUTAGE_MAX_PAUSE`], as the store's own retries do.
const OUTAGE_FIRST_PAUSE: Duration = Duration::from_millis(50);
const OUTAGE_MAX_PAUSE: Duration = Duration::from_secs(1);
/// While the failure goes on with the same reason, it is logged again this often.
const OUTAGE_LOG_EVERY: Duration = Duration::from_secs(60);

/// How long a claimed delivery is held, where deliveries are claimed: on the Redis engine,
/// whose instances all dispatch from the one ledger (see [`ClaimDelivery`]).
fn claim_hold(store: &Engine) -> Option<u64> {
    matches!(store, Engine::Redis(_)).then_some(CLAIM_HOLD.as_millis() as u64)
}

/// What the dispatcher has done since the start, for `/metrics`.
#[derive(Debug, Default)]
pub struct DispatchCounters {
    pub delivered: AtomicU64,
    pub failed_attempts: AtomicU64,
}

pub fn spawn_dispatcher(
    store: Arc<Engine>,
    webhooks: Arc<Webhooks>,
    counters: Arc<DispatchCounters>,
) -> Background {
    // Stopped, it takes no new work, and each lane ends once the send under way is
    // recorded (see [`finish_sending`]).
    Background::spawn(|mut stopped| async move {
        let lanes = Arc::new(Semaphore::new(CONCURRENT_SUBSCRIPTIONS));
        let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
        let lane_ended = Arc::new(Notify::new());
        let mut sending = JoinSet::new();
        let mut outage: Option<Outage> = None;
        'looks: loop {
            while sending.try_join_next().is_some() {}
            let found = match next_batch(&store, &webhooks, &busy).await {
                Ok(batch) => {
                    if let Some(ended) = outage.take() {
                        ended.ended();
                    }
                    batch
                }
                Err(why) => {
                    let pause = outage.get_or_insert_with(Outage::new).failed(why);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => continue,
                        _ = stopped.changed() => break,
                    }
                }
            };
            let full = found.len() >= BATCH;
            for lane in lanes_of(found) {
                // A lane not started here was not claimed: the next look takes it again.
                let permit = tokio::select! {
                    biased;
                    _ = stopped.changed() => break 'looks,
                    permit = lanes.clone().acquire_owned() => permit,
                };
                let Ok(permit) = permit else {
                    break 'looks;
                };
                let (store, webhooks) = (store.clone(), webhooks.clone());
                let (counters, busy, ended) = (counters.clone(), busy.clone(), lane_ended.clone());
                let stopping = stopped.clone();
                sending.spawn(async move {
                    let subscription = lane[0].subscription.subscription_id.clone();
                    serve_lane(&store, &webhooks, &counters, lane, &stopping).await;
                    busy.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&subscription);
                    drop(permit);
                    ended.notify_one();
                });
            }
            if full {
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(IDLE_POLL) => {}
                // A lane's subscription may have more waiting.
                _ = lane_ended.notified() => {}
                _ = stopped.changed() => break,
            }
        }
        finish_sending(sending).await;
    })
}

/// At a stop: waits for the lanes' sends under way to be answered and recorded, for up
/// to [`STOP_GRACE`]. A send cut off has its attempt unrecorded: the delivery is sent
/// again, after the claim's hold on the Redis engine, by the next start on the embedded
/// one.
async fn finish_sending(mut sending: JoinSet<()>) {
    let finished = tokio::time::timeout(STOP_GRACE, async {
        while sending.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            lanes = sending.len(),
            "webhook sends still under way at the stop were cut off; they are sent again later"
        );
        sending.abort_all();
    }
}

/// The store failing to give the dispatcher its work (Redis down, a flushed ledger, a
/// journal fault): the looks back off, and the log says it when it starts, when its reason
/// changes, once a minute while it lasts, and when it ends, rather than at every look.
struct Outage {
    failures: u32,
    reason: String,
    logged: Option<Instant>,
}

impl Outage {
    fn new() -> Outage {
        Outage {
            failures: 0,
            reason: String::new(),
            logged: None,
        }
    }

    /// Counts a failure, logging it if it is news; answers how long to wait before the
    /// next look.
    fn failed(&mut self, why: String) -> Duration {
        self.failures += 1;
        let stale = self
            .logged
            .is_none_or(|at| at.elapsed() >= OUTAGE_LOG_EVERY);
        if stale || why != self.reason {
            tracing::warn!(%why, failures = self.failures, "webhook dispatch could not read its work; trying again");
            self.logged = Some(Instant::now());
            self.reason = why;
        }
        Self::pause(self.failures)
    }

    /// The pause after `failures` failures in a row.
    fn pause(failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        (OUTAGE_FIRST_PAUSE * (1 << doublings)).min(OUTAGE_MAX_PAUSE)
    }

    fn ended(self) {
        tracing::info!(
            failures = self.failures,
            "webhook dispatch reads its work again"
        );
    }
}

/// One due delivery with what sending it needs.
struct Job {
    delivery: Arc<Delivery>,
    subscription: Arc<WebhookSubscription>,
    event: Option<Event>,
}

/// The due deliveries of subscriptions without a lane, with their events (read from the
/// history store in one go); their subscriptions are marked busy. Refreshes the security
/// configuration the outbound client enforces.
async fn next_batch(
    store: &Engine,
    webhooks: &Webhooks,
    busy: &Mutex<HashSet<String>>,
) -> Result<Vec<Job>, String> {
    let config = store
        .execute(
            GetWebhookSecurity {
                actor: Actor::Admin,
            },
            Load::Busy,
        )
        .await
        .map_err(|e| e.to_string())?
        .result
        .map_err(|e| e.to_string())?;
    webhooks.enforce(config);
    let skip: Vec<String> = busy
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    let due: Vec<DueDelivery> = store
        .execute(
            DueDeliveries {
                limit: BATCH,
                skip,
                hold_ms: claim_hold(store),
            },
            Load::Busy,
        )
        .await
        .map_err(|e| e.to_string())?
        .result
        .map_err(|e| e.to_string())?;
    let mut claimed: HashSet<String> = HashSet::new();
    let due: Vec<DueDelivery> = {
        let mut busy = busy.lock().unwrap_or_else(|e| e.into_inner());
        due.into_iter()
            .filter(|(_, w)| {
                let id = &w.subscription_id;
                claimed.contains(id) || (busy.insert(id.clone()) && claimed.insert(id.clone()))
            })
            .collect()
    };
    if due.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = due.iter().map(|(d, _)| d.event_id.clone()).collect();
    let events = store
        .read_history(move |history| {
            ids.iter()
                .map(|id| history.event(id))
                .collect::<std::io::Result<Vec<_>>>()
        })
        .await;
    let events = match events {
        Ok(events) => events,
        Err(e) => {
            // Nothing was sent: let them be taken again on the next look.
            let mut busy = busy.lock().unwrap_or_else(|e| e.into_inner());
            for id in &claimed {
                busy.remove(id);
            }
            return Err(e.to_string());
        }
    };
    Ok(due
        .into_iter()
        .zip(events)
        .map(|((delivery, subscription), event)| Job {
            delivery,
            subscription,
            event,
        })
        .collect())
}

/// The jobs grouped by subscription, each group in queue order.
fn lanes_of(jobs: Vec<Job>) -> Vec<Vec<Job>> {
    let mut order: Vec<String> = Vec::new();
    let mut lanes: HashMap<String, Vec<Job>> = HashMap::new();
    for job in jobs {
        let id = job.subscription.subscription_id.clone();
        lanes
            .entry(id.clone())
            .or_insert_with(|| {
                order.push(id);
                Vec::new()
            })
            .push(job);
    }
    order
        .into_iter()
        .filter_map(|id| lanes.remove(&id))
        .collect()
}

/// Sends one subscription's deliveries in order, each attempt recorded before the next is
/// looked at. Every delivery after the first is sent only if it is still pending: a pause,
/// a delete or an auto-disable (which the last attempt's record may have made) stops the
/// lane, with at most the send already under way finishing.
async fn serve_lane(
    store: &Arc<Engine>,
    webhooks: &Webhooks,
    counters: &DispatchCounters,
    lane: Vec<Job>,
    stopping: &watch::Receiver<bool>,
) {
    let hold_ms = claim_hold(store);
    for (i, job) in lane.into_iter().enumerate() {
        // Stopping: nothing is claimed or sent after the send under way.
        if *stopping.borrow() {
            return;
        }
        let id = job.delivery.delivery_id.clone();
        if i > 0 || hold_ms.is_some() {
            let claim = ClaimDelivery {
                delivery_id: id.clone(),
                attempts: job.delivery.attempts,
                hold_ms,
            };
            let pending = match store.execute(claim, Load::Busy).await {
                Ok(applied) => applied.result.map_err(|e| e.to_string()),
                // Recorded, most likely, but not acknowledged (Redis short of the replicas
                // asked for): sent anyway, at worst twice, rather than held back.
                Err(StoreError::OutcomeUnknown(_)) => Ok(true),
                Err(e) => Err(e.to_string()),
            };
            match pending {
                Ok(true) => {}
                // Cancelled, or claimed by another instance, meanwhile: so are the lane's
                // later deliveries, or they must wait for it; the next look decides.
                Ok(false) => return,
                Err(why) => {
                    tracing::warn!(delivery = %id, %why, "webhook lane stopped; it is taken again later");
                    return;
                }
            }
        }
        let attempt = attempt(webhooks, &job).await;
        let counter = if attempt.success {
            &counters.delivered
        } else {
            &counters.failed_attempts
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let record = RecordAttempt {
            delivery_id: id.clone(),
            attempt,
            retry_in_ms: retry_delay(&job),
        };
        if let Err(e) = store.execute(record, Load::Busy).await {
            tracing::warn!(delivery = %id, error = %e, "delivery attempt not recorded; it will be retried");
        }
    }
}

/// One attempt at a job.
async fn attempt(webhooks: &Webhooks, job: &Job) -> Attempt {
    let Some(event) = &job.event else {
        return unsent("the event is no longer stored (past its retention)".into());
    };
    let credentials = match webhooks.credentials(&job.subscription) {
        Ok(credentials) => credentials,
        Err(why) => return unsent(why),
    };
    let trace_id = event.trace_id.clone().unwrap_or_else(|| {
        job.delivery
            .trace_id
            .clone()
            .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()))
    });
    let body = serde_json::to_vec(&EventResponse::from(event.clone())).unwrap_or_default();
    let out = Outbound {
        url: &job.subscription.url,
        body,
        event_id: &event.event_id,
        event_type: event.event_type.name(),
        trace_id: &trace_id,
        request_id: event.request_id.as_deref(),
        credentials,
    };
    webhooks.send(out, REQUEST_TIMEOUT).await
}

/// The delay before the next try, should this one fail: the policy's, ±10 % jitter (so
/// receivers that failed together are not retried in lockstep), within its maximum.
fn retry_delay(job: &Job) -> u64 {
    let policy = job.subscription.retry_policy;
    let base = policy.delay_ms(job.delivery.attempts + 1) as f64;
    let jitter = 0.9 + rand::random::<f64>() * 0.2;
    ((base * jitter) as u64).min(policy.max_delay_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_backs_off_from_50_ms_doubling_to_a_second() {
        let pauses: Vec<u128> = (1..=8).map(|n| Outage::pause(n).as_millis()).collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(Outage::pause(u32::MAX), OUTAGE_MAX_PAUSE);
    }
}
