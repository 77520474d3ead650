//! Many `cycles serve` processes on one Redis ledger: a storm of concurrent lifecycles from
//! 200 clients, every operation sent to another instance than the last, on one shared
//! budget and on a budget per client. Nothing is oversubscribed, every client gets an
//! answer the protocol allows (a hold, or a refusal for want of budget: never an error),
//! every instance reports the same balances, and they reconcile exactly with what the
//! clients were told.
//!
//! With `--redis-advertise-url`, instances hand their writes to the one holding the lease:
//! the same storm must come out the same, and a holder killed mid-storm must cost its
//! clients nothing but retries the protocol allows (503, then the same idempotency key).
//!
//! Needs a Redis: `CYCLES_TEST_REDIS_URL`, and a Redis Cluster for the shared budget on
//! one: `CYCLES_TEST_REDIS_CLUSTER_URL` (`.ci/run` sets both); without them the tests pass
//! without running, saying so.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use store::redis::ScratchLedger;
use tempfile::TempDir;

use crate::ledger_http::{assert_ledger_ok, call, provision, redis_url, topology, try_call};
use crate::process::{client, RedisServe, Server};
use crate::receiver::Receiver;

const INSTANCES: usize = 3;
const CLIENTS: usize = 200;
const LIFECYCLES: usize = 5;
const UNIT: &str = "USD_MICROCENTS";
const ESTIMATE: i64 = 1_000;
/// The shared budget covers about a fifth of what the clients commit (their commits charge
/// half an estimate on average): most of the storm runs with the budget nearly exhausted,
/// where an oversubscription would show.
const SHARED_ALLOCATED: i64 = (CLIENTS * LIFECYCLES) as i64 * ESTIMATE / 10;
/// Each client's own budget covers three of its five holds.
const OWN_ALLOCATED: i64 = 3 * ESTIMATE;

/// What one client was told.
#[derive(Debug, Default)]
struct Told {
    /// Per budgeted scope: the amounts committed.
    charged: i64,
    holds: usize,
    refusals: usize,
    /// Anything else: an error the storm must never see.
    unexpected: Vec<(u16, Value)>,
}

/// How a client takes a 503 or no answer at all.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Patience {
    /// Never expected: told as unexpected (a 503), or the test fails (no answer).
    None,
    /// An instance may die: the same request (same idempotency key) is sent to the next
    /// instance, as a client behind a load balancer would, for up to about 10 s.
    Retry,
}

/// Sends a request to the next instance in turn, as `patience` says.
async fn ask(
    http: &reqwest::Client,
    next: &mut impl FnMut() -> String,
    path: &str,
    key: &str,
    body: Value,
    patience: Patience,
) -> (u16, Value) {
    if patience == Patience::None {
        return call(http, &next(), path, Some(key), Some(body)).await;
    }
    let mut last = None;
    for _ in 0..200 {
        match try_call(http, &next(), path, Some(key), Some(body.clone())).await {
            Ok((503, reply)) => last = Some((503, reply)),
            Ok(answer) => return answer,
            Err(e) => last = Some((0, Value::String(e.to_string()))),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last.expect("tried")
}

/// One client: reserve → commit (or release, one time in five), each call to the next
/// instance in turn.
async fn lifecycles(
    bases: Arc<Vec<String>>,
    key: String,
    subject: Value,
    name: String,
    patience: Patience,
) -> Told {
    let http = client();
    let mut told = Told::default();
    let mut turn = name.len();
    let mut next = || {
        turn += 1;
        bases[turn % bases.len()].clone()
    };
    for n in 0..LIFECYCLES {
        let body = json!({
            "idempotency_key": format!("{name}-r{n}"),
            "subject": subject,
            "action": {"kind": "llm.completion", "name": "model"},
            "estimate": {"unit": UNIT, "amount": ESTIMATE},
        });
        let (status, reply) = ask(&http, &mut next, "/v1/reservations", &key, body, patience).await;
        if status == 409 && reply["error"] == "BUDGET_EXCEEDED" {
            told.refusals += 1;
            continue;
        }
        let Some(id) = reply["reservation_id"].as_str().filter(|_| status == 200) else {
            told.unexpected.push((status, reply));
            continue;
        };
        told.holds += 1;
        let (path, body) = if n % 5 == 4 {
            (
                "release",
                json!({"idempotency_key": format!("{name}-x{n}")}),
            )
        } else {
            let actual = 1 + (n as i64 * 211 + name.len() as i64) % ESTIMATE;
            let body = json!({
                "idempotency_key": format!("{name}-c{n}"),
                "actual": {"unit": UNIT, "amount": actual},
            });
            ("commit", body)
        };
        let url = format!("/v1/reservations/{id}/{path}");
        let (status, reply) = ask(&http, &mut next, &url, &key, body, patience).await;
        match (status, path) {
            (200, "commit") => {
                told.charged += reply["charged"]["amount"].as_i64().expect("charged")
            }
            (200, _) => {}
            _ => told.unexpected.push((status, reply)),
        }
    }
    told
}

/// Every instance's view of one budget: (allocated, remaining, reserved, spent, debt).
async fn balance(bases: &[String], key: &str, scope_param: &str) -> Vec<[i64; 5]> {
    let http = client();
    let mut views = Vec::new();
    for base in bases {
        let (status, body) = call(
            &http,
            base,
            &format!("/v1/balances?{scope_param}"),
            Some(key),
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let b = &body["balances"][0];
        let n = |f: &str| b[f]["amount"].as_i64().unwrap_or(0);
        views.push([
            n("allocated"),
            n("remaining"),
            n("reserved"),
            n("spent"),
            n("debt"),
        ]);
    }
    views
}

/// Each instance wrote: it took the writer's lease, and handed it on when asked. The
/// balances the test read from instances without the lease were answered without it, and
/// the log was compacted while the storm ran.
async fn assert_every_instance_wrote(bases: &[String]) {
    let rounds = counters(bases, "cycles_redis_rounds_total").await;
    let leases = counters(bases, "cycles_redis_leases_total").await;
    for (i, base) in bases.iter().enumerate() {
        assert!(rounds[i] > 0, "{base} never wrote");
        assert!(leases[i] > 1, "{base} took the lease once only");
    }
    let snapshots = total(bases, "cycles_redis_snapshots_total").await;
    let reads_without_lease = total(bases, "cycles_redis_reads_without_lease_total").await;
    assert!(snapshots > 0, "the log was never compacted");
    assert!(
        reads_without_lease > 0,
        "no read was answered without the lease"
    );
}

/// One counter of `/metrics` on each of `bases`.
async fn counters(bases: &[String], name: &str) -> Vec<u64> {
    let http = client();
    let mut values = Vec::new();
    for base in bases {
        let (status, text) = call(&http, base, "/metrics", None, None).await;
        assert_eq!(status, 200);
        let text = text.as_str().expect("metrics text").to_string();
        values.push(
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} not on /metrics")),
        );
    }
    values
}

/// One counter of `/metrics`, summed over `bases`.
async fn total(bases: &[String], name: &str) -> u64 {
    counters(bases, name).await.iter().sum()
}

/// Instances handed their writes to the holder, many of them before their handler ran
/// (the holder was read a moment ago), and none of those was lost. How many go before
/// their handler depends on how often rounds read the holder, so on the host's speed: a
/// slow host had 31–48 % of them go so, a faster one most; a fifth is asked for here,
/// enough to tell that the path is taken.
async fn assert_writes_were_handed_on(bases: &[String]) {
    let sent = total(bases, "cycles_forward_sent_total").await;
    let by_rounds = total(bases, "cycles_redis_forwarded_total").await;
    let lost = total(bases, "cycles_forward_lost_total").await;
    assert!(sent > 100, "only {sent} requests were handed to the holder");
    assert!(
        sent.saturating_sub(by_rounds) * 5 >= sent,
        "{by_rounds} of {sent} requests handed on waited for a round first"
    );
    assert_eq!(lost, 0, "requests handed on went unanswered");
}

/// An audited write sent to each instance is audited under the request id its client was
/// answered with, whichever instance ran it (the holder takes it from the peer that handed
/// it on); peer headers a client makes up, without the ledger's secret, are ignored.
async fn assert_audit_follows_each_request(bases: &[String]) {
    let http = client();
    let sent_before = total(bases, "cycles_forward_sent_total").await;
    let mut answered = Vec::new();
    for (i, base) in bases.iter().enumerate() {
        let resp = http
            .post(format!("{base}/v1/admin/tenants"))
            .header("X-Admin-API-Key", crate::process::ADMIN_KEY)
            .header("x-cycles-peer", "not-the-secret")
            .header("x-cycles-peer-request-id", "made-up")
            .json(&json!({"tenant_id": format!("audited-{i}"), "name": "audited"}))
            .send()
            .await
            .expect("an answer");
        assert_eq!(resp.status(), 201);
        let id = resp.headers()["x-request-id"].to_str().expect("ascii");
        answered.push(id.to_string());
    }
    let (status, page) = call(
        &http,
        &bases[0],
        "/v1/admin/audit/logs?operation=createTenant&limit=50",
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let audited: Vec<&str> = page["logs"]
        .as_array()
        .expect("logs")
        .iter()
        .filter_map(|e| e["request_id"].as_str())
        .collect();
    for id in &answered {
        assert!(audited.contains(&id.as_str()), "{id} not in {audited:?}");
    }
    assert!(!audited.contains(&"made-up"));
    let sent_after = total(bases, "cycles_forward_sent_total").await;
    assert!(sent_after > sent_before, "no audited write was handed on");
}

/// Dropped in field order: the servers stop first, then the ledger goes from Redis.
struct Fleet {
    servers: Vec<Server>,
    ledger: ScratchLedger,
    writes: Writes,
    bases: Arc<Vec<String>>,
    _dirs: Vec<TempDir>,
}

/// How the fleet's instances write.
#[derive(Clone, Copy, PartialEq)]
enum Writes {
    /// Each waits for the lease in turn.
    Turns,
    /// Each hands its writes to the holder (`--redis-advertise-url`).
    Forwarded,
}

/// `INSTANCES` servers on a new ledger named after `name`, `extra` given to each.
async fn fleet(
    url: String,
    cluster: bool,
    name: &str,
    writes: Writes,
    extra: &[&'static str],
) -> Fleet {
    let ledger = ScratchLedger::new(&url, topology(cluster), &format!("storm-{name}"));
    let mut servers = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..INSTANCES {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let mut redis = RedisServe::new(&url, cluster, &ledger.namespace);
        // Compactions run all through the storm (it appends a few thousand records), so
        // instances also read the ledger back from snapshots they did not write.
        redis.extra = vec!["--redis-snapshot-records", "200"];
        if writes == Writes::Forwarded {
            // A holder killed holds the others up for this long, at most.
            redis.extra.extend([
                "--redis-advertise-url",
                "http://127.0.0.1:{port}",
                "--redis-lease-ms",
                "500",
            ]);
        }
        redis.extra.extend(extra);
        servers.push(Server::start_redis(&data, dir.path(), &redis).await);
        dirs.push(dir);
    }
    let bases = Arc::new(servers.iter().map(|s| s.base.clone()).collect());
    Fleet {
        servers,
        ledger,
        writes,
        bases,
        _dirs: dirs,
    }
}

async fn storm(fleet: &Fleet, key: &str, subject_of: impl Fn(usize) -> Value) -> Vec<Told> {
    let clients = start_clients(&fleet.bases, key, subject_of, Patience::None);
    collect(clients).await
}

fn start_clients(
    bases: &Arc<Vec<String>>,
    key: &str,
    subject_of: impl Fn(usize) -> Value,
    patience: Patience,
) -> Vec<tokio::task::JoinHandle<Told>> {
    (0..CLIENTS)
        .map(|c| {
            let task = lifecycles(
                bases.clone(),
                key.to_string(),
                subject_of(c),
                format!("client{c}"),
                patience,
            );
            tokio::spawn(task)
        })
        .collect()
}

/// Every client's account; none may have seen an answer the protocol does not allow.
async fn collect(clients: Vec<tokio::task::JoinHandle<Told>>) -> Vec<Told> {
    let mut told = Vec::new();
    for task in clients {
        told.push(task.await.expect("client"));
    }
    for t in &told {
        assert!(
            t.unexpected.is_empty(),
            "answers the storm must never see: {:?}",
            t.unexpected
        );
    }
    told
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_sharing_one_budget_never_oversubscribe_it() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    shared_budget_storm(fleet(url, false, "shared", Writes::Turns, &[]).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_handing_writes_to_the_holder_never_oversubscribe_one_budget() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    shared_budget_storm(fleet(url, false, "forwarded", Writes::Forwarded, &[]).await).await;
}

/// A key's rate limit holds for writes handed to the holder: counted once, by the instance
/// that ran the limit (the one the client reached, or the holder for a request sent there
/// straight away), never by neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_handed_to_the_holder_share_one_rate_limit() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    let limit = ["--rate-limit-per-second", "1", "--rate-limit-burst", "5"];
    let fleet = fleet(url, false, "limited", Writes::Forwarded, &limit).await;
    let budgets = [("tenant:storm".to_string(), SHARED_ALLOCATED)];
    // Through the first instance, which takes the lease.
    let key = provision(&fleet.bases[0], "storm", &budgets, UNIT).await;
    let http = client();
    let sent_before = total(&fleet.bases, "cycles_forward_sent_total").await;
    // One key's writes, to every instance in turn: each instance alone would allow a
    // burst of 5, so 15 in all if each counted its own.
    let (mut held, mut limited) = (0, 0);
    for n in 0..15 {
        let body = json!({
            "idempotency_key": format!("limited-{n}"),
            "subject": {"tenant": "storm"},
            "action": {"kind": "llm.completion", "name": "model"},
            "estimate": {"unit": UNIT, "amount": ESTIMATE},
        });
        let (status, reply) = call(
            &http,
            &fleet.bases[n % fleet.bases.len()],
            "/v1/reservations",
            Some(&key),
            Some(body),
        )
        .await;
        match status {
            200 => held += 1,
            429 => limited += 1,
            _ => panic!("{status}: {reply}"),
        }
    }
    let sent_after = total(&fleet.bases, "cycles_forward_sent_total").await;
    assert!(sent_after > sent_before, "no write was handed on");
    assert!(limited > 0, "15 writes in a burst of 5 were never limited");
    assert!(
        (5..=8).contains(&held),
        "{held} writes allowed, in a burst of 5 at 1/s across the instances"
    );
    // The instances that handed writes on took no token for them: a read there, which
    // they count themselves, is still allowed.
    for base in &fleet.bases[1..] {
        let (status, reply) =
            call(&http, base, "/v1/balances?tenant=storm", Some(&key), None).await;
        assert_eq!(status, 200, "{base}: {reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_on_a_redis_cluster_share_one_budget_exactly() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_CLUSTER_URL") else {
        return;
    };
    shared_budget_storm(fleet(url, true, "cluster", Writes::Turns, &[]).await).await;
}

async fn shared_budget_storm(fleet: Fleet) {
    let writes = fleet.writes;
    let budgets = [("tenant:storm".to_string(), SHARED_ALLOCATED)];
    let key = provision(&fleet.bases[0], "storm", &budgets, UNIT).await;
    let told = storm(&fleet, &key, |_| json!({"tenant": "storm"})).await;
    assert_shared_budget_exact(&fleet.bases, &key, &told).await;
    match writes {
        Writes::Turns => assert_every_instance_wrote(&fleet.bases).await,
        Writes::Forwarded => {
            assert_writes_were_handed_on(&fleet.bases).await;
            assert_audit_follows_each_request(&fleet.bases).await;
        }
    }
    assert_ledger_ok(&fleet.ledger);
}

/// The shared budget was run dry, never oversubscribed, and every instance (of `bases`)
/// reports exactly what the clients were told.
async fn assert_shared_budget_exact(bases: &[String], key: &str, told: &[Told]) {
    let charged: i64 = told.iter().map(|t| t.charged).sum();
    let holds: usize = told.iter().map(|t| t.holds).sum();
    let refusals: usize = told.iter().map(|t| t.refusals).sum();
    assert!(
        refusals > 0,
        "the storm must run the budget dry (holds {holds})"
    );
    assert!(
        holds >= (SHARED_ALLOCATED / ESTIMATE) as usize,
        "holds {holds}"
    );
    let views = balance(bases, key, "tenant=storm").await;
    for view in &views {
        assert_eq!(view, &views[0], "every instance reports the same balance");
    }
    let [allocated, remaining, reserved, spent, debt] = views[0];
    assert_eq!(allocated, SHARED_ALLOCATED);
    assert_eq!((reserved, debt), (0, 0), "every hold settled, no debt");
    assert_eq!(
        spent, charged,
        "spent is exactly what the clients were told they were charged"
    );
    assert_eq!(remaining, allocated - spent);
    assert!(remaining >= 0);
}

/// The instance holding the lease is killed (SIGKILL) while the others hand it the storm's
/// writes: they find it gone, take the lease once it lapses, and every client's lifecycles
/// finish with answers the protocol allows (a 503 or no answer is retried elsewhere with
/// the same idempotency key), the budget exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_killed_while_writes_are_handed_to_it_loses_nothing() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    let mut fleet = fleet(url, false, "holder-killed", Writes::Forwarded, &[]).await;
    let budgets = [("tenant:storm".to_string(), SHARED_ALLOCATED)];
    let key = provision(&fleet.bases[0], "storm", &budgets, UNIT).await;
    let clients = start_clients(
        &fleet.bases,
        &key,
        |_| json!({"tenant": "storm"}),
        Patience::Retry,
    );
    // Once writes are being handed to an instance holding the lease, it is killed.
    let mut holder = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let held = counters(&fleet.bases, "cycles_redis_lease_held").await;
        let sent = counters(&fleet.bases, "cycles_forward_sent_total").await;
        if sent.iter().sum::<u64>() > 0 {
            holder = held.iter().position(|&h| h == 1);
            if holder.is_some() {
                break;
            }
        }
    }
    let holder = holder.expect("writes handed to an instance holding the lease");
    fleet.servers.remove(holder).kill();
    let survivors: Vec<String> = (0..INSTANCES)
        .filter(|&i| i != holder)
        .map(|i| fleet.bases[i].clone())
        .collect();
    let told = collect(clients).await;
    assert_shared_budget_exact(&survivors, &key, &told).await;
    let unreachable = counters(&survivors, "cycles_forward_unreachable_total").await;
    let lost = counters(&survivors, "cycles_forward_lost_total").await;
    assert!(
        unreachable.iter().chain(&lost).sum::<u64>() > 0,
        "the survivors never found the holder gone: the kill came after the storm"
    );
    assert_ledger_ok(&fleet.ledger);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_keep_every_clients_own_budget_exact() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    let fleet = fleet(url, false, "isolated", Writes::Turns, &[]).await;
    let scope = |c: usize| format!("tenant:iso/workspace:w{c}");
    let budgets: Vec<(String, i64)> = (0..CLIENTS).map(|c| (scope(c), OWN_ALLOCATED)).collect();
    let key = provision(&fleet.bases[0], "iso", &budgets, UNIT).await;
    let told = storm(
        &fleet,
        &key,
        |c| json!({"tenant": "iso", "workspace": format!("w{c}")}),
    )
    .await;
    for (c, t) in told.iter().enumerate() {
        // Three holds fit; the other two are refused (or fit after a release).
        assert!(
            t.holds >= 3 && t.holds + t.refusals == LIFECYCLES,
            "client {c}: {t:?}"
        );
        let views = balance(&fleet.bases, &key, &format!("tenant=iso&workspace=w{c}")).await;
        for view in &views {
            assert_eq!(
                view, &views[0],
                "client {c}: every instance reports the same balance"
            );
        }
        let [allocated, remaining, reserved, spent, debt] = views[0];
        assert_eq!(
            (allocated, reserved, debt),
            (OWN_ALLOCATED, 0, 0),
            "client {c}"
        );
        assert_eq!(spent, t.charged, "client {c}");
        assert_eq!(remaining, allocated - spent, "client {c}");
    }
    assert_every_instance_wrote(&fleet.bases).await;
    assert_ledger_ok(&fleet.ledger);
}

/// Every instance runs a webhook dispatcher over the one ledger: each delivery is claimed
/// before it is sent, so an event funded through any instance reaches its receiver once
/// (it reached it up to three times, once per instance that took it), and a subscription's
/// events arrive one at a time, in order, although its receiver is slow enough for every
/// instance to find some of them due while another is sending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_deliver_each_event_once() {
    const FUNDINGS: usize = 30;
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    let fleet = fleet(url, false, "webhooks", Writes::Turns, &[]).await;
    let received = subscribe(&fleet, Duration::from_millis(30)).await;
    fund(&fleet.bases, 0..FUNDINGS).await;
    wait_for_events(&received, FUNDINGS, Duration::from_secs(30)).await;
    // Time for a second copy of any of them, from another instance, to arrive.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_each_once_in_order(&received, FUNDINGS);
    assert_ledger_ok(&fleet.ledger);
}

/// A stop lets the send under way finish and records it, so stopping every instance in
/// the middle of a subscription's deliveries (a rolling restart) neither sends one twice
/// nor leaves the rest held for the claim's minute: an instance started after them sends
/// them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_finishes_its_sends_and_holds_nothing_up() {
    const FUNDINGS: usize = 8;
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    let mut fleet = fleet(url, false, "webhook-stop", Writes::Turns, &[]).await;
    let received = subscribe(&fleet, Duration::from_millis(400)).await;
    fund(&fleet.bases, 0..FUNDINGS).await;
    wait_for_events(&received, 1, Duration::from_secs(30)).await;
    for server in &fleet.servers {
        server.signal_term();
    }
    for server in fleet.servers.drain(..) {
        let status = server.wait_exit().await;
        assert!(status.success(), "graceful stop exited with {status}");
    }
    let sent_before = received.events().len();
    assert!(sent_before < FUNDINGS, "the stop came after every send");
    let dir = tempfile::tempdir().expect("temp dir");
    let redis = RedisServe::new(&fleet.ledger.url, false, &fleet.ledger.namespace);
    let next = Server::start_redis(&dir.path().join("data"), dir.path(), &redis).await;
    wait_for_events(&received, FUNDINGS, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_each_once_in_order(&received, FUNDINGS);
    next.terminate().await;
    assert_ledger_ok(&fleet.ledger);
}

/// Opens the fleet's webhook security to loopback, provisions tenant `hooks` and
/// subscribes a receiver taking `delay` per request to its `budget.funded`.
async fn subscribe(fleet: &Fleet, delay: Duration) -> Receiver {
    let (received, hook) = Receiver::start_slow(delay).await;
    let first = &fleet.bases[0];
    let security = json!({"blocked_cidr_ranges": [], "allow_http": true});
    let put = client()
        .put(format!("{first}/v1/admin/config/webhook-security"))
        .header("X-Admin-API-Key", crate::process::ADMIN_KEY)
        .json(&security)
        .send()
        .await
        .expect("webhook security");
    assert_eq!(put.status(), 200);
    provision(first, "hooks", &[("tenant:hooks".into(), 1_000_000)], UNIT).await;
    let subscription = json!({"url": hook, "event_types": ["budget.funded"]});
    let path = "/v1/admin/webhooks?tenant_id=hooks";
    let (status, _) = call(&client(), first, path, None, Some(subscription)).await;
    assert_eq!(status, 201);
    received
}

/// Funds tenant `hooks` once per number, through the instances in turn.
async fn fund(bases: &[String], numbers: std::ops::Range<usize>) {
    let http = client();
    for n in numbers {
        let base = &bases[n % bases.len()];
        let path = format!("/v1/admin/budgets/fund?scope=tenant:hooks&unit={UNIT}&tenant_id=hooks");
        let credit = json!({"operation": "CREDIT", "amount": {"unit": UNIT, "amount": 1},
                            "idempotency_key": format!("fund-{n}")});
        let (status, body) = call(&http, base, &path, None, Some(credit)).await;
        assert_eq!(status, 200, "{body}");
    }
}

async fn wait_for_events(received: &Receiver, events: usize, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    while received.by_event().len() < events {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {events} events arrived within {within:?}",
            received.by_event().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every one of `events` events arrived once, in order, one request at a time.
fn assert_each_once_in_order(received: &Receiver, events: usize) {
    let counts = received.by_event();
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert_eq!(counts.len(), events);
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let arrived = received.events();
    let mut in_order = arrived.clone();
    in_order.sort();
    assert_eq!(
        arrived, in_order,
        "event ids grow with time: they came out of order"
    );
    assert_eq!(
        received.most_at_once(),
        1,
        "one subscription's deliveries overlapped"
    );
}
