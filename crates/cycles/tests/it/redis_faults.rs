//! The Redis engine when its Redis fails: killed (-9) under load and restarted from its
//! append-only file, paused, slowed, flushed, or not there yet at start. The server answers
//! 503 quickly (never 401, never a guess), loses nothing Redis acknowledged, never doubles a
//! hold when a request whose outcome it lost is retried, recovers by itself, and never
//! serves a flushed ledger.
//!
//! Each test runs its own `redis-server` on a free loopback port in a temporary directory.
//! Needs `redis-server` and `redis-cli` (`.ci/run` installs them); with `CYCLES_TEST_REDIS_URL`
//! unset (no Redis on this machine) the tests pass without running, saying so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use store::redis::{ScratchLedger, Topology};
use tempfile::TempDir;

use crate::ledger_http::{assert_redis_ledger_ok, call, provision, redis_url};
use crate::process::{
    assert_serve_refused, assert_serve_refused_in_use, assert_verify_ok, client, free_port,
    logs_in, RedisServe, Server,
};

const TENANT: &str = "faults";
const UNIT: &str = "USD_MICROCENTS";
const ESTIMATE: i64 = 1_000;
const NAMESPACE: &str = "cycles-faults";

/// Whether this machine has a Redis to test against (the tests need its binaries).
fn redis_here() -> bool {
    redis_url("CYCLES_TEST_REDIS_URL").is_some()
}

/// A tenant, a key and a budget of `allocated` at the tenant's scope; answers the key.
async fn provision_tenant(base: &str, allocated: i64) -> String {
    let budgets = [(format!("tenant:{TENANT}"), allocated)];
    provision(base, TENANT, &budgets, UNIT).await
}

/// A reserve of `ESTIMATE` under `idempotency_key`.
async fn reserve(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    idempotency_key: &str,
) -> (u16, Value) {
    let body = reserve_body(idempotency_key);
    call(http, base, "/v1/reservations", Some(key), Some(body)).await
}

/// A `redis-server` of the test's own, with its append-only file synced at every write.
struct RedisProcess {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    /// More arguments (`--replicaof …`).
    extra: Vec<String>,
}

impl RedisProcess {
    fn start(dir: &Path, port: u16) -> RedisProcess {
        RedisProcess::start_with(dir, port, &[])
    }

    fn start_with(dir: &Path, port: u16, extra: &[&str]) -> RedisProcess {
        std::fs::create_dir_all(dir).expect("redis dir");
        let mut redis = RedisProcess {
            child: None,
            port,
            dir: dir.to_path_buf(),
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        redis.spawn();
        redis
    }

    fn spawn(&mut self) {
        // A configuration file (empty: the arguments say everything), as a Sentinel needs
        // to rewrite one when it reconfigures a replica.
        let config = self.dir.join("redis.conf");
        if !config.exists() {
            std::fs::write(&config, "").expect("redis.conf");
        }
        let child = Command::new("redis-server")
            .arg(&config)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .args(["--enable-debug-command", "yes"])
            .args(&self.extra)
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.cli(&["ping"]).trim() != "PONG" {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL redis-server");
            child.wait().expect("wait redis-server");
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn reserve_body(idempotency_key: &str) -> Value {
    json!({
        "idempotency_key": idempotency_key,
        "subject": {"tenant": TENANT},
        "action": {"kind": "llm.completion", "name": "model"},
        "estimate": {"unit": UNIT, "amount": ESTIMATE},
    })
}

/// The tenant budget's (reserved, spent).
async fn held_and_spent(base: &str, key: &str) -> (i64, i64) {
    let (s, body) = call(
        &client(),
        base,
        &format!("/v1/balances?tenant={TENANT}"),
        Some(key),
        None,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let b = &body["balances"][0];
    (
        b["reserved"]["amount"].as_i64().unwrap_or(0),
        b["spent"]["amount"].as_i64().unwrap_or(0),
    )
}

async fn ready(base: &str) -> bool {
    let resp = client()
        .get(format!("{base}/actuator/health/readiness"))
        .send()
        .await;
    resp.is_ok_and(|r| r.status() == 200)
}

/// Waits (at most `within`) until the server is ready again.
async fn recovers(base: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !ready(base).await {
        assert!(
            Instant::now() < deadline,
            "the server did not recover by itself"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Rig {
    redis: RedisProcess,
    server: Server,
    /// The Redis's and the server's directories, the server's log among them.
    dir: TempDir,
}

/// Waits until a replica has synced with its primary.
/// A replica of `primary` in `dir`, on a free port, once it has synced.
fn start_replica(dir: &Path, primary: &RedisProcess) -> RedisProcess {
    let primary_port = primary.port.to_string();
    let replica_of = ["--replicaof", "127.0.0.1", primary_port.as_str()];
    let replica = RedisProcess::start_with(dir, free_port(), &replica_of);
    linked(&replica);
    replica
}

fn linked(replica: &RedisProcess) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !replica
        .cli(&["info", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "the replica did not sync");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A Redis of the test's own and a server on it, with a short timeout.
async fn rig(timeout_ms: &str) -> Rig {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisProcess::start(dir.path(), free_port());
    let url = redis.url();
    let mut serve = RedisServe::new(&url, false, NAMESPACE);
    serve.durability = "aof";
    serve.timeout_ms = timeout_ms;
    // Compactions run through the faults too, and settled reservations are archived at
    // once: a new instance reads them from the history streams.
    serve.extra = vec!["--redis-snapshot-records", "500", "--archive-after-ms", "0"];
    let server = Server::start_redis(&dir.path().join("data"), dir.path(), &serve).await;
    Rig { redis, server, dir }
}

/// What one client was told.
#[derive(Default)]
struct Told {
    /// (reservation id, committed amount if the commit was acknowledged).
    acked: Vec<(String, Option<i64>)>,
    unavailable: usize,
    unexpected: Vec<(u16, Value)>,
}

/// Eight clients running `lifecycles` until the flag is set.
fn clients_under_load(
    base: &str,
    key: &str,
) -> (Arc<AtomicBool>, Vec<tokio::task::JoinHandle<Told>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let clients = (0..8)
        .map(|c| {
            let (base, key) = (base.to_string(), key.to_string());
            tokio::spawn(lifecycles(base, key, format!("client{c}"), stop.clone()))
        })
        .collect();
    (stop, clients)
}

/// Reserve → commit until `stop`, going on through 503s.
async fn lifecycles(base: String, key: String, name: String, stop: Arc<AtomicBool>) -> Told {
    let http = client();
    let mut told = Told::default();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let (status, reply) = reserve(&http, &base, &key, &format!("{name}-r{n}")).await;
        let id = match (status, reply["reservation_id"].as_str()) {
            (200, Some(id)) => id.to_string(),
            (503, _) => {
                told.unavailable += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            _ => {
                told.unexpected.push((status, reply));
                continue;
            }
        };
        let actual = 1 + (n * 37) % ESTIMATE;
        let body = json!({"idempotency_key": format!("{name}-c{n}"), "actual": {"unit": UNIT, "amount": actual}});
        let (status, reply) = call(
            &http,
            &base,
            &format!("/v1/reservations/{id}/commit"),
            Some(&key),
            Some(body),
        )
        .await;
        match status {
            200 => told.acked.push((id, Some(actual))),
            503 => {
                told.unavailable += 1;
                told.acked.push((id, None));
            }
            _ => told.unexpected.push((status, reply)),
        }
    }
    told
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_redis_under_load_loses_nothing_it_acknowledged() {
    if !redis_here() {
        return;
    }
    let mut rig = rig("200").await;
    let base = rig.server.base.clone();
    let key = provision_tenant(&base, 1_000_000_000_000).await;
    let (stop, clients) = clients_under_load(&base, &key);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    rig.redis.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    rig.redis.spawn();
    recovers(&base, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut told = Vec::new();
    for c in clients {
        told.push(c.await.expect("client"));
    }
    let unavailable: usize = told.iter().map(|t| t.unavailable).sum();
    assert!(unavailable > 0, "the outage must have been seen");
    let checked = assert_acknowledged_present(&base, &told).await;
    eprintln!(
        "acknowledged reservations checked: {checked}; 503s during the outage: {unavailable}"
    );
    assert!(checked > 0);
    // Writes go on after the restart.
    let http = client();
    let (s, r) = reserve(&http, &base, &key, "after-restart").await;
    assert_eq!(s, 200, "{r}");
    let snapshots = metric(&base, "cycles_redis_snapshots_total").await;
    assert!(snapshots > 0, "no compaction ran");
    // A new instance reads the ledger and its history from what Redis kept: the
    // snapshot, the history streams and the log after the snapshot.
    let fresh = tempfile::tempdir().expect("temp dir");
    let url = rig.redis.url();
    let mut serve = RedisServe::new(&url, false, NAMESPACE);
    serve.durability = "aof";
    let other = Server::start_redis(&fresh.path().join("data"), fresh.path(), &serve).await;
    assert_eq!(
        assert_acknowledged_present(&other.base, &told).await,
        checked
    );
    let archived = metric(&other.base, "cycles_reservations_archived").await;
    assert!(
        archived > 0,
        "the new instance found no archived reservation"
    );
    assert_redis_ledger_ok(&rig.redis.url(), false, NAMESPACE);
}

/// A value on the server's `/metrics`.
async fn metric(base: &str, name: &str) -> u64 {
    let (s, metrics) = call(&client(), base, "/metrics", None, None).await;
    assert_eq!(s, 200);
    metrics
        .as_str()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

/// Every reservation a client was told was held is there, committed where its commit was
/// acknowledged; answers how many were checked.
async fn assert_acknowledged_present(base: &str, told: &[Told]) -> usize {
    let http = client();
    let mut checked = 0;
    for t in told {
        assert!(
            t.unexpected.is_empty(),
            "answers other than 200 and 503: {:?}",
            t.unexpected
        );
        for (id, committed) in &t.acked {
            let (s, r) = call(&http, base, &format!("/v1/reservations/{id}"), None, None).await;
            assert_eq!(
                s, 200,
                "acknowledged reservation {id} is gone from {base}: {r}"
            );
            match committed {
                Some(amount) => {
                    assert_eq!(r["status"], "COMMITTED", "{id}: {r}");
                    assert_eq!(r["committed"]["amount"].as_i64(), Some(*amount), "{id}");
                }
                // Its commit's outcome was not known: either is right.
                None => assert!(
                    r["status"] == "ACTIVE" || r["status"] == "COMMITTED",
                    "{id}: {r}"
                ),
            }
            checked += 1;
        }
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_or_slow_redis_is_answered_503_at_once_and_a_retry_never_doubles_a_hold() {
    if !redis_here() {
        return;
    }
    let rig = rig("100").await;
    let base = rig.server.base.clone();
    let key = provision_tenant(&base, 1_000_000).await;
    let http = client();
    for (fault, retry_key) in [("pause", "paused-reserve"), ("sleep", "slept-reserve")] {
        let (held_before, _) = held_and_spent(&base, &key).await;
        let port = rig.redis.port.to_string();
        let blocker = std::thread::spawn(move || {
            let args: &[&str] = match fault {
                "pause" => &["client", "pause", "2000", "ALL"],
                _ => &["debug", "sleep", "2"],
            };
            Command::new("redis-cli")
                .args(["-p", &port])
                .args(args)
                .output()
                .expect("redis-cli")
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The request whose outcome the server loses: it may or may not be recorded.
        let started = Instant::now();
        let (s, r) = reserve(&http, &base, &key, retry_key).await;
        assert_eq!(s, 503, "{fault}: {r}");
        assert!(
            started.elapsed() < Duration::from_millis(1_500),
            "{fault}: 503 took {:?}",
            started.elapsed()
        );
        // While it is out: 503 at once (the breaker), readiness DOWN, never a 401.
        let started = Instant::now();
        let (s, r) = call(
            &http,
            &base,
            &format!("/v1/balances?tenant={TENANT}"),
            Some(&key),
            None,
        )
        .await;
        assert_eq!(s, 503, "{fault}: {r}");
        assert!(
            started.elapsed() < Duration::from_millis(1_500),
            "{fault}: the second 503 took {:?}",
            started.elapsed()
        );
        assert!(!ready(&base).await, "{fault}: readiness must be DOWN");
        blocker.join().expect("redis-cli thread");
        recovers(&base, Duration::from_secs(10)).await;
        // The retry with the same key answers the first request, whatever became of it:
        // one hold, never two.
        let (s, r) = reserve(&http, &base, &key, retry_key).await;
        assert_eq!(s, 200, "{fault}: {r}");
        let (s, again) = reserve(&http, &base, &key, retry_key).await;
        assert_eq!(s, 200);
        assert_eq!(
            again["reservation_id"], r["reservation_id"],
            "{fault}: a replay"
        );
        let (held, _) = held_and_spent(&base, &key).await;
        assert_eq!(
            held,
            held_before + ESTIMATE,
            "{fault}: the retried reserve holds once"
        );
    }
    assert_redis_ledger_ok(&rig.redis.url(), false, NAMESPACE);
}

/// An instance started after its predecessor died holding the lease waits for that lease
/// to lapse, on an idle Redis and with the default 50 ms timeout, without counting the
/// wait as a Redis failure: Redis ends a blocked `BLPOP` in its timer (about 100 ms late
/// at its default `hz`), and that late answer opened the breaker, so everything, reads
/// included, was refused for the lease's two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_predecessors_lapsing_lease_is_waited_for_without_refusals() {
    if !redis_here() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisProcess::start(dir.path(), free_port());
    let url = redis.url();
    let mut serve = RedisServe::new(&url, false, NAMESPACE);
    serve.timeout_ms = "50";
    let data = dir.path().join("data");
    let first = Server::start_redis(&data, dir.path(), &serve).await;
    let key = provision_tenant(&first.base, 1_000_000).await;
    let http = client();
    let (s, r) = reserve(&http, &first.base, &key, "before").await;
    assert_eq!(s, 200, "{r}");
    first.kill();
    let next = Server::start_redis(&data, dir.path(), &serve).await;
    let base = next.base.clone();
    // A read, and a write that waits for the dead holder's lease to lapse.
    let (s, r) = call(&http, &base, "/v1/reservations?limit=1", Some(&key), None).await;
    assert_eq!(s, 200, "{r}");
    let (s, r) = reserve(&http, &base, &key, "after").await;
    assert_eq!(s, 200, "{r}");
    assert!(ready(&base).await);
    assert_eq!(metric(&base, "cycles_redis_faults_total").await, 0);
    next.terminate().await;
}

/// An instance whose append failed reads the ledger again before it serves, and does not
/// wait for its history cache to write what it was handed first: under load that writer
/// is behind, and every request waited (up to five seconds) behind the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_after_a_failed_append_does_not_wait_for_the_history() {
    if !redis_here() {
        return;
    }
    let rig = rig("200").await;
    let base = rig.server.base.clone();
    let key = provision_tenant(&base, 1_000_000).await;
    let http = client();
    // The history cache's writer is held up: another connection holds its write lock.
    let path = rig.dir.path().join("data/redis-history/history.sqlite");
    let history = rusqlite::Connection::open(path).expect("open history");
    history
        .execute_batch("BEGIN IMMEDIATE")
        .expect("lock history");
    // An audited write, whose entry waits for the writer.
    let other = json!({"tenant_id": "other", "name": "other"});
    let (s, r) = call(&http, &base, "/v1/admin/tenants", None, Some(other)).await;
    assert_eq!(s, 201, "{r}");
    // A reserve (the lease renewed), then one whose append Redis holds past the timeout:
    // writes are paused, reads (the idle writer's look at its lease) are not.
    let (s, r) = reserve(&http, &base, &key, "before").await;
    assert_eq!(s, 200, "{r}");
    let pause = Duration::from_millis(2_000);
    let millis = pause.as_millis().to_string();
    assert_eq!(
        rig.redis.cli(&["client", "pause", &millis, "WRITE"]).trim(),
        "OK"
    );
    let paused = Instant::now();
    let (s, r) = reserve(&http, &base, &key, "during").await;
    assert_eq!(s, 503, "{r}");
    assert!(
        paused.elapsed() < pause,
        "the append was not refused within the pause"
    );
    tokio::time::sleep(pause.saturating_sub(paused.elapsed())).await;
    let awake = Instant::now();
    let served = loop {
        let (s, r) = reserve(&http, &base, &key, "after").await;
        if s == 200 {
            break awake.elapsed();
        }
        assert_eq!(s, 503, "{r}");
        assert!(
            awake.elapsed() < Duration::from_secs(15),
            "never served again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        served < Duration::from_secs(3),
        "served again {served:?} after Redis answered"
    );
    assert!(metric(&base, "cycles_redis_reloads_total").await >= 1);
    // Released, the writer writes the entry it was handed, once.
    history.execute_batch("ROLLBACK").expect("unlock history");
    let (s, r) = call(
        &http,
        &base,
        "/v1/admin/audit/logs?tenant_id=other",
        None,
        None,
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let created = r["logs"].as_array().expect("logs").len();
    assert_eq!(created, 1, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flushed_redis_is_never_served() {
    if !redis_here() {
        return;
    }
    let rig = rig("200").await;
    let base = rig.server.base.clone();
    let key = provision_tenant(&base, 1_000_000).await;
    assert_eq!(rig.redis.cli(&["flushall"]).trim(), "OK");
    let http = client();
    let (s, r) = reserve(&http, &base, &key, "after-flush").await;
    assert_eq!(s, 503, "{r}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (s, r) = reserve(&http, &base, &key, "after-flush-2").await;
    assert_eq!(s, 503, "a flushed ledger is never served: {r}");
    assert!(!ready(&base).await);
    // Nothing was written to the empty Redis: no new ledger appeared in it.
    assert_eq!(rig.redis.cli(&["dbsize"]).trim(), "0");
    // The webhook dispatcher, refused at every look, backs off and says so once, rather
    // than at every look (20 a second).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let said = logs_in(rig.dir.path());
    let warnings = said
        .matches("webhook dispatch could not read its work")
        .count();
    assert!(
        (1..=2).contains(&warnings),
        "{warnings} warnings in 3 s of a flushed ledger"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_started_before_its_redis_serves_once_it_is_up() {
    if !redis_here() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let mut serve = RedisServe::new(&url, false, NAMESPACE);
    serve.durability = "aof";
    serve.timeout_ms = "100";
    serve.ready = false;
    let server = Server::start_redis(&dir.path().join("data"), dir.path(), &serve).await;
    let http = client();
    let started = Instant::now();
    let (s, r) = call(
        &http,
        &server.base,
        "/v1/admin/tenants",
        None,
        Some(json!({"tenant_id": TENANT, "name": TENANT})),
    )
    .await;
    assert_eq!(s, 503, "{r}");
    assert!(started.elapsed() < Duration::from_millis(1_500));
    assert!(!ready(&server.base).await);
    let _redis = RedisProcess::start(dir.path(), port);
    recovers(&server.base, Duration::from_secs(10)).await;
    let key = provision_tenant(&server.base, 1_000_000).await;
    let (s, r) = reserve(&http, &server.base, &key, "once-up").await;
    assert_eq!(s, 200, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_wait_for_the_replicas_asked_for() {
    if !redis_here() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let primary = RedisProcess::start(&dir.path().join("primary"), free_port());
    let url = primary.url();
    let mut serve = RedisServe::new(&url, false, NAMESPACE);
    serve.durability = "aof";
    serve.timeout_ms = "300";
    serve.extra = vec!["--redis-replicas", "1"];
    // Started while the primary has no replica, a server says what its writes will get.
    let logs = dir.path().join("alone");
    std::fs::create_dir_all(&logs).expect("logs dir");
    let alone = Server::start_redis(&logs.join("data"), &logs, &serve).await;
    alone.terminate().await;
    let said = logs_in(&logs);
    assert!(said.contains("fewer replicas connected than --redis-replicas asks for"));
    let mut replica = start_replica(&dir.path().join("replica"), &primary);
    let server = Server::start_redis(&dir.path().join("data"), dir.path(), &serve).await;
    let base = server.base.clone();
    let key = provision_tenant(&base, 1_000_000).await;
    let http = client();
    let (s, r) = reserve(&http, &base, &key, "replicated").await;
    assert_eq!(s, 200, "{r}");
    let log = format!("{{{NAMESPACE}}}:log");
    let on_replica: u64 = replica.cli(&["xlen", &log]).trim().parse().expect("xlen");
    let on_primary: u64 = primary.cli(&["xlen", &log]).trim().parse().expect("xlen");
    assert_eq!(
        on_replica, on_primary,
        "every acknowledged round is on the replica"
    );
    // Without its replica, a write is recorded by the primary but not acknowledged.
    replica.kill9();
    let (s, r) = reserve(&http, &base, &key, "unreplicated").await;
    assert_eq!(s, 503, "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap_or_default()
            .contains("replicas"),
        "{r}"
    );
    replica.spawn();
    linked(&replica);
    recovers(&base, Duration::from_secs(10)).await;
    // Its retry answers it from the log: held once.
    let (s, r) = reserve(&http, &base, &key, "unreplicated").await;
    assert_eq!(s, 200, "{r}");
    let (held, _) = held_and_spent(&base, &key).await;
    assert_eq!(held, 2 * ESTIMATE);
}

/// A Redis Sentinel of the test's own, watching one primary (as `cycles`), with a quorum
/// of one and a failover after 1 s without an answer.
struct SentinelProcess {
    child: Child,
    port: u16,
}

impl SentinelProcess {
    fn start(dir: &Path, primary: &RedisProcess) -> SentinelProcess {
        std::fs::create_dir_all(dir).expect("sentinel dir");
        let port = free_port();
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\n\
                 sentinel monitor cycles 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds cycles 1000\n\
                 sentinel failover-timeout cycles 5000\n",
                primary.port
            ),
        )
        .expect("sentinel config");
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        let sentinel = SentinelProcess { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sentinel
            .cli(&["sentinel", "replicas", "cycles"])
            .contains("slave")
        {
            assert!(
                Instant::now() < deadline,
                "the sentinel did not find the replicas"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        sentinel
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Sentinel that accepts connections and never answers, listed first, costs the server
/// no more than its timeout: it finds the primary through the next Sentinel and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_that_never_answers_is_passed_over() {
    if !redis_here() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let primary = RedisProcess::start(&dir.path().join("primary"), free_port());
    let _replica = start_replica(&dir.path().join("replica"), &primary);
    let sentinel = SentinelProcess::start(&dir.path().join("sentinel"), &primary);
    // The kernel completes its connections into the backlog; nothing ever reads them.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let hung_port = hung.local_addr().expect("address").port();
    let url = format!(
        "redis://127.0.0.1:{hung_port},redis://127.0.0.1:{}",
        sentinel.port
    );
    let mut serve = RedisServe::new(&url, false, NAMESPACE);
    serve.durability = "aof";
    serve.timeout_ms = "100";
    serve.extra = vec!["--redis-sentinel-master", "cycles"];
    let server = Server::start_redis(&dir.path().join("data"), dir.path(), &serve).await;
    let key = provision_tenant(&server.base, 1_000_000).await;
    let (s, r) = reserve(&client(), &server.base, &key, "past-the-hung-sentinel").await;
    assert_eq!(s, 200, "{r}");
    drop(hung);
}

/// A primary with two replicas, watched by a Sentinel; the server finds the primary
/// through it and waits for one replica per write. The primary is killed under load: the
/// Sentinel promotes a replica, the server answers 503 meanwhile and then writes to the new
/// primary by itself, and every reservation it acknowledged is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_under_load_loses_nothing_acknowledged() {
    if !redis_here() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut primary = RedisProcess::start(&dir.path().join("primary"), free_port());
    let replicas: Vec<RedisProcess> = ["replica-a", "replica-b"]
        .iter()
        .map(|name| start_replica(&dir.path().join(name), &primary))
        .collect();
    let sentinel = SentinelProcess::start(&dir.path().join("sentinel"), &primary);
    let url = format!("redis://127.0.0.1:{}", sentinel.port);
    let mut serve = RedisServe::new(&url, false, NAMESPACE);
    serve.durability = "aof";
    serve.timeout_ms = "300";
    serve.extra = vec![
        "--redis-sentinel-master",
        "cycles",
        "--redis-replicas",
        "1",
        "--redis-snapshot-records",
        "500",
    ];
    let server = Server::start_redis(&dir.path().join("data"), dir.path(), &serve).await;
    let base = server.base.clone();
    let key = provision_tenant(&base, 1_000_000_000_000).await;
    let (stop, clients) = clients_under_load(&base, &key);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    primary.kill9();
    tokio::time::sleep(Duration::from_millis(200)).await;
    recovers(&base, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    stop.store(true, Ordering::Relaxed);
    let mut told = Vec::new();
    for c in clients {
        told.push(c.await.expect("client"));
    }
    let unavailable: usize = told.iter().map(|t| t.unavailable).sum();
    assert!(unavailable > 0, "the failover must have been seen");
    // Writes are acknowledged again once the other replica follows the new primary (until
    // then they are recorded but "outcome unknown", and retried with the same key).
    let http = client();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, r) = reserve(&http, &base, &key, "after-failover").await;
        if s == 200 {
            break;
        }
        assert!(s == 503 && Instant::now() < deadline, "{s}: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let checked = assert_acknowledged_present(&base, &told).await;
    eprintln!(
        "acknowledged reservations checked: {checked}; 503s during the failover: {unavailable}"
    );
    // The Sentinel names a former replica primary.
    let named = sentinel.cli(&["sentinel", "get-master-addr-by-name", "cycles"]);
    assert!(
        replicas.iter().any(|r| named.contains(&r.port.to_string())),
        "the primary is now {named:?}"
    );
    assert_verify_ok(&[
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-sentinel-master",
        "cycles",
        "--redis-namespace",
        NAMESPACE,
    ]);
}

/// A Redis URL that does not parse can never connect: the server refuses it at start,
/// naming it, where a Redis that is down is waited for. No Redis is needed.
#[test]
fn a_redis_url_that_does_not_parse_is_refused_at_start() {
    let dir = TempDir::new().unwrap();
    let single = ["--store", "redis", "--redis-url", "notaurl"];
    assert_serve_refused(
        dir.path(),
        &single,
        "the Redis URL 'notaurl' does not parse",
    );
    let cluster = [
        "--store",
        "redis",
        "--redis-cluster",
        "--redis-url",
        "redis://127.0.0.1:1,http//x",
    ];
    assert_serve_refused(
        dir.path(),
        &cluster,
        "the Redis URL 'http//x' does not parse",
    );
}

/// Two instances on one machine never share a data directory: each deletes the history
/// cache it finds there at start, so a second one on it is refused, and the first goes on.
#[tokio::test]
async fn a_second_instance_on_a_data_directory_is_refused() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let ledger = ScratchLedger::new(&url, Topology::Single, "dir-in-use");
    let ns = &ledger.namespace;
    let server = Server::start_redis(&data, dir.path(), &RedisServe::new(&url, false, ns)).await;
    let args = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--redis-namespace",
        ns,
        "--redis-durability",
        "none",
    ];
    assert_serve_refused_in_use(&data, &args);
    assert!(ready(&server.base).await, "the first instance still serves");
}

/// A TCP proxy in front of a Redis that holds back the next `stalls` commands naming
/// `XRANGE` (a read of the log, or of a history stream) for `stall` each: a late reply, as
/// a busy host gives one, to one instance and to one kind of command, where `DEBUG SLEEP` or
/// `CLIENT PAUSE` would hold up every client and every command.
struct StallProxy {
    port: u16,
    stalls: Arc<AtomicUsize>,
}

impl StallProxy {
    async fn start(redis_port: u16, stall: Duration) -> StallProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let stalls = Arc::new(AtomicUsize::new(0));
        let armed = stalls.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", redis_port)).await
                else {
                    continue;
                };
                tokio::spawn(relay(client, server, armed.clone(), stall));
            }
        });
        StallProxy { port, stalls }
    }

    /// Holds back the next `n` reads.
    fn stall_next(&self, n: usize) {
        self.stalls.store(n, Ordering::SeqCst);
    }

    /// Whether every read held back has been.
    fn spent(&self) -> bool {
        self.stalls.load(Ordering::SeqCst) == 0
    }
}

/// Relays one connection both ways, holding back each chunk from the instance that names
/// `XRANGE` for `stall` while `armed` counts reads to hold back. Either side closing (the
/// instance drops a connection it gave up on) ends both.
async fn relay(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    armed: Arc<AtomicUsize>,
    stall: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            let names_xrange = buf[..n]
                .windows(6)
                .any(|w| w.eq_ignore_ascii_case(b"XRANGE"));
            let take = |left: usize| left.checked_sub(1);
            if names_xrange
                && armed
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take)
                    .is_ok()
            {
                tokio::time::sleep(stall).await;
            }
            server_write.write_all(&buf[..n]).await?;
        }
    };
    let down = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// An instance without the lease reads the log to its end before it answers a read. When
/// Redis answers that read late (past the timeout) though it had just answered the round's
/// first command, the operations that waited for it are refused (`503`), and nothing else:
/// no breaker opens, readiness stays UP, and the next read is answered. Only three such
/// failures in a row open the breaker, which then closes by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_reply_to_a_read_of_the_log_refuses_only_the_operations_that_waited_for_it() {
    if !redis_here() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisProcess::start(&dir.path().join("redis"), free_port());
    let proxy = StallProxy::start(redis.port, Duration::from_millis(1_500)).await;
    let start = |url: String, name: &'static str| {
        let dir = dir.path().join(name);
        async move {
            std::fs::create_dir_all(&dir).expect("instance dir");
            let mut serve = RedisServe::new(&url, false, NAMESPACE);
            serve.timeout_ms = "500";
            serve.extra = vec!["--redis-advertise-url", "http://127.0.0.1:{port}"];
            Server::start_redis(&dir.join("data"), &dir, &serve).await
        }
    };
    // The holder writes straight to Redis; the reader reads through the proxy.
    let holder = start(redis.url(), "holder").await;
    let reader = start(format!("redis://127.0.0.1:{}", proxy.port), "reader").await;
    let key = provision_tenant(&holder.base, 1_000_000_000).await;
    let http = client();
    let mut n = 0;
    // A reservation written by the holder, read back through the reader (which must read
    // the log to its end to find it): answers the read's status.
    let mut write_then_read = || {
        n += 1;
        let (http, holder, reader, key) = (&http, &holder.base, &reader.base, &key);
        async move {
            let (s, r) = reserve(http, holder, key, &format!("late-reply-{n}")).await;
            assert_eq!(s, 200, "{r}");
            let id = r["reservation_id"]
                .as_str()
                .expect("reservation id")
                .to_string();
            let path = format!("/v1/reservations/{id}");
            let (s, r) = call(http, reader, &path, Some(key), None).await;
            assert!(s == 200 || s == 503, "{s}: {r}");
            if s == 200 {
                assert_eq!(r["reservation_id"], id.as_str(), "{r}");
            }
            s
        }
    };
    assert_eq!(write_then_read().await, 200);
    let faults = metric(&reader.base, "cycles_redis_faults_total").await;

    // One late reply: what waited for it is refused; the breaker stays closed.
    proxy.stall_next(1);
    let mut refused = 0;
    while !proxy.spent() {
        if write_then_read().await == 503 {
            refused += 1;
        }
    }
    // Answered at once, with no breaker's delay to wait out.
    assert_eq!(write_then_read().await, 200);
    assert!(refused <= 1, "{refused} reads refused for one late reply");
    assert_eq!(
        metric(&reader.base, "cycles_redis_failed_reads_total").await,
        1
    );
    assert_eq!(
        metric(&reader.base, "cycles_redis_faults_total").await,
        faults,
        "one late reply opened the breaker"
    );
    assert_eq!(metric(&reader.base, "cycles_redis_unavailable").await, 0);
    assert!(ready(&reader.base).await);

    // Three in a row: the third opens the breaker, which closes by itself. Each try starts
    // the streak afresh with a read answered. On a loaded host one of the held replies can
    // go to another of the reader's reads, one allowed longer than the hold (loading's or
    // compaction's, most likely; not observed), which then succeeds: that cuts the streak
    // short, and the three are held again.
    let mut opened = false;
    for _ in 0..5 {
        let deadline = Instant::now() + Duration::from_secs(10);
        while write_then_read().await != 200 {
            assert!(Instant::now() < deadline, "the reader did not answer");
        }
        let before = metric(&reader.base, "cycles_redis_failed_reads_total").await;
        proxy.stall_next(3);
        while !proxy.spent() {
            write_then_read().await;
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while metric(&reader.base, "cycles_redis_faults_total").await == faults
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if metric(&reader.base, "cycles_redis_faults_total").await == faults + 1 {
            // The first two are counted as late replies; the third opened the breaker.
            let counted = metric(&reader.base, "cycles_redis_failed_reads_total").await - before;
            assert_eq!(
                counted, 2,
                "the breaker opened after {counted} late replies"
            );
            opened = true;
            break;
        }
    }
    assert!(
        opened,
        "three late replies in a row did not open the breaker"
    );
    recovers(&reader.base, Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while write_then_read().await != 200 {
        assert!(Instant::now() < deadline, "the reader did not answer again");
    }
    assert_redis_ledger_ok(&redis.url(), false, NAMESPACE);
}
