//! Timing loops: sequential (the write and read classes) and concurrent (the lifecycle and
//! fan-out cells).

use std::ops::Range;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::api::Runtime;
use crate::progress::Phase;
use crate::stats::{histogram, record};

/// What a loop measured: the timings of the successful operations, and the failures.
#[derive(Default)]
pub struct Timed {
    pub timings: Vec<Duration>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Timed {
    fn fail(&mut self, e: anyhow::Error) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!("{e:#}"));
        }
    }

    /// Adds a warm-up's failures (its timings are discarded).
    pub fn absorb_errors(&mut self, warmup: Timed) {
        self.errors += warmup.errors;
        if self.first_error.is_none() {
            self.first_error = warmup.first_error;
        }
    }
}

/// Runs `op(i)` for each `i` in `range`, strictly one after another, timing each whole
/// operation (for composites, every HTTP call of it).
pub async fn sequential(
    range: Range<usize>,
    phase: &Phase,
    op: &mut impl AsyncFnMut(usize) -> anyhow::Result<()>,
) -> Timed {
    let mut out = Timed {
        timings: Vec::with_capacity(range.len()),
        ..Timed::default()
    };
    for i in range {
        let started = Instant::now();
        let result = op(i).await;
        let took = started.elapsed();
        match result {
            Ok(()) => out.timings.push(took),
            Err(e) => out.fail(e),
        }
        phase.inc(1);
    }
    out
}

/// What one concurrent client does per iteration.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LoadOp {
    /// Reserve 100 then commit 80, back to back: one lifecycle.
    Lifecycle,
    /// Reserve 100 only (the fan-out cells).
    Reserve,
}

impl LoadOp {
    pub async fn once(self, rt: &mut Runtime) -> anyhow::Result<()> {
        let id = rt.reserve().await?;
        if self == LoadOp::Lifecycle {
            rt.commit(&id).await?;
        }
        Ok(())
    }
}

/// A concurrent cell's outcome; `per_client` counts each client's successes.
pub struct Load {
    pub histogram: Histogram<u64>,
    pub per_client: Vec<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Every client loops `op` until `window` has passed since they were all released;
/// operations in flight at the deadline finish and are counted (as in the reference).
/// Clients must be connected beforehand.
pub async fn concurrent(clients: Vec<Runtime>, op: LoadOp, window: Duration) -> Load {
    let deadline = Instant::now() + window;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut rt| {
            tokio::spawn(async move {
                let mut h = histogram();
                let mut timed = Timed::default();
                while Instant::now() < deadline {
                    let started = Instant::now();
                    match op.once(&mut rt).await {
                        Ok(()) => record(&mut h, started.elapsed()),
                        Err(e) => timed.fail(e),
                    }
                }
                (h, timed)
            })
        })
        .collect();
    let mut load = Load {
        histogram: histogram(),
        per_client: Vec::with_capacity(tasks.len()),
        errors: 0,
        first_error: None,
    };
    for task in tasks {
        match task.await {
            Ok((h, timed)) => {
                load.per_client.push(h.len());
                load.histogram
                    .add(&h)
                    .expect("histograms with identical bounds always merge");
                load.errors += timed.errors;
                load.first_error = load.first_error.or(timed.first_error);
            }
            Err(e) => {
                load.per_client.push(0);
                load.errors += 1;
                load.first_error = load.first_error.or(Some(format!("client task: {e}")));
            }
        }
    }
    load
}
