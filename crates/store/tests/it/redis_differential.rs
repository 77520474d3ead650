//! The Redis engine against the pure ledger: the crash tests' workload (reservations
//! committed, released, expired by the sweep and archived, rejected second commits,
//! credits), plus credits and a reserve past 2^53 and a credit that would pass 2^63 − 1,
//! sent in turn to three instances of one ledger. Every answer must be the ledger's, and
//! the ledger read back from Redis must be the ledger's state, field for field, with every
//! rule holding.
//!
//! Needs a Redis: `CYCLES_TEST_REDIS_URL` (`.ci/run` sets it); without it the test passes
//! without running, saying so.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ledger::State;
use store::redis::{RedisConfig, RedisDurability, RedisStore};
use store::{Clock, Load, ManualClock};

use crate::recovery::{canonical, fund, reserve, workload, STEP_MS, T0};

fn redis_url() -> Option<String> {
    let url = std::env::var("CYCLES_TEST_REDIS_URL").ok();
    if url.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CYCLES_TEST_REDIS_URL is not set in CI"
        );
        eprintln!("skipped: the Redis differential test needs CYCLES_TEST_REDIS_URL");
    }
    url
}

fn open(url: &str, namespace: &str, clock: Arc<ManualClock>, dir: &std::path::Path) -> RedisStore {
    let mut config = RedisConfig::new(url, dir, clock);
    config.namespace = namespace.into();
    config.durability = RedisDurability::None;
    config.timeout = std::time::Duration::from_secs(2);
    RedisStore::open(config).expect("open the Redis engine").0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_answer_as_the_ledger_and_keep_its_state() {
    let Some(url) = redis_url() else { return };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let namespace = format!("cycles-differential-{}-{nanos}", std::process::id());
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("temp dir"))
        .collect();
    let clock = Arc::new(ManualClock::new(T0));
    let stores: Vec<RedisStore> = dirs
        .iter()
        .map(|d| open(&url, &namespace, clock.clone(), d.path()))
        .collect();
    let mut commands = workload(0, 400);
    let huge = (1i64 << 53) + 1;
    commands.push(fund(90_001, huge));
    commands.push(fund(90_002, huge));
    commands.push(reserve("res-huge", huge));
    commands.push(fund(90_003, i64::MAX - 3 * huge));
    commands.push(fund(90_004, i64::MAX));
    commands.push(reserve("res-after-huge", 1_000));
    let mut model = State::new();
    for (i, command) in commands.into_iter().enumerate() {
        clock.advance(STEP_MS);
        let expected = command.clone().apply(&mut model, clock.now_ms());
        let answered = command.execute(&stores[i % stores.len()], Load::Busy).await;
        assert_eq!(
            answered, expected.result,
            "command {i}: the Redis engine and the ledger disagree"
        );
    }
    drop(stores);
    let (records, state, violations) =
        store::redis::verify(&url, false, &namespace).expect("read the ledger back");
    assert!(records > 300, "{records} records");
    assert!(violations.is_empty(), "{violations:?}");
    assert!(
        canonical(&state) == canonical(&model),
        "the ledger read back from Redis is not the ledger's state"
    );
    store::redis::delete_ledger(&url, false, &namespace).expect("delete the test ledger");
}
