//! Storage faults (the embedded engine): a journal `write` or `fdatasync` failing with EIO,
//! a full disk, a read-only file system, injected into the journal's file operations. The
//! store must stop acknowledging writes at once, never acknowledge what is not durable, keep
//! serving reads (of the durable state), take writes again once the disk does — without a
//! restart — and lose nothing: after a crash and a restart, exactly the acknowledged writes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ledger::{Actor, LookupBudget};
use store::embedded::{verify, DiskFault, DiskFaults, Durability, EmbeddedConfig, EmbeddedStore};
use store::{Load, ManualClock, Store, StoreError};
use tempfile::TempDir;

use crate::recovery::{credit, provisioning, Command, T0, UNIT};

/// What `tenant:t` is allocated after provisioning.
const PROVISIONED: i64 = 10_000_000;
/// One credit's amount.
const CREDIT: i64 = 1_000;

fn open(dir: &Path, faults: Arc<DiskFaults>) -> EmbeddedStore {
    let clock = Arc::new(ManualClock::new(T0));
    let mut config = EmbeddedConfig::new(dir, Durability::Strict, clock);
    config.faults = faults;
    EmbeddedStore::open(config).expect("open store").0
}

/// `tenant:t`'s allocation, or why it could not be read.
async fn allocated(store: &EmbeddedStore) -> Result<i64, StoreError> {
    let lookup = LookupBudget {
        actor: Actor::Admin,
        scope: "tenant:t".into(),
        unit: UNIT,
    };
    let reply = store.execute(lookup, Load::Busy).await?;
    Ok(reply.result.expect("the budget exists").allocated)
}

/// Credits `tenant:t` (idempotency key `fund-{n}`): whether it was acknowledged.
async fn credited(store: &EmbeddedStore, n: usize, load: Load) -> bool {
    let Command::FundBudget(op) = credit(n) else {
        unreachable!("a credit is a funding")
    };
    match store.execute(op, load).await {
        Ok(reply) => {
            reply.result.expect("a credit is accepted");
            true
        }
        Err(StoreError::Unavailable(_)) => false,
        Err(e) => panic!("unexpected refusal: {e}"),
    }
}

/// Waits up to 10 s for `check` to hold.
async fn eventually<F: std::future::Future<Output = bool>>(mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "not within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn provision(store: &EmbeddedStore) {
    for command in provisioning() {
        command
            .execute(store, Load::Busy)
            .await
            .expect("provisioned");
    }
}

async fn a_fault_refuses_writes_serves_reads_and_heals(fault: DiskFault) {
    let dir = TempDir::new().unwrap();
    let faults = Arc::new(DiskFaults::default());
    let store = open(dir.path(), faults.clone());
    provision(&store).await;
    assert!(credited(&store, 1, Load::Busy).await);
    let before = PROVISIONED + CREDIT;
    assert_eq!(allocated(&store).await.unwrap(), before);

    faults.inject(Some(fault));
    // The first write after the fault is refused (its record could not be made durable),
    // whether the server was busy or it ran the round on its own thread.
    assert!(
        !credited(&store, 2, Load::Alone).await,
        "{fault:?}: acknowledged"
    );
    assert!(!store.health().ready);
    // Reads are served, from the durable state: the refused credit is not in it.
    eventually(|| async { allocated(&store).await.is_ok() }).await;
    assert_eq!(allocated(&store).await.unwrap(), before);
    assert!(!credited(&store, 3, Load::Busy).await);
    assert!(!credited(&store, 4, Load::Alone).await);
    assert!(
        store.health().detail.contains("serving reads"),
        "{:?}",
        store.health()
    );
    assert_eq!(allocated(&store).await.unwrap(), before);

    // The disk takes writes again: so does the store, without a restart. The refused credit
    // retried under its idempotency key is recorded once.
    faults.inject(None);
    eventually(|| async { store.health().ready }).await;
    assert!(credited(&store, 2, Load::Busy).await);
    assert!(
        credited(&store, 2, Load::Busy).await,
        "an idempotent replay"
    );
    assert!(credited(&store, 5, Load::Alone).await);
    let after = before + 2 * CREDIT;
    assert_eq!(allocated(&store).await.unwrap(), after);

    // A crash (no shutdown) and a restart: exactly the acknowledged credits.
    drop(store);
    let (recovered, violations) = verify(dir.path()).expect("verify");
    assert!(violations.is_empty(), "{violations:?}");
    let store = open(dir.path(), Arc::default());
    assert_eq!(
        allocated(&store).await.unwrap(),
        after,
        "{fault:?}: {recovered:?}"
    );
    assert!(credited(&store, 6, Load::Busy).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_refuses_writes_serves_reads_and_heals() {
    a_fault_refuses_writes_serves_reads_and_heals(DiskFault::WriteError).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_fdatasync_refuses_writes_serves_reads_and_heals() {
    a_fault_refuses_writes_serves_reads_and_heals(DiskFault::SyncError).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_serves_reads_and_heals() {
    a_fault_refuses_writes_serves_reads_and_heals(DiskFault::NoSpace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_disk_refuses_writes_serves_reads_and_heals() {
    a_fault_refuses_writes_serves_reads_and_heals(DiskFault::ReadOnly).await;
}

/// Credits from many writers while the disk fails and recovers, again and again: every
/// acknowledged credit is in the state, during and after a restart, and no refused one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_under_load_lose_nothing_acknowledged_and_record_nothing_refused() {
    const WRITERS: usize = 8;
    let dir = TempDir::new().unwrap();
    let faults = Arc::new(DiskFaults::default());
    let store = Arc::new(open(dir.path(), faults.clone()));
    provision(&store).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut acknowledged, mut refused, mut n) = (0i64, 0usize, 0usize);
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let load = if n % 3 == 0 { Load::Alone } else { Load::Busy };
                    if credited(&store, w * 1_000_000 + n, load).await {
                        acknowledged += 1;
                    } else {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                (acknowledged, refused)
            })
        })
        .collect();
    let kinds = [
        DiskFault::SyncError,
        DiskFault::WriteError,
        DiskFault::NoSpace,
        DiskFault::ReadOnly,
    ];
    for round in 0..12 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        faults.inject(Some(kinds[round % kinds.len()]));
        tokio::time::sleep(Duration::from_millis(60)).await;
        faults.inject(None);
        eventually(|| async { store.health().ready }).await;
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut acknowledged, mut refused) = (0, 0);
    for writer in writers {
        let (a, r) = writer.await.unwrap();
        acknowledged += a;
        refused += r;
    }
    assert!(
        acknowledged > 100 && refused > 0,
        "{acknowledged} / {refused}"
    );
    let expected = PROVISIONED + acknowledged * CREDIT;
    assert_eq!(allocated(&store).await.unwrap(), expected);
    drop(store);
    let (_, violations) = verify(dir.path()).expect("verify");
    assert!(violations.is_empty(), "{violations:?}");
    let store = open(dir.path(), Arc::default());
    assert_eq!(allocated(&store).await.unwrap(), expected);
    eprintln!("{acknowledged} credits acknowledged, {refused} refused across 12 faults");
}
