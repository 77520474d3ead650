//! The human-readable report, in the reference's layout: its per-case lines
//! (`[Benchmark]`, `[Concurrent]`, `[Fanout]`) and a summary table, so the two can be read
//! side by side. Times are printed with more decimals than the reference's `%.1f`, since
//! ours are often below a millisecond.

use std::fmt::Write;

use crate::report::{CaseReport, Class, Report};
use crate::stats::{Sample, Spread};

pub fn ms(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if v < 10.0 {
        format!("{v:.3}")
    } else if v < 100.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

fn spread(s: &Spread) -> String {
    format!("{}–{}", ms(s.min), ms(s.max))
}

pub fn bytes(v: Option<u64>) -> String {
    v.map_or("n/a".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
}

/// The reference's per-case line for one trial of a sequential case.
pub fn benchmark_line(name: &str, s: &Sample) -> String {
    format!(
        "[Benchmark] {name:<20} p50={}ms  p95={}ms  p99={}ms  min={}ms  max={}ms",
        ms(s.p50_ms),
        ms(s.p95_ms),
        ms(s.p99_ms),
        ms(s.min_ms),
        ms(s.max_ms)
    )
}

/// The reference's line for a lifecycle cell.
pub fn concurrent_line(clients: usize, window_secs: f64, s: &Sample) -> String {
    format!(
        "[Concurrent] {clients:2} clients: {} ops in {window_secs}s = {:.1} ops/s  p50={}ms  p95={}ms  p99={}ms  errors={}",
        s.n,
        s.ops_per_sec,
        ms(s.p50_ms),
        ms(s.p95_ms),
        ms(s.p99_ms),
        s.errors
    )
}

/// The reference's line for a fan-out cell.
pub fn fanout_line(shape: &str, clients: usize, window_secs: f64, s: &Sample) -> String {
    let attempts = s.n + s.errors;
    let rate = if attempts == 0 {
        0.0
    } else {
        s.errors as f64 * 100.0 / attempts as f64
    };
    format!(
        "[Fanout] {shape} {clients} clients: {} reserves in {window_secs}s = {:.1} reserves/s  p50={}ms  p95={}ms  p99={}ms  errors={}  error_rate={rate:.2}%  ledger_mismatches={}",
        s.n,
        s.ops_per_sec,
        ms(s.p50_ms),
        ms(s.p95_ms),
        ms(s.p99_ms),
        s.errors,
        s.ledger_mismatches
    )
}

fn table(out: &mut String, title: &str, rows: &[&CaseReport]) {
    if rows.is_empty() {
        return;
    }
    let rule = format!(
        "+{:-<26}+{:-<10}+{:-<10}+{:-<10}+{:-<10}+{:-<10}+{:-<11}+{:-<17}+{:-<9}+",
        "", "", "", "", "", "", "", "", ""
    );
    let _ = writeln!(out, "\n{title}\n{rule}");
    let _ = writeln!(
        out,
        "| {:<24} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>9} | {:>15} | {:>7} |",
        "Operation",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "min ms",
        "max ms",
        "ops/s",
        "p50 trials",
        "×floor"
    );
    let _ = writeln!(out, "{rule}");
    for c in rows {
        let ratio = c.p50_over_floor.map_or("n/a".into(), |r| format!("{r:.2}"));
        let _ = writeln!(
            out,
            "| {:<24} | {:>8} | {:>8} | {:>8} | {:>8} | {:>8} | {:>9.1} | {:>15} | {:>7} |",
            c.meta.name,
            ms(c.p50_ms.median),
            ms(c.p95_ms.median),
            ms(c.p99_ms.median),
            ms(c.min_ms.median),
            ms(c.max_ms.median),
            c.ops_per_sec.median,
            spread(&c.p50_ms),
            ratio
        );
    }
    let _ = writeln!(out, "{rule}");
}

fn per_op(s: &Option<Spread>) -> String {
    s.map_or("n/a".into(), |s| {
        format!("{:.1} (trials {:.1}–{:.1})", s.median, s.min, s.max)
    })
}

/// The instances the concurrent cells' clients were spread over besides the first.
fn instances(urls: &[String]) -> String {
    match urls {
        [] => String::new(),
        urls => format!(" (concurrent cells spread over it and {})", urls.join(", ")),
    }
}

/// The whole human-readable report.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let e = &r.environment;
    let _ = writeln!(
        out,
        "Cycles benchmark: {}{}  engine={}  durability={}{}",
        r.target.url,
        instances(&r.target.spread_urls),
        r.target.engine,
        r.target.durability,
        if r.target.durability == "none" {
            " (memory only: nothing is fsynced)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "commit {}  |  {}  |  {} × {}  |  kernel {}  |  {}",
        e.commit, e.toolchain, e.cores, e.cpu_model, e.kernel, e.os
    );
    let _ = writeln!(
        out,
        "load average at start {}, at end {} (client and server share this machine)",
        e.load_average_start, e.load_average_end
    );
    let m = &r.method;
    let _ = writeln!(
        out,
        "method: {} warm-up + {} measured sequential iterations, {} s concurrent windows, {} trial(s): medians (p50 trials = min–max across trials); client threads {}{}",
        m.warmup,
        m.iterations,
        m.window_secs,
        m.trials,
        m.client_threads,
        if m.varied_estimates {
            "; lifecycles reserve varied estimates (100–1 000 000)"
        } else {
            ""
        }
    );
    let floors: Vec<&CaseReport> = r.floors.iter().collect();
    table(&mut out, "Floors", &floors);
    for (title, class) in [
        ("Write path (sequential, 1 client)", Class::Write),
        ("Read path (sequential, 1 client)", Class::Read),
        ("Reserve→commit lifecycles (concurrent)", Class::Concurrent),
        ("Fan-out (reserve only, concurrent)", Class::Fanout),
    ] {
        let rows: Vec<&CaseReport> = r.cases.iter().filter(|c| c.meta.class == class).collect();
        table(&mut out, title, &rows);
    }
    let concurrent = r.cases.iter().filter(|c| c.meta.class == Class::Concurrent);
    for c in concurrent {
        let _ = writeln!(
            out,
            "{}  [errors {}]",
            concurrent_line(
                c.meta.clients.unwrap_or(0) as usize,
                m.window_secs,
                &median_sample(c)
            ),
            c.errors
        );
    }
    for c in r.cases.iter().filter(|c| c.meta.class == Class::Fanout) {
        let shape = c.meta.name.split_whitespace().nth(1).unwrap_or("?");
        let _ = writeln!(
            out,
            "{}",
            fanout_line(
                shape,
                c.meta.clients.unwrap_or(0) as usize,
                m.window_secs,
                &median_sample(c)
            )
        );
    }
    if !r.fixtures.is_empty() {
        let _ = writeln!(
            out,
            "\nFixtures (built through the API, not timed as a case):"
        );
        for f in &r.fixtures {
            let _ = writeln!(
                out,
                "  {:>5} {:>9} rows: {:.1} s with {} clients ({:.0} rows/s, {} errors)",
                f.kind, f.rows, f.seconds, f.clients, f.rows_per_sec, f.errors
            );
        }
    }
    let res = &r.resources;
    let _ = writeln!(
        out,
        "\nServer: peak RSS {} ({}); after the large list fixtures {}",
        bytes(res.peak_rss_bytes),
        res.peak_rss_source,
        bytes(res.peak_rss_after_large_fixtures_bytes)
    );
    if res.audit_rss_before_bytes.is_some() || res.audit_entries_after.is_some() {
        let _ = writeln!(
            out,
            "Server RSS before the audit fixtures {}, after them {} ({} audit entries)",
            bytes(res.audit_rss_before_bytes),
            bytes(res.audit_rss_after_bytes),
            res.audit_entries_after
                .map_or("n/a".to_string(), |n| n.to_string())
        );
    }
    if let Some(n) = res.settled_reservations {
        let per = res
            .rss_per_settled_reservation()
            .map_or("n/a".to_string(), |b| format!("{b:.1} bytes"));
        let _ = writeln!(
            out,
            "Server RSS after the first settled fixture {}, after the last {} ({n} more \
             reservations settled and archived: {per} each)",
            bytes(res.settled_rss_before_bytes),
            bytes(res.settled_rss_after_bytes),
        );
    }
    let _ = writeln!(
        out,
        "Heap allocations per request: reserve {}, commit {}",
        per_op(&res.allocations_per_reserve),
        per_op(&res.allocations_per_commit)
    );
    let cpu: Vec<String> = r
        .cases
        .iter()
        .filter_map(|c| {
            Some(format!(
                "{} {:.1}",
                c.meta.name, c.server_cpu_us_per_op?.median
            ))
        })
        .collect();
    if !cpu.is_empty() {
        let _ = writeln!(
            out,
            "Server CPU per operation, µs (a lifecycle is two requests):\n  {}",
            cpu.join(", ")
        );
    }
    if !res.server_counters.is_empty() {
        let all: Vec<String> = res
            .server_counters
            .iter()
            .map(|(k, v)| format!("{}={v}", k.trim_start_matches("cycles_")))
            .collect();
        let _ = writeln!(out, "Server counters over the run: {}", all.join(", "));
    }
    if let Some(c) = r.case("Reserve") {
        let _ = writeln!(
            out,
            "Journal per reserve: {} fdatasync, {} batches",
            per_op(&c.syncs_per_op),
            per_op(&c.batches_per_op)
        );
    }
    if !r.targets.is_empty() {
        let _ = writeln!(out, "\nTargets:");
        for t in &r.targets {
            let status = if t.met { "MET " } else { "MISS" };
            let _ = writeln!(out, "  [{status}] {}: {}", t.target, t.measured);
        }
    }
    let _ = writeln!(
        out,
        "\nErrors: {}   Ledger mismatches: {}",
        r.errors(),
        r.ledger_mismatches()
    );
    for note in &r.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

/// The medians of a case, shaped as one sample (for the reference-style lines).
fn median_sample(c: &CaseReport) -> Sample {
    Sample {
        n: c.samples / c.trials.len().max(1) as u64,
        p50_ms: c.p50_ms.median,
        p95_ms: c.p95_ms.median,
        p99_ms: c.p99_ms.median,
        min_ms: c.min_ms.median,
        max_ms: c.max_ms.median,
        mean_ms: c.mean_ms.median,
        ops_per_sec: c.ops_per_sec.median,
        errors: c.errors,
        ledger_mismatches: c.ledger_mismatches,
        ..Sample::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_the_reference_format() {
        let s = crate::report::tests::sample(1.25, 400.0);
        assert_eq!(
            benchmark_line("Reserve", &s),
            "[Benchmark] Reserve              p50=1.250ms  p95=1.875ms  p99=2.500ms  min=0.625ms  max=3.750ms"
        );
        assert!(concurrent_line(8, 5.0, &s)
            .starts_with("[Concurrent]  8 clients: 200 ops in 5s = 400.0 ops/s"));
        assert!(
            fanout_line("shared", 10, 5.0, &s).contains("error_rate=0.00%  ledger_mismatches=0")
        );
    }

    #[test]
    fn render_mentions_every_case_and_target() {
        let r = crate::report::tests::report("strict", 1.0);
        let text = render(&r);
        for needle in [
            "Reserve",
            "Commit",
            "Lifecycles 32 clients",
            "[Fanout] shared 200",
            "Targets:",
            "MISS",
            "Ledger mismatches: 1",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        assert_eq!(ms(f64::NAN), "n/a");
        assert_eq!(ms(123.456), "123.5");
    }

    #[test]
    fn render_names_the_instances_clients_were_spread_over() {
        let mut r = crate::report::tests::report("none", 1.0);
        assert!(render(&r).starts_with("Cycles benchmark: http://127.0.0.1:7878  engine="));
        r.target.spread_urls = vec![
            "http://127.0.0.1:7879".into(),
            "http://127.0.0.1:7880".into(),
        ];
        assert!(render(&r).starts_with(
            "Cycles benchmark: http://127.0.0.1:7878 (concurrent cells spread over it and \
             http://127.0.0.1:7879, http://127.0.0.1:7880)  engine="
        ));
    }
}
