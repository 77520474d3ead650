//! `cycles verify`: recover a data directory read-only and check every ledger rule.

use std::path::Path;

use anyhow::bail;

use crate::output::say;
use crate::serve::RedisTarget;

pub fn run(data_dir: &Path) -> anyhow::Result<()> {
    if !data_dir.is_dir() {
        bail!("{} is not a data directory", data_dir.display());
    }
    let (recovered, violations) = store::embedded::verify(data_dir)?;
    let budgets = recovered.state.budgets().count();
    say!(
        "snapshot: {}, journal records replayed: {}, last seq: {}, torn tail: {} bytes",
        recovered
            .snapshot_seq
            .map_or("none".to_string(), |s| s.to_string()),
        recovered.records_replayed,
        recovered.last_seq,
        recovered.truncated_bytes
    )?;
    say!(
        "budgets: {budgets}, reservations: {}",
        recovered.state.reservation_count()
    )?;
    report(&violations)
}

/// Reads a Redis engine's ledger (its snapshot and the log after it, read-only) and checks
/// it.
pub fn run_redis(target: &RedisTarget) -> anyhow::Result<()> {
    let verified = store::redis::verify(
        &target.redis_url,
        &target.topology(),
        &target.redis_namespace,
    )?;
    let snapshot = verified
        .snapshot
        .map_or("none".to_string(), |v| format!("up to record {v}"));
    say!(
        "ledger '{}': snapshot: {snapshot}, log records read after it: {}",
        target.redis_namespace,
        verified.records
    )?;
    say!(
        "budgets: {}, reservations: {}",
        verified.state.budgets().count(),
        verified.state.reservation_count()
    )?;
    report(&verified.violations)
}

fn report(violations: &[ledger::Violation]) -> anyhow::Result<()> {
    if violations.is_empty() {
        say!("OK: every budget satisfies remaining = allocated - spent - reserved - debt, and reserved equals its ACTIVE holds")?;
        return Ok(());
    }
    for v in violations {
        say!("VIOLATION: {}", v.0)?;
    }
    bail!("{} violation(s)", violations.len())
}
