//! What the suite reads about the server itself: its `/metrics` counters and, when it runs
//! on this machine, its process in `/proc`.

use std::collections::BTreeMap;
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
/// Exported only by the Redis engine.
pub const REDIS_ROUNDS: &str = "cycles_redis_rounds_total";
pub const PEAK_RSS: &str = "process_peak_resident_memory_bytes";
pub const AUDIT_ENTRIES: &str = "cycles_audit_entries";
pub const ARCHIVED: &str = "cycles_reservations_archived";

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

/// The `/metrics` counters the suite follows: totals in a [`Counters`] reading, per
/// operation in a [`PerOp`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Metered {
    pub allocations: Option<f64>,
    pub syncs: Option<f64>,
    pub batches: Option<f64>,
}

/// What the suite reads about the server around a measured block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    pub metered: Metered,
    /// The CPU clocks of a local server (see [`CpuClock`]).
    pub cpu: Option<CpuClock>,
}

/// What a measured block cost the server, per operation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerOp {
    pub metered: Metered,
    /// Server CPU time in microseconds.
    pub cpu_us: Option<f64>,
}

impl Counters {
    pub fn parse(text: Option<&str>) -> Counters {
        let get = |name| text.and_then(|t| metric(t, name));
        Counters {
            metered: Metered {
                allocations: get(ALLOCATIONS),
                syncs: get(SYNCS),
                batches: get(BATCHES),
            },
            cpu: None,
        }
    }

    /// `(self − before − overhead) / ops` per counter (`overhead`: what reading the
    /// counters twice costs by itself, measured, as the cost of one operation).
    pub fn per_op(&self, before: &Counters, overhead: &PerOp, ops: usize) -> PerOp {
        let per = |delta: Option<f64>, extra: Option<f64>| {
            let delta = delta? - extra.unwrap_or(0.0);
            (ops > 0).then(|| delta.max(0.0) / ops as f64)
        };
        let counter = |field: fn(&Metered) -> Option<f64>| {
            let delta = Some(field(&self.metered)? - field(&before.metered)?);
            per(delta, field(&overhead.metered))
        };
        let cpu = match (&self.cpu, &before.cpu) {
            (Some(after), Some(before)) => Some(after.us_since(before)),
            _ => None,
        };
        PerOp {
            metered: Metered {
                allocations: counter(|m| m.allocations),
                syncs: counter(|m| m.syncs),
                batches: counter(|m| m.batches),
            },
            cpu_us: per(cpu, overhead.cpu_us),
        }
    }
}

/// A local process's CPU clocks at one instant: each live thread's scheduler run time
/// (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds; the tick counts of `/proc/<pid>/stat`
/// are too coarse for a 200-request block) and the process's tick count, which keeps the
/// time of threads that have ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuClock {
    threads: BTreeMap<u64, u64>,
    ticks: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

impl CpuClock {
    pub fn read(pid: u32) -> Option<CpuClock> {
        let mut threads = BTreeMap::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let task = task.ok()?;
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            // A thread that ends while the directory is read is skipped.
            let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
                continue;
            };
            threads.insert(tid, stat.split_whitespace().next()?.parse().ok()?);
        }
        Some(CpuClock {
            threads,
            ticks: cpu_ticks(pid)?,
        })
    }

    /// Microseconds of CPU used since `earlier`: the exact sum of the threads' run times when
    /// every thread of `earlier` is still alive. When one ended in between (a finished
    /// snapshot writer, say), its run time left with it and the sum would read low, so the
    /// process's tick count is used instead (10 ms resolution, the ended thread included).
    pub fn us_since(&self, earlier: &CpuClock) -> f64 {
        let all_alive = earlier
            .threads
            .keys()
            .all(|tid| self.threads.contains_key(tid));
        if all_alive {
            let ns: u64 = self
                .threads
                .iter()
                .map(|(tid, ns)| ns.saturating_sub(earlier.threads.get(tid).copied().unwrap_or(0)))
                .sum();
            ns as f64 / 1e3
        } else {
            self.ticks.saturating_sub(earlier.ticks) as f64 * 1e6 / TICKS_PER_SECOND
        }
    }
}

/// Resident memory now (`VmRSS`) of a local process, in bytes.
pub fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
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
        let clock = |ns: u64| CpuClock {
            threads: BTreeMap::from([(1, ns)]),
            ticks: 0,
        };
        let before = Counters {
            metered: Metered {
                allocations: Some(1000.0),
                syncs: Some(10.0),
                batches: None,
            },
            cpu: Some(clock(500_000)),
        };
        let after = Counters {
            metered: Metered {
                allocations: Some(3050.0),
                syncs: Some(210.0),
                batches: Some(5.0),
            },
            cpu: Some(clock(10_500_000)),
        };
        let overhead = PerOp {
            metered: Metered {
                allocations: Some(50.0),
                ..Metered::default()
            },
            cpu_us: Some(2_000.0),
        };
        let p = after.per_op(&before, &overhead, 200);
        assert_eq!(p.metered.allocations, Some(10.0));
        assert_eq!(p.cpu_us, Some(40.0));
        assert_eq!(p.metered.syncs, Some(1.0));
        assert_eq!(p.metered.batches, None);
    }

    #[test]
    fn own_process_is_readable() {
        let pid = std::process::id();
        assert!(peak_rss(pid).unwrap() > 0);
        assert!(cpu_ticks(pid).is_some());
        let spin = std::time::Instant::now();
        let before = CpuClock::read(pid).unwrap();
        while spin.elapsed() < Duration::from_millis(20) {}
        let used = CpuClock::read(pid).unwrap().us_since(&before);
        assert!(used > 0.0, "spinning used CPU");
    }

    #[test]
    fn cpu_of_an_ended_thread_is_kept_by_the_tick_count() {
        let before = CpuClock {
            threads: BTreeMap::from([(1, 5_000_000), (2, 9_000_000)]),
            ticks: 10,
        };
        // Both threads alive: the exact sum of their run times.
        let later = CpuClock {
            threads: BTreeMap::from([(1, 6_000_000), (2, 9_500_000), (3, 250_000)]),
            ticks: 11,
        };
        assert_eq!(later.us_since(&before), 1_750.0);
        // Thread 2 ended (it ran 40 ms more first): the live threads' sum would say 1 ms,
        // the process's ticks say 50 ms.
        let after_exit = CpuClock {
            threads: BTreeMap::from([(1, 6_000_000)]),
            ticks: 15,
        };
        assert_eq!(after_exit.us_since(&before), 50_000.0);
    }
}
