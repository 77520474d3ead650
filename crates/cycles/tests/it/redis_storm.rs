//! Many `cycles serve` processes on one Redis ledger: a storm of concurrent lifecycles from
//! 200 clients, every operation sent to another instance than the last, on one shared
//! budget and on a budget per client. Nothing is oversubscribed, every client gets an
//! answer the protocol allows (a hold, or a refusal for want of budget: never an error),
//! every instance reports the same balances, and they reconcile exactly with what the
//! clients were told.
//!
//! Needs a Redis: `CYCLES_TEST_REDIS_URL`, and a Redis Cluster for the shared budget on
//! one: `CYCLES_TEST_REDIS_CLUSTER_URL` (`.ci/run` sets both); without them the tests pass
//! without running, saying so.

use std::sync::Arc;

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::ledger_http::{assert_redis_ledger_ok, call, namespace, provision, redis_url, topology};
use crate::process::{client, RedisServe, Server};

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

/// One client: reserve → commit (or release, one time in five), each call to the next
/// instance in turn.
async fn lifecycles(bases: Arc<Vec<String>>, key: String, subject: Value, name: String) -> Told {
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
        let (status, reply) =
            call(&http, &next(), "/v1/reservations", Some(&key), Some(body)).await;
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
        let (status, reply) = call(&http, &next(), &url, Some(&key), Some(body)).await;
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
    let http = client();
    let mut reads_without_lease = 0;
    let mut snapshots = 0;
    for base in bases {
        let (status, text) = call(&http, base, "/metrics", None, None).await;
        assert_eq!(status, 200);
        let text = text.as_str().expect("metrics text").to_string();
        let counter = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} not on /metrics"))
        };
        assert!(
            counter("cycles_redis_rounds_total ") > 0,
            "{base} never wrote"
        );
        assert!(
            counter("cycles_redis_leases_total ") > 1,
            "{base} took the lease once only"
        );
        reads_without_lease += counter("cycles_redis_reads_without_lease_total ");
        snapshots += counter("cycles_redis_snapshots_total ");
    }
    assert!(snapshots > 0, "the log was never compacted");
    assert!(
        reads_without_lease > 0,
        "no read was answered without the lease"
    );
}

struct Fleet {
    servers: Vec<Server>,
    bases: Arc<Vec<String>>,
    url: String,
    cluster: bool,
    namespace: String,
    _dirs: Vec<TempDir>,
}

impl Drop for Fleet {
    /// The servers stop first, then the ledger goes from Redis.
    fn drop(&mut self) {
        self.servers.clear();
        let deleted =
            store::redis::delete_ledger(&self.url, &topology(self.cluster), &self.namespace);
        if let Err(e) = deleted {
            eprintln!("the storm's ledger {} was not deleted: {e}", self.namespace);
        }
    }
}

/// `INSTANCES` servers on a new ledger named after `name`.
async fn fleet(url: String, cluster: bool, name: &str) -> Fleet {
    let namespace = namespace(&format!("storm-{name}"));
    let mut servers = Vec::new();
    let mut dirs = Vec::new();
    for _ in 0..INSTANCES {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let mut redis = RedisServe::new(&url, cluster, &namespace);
        // Compactions run all through the storm (it appends a few thousand records), so
        // instances also read the ledger back from snapshots they did not write.
        redis.extra = vec!["--redis-snapshot-records", "200"];
        servers.push(Server::start_redis(&data, dir.path(), &redis).await);
        dirs.push(dir);
    }
    let bases = Arc::new(servers.iter().map(|s| s.base.clone()).collect());
    Fleet {
        servers,
        bases,
        url,
        cluster,
        namespace,
        _dirs: dirs,
    }
}

async fn storm(fleet: &Fleet, key: &str, subject_of: impl Fn(usize) -> Value) -> Vec<Told> {
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let task = lifecycles(
                fleet.bases.clone(),
                key.to_string(),
                subject_of(c),
                format!("client{c}"),
            );
            tokio::spawn(task)
        })
        .collect();
    let mut told = Vec::new();
    for task in tasks {
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
    shared_budget_storm(fleet(url, false, "shared").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_on_a_redis_cluster_share_one_budget_exactly() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_CLUSTER_URL") else {
        return;
    };
    shared_budget_storm(fleet(url, true, "cluster").await).await;
}

async fn shared_budget_storm(fleet: Fleet) {
    let budgets = [("tenant:storm".to_string(), SHARED_ALLOCATED)];
    let key = provision(&fleet.bases[0], "storm", &budgets, UNIT).await;
    let told = storm(&fleet, &key, |_| json!({"tenant": "storm"})).await;
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
    let views = balance(&fleet.bases, &key, "tenant=storm").await;
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
    assert_every_instance_wrote(&fleet.bases).await;
    assert_redis_ledger_ok(&fleet.url, fleet.cluster, &fleet.namespace);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_keep_every_clients_own_budget_exact() {
    let Some(url) = redis_url("CYCLES_TEST_REDIS_URL") else {
        return;
    };
    let fleet = fleet(url, false, "isolated").await;
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
    assert_redis_ledger_ok(&fleet.url, fleet.cluster, &fleet.namespace);
}
