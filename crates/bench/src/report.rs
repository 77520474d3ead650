//! The report: its JSON shape, the aggregation of trials (median and min–max per metric),
//! the floors each case is quoted against, and the targets of the issue.

use serde::{Deserialize, Serialize};

use crate::envinfo::Environment;
use crate::stats::{Sample, Spread};

pub const SCHEMA: u32 = 1;
pub const HTTP_FLOOR: &str = "HTTP floor (health)";
/// A 4 KiB overwrite of synced space + fdatasync, as the journal writes: the floor cases
/// are quoted against.
pub const FSYNC_FLOOR: &str = "fdatasync floor (4 KiB overwrite)";
/// A 4 KiB append + fdatasync (the file grows, so the sync also writes its size): reported
/// beside it, the floor earlier reports quoted against.
pub const FSYNC_APPEND_FLOOR: &str = "fdatasync floor (4 KiB append)";
pub const REDIS_FLOOR: &str = "Redis floor (PING)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Floor,
    Write,
    Read,
    Concurrent,
    Fanout,
}

/// What a case is. `calls` HTTP requests per timed operation, `writes` of which change
/// state (with strict durability each of those waits for an fdatasync).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseMeta {
    pub name: String,
    pub class: Class,
    pub calls: u32,
    pub writes: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
}

impl CaseMeta {
    pub fn new(name: impl Into<String>, class: Class, calls: u32, writes: u32) -> CaseMeta {
        CaseMeta {
            name: name.into(),
            class,
            calls,
            writes,
            clients: None,
            rows: None,
        }
    }

    pub fn clients(mut self, n: usize) -> CaseMeta {
        self.clients = Some(n as u32);
        self
    }

    pub fn rows(mut self, n: u64) -> CaseMeta {
        self.rows = Some(n);
        self
    }
}

/// One case across trials: each metric's median with its min–max, and every trial's sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseReport {
    #[serde(flatten)]
    pub meta: CaseMeta,
    pub p50_ms: Spread,
    pub p95_ms: Spread,
    pub p99_ms: Spread,
    pub min_ms: Spread,
    pub max_ms: Spread,
    pub mean_ms: Spread,
    pub ops_per_sec: Spread,
    /// Timed operations, all trials together.
    pub samples: u64,
    pub errors: u64,
    pub ledger_mismatches: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations_per_op: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syncs_per_op: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_per_op: Option<Spread>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_op: Option<Spread>,
    /// The physical floor of one operation: `calls` × HTTP floor (+ `writes` × fdatasync
    /// floor with strict durability), medians of the same run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_over_floor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    pub trials: Vec<Sample>,
}

impl CaseReport {
    pub fn aggregate(meta: CaseMeta, trials: Vec<Sample>, first_error: Option<String>) -> Self {
        let spread = |f: fn(&Sample) -> f64| Spread::of(&trials.iter().map(f).collect::<Vec<_>>());
        CaseReport {
            p50_ms: spread(|s| s.p50_ms),
            p95_ms: spread(|s| s.p95_ms),
            p99_ms: spread(|s| s.p99_ms),
            min_ms: spread(|s| s.min_ms),
            max_ms: spread(|s| s.max_ms),
            mean_ms: spread(|s| s.mean_ms),
            ops_per_sec: spread(|s| s.ops_per_sec),
            samples: trials.iter().map(|s| s.n).sum(),
            errors: trials.iter().map(|s| s.errors).sum(),
            ledger_mismatches: trials.iter().map(|s| s.ledger_mismatches).sum(),
            allocations_per_op: Spread::of_some(trials.iter().map(|s| s.allocations_per_op)),
            syncs_per_op: Spread::of_some(trials.iter().map(|s| s.syncs_per_op)),
            batches_per_op: Spread::of_some(trials.iter().map(|s| s.batches_per_op)),
            server_cpu_us_per_op: Spread::of_some(trials.iter().map(|s| s.server_cpu_us_per_op)),
            floor_ms: None,
            floor: None,
            p50_over_floor: None,
            first_error,
            meta,
            trials,
        }
    }

    /// Quotes the case against its floor.
    fn attach_floor(&mut self, http_ms: f64, fsync_ms: Option<f64>) {
        let (calls, writes) = (self.meta.calls, self.meta.writes);
        let mut floor = f64::from(calls) * http_ms;
        let mut label = format!("{calls}×HTTP");
        if let (Some(fsync), true) = (fsync_ms, writes > 0) {
            floor += f64::from(writes) * fsync;
            label.push_str(&format!(" + {writes}×fdatasync"));
        }
        self.floor_ms = Some(floor);
        self.floor = Some(label);
        self.p50_over_floor = Some(self.p50_ms.median / floor);
    }
}

/// Collects samples case by case, trial after trial, keeping first-seen order.
#[derive(Default)]
pub struct Collector {
    cases: Vec<(CaseMeta, Vec<Sample>, Option<String>)>,
}

impl Collector {
    pub fn add(&mut self, meta: CaseMeta, sample: Sample, error: Option<String>) {
        match self.cases.iter_mut().find(|(m, _, _)| m.name == meta.name) {
            Some((_, samples, first)) => {
                samples.push(sample);
                if first.is_none() {
                    *first = error;
                }
            }
            None => self.cases.push((meta, vec![sample], error)),
        }
    }

    pub fn finish(self) -> Vec<CaseReport> {
        self.cases
            .into_iter()
            .map(|(meta, samples, error)| CaseReport::aggregate(meta, samples, error))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetInfo {
    pub url: String,
    /// Further instances of the same ledger the concurrent cells' clients were spread over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread_urls: Vec<String>,
    /// `embedded` when the server reports the embedded engine's counters, else `unknown`.
    pub engine: String,
    /// `strict` / `none` as given or inferred from the journal's sync counter.
    pub durability: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_pid: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Method {
    pub warmup: usize,
    pub iterations: usize,
    pub trials: usize,
    pub window_secs: f64,
    pub concurrency_clients: Vec<usize>,
    /// Whether the lifecycles' estimates varied (`--varied-estimates`).
    #[serde(default)]
    pub varied_estimates: bool,
    pub fanout_clients: Vec<usize>,
    pub list_rows: Vec<u64>,
    /// The audit log sizes of the audit cells.
    #[serde(default)]
    pub audit_entries: Vec<u64>,
    /// The numbers of settled reservations the settled cells ran at.
    #[serde(default)]
    pub settled_rows: Vec<u64>,
    pub fixture_clients: usize,
    pub client_threads: usize,
    pub quick: bool,
    /// The phases that ran (`--only`); the floors always run.
    #[serde(default)]
    pub phases: Vec<String>,
}

/// A list-cell population, built through the API and timed apart from the measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fixture {
    /// What was built: `list` (ACTIVE reservations) or `audit` (audit entries).
    #[serde(default = "list_fixture")]
    pub kind: String,
    pub rows: u64,
    pub clients: usize,
    pub seconds: f64,
    pub rows_per_sec: f64,
    pub errors: u64,
}

fn list_fixture() -> String {
    "list".into()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    /// Server peak RSS after the main trials (before the 100k/1M list fixtures).
    pub peak_rss_bytes: Option<u64>,
    /// `/proc/<pid>/status VmHWM`, `/metrics process_peak_resident_memory_bytes` or `n/a`.
    pub peak_rss_source: String,
    pub peak_rss_after_large_fixtures_bytes: Option<u64>,
    /// Heap allocations per request in the server (counting allocator; `None` = n/a).
    pub allocations_per_reserve: Option<Spread>,
    pub allocations_per_commit: Option<Spread>,
    /// Growth of the server's store counters over the whole run (commands, batches,
    /// fdatasyncs, journal bytes, snapshots, allocations), from `/metrics`.
    #[serde(default)]
    pub server_counters: std::collections::BTreeMap<String, f64>,
    /// The server's RSS (`VmRSS`, settled) before the audit fixtures and after the largest,
    /// with the audit log's size then.
    #[serde(default)]
    pub audit_rss_before_bytes: Option<u64>,
    #[serde(default)]
    pub audit_rss_after_bytes: Option<u64>,
    #[serde(default)]
    pub audit_entries_after: Option<u64>,
    /// Webhook deliveries per second to a local receiver (the webhooks phase).
    #[serde(default)]
    pub webhook_deliveries_per_sec: Option<f64>,
    #[serde(default)]
    pub webhook_deliveries: Option<u64>,
    /// The server's RSS (`VmRSS`, settled) after the first settled fixture (before it, with
    /// one) and after the largest, with the reservations settled (and archived) in
    /// between.
    #[serde(default)]
    pub settled_rss_before_bytes: Option<u64>,
    #[serde(default)]
    pub settled_rss_after_bytes: Option<u64>,
    #[serde(default)]
    pub settled_reservations: Option<u64>,
}

impl Resources {
    /// RSS grown per settled reservation over the settled fixtures, in bytes.
    pub fn rss_per_settled_reservation(&self) -> Option<f64> {
        let (before, after, n) = (
            self.settled_rss_before_bytes?,
            self.settled_rss_after_bytes?,
            self.settled_reservations.filter(|n| *n > 0)?,
        );
        Some((after as f64 - before as f64) / n as f64)
    }
}

/// `1k` for 1 000, `1M` for 1 000 000.
pub fn rows_label(rows: u64) -> String {
    match rows {
        r if r >= 1_000_000 && r % 1_000_000 == 0 => format!("{}M", r / 1_000_000),
        r if r >= 1_000 && r % 1_000 == 0 => format!("{}k", r / 1_000),
        r => r.to_string(),
    }
}

/// The settled cells, each run at every number of settled reservations (`<cell> @1k`,
/// `<cell> @1M`): one reservation kept ACTIVE read beside an archived one, and the newest
/// page of the tenant's reservations (archived rows merged with the live one).
pub const SETTLED_CELLS: [&str; 3] = [
    "GET reservation, live",
    "GET reservation, archived",
    "LIST sorted, archived",
];

/// The history cells, each run at every size of the history (`<cell> @1k`, `<cell> @1M`):
/// the audit fixture's writes are top-ups, and each leaves one audit entry and one
/// `budget.funded` event, so the audit log and the event log grow together.
pub const HISTORY_CELLS: [&str; 5] = [
    "AUDIT newest page",
    "AUDIT one tenant's top-ups",
    "AUDIT refusals",
    "EVENT newest page",
    "EVENT one tenant's top-ups",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    pub target: String,
    pub measured: String,
    pub met: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: u32,
    pub generated_at_unix: u64,
    pub target: TargetInfo,
    pub environment: Environment,
    pub method: Method,
    pub floors: Vec<CaseReport>,
    pub cases: Vec<CaseReport>,
    pub fixtures: Vec<Fixture>,
    pub resources: Resources,
    pub targets: Vec<TargetCheck>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn case(&self, name: &str) -> Option<&CaseReport> {
        self.cases
            .iter()
            .chain(&self.floors)
            .find(|c| c.meta.name == name)
    }

    fn floor_p50(&self, name: &str) -> Option<f64> {
        self.floors
            .iter()
            .find(|c| c.meta.name == name)
            .map(|c| c.p50_ms.median)
            .filter(|v| v.is_finite())
    }

    /// Quotes every case against its floor and evaluates the targets.
    pub fn finalize(&mut self) {
        let strict = self.target.durability == "strict";
        let fsync = self.floor_p50(FSYNC_FLOOR).filter(|_| strict);
        if let Some(http) = self.floor_p50(HTTP_FLOOR) {
            for case in &mut self.cases {
                case.attach_floor(http, fsync);
            }
        }
        self.resources.allocations_per_reserve = self.allocations_of("Reserve");
        self.resources.allocations_per_commit = self.allocations_of("Commit");
        self.targets = self.evaluate_targets();
    }

    fn allocations_of(&self, name: &str) -> Option<Spread> {
        self.case(name).and_then(|c| c.allocations_per_op)
    }

    pub fn errors(&self) -> u64 {
        self.cases
            .iter()
            .chain(&self.floors)
            .map(|c| c.errors)
            .sum()
    }

    pub fn ledger_mismatches(&self) -> u64 {
        self.cases.iter().map(|c| c.ledger_mismatches).sum()
    }

    fn evaluate_targets(&self) -> Vec<TargetCheck> {
        let mut out = Vec::new();
        let p50 = |name: &str| self.case(name).map(|c| c.p50_ms.median);
        let http = self.floor_p50(HTTP_FLOOR);
        let fsync = self.floor_p50(FSYNC_FLOOR);
        let strict = self.target.durability == "strict";
        match (self.target.durability.as_str(), p50("Reserve"), http) {
            ("none", Some(reserve), Some(http)) => out.push(ratio_target(
                "none: Reserve p50 ≤ 1.5 × HTTP floor",
                reserve,
                http,
                1.5,
            )),
            ("strict", Some(reserve), Some(http)) => {
                if let Some(fsync) = fsync {
                    out.push(ratio_target(
                        "strict, 1 client: Reserve p50 ≤ 1.2 × (HTTP + fdatasync floors)",
                        reserve,
                        http + fsync,
                        1.2,
                    ));
                }
            }
            _ => {}
        }
        if let (true, Some(c)) = (strict, self.case("Lifecycles 32 clients")) {
            let v = c.ops_per_sec.median;
            out.push(TargetCheck {
                target: "strict: reserve→commit lifecycles at 32 clients ≥ 10 000/s".into(),
                measured: format!("{v:.1}/s"),
                met: v >= 10_000.0,
            });
        }
        for shape in ["shared", "isolated"] {
            if let (true, Some(c)) = (strict, self.case(&format!("Fan-out {shape} 200"))) {
                let p99 = c.p99_ms.median;
                out.push(TargetCheck {
                    target: format!(
                        "strict: fan-out {shape} 200 clients p99 ≤ 20 ms, 0 mismatches"
                    ),
                    measured: format!("p99 {p99:.2} ms, {} mismatches", c.ledger_mismatches),
                    met: p99 <= 20.0 && c.ledger_mismatches == 0,
                });
            }
        }
        for cell in HISTORY_CELLS {
            if let (Some(big), Some(small)) =
                (p50(&format!("{cell} @1M")), p50(&format!("{cell} @1k")))
            {
                out.push(ratio_target(
                    &format!("{cell} p50 @1M ≤ 1.2 × @1k"),
                    big,
                    small,
                    1.2,
                ));
            }
        }
        let res = &self.resources;
        if let (Some(before), Some(after), Some(entries)) = (
            res.audit_rss_before_bytes,
            res.audit_rss_after_bytes,
            res.audit_entries_after.filter(|n| *n >= 1_000_000),
        ) {
            let grown = after as f64 - before as f64;
            out.push(TargetCheck {
                target: "RSS after 1M audit entries ≤ RSS before + 50 MiB".into(),
                measured: format!("{:+.1} MiB ({} entries)", grown / (1 << 20) as f64, entries),
                met: grown <= (50 << 20) as f64,
            });
        }
        if let (Some(rate), Some(n)) = (res.webhook_deliveries_per_sec, res.webhook_deliveries) {
            out.push(TargetCheck {
                target: "webhook deliveries to a local receiver ≥ 5000/s".into(),
                measured: format!("{rate:.0}/s ({n} deliveries)"),
                met: rate >= 5000.0,
            });
        }
        let largest_settled = self.method.settled_rows.iter().copied().max();
        if let Some(label) = largest_settled.filter(|n| *n >= 1_000_000).map(rows_label) {
            let [live, archived, list] = SETTLED_CELLS.map(|cell| p50(&format!("{cell} @{label}")));
            if let (Some(archived), Some(live)) = (archived, live) {
                out.push(ratio_target(
                    &format!("GET of an archived reservation p50 ≤ 2 × a live one @{label}"),
                    archived,
                    live,
                    2.0,
                ));
            }
            if let (Some(big), Some(small)) = (list, p50("LIST sorted, archived @1k")) {
                out.push(ratio_target(
                    &format!("LIST sorted, archived p50 @{label} ≤ 1.2 × @1k"),
                    big,
                    small,
                    1.2,
                ));
            }
        }
        if let (Some(per), Some(n)) = (
            res.rss_per_settled_reservation(),
            res.settled_reservations.filter(|n| *n >= 1_000_000),
        ) {
            out.push(TargetCheck {
                target: "RSS per settled reservation ≤ 0.25 KiB".into(),
                measured: format!("{per:.1} bytes ({n} settled)"),
                met: per <= 256.0,
            });
        }
        if let (Some(big), Some(small)) = (p50("LIST sorted @1M"), p50("LIST sorted @1k")) {
            out.push(ratio_target(
                "LIST sorted p50 @1M ≤ 1.2 × @1k",
                big,
                small,
                1.2,
            ));
        }
        out
    }
}

fn ratio_target(target: &str, value: f64, base: f64, limit: f64) -> TargetCheck {
    let ratio = value / base;
    TargetCheck {
        target: target.into(),
        measured: format!("{value:.3} ms vs {base:.3} ms = {ratio:.2}×"),
        met: ratio <= limit,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample(p50: f64, ops: f64) -> Sample {
        Sample {
            n: 200,
            p50_ms: p50,
            p95_ms: p50 * 1.5,
            p99_ms: p50 * 2.0,
            min_ms: p50 / 2.0,
            max_ms: p50 * 3.0,
            mean_ms: p50,
            ops_per_sec: ops,
            ..Sample::default()
        }
    }

    /// A small report: floors, a reserve, a commit, a 32-client cell and a fan-out cell.
    pub fn report(durability: &str, scale: f64) -> Report {
        let mut c = Collector::default();
        let mut f = Collector::default();
        for trial in 0..3 {
            let jitter = 1.0 + f64::from(trial) * 0.01;
            f.add(
                CaseMeta::new(HTTP_FLOOR, Class::Floor, 1, 0),
                sample(0.1 * jitter, 0.0),
                None,
            );
            f.add(
                CaseMeta::new(FSYNC_FLOOR, Class::Floor, 0, 0),
                sample(1.0, 0.0),
                None,
            );
            let mut reserve = sample(1.2 * scale * jitter, 800.0);
            reserve.allocations_per_op = Some(100.0);
            c.add(CaseMeta::new("Reserve", Class::Write, 1, 1), reserve, None);
            c.add(
                CaseMeta::new("Commit", Class::Write, 1, 1),
                sample(1.1 * scale, 900.0),
                None,
            );
            c.add(
                CaseMeta::new("Lifecycles 32 clients", Class::Concurrent, 2, 2).clients(32),
                sample(5.0 * scale, 6000.0 / scale),
                None,
            );
            let mut fanout = sample(8.0 * scale, 9000.0 / scale);
            fanout.ledger_mismatches = u64::from(trial == 2);
            c.add(
                CaseMeta::new("Fan-out shared 200", Class::Fanout, 1, 1).clients(200),
                fanout,
                Some("boom".into()).filter(|_| trial == 1),
            );
        }
        let mut r = Report {
            schema: SCHEMA,
            generated_at_unix: 0,
            target: TargetInfo {
                url: "http://127.0.0.1:7878".into(),
                spread_urls: Vec::new(),
                engine: "embedded".into(),
                durability: durability.into(),
                server_pid: None,
            },
            environment: Environment::default(),
            method: Method {
                warmup: 50,
                iterations: 200,
                trials: 3,
                window_secs: 5.0,
                concurrency_clients: vec![32],
                varied_estimates: false,
                fanout_clients: vec![200],
                list_rows: vec![],
                audit_entries: vec![],
                settled_rows: vec![],
                fixture_clients: 64,
                client_threads: 1,
                quick: false,
                phases: vec![],
            },
            floors: f.finish(),
            cases: c.finish(),
            fixtures: vec![],
            resources: Resources::default(),
            targets: vec![],
            notes: vec![],
        };
        r.finalize();
        r
    }

    #[test]
    fn trials_aggregate_to_median_and_range() {
        let r = report("strict", 1.0);
        let reserve = r.case("Reserve").unwrap();
        assert_eq!(reserve.trials.len(), 3);
        assert_eq!(reserve.samples, 600);
        assert!((reserve.p50_ms.median - 1.212).abs() < 1e-9);
        assert!((reserve.p50_ms.min - 1.2).abs() < 1e-9);
        assert!((reserve.p50_ms.max - 1.224).abs() < 1e-9);
        let fanout = r.case("Fan-out shared 200").unwrap();
        assert_eq!(fanout.ledger_mismatches, 1);
        assert_eq!(fanout.first_error.as_deref(), Some("boom"));
        assert_eq!(r.ledger_mismatches(), 1);
        assert_eq!(r.resources.allocations_per_reserve.unwrap().median, 100.0);
        assert!(r.resources.allocations_per_commit.is_none());
    }

    #[test]
    fn cases_are_quoted_against_their_floor() {
        let r = report("strict", 1.0);
        let reserve = r.case("Reserve").unwrap();
        let http = r.floor_p50(HTTP_FLOOR).unwrap();
        assert!((reserve.floor_ms.unwrap() - (http + 1.0)).abs() < 1e-9);
        assert_eq!(reserve.floor.as_deref(), Some("1×HTTP + 1×fdatasync"));
        let lifecycle = r.case("Lifecycles 32 clients").unwrap();
        assert!((lifecycle.floor_ms.unwrap() - 2.0 * (http + 1.0)).abs() < 1e-9);
        // Without strict durability the fdatasync floor does not apply.
        let none = report("none", 1.0);
        assert_eq!(
            none.case("Reserve").unwrap().floor.as_deref(),
            Some("1×HTTP")
        );
    }

    #[test]
    fn targets_follow_the_durability_mode() {
        let strict = report("strict", 1.0);
        let names: Vec<&str> = strict.targets.iter().map(|t| t.target.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(strict.targets[0].met, "1.212 ≤ 1.2 × 1.101");
        assert!(!strict.targets[1].met, "6000/s < 10000/s");
        assert!(
            !strict.targets[2].met,
            "a mismatch fails the fan-out target"
        );
        let none = report("none", 1.0);
        assert_eq!(none.targets.len(), 1);
        assert!(!none.targets[0].met, "1.212 ms is 12× the 0.1 ms floor");
    }

    #[test]
    fn json_round_trip_keeps_everything() {
        let mut r = report("strict", 1.0);
        r.cases[0].trials[0].p99_ms = f64::NAN;
        let json = serde_json::to_string_pretty(&r).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert!(back.cases[0].trials[0].p99_ms.is_nan());
        assert_eq!(back.cases.len(), r.cases.len());
        for (a, b) in back.cases.iter().zip(&r.cases) {
            assert_eq!(a.meta, b.meta);
            assert_eq!(a.trials.len(), b.trials.len());
            assert!((a.p50_ms.median - b.p50_ms.median).abs() < 1e-12);
            assert_eq!(
                a.allocations_per_op.is_some(),
                b.allocations_per_op.is_some()
            );
        }
        assert_eq!(
            (&back.targets, &back.target, &back.method),
            (&r.targets, &r.target, &r.method)
        );
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["cases"][0]["name"], "Reserve");
        assert_eq!(v["cases"][0]["class"], "write");
        assert!(v["cases"][0]["p50_ms"]["median"].is_f64());
        assert_eq!(v["target"]["durability"], "strict");
    }
}
