//! `cycles bench compare` (a delta table; gating metrics fail beyond a threshold) and
//! `cycles bench check` (absolute budgets for CI: errors, mismatches, allocations, latency
//! ceilings).

use std::fmt::Write;

use crate::report::{Class, Report};
use crate::text::ms;

/// How a metric is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Lower is better and a regression fails the comparison (p50s).
    Latency,
    /// Higher is better and a regression fails (ops/s of the concurrent cells).
    Throughput,
    /// Lower is better, reported only (p99s: noisy, as the reference learned; floors;
    /// allocations).
    Info,
}

/// Every compared metric of a report: `(name, value, kind)`.
pub fn metrics(r: &Report) -> Vec<(String, f64, Kind)> {
    let mut out = Vec::new();
    for c in &r.floors {
        out.push((
            format!("{} p50 ms", c.meta.name),
            c.p50_ms.median,
            Kind::Info,
        ));
    }
    for c in &r.cases {
        let name = &c.meta.name;
        out.push((format!("{name} p50 ms"), c.p50_ms.median, Kind::Latency));
        out.push((format!("{name} p99 ms"), c.p99_ms.median, Kind::Info));
        if matches!(c.meta.class, Class::Concurrent | Class::Fanout) {
            out.push((
                format!("{name} ops/s"),
                c.ops_per_sec.median,
                Kind::Throughput,
            ));
        }
        if let Some(a) = c.allocations_per_op {
            out.push((format!("{name} allocations/op"), a.median, Kind::Info));
        }
    }
    out
}

/// Positive = worse: `(new − old)/old` for lower-is-better, `(old − new)/old` for
/// throughput. A zero or missing baseline gives 0.
pub fn change(old: f64, new: f64, kind: Kind) -> f64 {
    if !old.is_finite() || !new.is_finite() || old == 0.0 {
        return 0.0;
    }
    match kind {
        Kind::Throughput => (old - new) / old,
        Kind::Latency | Kind::Info => (new - old) / old,
    }
}

/// The delta table and the gating metrics that regressed beyond `threshold`.
pub fn compare(old: &Report, new: &Report, threshold: f64) -> (String, Vec<String>) {
    let before = metrics(old);
    let after = metrics(new);
    let mut out = String::new();
    let mut breaches = Vec::new();
    let _ = writeln!(
        out,
        "Baseline {} ({}) vs current {} ({}), threshold {:.0}%\n",
        old.environment.commit,
        old.target.durability,
        new.environment.commit,
        new.target.durability,
        threshold * 100.0
    );
    let differences = method_differences(old, new);
    if !differences.is_empty() {
        let _ = writeln!(
            out,
            "Note: the two runs differ in how they measured, so their cells are not the same \
             workload:"
        );
        for d in &differences {
            let _ = writeln!(out, "- {d}");
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "| Metric | Baseline | Current | Change | Status |");
    let _ = writeln!(out, "|---|---:|---:|---:|---|");
    for (name, value, kind) in &after {
        let Some((_, base, _)) = before.iter().find(|(n, _, _)| n == name) else {
            let _ = writeln!(out, "| {name} | — | {} | — | new |", ms(*value));
            continue;
        };
        let delta = change(*base, *value, *kind);
        let status = match kind {
            Kind::Info if delta > threshold => "worse (non-gating)",
            Kind::Info => "ok (non-gating)",
            _ if delta > threshold => {
                breaches.push(format!("{name}: {:+.1}%", delta * 100.0));
                "REGRESSION"
            }
            _ if delta < -threshold => "improved",
            _ => "ok",
        };
        let signed = match kind {
            Kind::Throughput => -delta,
            _ => delta,
        };
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {:+.1}% | {status} |",
            ms(*base),
            ms(*value),
            signed * 100.0
        );
    }
    for (name, _, _) in before
        .iter()
        .filter(|(n, _, _)| !after.iter().any(|(m, _, _)| m == n))
    {
        let _ = writeln!(out, "| {name} | | — | — | missing |");
    }
    (out, breaches)
}

/// What differs between the two reports' methods and targets, one line each (baseline's
/// value first). A change in any of these changes what a cell measures, so a delta between
/// them is not the code's alone.
fn method_differences(old: &Report, new: &Report) -> Vec<String> {
    let (a, b) = (&old.method, &new.method);
    let estimates = |varied: bool| if varied { "varied" } else { "fixed" };
    let clients = |c: &[usize]| format!("{c:?}");
    let sizes = |n: &[u64]| format!("{n:?}");
    // A report written before phases were recorded ran them all.
    let phases = |p: &[String]| match p.is_empty() {
        true => "all".to_string(),
        false => p.join(","),
    };
    let host = |r: &Report| format!("{} × {}", r.environment.cores, r.environment.cpu_model);
    let pairs = [
        ("host", host(old), host(new)),
        (
            "toolchain",
            old.environment.toolchain.clone(),
            new.environment.toolchain.clone(),
        ),
        (
            "engine",
            old.target.engine.clone(),
            new.target.engine.clone(),
        ),
        (
            "durability",
            old.target.durability.clone(),
            new.target.durability.clone(),
        ),
        (
            "instances",
            (1 + old.target.spread_urls.len()).to_string(),
            (1 + new.target.spread_urls.len()).to_string(),
        ),
        (
            "window (s)",
            a.window_secs.to_string(),
            b.window_secs.to_string(),
        ),
        ("trials", a.trials.to_string(), b.trials.to_string()),
        (
            "iterations",
            a.iterations.to_string(),
            b.iterations.to_string(),
        ),
        ("warm-up", a.warmup.to_string(), b.warmup.to_string()),
        (
            "concurrency clients",
            clients(&a.concurrency_clients),
            clients(&b.concurrency_clients),
        ),
        (
            "fan-out clients",
            clients(&a.fanout_clients),
            clients(&b.fanout_clients),
        ),
        (
            "lifecycle estimates",
            estimates(a.varied_estimates).to_string(),
            estimates(b.varied_estimates).to_string(),
        ),
        (
            "client threads",
            a.client_threads.to_string(),
            b.client_threads.to_string(),
        ),
        ("quick", a.quick.to_string(), b.quick.to_string()),
        ("phases", phases(&a.phases), phases(&b.phases)),
        ("list rows", sizes(&a.list_rows), sizes(&b.list_rows)),
        (
            "audit entries",
            sizes(&a.audit_entries),
            sizes(&b.audit_entries),
        ),
        (
            "settled rows",
            sizes(&a.settled_rows),
            sizes(&b.settled_rows),
        ),
        (
            "fixture clients",
            a.fixture_clients.to_string(),
            b.fixture_clients.to_string(),
        ),
    ];
    pairs
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(what, a, b)| format!("{what}: {a} in the baseline, {b} in the current run"))
        .collect()
}

/// Absolute budgets for CI.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budgets {
    pub max_allocations_per_reserve: Option<f64>,
    pub max_allocations_per_commit: Option<f64>,
    /// Ceiling for every case's p50 (a catastrophe ceiling, not a target).
    pub max_p50_ms: Option<f64>,
    /// Ceiling for every case's p99.
    pub max_p99_ms: Option<f64>,
    /// Most RSS growth allowed per settled reservation (the settled phase), in bytes.
    pub max_rss_per_settled_bytes: Option<f64>,
}

/// Every budget `r` breaks; errors and ledger mismatches always do.
pub fn check(r: &Report, b: &Budgets) -> Vec<String> {
    let mut failures = Vec::new();
    for c in r.cases.iter().chain(&r.floors) {
        let name = &c.meta.name;
        if c.errors > 0 {
            let why = c.first_error.as_deref().unwrap_or("");
            failures.push(format!("{name}: {} errors ({why})", c.errors));
        }
        if c.ledger_mismatches > 0 {
            failures.push(format!("{name}: {} ledger mismatches", c.ledger_mismatches));
        }
        if c.meta.class == Class::Floor {
            continue;
        }
        let ceilings = [
            ("p50", c.p50_ms.median, b.max_p50_ms),
            ("p99", c.p99_ms.median, b.max_p99_ms),
        ];
        for (what, value, ceiling) in ceilings {
            match ceiling {
                Some(max) if value.is_nan() || value > max => failures.push(format!(
                    "{name}: {what} {} ms over the {max} ms ceiling",
                    ms(value)
                )),
                _ => {}
            }
        }
    }
    let allocations = [
        (
            "reserve",
            &r.resources.allocations_per_reserve,
            b.max_allocations_per_reserve,
        ),
        (
            "commit",
            &r.resources.allocations_per_commit,
            b.max_allocations_per_commit,
        ),
    ];
    for (op, measured, budget) in allocations {
        match (measured, budget) {
            (_, None) => {}
            (None, Some(_)) => failures.push(format!(
                "allocations per {op}: not measured (build the server with --features alloc-count)"
            )),
            (Some(m), Some(max)) if m.median > max => failures.push(format!(
                "allocations per {op}: {:.1} over the budget of {max}",
                m.median
            )),
            _ => {}
        }
    }
    match (
        r.resources.rss_per_settled_reservation(),
        b.max_rss_per_settled_bytes,
    ) {
        (_, None) => {}
        (None, Some(_)) => failures.push(
            "RSS per settled reservation: not measured (run the settled phase with --server-pid)"
                .into(),
        ),
        (Some(per), Some(max)) if per > max => failures.push(format!(
            "RSS per settled reservation: {per:.1} bytes over the budget of {max}"
        )),
        _ => {}
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::report;

    #[test]
    fn change_is_positive_when_worse() {
        assert!((change(1.0, 1.3, Kind::Latency) - 0.3).abs() < 1e-9);
        assert!((change(100.0, 70.0, Kind::Throughput) - 0.3).abs() < 1e-9);
        assert!(change(100.0, 130.0, Kind::Throughput) < 0.0);
        assert_eq!(change(0.0, 5.0, Kind::Latency), 0.0);
        assert_eq!(change(f64::NAN, 5.0, Kind::Latency), 0.0);
    }

    #[test]
    fn identical_reports_pass() {
        let r = report("strict", 1.0);
        let (table, breaches) = compare(&r, &r, 0.25);
        assert!(breaches.is_empty(), "{breaches:?}");
        assert!(table.contains("| Reserve p50 ms |"));
        assert!(!table.contains("Note:"), "{table}");
    }

    #[test]
    fn reports_of_fixed_and_varied_estimates_are_told_apart() {
        let fixed = report("strict", 1.0);
        let mut varied = report("strict", 1.0);
        varied.method.varied_estimates = true;
        let (table, _) = compare(&fixed, &varied, 0.25);
        assert!(
            table.contains(
                "- lifecycle estimates: fixed in the baseline, varied in the current run"
            ),
            "{table}"
        );
    }

    #[test]
    fn every_difference_in_method_is_named() {
        let old = report("strict", 1.0);
        let mut new = report("none", 1.0);
        new.method.window_secs = old.method.window_secs * 2.0;
        new.method.trials = old.method.trials + 1;
        new.method.concurrency_clients = vec![8];
        new.target.spread_urls = vec!["http://127.0.0.1:1".into(), "http://127.0.0.1:2".into()];
        new.environment.cores = old.environment.cores + 2;
        new.method.phases = vec!["lifecycles".into()];
        new.method.list_rows = vec![1_000];
        let (table, _) = compare(&old, &new, 0.25);
        let notes: Vec<&str> = table.lines().filter(|l| l.starts_with("- ")).collect();
        assert_eq!(notes.len(), 8, "{table}");
        assert!(
            table.contains("- phases: all in the baseline, lifecycles in the current run"),
            "{table}"
        );
        assert!(table.contains("- list rows: "), "{table}");
        assert!(table.contains("- host: "), "{table}");
        assert!(
            table.contains("- durability: strict in the baseline, none in the current run"),
            "{table}"
        );
        assert!(
            table.contains("- instances: 1 in the baseline, 3 in the current run"),
            "{table}"
        );
        assert!(
            table.contains("- concurrency clients: [32] in the baseline, [8] in the current run"),
            "{table}"
        );
        assert!(table.contains("- window (s): "), "{table}");
        assert!(table.contains("- trials: "), "{table}");
    }

    #[test]
    fn gating_metrics_fail_beyond_the_threshold() {
        let old = report("strict", 1.0);
        let slower = report("strict", 1.4);
        let (table, breaches) = compare(&old, &slower, 0.25);
        // p50s of every case and the throughput of the concurrent cells gate; p99s do not.
        assert!(
            breaches.iter().any(|b| b.starts_with("Reserve p50 ms")),
            "{breaches:?}"
        );
        assert!(breaches
            .iter()
            .any(|b| b.starts_with("Lifecycles 32 clients ops/s")));
        assert!(!breaches.iter().any(|b| b.contains("p99")));
        assert!(table.contains("worse (non-gating)"));
        let (_, within) = compare(&old, &slower, 0.45);
        assert!(within.is_empty(), "{within:?}");
        let (table, improved) = compare(&slower, &old, 0.1);
        assert!(improved.is_empty());
        assert!(table.contains("improved"));
    }

    #[test]
    fn budgets() {
        let mut r = report("strict", 1.0);
        // The fixture has one ledger mismatch and one error-free run.
        let failures = check(&r, &Budgets::default());
        assert_eq!(failures.len(), 1, "{failures:?}");
        r.cases.iter_mut().for_each(|c| c.ledger_mismatches = 0);
        assert!(check(&r, &Budgets::default()).is_empty());
        let tight = Budgets {
            max_allocations_per_reserve: Some(99.0),
            max_allocations_per_commit: Some(10.0),
            max_p50_ms: Some(5.0),
            max_p99_ms: Some(1000.0),
            max_rss_per_settled_bytes: None,
        };
        let failures = check(&r, &tight);
        assert_eq!(failures.len(), 3, "{failures:?}");
        assert!(failures
            .iter()
            .any(|f| f.contains("reserve: 100.0 over the budget of 99")));
        assert!(failures.iter().any(|f| f.contains("commit: not measured")));
        assert!(failures
            .iter()
            .any(|f| f.starts_with("Fan-out shared 200: p50")));
        r.cases[0].errors = 2;
        assert!(check(&r, &Budgets::default())[0].starts_with("Reserve: 2 errors"));
        r.cases[0].errors = 0;
        // 100 MiB grown over a million settled reservations: 104.9 bytes each.
        let memory = Budgets {
            max_rss_per_settled_bytes: Some(100.0),
            ..Budgets::default()
        };
        assert_eq!(check(&r, &memory), ["RSS per settled reservation: not measured (run the settled phase with --server-pid)"]);
        r.resources.settled_rss_before_bytes = Some(50 << 20);
        r.resources.settled_rss_after_bytes = Some(150 << 20);
        r.resources.settled_reservations = Some(1_000_000);
        assert_eq!(
            check(&r, &memory),
            ["RSS per settled reservation: 104.9 bytes over the budget of 100"]
        );
        r.resources.settled_rss_after_bytes = Some(140 << 20);
        assert!(check(&r, &memory).is_empty());
    }
}
