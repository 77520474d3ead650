//! The anomaly detector: burn-rate anomalies, denial, expiry and authentication-failure rate
//! spikes, and high latency, each over the windows and thresholds that subscriptions ask
//! for (`WebhookThresholdConfig`).
//!
//! The request path only counts, and only what someone listens for ([`Detector::decided`],
//! [`Detector::settled`], [`Detector::authenticated`], [`Detector::answered`]: a flag read
//! when nobody does). A background task ticks: it asks the ledger what to watch
//! ([`WatchAnomalies`]), closes the counts of the tick into each window, samples the
//! budgets' spend, and emits what reached a threshold ([`EmitAnomalies`]) as events, which
//! the ledger routes and journals like any other. An anomaly is emitted once when it starts
//! and again only after it has ended: a spike that lasts an hour is one event, not one per
//! tick.
//!
//! The windows are measurements, not state: they live in this process, and a restart starts
//! them afresh (a burn rate needs two windows of history again before it can be anomalous).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::task::Background;
use ledger::{
    Anomaly, AnomalyWatch, BudgetKey, EmitAnomalies, EventType, Millis, Watch, WatchAnomalies,
    SYSTEM_TENANT,
};
use serde_json::json;
use store::{Engine, Load, Store};

/// Fewer observations than this in a window are not a rate: one denial out of one decision
/// is not a spike.
pub const MIN_SAMPLES: u64 = 20;
/// A burn rate is anomalous only against a baseline of at least this many whole windows.
const BASELINE_WINDOWS: u32 = 2;
/// The weight of the newest window in the burn-rate baseline (an exponential average, about
/// the last five windows).
const BASELINE_WEIGHT: f64 = 0.2;
/// Samples of a budget's spend kept per window.
const SAMPLES_PER_WINDOW: i64 = 10;

/// How the detector runs (`cycles serve` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetectorOptions {
    /// How often windows are closed and checked.
    pub tick: Duration,
    /// The p99 over a minute above which `system.high_latency` is emitted; `None`: never.
    pub high_latency: Option<Duration>,
}

impl Default for DetectorOptions {
    fn default() -> Self {
        DetectorOptions {
            tick: Duration::from_secs(5),
            high_latency: Some(Duration::from_secs(1)),
        }
    }
}

/// The rate signals, each a count of observations and of the ones that count against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Signal {
    /// Reservation decisions, and denials among them.
    Denial,
    /// Settled reservations, and expiries among them.
    Expiry,
    /// Requests that presented a credential, and the ones refused 401.
    AuthFailure,
}

impl Signal {
    const ALL: [Signal; 3] = [Signal::Denial, Signal::Expiry, Signal::AuthFailure];

    fn event_type(self) -> EventType {
        match self {
            Signal::Denial => EventType::ReservationDenialRateSpike,
            Signal::Expiry => EventType::ReservationExpiryRateSpike,
            Signal::AuthFailure => EventType::ApiKeyAuthFailureRateSpike,
        }
    }

    fn metric(self) -> &'static str {
        match self {
            Signal::Denial => "denial_rate",
            Signal::Expiry => "expiry_rate",
            Signal::AuthFailure => "auth_failure_rate",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Observations and hits per signal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    seen: [u64; 3],
    hits: [u64; 3],
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        for i in 0..3 {
            self.seen[i] += other.seen[i];
            self.hits[i] += other.hits[i];
        }
    }
}

/// Latency buckets: upper bounds in microseconds, doubling from 100 µs to about 52 s.
const LATENCY_BUCKETS: usize = 20;

fn latency_bucket(d: Duration) -> usize {
    let us = d.as_micros().max(1) as u64;
    let mut bound = 100u64;
    for i in 0..LATENCY_BUCKETS - 1 {
        if us <= bound {
            return i;
        }
        bound *= 2;
    }
    LATENCY_BUCKETS - 1
}

fn latency_bound(i: usize) -> Duration {
    Duration::from_micros(100u64 << i)
}

/// What the request path counts, between two ticks.
pub struct Detector {
    options: DetectorOptions,
    /// Whether each signal, and the latency, is watched: the request path records nothing
    /// otherwise.
    watching: [AtomicBool; 3],
    watching_latency: AtomicBool,
    open: Mutex<HashMap<Arc<str>, Counts>>,
    latency: [AtomicU64; LATENCY_BUCKETS],
    /// Ticks run and anomalies emitted, for `/metrics`.
    pub ticks: AtomicU64,
    pub emitted: AtomicU64,
}

impl Detector {
    pub fn new(options: DetectorOptions) -> Self {
        Detector {
            options,
            watching: Default::default(),
            watching_latency: AtomicBool::new(false),
            open: Mutex::new(HashMap::new()),
            latency: Default::default(),
            ticks: AtomicU64::new(0),
            emitted: AtomicU64::new(0),
        }
    }

    fn watching(&self, signal: Signal) -> bool {
        self.watching[signal.index()].load(Ordering::Relaxed)
    }

    /// Counts `seen` observations of `signal` for `tenant`, `hits` of them against it.
    fn count(&self, signal: Signal, tenant: &Arc<str>, seen: u64, hits: u64) {
        if !self.watching(signal) {
            return;
        }
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let counts = open.entry(tenant.clone()).or_default();
        counts.seen[signal.index()] += seen;
        counts.hits[signal.index()] += hits;
    }

    /// A reservation decision of `tenant` (a reserve, a dry run or a decide), denied or not.
    pub fn decided(&self, tenant: &Arc<str>, denied: bool) {
        self.count(Signal::Denial, tenant, 1, u64::from(denied));
    }

    /// Reservations of `tenant` settled: `expired` by the sweep, `other` committed or
    /// released.
    pub fn settled(&self, tenant: &Arc<str>, expired: usize, other: usize) {
        let (expired, other) = (expired as u64, other as u64);
        self.count(Signal::Expiry, tenant, expired + other, expired);
    }

    /// Whether authentication failures are watched: if not, the request path need not even
    /// look for a credential.
    pub fn watching_authentication(&self) -> bool {
        self.watching(Signal::AuthFailure)
    }

    /// A request that presented a credential, refused 401 or not. Counted for the whole
    /// server: a failed key names no tenant.
    pub fn authenticated(&self, failed: bool) {
        static SYSTEM: std::sync::LazyLock<Arc<str>> =
            std::sync::LazyLock::new(|| Arc::from(SYSTEM_TENANT));
        self.count(Signal::AuthFailure, &SYSTEM, 1, u64::from(failed));
    }

    /// A request answered after `elapsed`.
    pub fn answered(&self, elapsed: Duration) {
        if self.watching_latency.load(Ordering::Relaxed) {
            self.latency[latency_bucket(elapsed)].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn set_watching(&self, watches: &[Watch]) {
        for signal in Signal::ALL {
            let watched = watches.iter().any(|w| w.event_type == signal.event_type());
            self.watching[signal.index()].store(watched, Ordering::Relaxed);
        }
        let latency = self.options.high_latency.is_some()
            && watches
                .iter()
                .any(|w| w.event_type == EventType::SystemHighLatency);
        self.watching_latency.store(latency, Ordering::Relaxed);
    }

    /// The counts since the last tick, and the latency buckets' totals so far.
    fn take(&self) -> (HashMap<Arc<str>, Counts>, [u64; LATENCY_BUCKETS]) {
        let open = std::mem::take(&mut *self.open.lock().unwrap_or_else(|e| e.into_inner()));
        let latency = std::array::from_fn(|i| self.latency[i].load(Ordering::Relaxed));
        (open, latency)
    }
}

/// A budget's spend over time.
struct Spend {
    /// `(when, spent)`, oldest first, at most one per tenth of the window.
    samples: VecDeque<(Millis, i64)>,
    /// The start of the current baseline window, and the spend then.
    window_start: (Millis, i64),
    /// Units per minute, averaged over whole windows.
    baseline: f64,
    windows: u32,
}

/// The detector's windows, owned by its task.
#[derive(Default)]
struct Windows {
    /// Closed counts per tenant (the system's for authentication), oldest first.
    counts: HashMap<Arc<str>, VecDeque<(Millis, Counts)>>,
    /// Closed latency totals, oldest first.
    latency: VecDeque<(Millis, [u64; LATENCY_BUCKETS])>,
    spends: HashMap<(BudgetKey, u32), Spend>,
    /// Anomalies in progress: emitted, not yet over.
    ongoing: Ongoing,
}

impl Windows {
    /// Closes one tick's counts at `now` and looks for anomalies.
    fn tick(
        &mut self,
        watch: &AnomalyWatch,
        counts: HashMap<Arc<str>, Counts>,
        latency: [u64; LATENCY_BUCKETS],
        high_latency: Option<Duration>,
    ) -> Vec<Anomaly> {
        let now = watch.now_ms;
        let longest = watch.watches.iter().map(|w| w.window_s).max().unwrap_or(0);
        let keep_from = now - i64::from(longest) * 1_000;
        for (tenant, closed) in counts {
            self.counts
                .entry(tenant)
                .or_default()
                .push_back((now, closed));
        }
        self.counts.retain(|_, series| {
            while series.front().is_some_and(|(at, _)| *at <= keep_from) {
                series.pop_front();
            }
            !series.is_empty()
        });
        self.latency.push_back((now, latency));
        let minute_ago = now - i64::from(ledger::HIGH_LATENCY_WINDOW_S) * 1_000;
        while self.latency.len() > 1 && self.latency[1].0 <= minute_ago {
            self.latency.pop_front();
        }
        let mut found = Vec::new();
        for w in &watch.watches {
            match w.event_type {
                EventType::BudgetBurnRateAnomaly => self.burn_rates(watch, w, &mut found),
                EventType::SystemHighLatency => {
                    if let Some(threshold) = high_latency {
                        self.high_latency(threshold, &mut found);
                    }
                }
                t => {
                    if let Some(signal) = Signal::ALL.into_iter().find(|s| s.event_type() == t) {
                        self.rates(now, w, signal, &mut found);
                    }
                }
            }
        }
        // A window nobody watches any more has no anomaly in progress.
        self.ongoing.retain(|(t, _, window)| {
            watch
                .watches
                .iter()
                .any(|w| w.event_type == *t && w.window_s == *window)
        });
        found
    }

    fn rates(&mut self, now: Millis, w: &Watch, signal: Signal, found: &mut Vec<Anomaly>) {
        let since = now - i64::from(w.window_s) * 1_000;
        let i = signal.index();
        let mut measured = Vec::new();
        for (tenant, series) in &self.counts {
            let mut total = Counts::default();
            for (_, c) in series.iter().filter(|(at, _)| *at > since) {
                total.add(c);
            }
            measured.push((tenant.clone(), total.seen[i], total.hits[i]));
        }
        // Tenants with no observation in the window end whatever was going on.
        let active: HashSet<&str> = measured.iter().map(|(t, _, _)| &**t).collect();
        self.ongoing.retain(|(t, tenant, window)| {
            *t != signal.event_type() || *window != w.window_s || active.contains(tenant.as_str())
        });
        for (tenant, seen, hits) in measured {
            let rate = if seen == 0 {
                0.0
            } else {
                hits as f64 / seen as f64
            };
            let anomalous = seen >= MIN_SAMPLES && rate >= w.threshold;
            let key = (signal.event_type(), tenant.to_string(), w.window_s);
            if !starts(&mut self.ongoing, key, anomalous) {
                continue;
            }
            let scope = (&*tenant != SYSTEM_TENANT).then(|| format!("tenant:{tenant}"));
            found.push(Anomaly {
                event_type: signal.event_type(),
                tenant_id: tenant.to_string(),
                scope,
                data: json!({
                    "metric": signal.metric(),
                    "current_rate": rate,
                    "threshold_rate": w.threshold,
                    "window_seconds": w.window_s,
                    "sample_count": hits,
                }),
            });
        }
    }

    fn burn_rates(&mut self, watch: &AnomalyWatch, w: &Watch, found: &mut Vec<Anomaly>) {
        let Some(budgets) = &watch.budgets else {
            return;
        };
        let now = watch.now_ms;
        let window_ms = i64::from(w.window_s) * 1_000;
        let step = (window_ms / SAMPLES_PER_WINDOW).max(1);
        // Budgets gone (or no longer watched at this window) are forgotten.
        self.spends
            .retain(|(key, window), _| *window != w.window_s || budgets.contains_key(key));
        for (key, b) in budgets {
            let spend = self
                .spends
                .entry((key.clone(), w.window_s))
                .or_insert_with(|| Spend {
                    samples: VecDeque::new(),
                    window_start: (now, b.spent),
                    baseline: 0.0,
                    windows: 0,
                });
            if b.spent < spend.window_start.1 {
                // Spend was reset: start over.
                *spend = Spend {
                    samples: VecDeque::new(),
                    window_start: (now, b.spent),
                    baseline: 0.0,
                    windows: 0,
                };
            }
            if spend.samples.back().is_none_or(|(at, _)| now - at >= step) {
                spend.samples.push_back((now, b.spent));
            }
            while spend.samples.len() > 1 && spend.samples[1].0 <= now - window_ms {
                spend.samples.pop_front();
            }
            let per_minute = |from: (Millis, i64), to: (Millis, i64)| {
                (to.1 - from.1) as f64 * 60_000.0 / (to.0 - from.0).max(1) as f64
            };
            // The trailing window, when the samples cover it.
            let current = spend
                .samples
                .front()
                .filter(|(at, _)| *at <= now - window_ms)
                .map(|&first| per_minute(first, (now, b.spent)));
            let anomalous = match current {
                Some(rate) => {
                    spend.windows >= BASELINE_WINDOWS
                        && spend.baseline > 0.0
                        && rate >= w.threshold * spend.baseline
                }
                None => false,
            };
            let key_text = format!("{}|{}", key.scope, key.unit.as_str());
            let key = (EventType::BudgetBurnRateAnomaly, key_text, w.window_s);
            if starts(&mut self.ongoing, key, anomalous) {
                let rate = current.unwrap_or_default();
                let exhaustion = if rate > 0.0 && b.remaining > 0 {
                    b.remaining as f64 / rate
                } else {
                    0.0
                };
                found.push(Anomaly {
                    event_type: EventType::BudgetBurnRateAnomaly,
                    tenant_id: b.tenant_id.to_string(),
                    scope: Some(b.scope.to_string()),
                    data: json!({
                        "scope": &*b.scope,
                        "unit": b.unit.as_str(),
                        "current_rate": rate,
                        "baseline_rate": spend.baseline,
                        "multiplier": rate / spend.baseline,
                        "window_seconds": w.window_s,
                        "projected_exhaustion_minutes": exhaustion,
                    }),
                });
            }
            // A whole window has passed: it joins the baseline (after the check, so an
            // anomalous window is compared with the windows before it).
            if now - spend.window_start.0 >= window_ms {
                let rate = per_minute(spend.window_start, (now, b.spent));
                spend.baseline = if spend.windows == 0 {
                    rate
                } else {
                    BASELINE_WEIGHT * rate + (1.0 - BASELINE_WEIGHT) * spend.baseline
                };
                spend.windows += 1;
                spend.window_start = (now, b.spent);
            }
        }
    }

    fn high_latency(&mut self, threshold: Duration, found: &mut Vec<Anomaly>) {
        let (Some((_, first)), Some((_, last))) = (self.latency.front(), self.latency.back())
        else {
            return;
        };
        let in_window: [u64; LATENCY_BUCKETS] = std::array::from_fn(|i| last[i] - first[i]);
        let total: u64 = in_window.iter().sum();
        let p99 = percentile(&in_window, total, 0.99);
        let anomalous = total >= MIN_SAMPLES && p99 > threshold;
        let key = (
            EventType::SystemHighLatency,
            SYSTEM_TENANT.to_string(),
            ledger::HIGH_LATENCY_WINDOW_S,
        );
        if starts(&mut self.ongoing, key, anomalous) {
            found.push(Anomaly {
                event_type: EventType::SystemHighLatency,
                tenant_id: SYSTEM_TENANT.to_string(),
                scope: None,
                data: json!({
                    "component": "http",
                    "message": format!(
                        "p99 latency over the last minute is above {} ms",
                        threshold.as_millis()
                    ),
                    "severity": "warning",
                    "details": {
                        "p99_upper_bound_ms": p99.as_secs_f64() * 1e3,
                        "threshold_ms": threshold.as_secs_f64() * 1e3,
                        "window_seconds": ledger::HIGH_LATENCY_WINDOW_S,
                        "sample_count": total,
                    },
                }),
            });
        }
    }
}

/// An anomaly in progress: its type, what it is about (a tenant, a budget) and its window.
type Ongoing = HashSet<(EventType, String, u32)>;

/// Whether an anomaly of `key` is to be emitted: `now_anomalous` and not already going on.
/// One no longer measured ends, so the next one is emitted again.
fn starts(ongoing: &mut Ongoing, key: (EventType, String, u32), now_anomalous: bool) -> bool {
    if now_anomalous {
        ongoing.insert(key)
    } else {
        ongoing.remove(&key);
        false
    }
}

/// The upper bound of the bucket holding the `q` quantile.
fn percentile(buckets: &[u64; LATENCY_BUCKETS], total: u64, q: f64) -> Duration {
    let rank = (total as f64 * q).ceil() as u64;
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank.max(1) {
            return latency_bound(i);
        }
    }
    latency_bound(LATENCY_BUCKETS - 1)
}

/// Runs the detector's ticks until stopped.
pub fn spawn_detector(store: Arc<Engine>, detector: Arc<Detector>) -> Background {
    Background::spawn(|mut stopped| async move {
        let mut windows = Windows::default();
        let mut ticker = tokio::time::interval(detector.options.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stopped.changed() => return,
            }
            let watched = store.execute(WatchAnomalies, Load::Busy).await;
            let watch = match watched.map(|r| r.result) {
                Ok(Ok(watch)) => watch,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the detector's watch was refused");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the detector could not read what to watch");
                    continue;
                }
            };
            detector.set_watching(&watch.watches);
            let (counts, latency) = detector.take();
            let anomalies = windows.tick(&watch, counts, latency, detector.options.high_latency);
            detector.ticks.fetch_add(1, Ordering::Relaxed);
            if anomalies.is_empty() {
                continue;
            }
            let n = anomalies.len() as u64;
            match store.execute(EmitAnomalies { anomalies }, Load::Busy).await {
                Ok(reply) if reply.result.is_ok() => {
                    detector.emitted.fetch_add(n, Ordering::Relaxed);
                }
                Ok(reply) => tracing::warn!(error = ?reply.result, "anomalies refused"),
                Err(e) => tracing::warn!(error = %e, "anomalies not recorded"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets_double_from_100_microseconds() {
        assert_eq!(latency_bucket(Duration::from_micros(50)), 0);
        assert_eq!(latency_bucket(Duration::from_micros(100)), 0);
        assert_eq!(latency_bucket(Duration::from_micros(101)), 1);
        assert_eq!(latency_bucket(Duration::from_millis(1)), 4);
        assert_eq!(
            latency_bucket(Duration::from_secs(3600)),
            LATENCY_BUCKETS - 1
        );
        let mut buckets = [0u64; LATENCY_BUCKETS];
        buckets[0] = 98;
        buckets[10] = 2;
        assert_eq!(percentile(&buckets, 100, 0.99), latency_bound(10));
        assert_eq!(percentile(&buckets, 100, 0.50), latency_bound(0));
    }
}
