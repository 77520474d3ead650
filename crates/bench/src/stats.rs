//! Statistics: nearest-rank percentiles over every timing (the reference's method), HDR
//! histograms for the concurrent cells, and medians with their spread across trials.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::server::PerOp;

/// The reference's percentile: element `min(ceil(p/100 × N) − 1, N − 1)` of the sorted
/// timings. With N = 200, p50 is element 99, p95 element 189, p99 element 197.
pub fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

/// The median (the mean of the two middle values for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// JSON has no NaN: serde_json writes a missing measurement as `null`; read it back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One trial of one case. Times in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub n: u64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p50_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p95_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p99_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub min_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub max_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub mean_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ops_per_sec: f64,
    pub errors: u64,
    pub ledger_mismatches: u64,
    /// Server-side counters per measured operation, when `/metrics` has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations_per_op: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syncs_per_op: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_per_op: Option<f64>,
    /// Server CPU time per measured operation (a local server, `--server-pid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_cpu_us_per_op: Option<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Sample {
    /// Sequential timings: nearest-rank percentiles; ops/s is the sequential rate
    /// (operations over the time spent in them).
    pub fn from_timings(timings: &[Duration], errors: u64) -> Sample {
        let mut v: Vec<f64> = timings.iter().copied().map(ms).collect();
        v.sort_by(f64::total_cmp);
        let total: f64 = v.iter().sum();
        let n = v.len();
        Sample {
            n: n as u64,
            p50_ms: nearest_rank(&v, 50.0),
            p95_ms: nearest_rank(&v, 95.0),
            p99_ms: nearest_rank(&v, 99.0),
            min_ms: v.first().copied().unwrap_or(f64::NAN),
            max_ms: v.last().copied().unwrap_or(f64::NAN),
            mean_ms: if n == 0 { f64::NAN } else { total / n as f64 },
            ops_per_sec: if total > 0.0 {
                n as f64 / (total / 1e3)
            } else {
                0.0
            },
            errors,
            ..Sample::default()
        }
    }

    /// The server's counters per measured operation.
    pub fn set_server(&mut self, per_op: &PerOp) {
        self.allocations_per_op = per_op.metered.allocations;
        self.syncs_per_op = per_op.metered.syncs;
        self.batches_per_op = per_op.metered.batches;
        self.server_cpu_us_per_op = per_op.cpu_us;
    }

    /// A concurrent cell: percentiles from an HDR histogram in microseconds; ops/s is
    /// successes over the nominal measurement window (the reference's formula).
    pub fn from_histogram(h: &Histogram<u64>, window: Duration, errors: u64) -> Sample {
        let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
        let n = h.len();
        let empty = n == 0;
        let or_nan = |v: f64| if empty { f64::NAN } else { v };
        Sample {
            n,
            p50_ms: or_nan(q(0.50)),
            p95_ms: or_nan(q(0.95)),
            p99_ms: or_nan(q(0.99)),
            min_ms: or_nan(h.min() as f64 / 1e3),
            max_ms: or_nan(h.max() as f64 / 1e3),
            mean_ms: or_nan(h.mean() / 1e3),
            ops_per_sec: n as f64 / window.as_secs_f64(),
            errors,
            ..Sample::default()
        }
    }
}

/// A histogram for latencies from 1 µs to 60 s at 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant histogram bounds are valid")
}

/// Records one latency in microseconds (clamped to the histogram's range).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record((d.as_micros() as u64).max(1));
}

/// A metric across trials: the median, and the min–max range so the noise is visible.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    #[serde(deserialize_with = "nan_if_null")]
    pub median: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub min: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        Spread {
            median: median(&finite),
            min: finite.iter().copied().fold(f64::NAN, f64::min),
            max: finite.iter().copied().fold(f64::NAN, f64::max),
        }
    }

    /// The spread of an optional metric: `None` when no trial measured it.
    pub fn of_some(values: impl Iterator<Item = Option<f64>>) -> Option<Spread> {
        let v: Vec<f64> = values.flatten().collect();
        (!v.is_empty()).then(|| Spread::of(&v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_matches_the_reference_indexes() {
        let v: Vec<f64> = (0..200).map(f64::from).collect();
        assert_eq!(nearest_rank(&v, 50.0), 99.0);
        assert_eq!(nearest_rank(&v, 95.0), 189.0);
        assert_eq!(nearest_rank(&v, 99.0), 197.0);
        assert_eq!(nearest_rank(&v, 100.0), 199.0);
        assert_eq!(nearest_rank(&v, 0.0), 0.0);
        assert_eq!(nearest_rank(&[7.0], 99.0), 7.0);
        assert!(nearest_rank(&[], 50.0).is_nan());
        let small = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(nearest_rank(&small, 50.0), 3.0);
        assert_eq!(nearest_rank(&small, 95.0), 5.0);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn sample_from_timings() {
        let t: Vec<Duration> = (1..=200).rev().map(Duration::from_millis).collect();
        let s = Sample::from_timings(&t, 2);
        assert_eq!((s.n, s.errors), (200, 2));
        assert_eq!((s.p50_ms, s.p95_ms, s.p99_ms), (100.0, 190.0, 198.0));
        assert_eq!((s.min_ms, s.max_ms), (1.0, 200.0));
        assert!((s.mean_ms - 100.5).abs() < 1e-9);
        assert!((s.ops_per_sec - 200.0 / 20.1).abs() < 1e-9);
    }

    #[test]
    fn sample_from_histogram() {
        let mut h = histogram();
        for ms in 1..=100 {
            record(&mut h, Duration::from_millis(ms));
        }
        let s = Sample::from_histogram(&h, Duration::from_secs(5), 0);
        assert_eq!(s.n, 100);
        assert!((s.p50_ms - 50.0).abs() < 0.1, "{}", s.p50_ms);
        assert!((s.p99_ms - 99.0).abs() < 0.1, "{}", s.p99_ms);
        assert_eq!(s.ops_per_sec, 20.0);
        assert!(
            Sample::from_histogram(&histogram(), Duration::from_secs(1), 3)
                .p50_ms
                .is_nan()
        );
    }

    #[test]
    fn spread_ignores_missing_values() {
        let s = Spread::of(&[3.0, f64::NAN, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of_some([None, None].into_iter()), None);
        let some = Spread::of_some([Some(4.0), None].into_iter()).unwrap();
        assert_eq!(some.median, 4.0);
    }
}
