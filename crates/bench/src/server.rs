//! What the suite reads about the server itself: its `/metrics` counters and, when it runs
//! on this machine, its process in `/proc`.

use std::time::Duration;

/// The value of an unlabelled Prometheus sample `name` in `text`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

pub const ALLOCATIONS: &str = "cycles_heap_allocations_total";
pub const SYNCS: &str = "cycles_journal_syncs_total";
pub const BATCHES: &str = "cycles_store_batches_total";
pub const COMMANDS: &str = "cycles_store_commands_total";
pub const PEAK_RSS: &str = "process_peak_resident_memory_bytes";

/// Counters whose growth over the whole run the report records (embedded engine).
pub const RUN_COUNTERS: [&str; 7] = [
    "cycles_store_commands_total",
    "cycles_store_batches_total",
    "cycles_journal_syncs_total",
    "cycles_journal_bytes_total",
    "cycles_snapshots_total",
    "cycles_heap_allocations_total",
    "cycles_reservations",
];

/// `after − before` for each of [`RUN_COUNTERS`] present in both texts.
pub fn run_deltas(
    before: Option<&str>,
    after: Option<&str>,
) -> std::collections::BTreeMap<String, f64> {
    RUN_COUNTERS
        .iter()
        .filter_map(|name| {
            let delta = metric(after?, name)? - metric(before?, name)?;
            Some((name.to_string(), delta))
        })
        .collect()
}

/// The server counters the suite reads around a measured block.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    pub allocations: Option<f64>,
    pub syncs: Option<f64>,
    pub batches: Option<f64>,
    /// CPU time of a local server's threads, in microseconds (see [`cpu_us`]).
    pub cpu_us: Option<f64>,
}

impl Counters {
    pub fn parse(text: Option<&str>) -> Counters {
        let get = |name| text.and_then(|t| metric(t, name));
        Counters {
            allocations: get(ALLOCATIONS),
            syncs: get(SYNCS),
            batches: get(BATCHES),
            cpu_us: None,
        }
    }

    /// `(self − before − overhead) / ops` per counter (`overhead`: what reading the
    /// counters twice costs by itself, measured).
    pub fn per_op(&self, before: &Counters, overhead: &Counters, ops: usize) -> Counters {
        let per = |after: Option<f64>, before: Option<f64>, extra: Option<f64>| {
            let delta = after? - before? - extra.unwrap_or(0.0);
            (ops > 0).then(|| delta.max(0.0) / ops as f64)
        };
        Counters {
            allocations: per(self.allocations, before.allocations, overhead.allocations),
            syncs: per(self.syncs, before.syncs, overhead.syncs),
            batches: per(self.batches, before.batches, overhead.batches),
            cpu_us: per(self.cpu_us, before.cpu_us, overhead.cpu_us),
        }
    }
}

/// CPU time a local process's live threads have used, in microseconds: the sum of each
/// thread's scheduler run time (`/proc/<pid>/task/*/schedstat`, nanoseconds — the tick
/// counts of `/proc/<pid>/stat` are too coarse for a 200-request block). A thread that ended
/// in between (a finished snapshot) drops out of the sum, so a block that spans one reads
/// low; the figure is for comparing builds, not an exact bill.
pub fn cpu_us(pid: u32) -> Option<f64> {
    let mut total_ns: u64 = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        total_ns += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total_ns as f64 / 1e3)
}

/// Peak resident memory (`VmHWM`) of a local process, in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU time (user + system, in clock ticks) a local process has used.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Waits until a local server is idle (under 5% of a core over half a second; e.g. after a
/// fixture build triggered a snapshot), at most `limit`. Without a pid: a fixed pause.
pub async fn settle(pid: Option<u32>, limit: Duration) {
    let Some(pid) = pid else {
        tokio::time::sleep(Duration::from_secs(2)).await;
        return;
    };
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        let Some(a) = cpu_ticks(pid) else { return };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(b) = cpu_ticks(pid) else { return };
        // 100 ticks per second: 5% of a core over 0.5 s is 2.5 ticks.
        if b.saturating_sub(a) <= 2 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP cycles_journal_syncs_total fdatasync calls.\n\
        # TYPE cycles_journal_syncs_total counter\n\
        cycles_journal_syncs_total 42\n\
        cycles_http_requests_total{method=\"GET\",route=\"/x\",status=\"200\"} 7\n\
        cycles_heap_allocations_total 1000\n";

    #[test]
    fn reads_unlabelled_samples() {
        assert_eq!(metric(TEXT, SYNCS), Some(42.0));
        assert_eq!(metric(TEXT, ALLOCATIONS), Some(1000.0));
        assert_eq!(metric(TEXT, "cycles_http_requests_total"), None);
        assert_eq!(metric(TEXT, BATCHES), None);
    }

    #[test]
    fn run_deltas_cover_counters_in_both_texts() {
        let later = TEXT.replace("syncs_total 42", "syncs_total 50");
        let d = run_deltas(Some(TEXT), Some(&later));
        assert_eq!(d.get(SYNCS), Some(&8.0));
        assert_eq!(d.get(ALLOCATIONS), Some(&0.0));
        assert!(!d.contains_key(BATCHES));
        assert!(run_deltas(None, Some(TEXT)).is_empty());
    }

    #[test]
    fn per_op_subtracts_the_reading_overhead() {
        let before = Counters {
            allocations: Some(1000.0),
            syncs: Some(10.0),
            batches: None,
            cpu_us: Some(500.0),
        };
        let after = Counters {
            allocations: Some(3050.0),
            syncs: Some(210.0),
            batches: Some(5.0),
            cpu_us: Some(10_500.0),
        };
        let overhead = Counters {
            allocations: Some(50.0),
            cpu_us: Some(2_000.0),
            ..Counters::default()
        };
        let p = after.per_op(&before, &overhead, 200);
        assert_eq!(p.allocations, Some(10.0));
        assert_eq!(p.cpu_us, Some(40.0));
        assert_eq!(p.syncs, Some(1.0));
        assert_eq!(p.batches, None);
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(peak_rss(pid).unwrap() > 0);
        assert!(cpu_ticks(pid).is_some());
        let spin = std::time::Instant::now();
        let before = cpu_us(pid).unwrap();
        while spin.elapsed() < Duration::from_millis(20) {}
        assert!(cpu_us(pid).unwrap() > before, "spinning used CPU");
    }
}
