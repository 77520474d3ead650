//! Crash tests for the `cycles` binary (DESIGN.md §8): kill -9 under load loses nothing that
//! was acknowledged, and SIGTERM drains in-flight requests and exits cleanly.
//!
//! Each test runs the real binary on a temporary data directory with strict durability,
//! drives it over HTTP with concurrent reserve → commit/release lifecycles, and keeps a
//! record of every operation that got a 2xx. After a crash the server is restarted on the
//! same directory and every acknowledged operation must be there, the budget must reconcile
//! exactly with the reservations, and `cycles verify` must agree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;

use crate::process::{assert_serve_refused_in_use, assert_verify_ok, client, Server, ADMIN_KEY};

const TENANT: &str = "crash";
const SCOPE: &str = "tenant:crash";
const UNIT: &str = "USD_MICROCENTS";
/// Every reservation holds this much; commits charge less, so no debt ever arises.
const ESTIMATE: i64 = 1_000;
const ALLOCATED: i64 = 1_000_000_000_000;
const CLIENTS: usize = 8;
/// How long the load runs before the server is killed.
const LOAD: Duration = Duration::from_millis(1_500);
const KILL_CYCLES: usize = 3;

/// `cycles verify --data-dir <dir>` must exit 0 and report OK.
fn assert_verify_data_dir_ok(data_dir: &Path) {
    let dir = data_dir.to_str().expect("a UTF-8 path");
    assert_verify_ok(&["--data-dir", dir]);
}

/// `cycles verify` on a directory that holds no ledger (a mistyped path, a backup copied
/// into the wrong place) says so and fails: its empty ledger would verify.
#[test]
fn verify_refuses_a_directory_without_a_ledger() {
    let empty = TempDir::new().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cycles"))
        .args(["verify", "--data-dir"])
        .arg(empty.path())
        .output()
        .expect("run cycles verify");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("holds no ledger"),
        "{}: {stderr}",
        output.status
    );
}

// ---------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------

/// Who a request is sent as.
#[derive(Clone, Copy)]
enum As<'a> {
    Admin,
    Key(&'a str),
}

/// Sends a request; `Err` is a transport failure (the server is gone or going).
async fn send(
    http: &reqwest::Client,
    url: String,
    who: As<'_>,
    body: Option<Value>,
) -> Result<(u16, Value), reqwest::Error> {
    let mut req = match &body {
        Some(_) => http.post(url),
        None => http.get(url),
    };
    req = match who {
        As::Admin => req.header("X-Admin-API-Key", ADMIN_KEY),
        As::Key(k) => req.header("X-Cycles-API-Key", k),
    };
    if let Some(body) = body {
        if let Some(key) = body["idempotency_key"].as_str() {
            req = req.header("X-Idempotency-Key", key.to_string());
        }
        req = req.json(&body);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// A request that must succeed with `expected`.
async fn expect(
    server: &Server,
    path: &str,
    who: As<'_>,
    body: Option<Value>,
    expected: u16,
) -> Value {
    let (status, body) = send(&client(), format!("{}{path}", server.base), who, body)
        .await
        .expect("request");
    assert_eq!(status, expected, "{path}: {body}");
    body
}

fn amount(body: &Value, field: &str) -> i64 {
    body[field]["amount"]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} missing in {body}"))
}

/// A tenant, an API key and a budget at the tenant scope; returns the key's secret.
async fn provision(server: &Server) -> String {
    let tenant = json!({"tenant_id": TENANT, "name": "Crash test"});
    expect(server, "/v1/admin/tenants", As::Admin, Some(tenant), 201).await;
    let key = json!({"tenant_id": TENANT, "name": "load"});
    let key = expect(server, "/v1/admin/api-keys", As::Admin, Some(key), 201).await;
    let budget = json!({
        "tenant_id": TENANT,
        "scope": SCOPE,
        "unit": UNIT,
        "allocated": {"unit": UNIT, "amount": ALLOCATED},
    });
    expect(server, "/v1/admin/budgets", As::Admin, Some(budget), 201).await;
    key["key_secret"].as_str().expect("key secret").to_string()
}

// ---------------------------------------------------------------------------------------
// Load and the record of what was acknowledged
// ---------------------------------------------------------------------------------------

/// The last acknowledged operation on a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acked {
    Reserved,
    Committed { charged: i64 },
    Released,
}

/// What one client saw.
#[derive(Debug, Default)]
struct ClientLog {
    /// Acknowledged operations in order: (reservation id, what was acknowledged).
    acks: Vec<(String, Acked)>,
    /// Answers that were neither a success nor a transport failure.
    unexpected: Vec<(u16, Value)>,
    /// When the last acknowledgement arrived.
    last_ack: Option<Instant>,
}

impl ClientLog {
    fn ack(&mut self, id: &str, what: Acked) {
        self.acks.push((id.to_string(), what));
        self.last_ack = Some(Instant::now());
    }
}

/// One client: reserve → commit (three times in four) or release, until the server stops
/// answering or `until` passes. Stops at the first transport failure.
async fn lifecycles(base: String, key: String, name: String, until: Instant) -> ClientLog {
    let http = client();
    let mut log = ClientLog::default();
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let body = json!({
            "idempotency_key": format!("{name}-r{n}"),
            "subject": {"tenant": TENANT},
            "action": {"kind": "llm.completion", "name": "model"},
            "estimate": {"unit": UNIT, "amount": ESTIMATE},
        });
        let Ok((status, reply)) = send(
            &http,
            format!("{base}/v1/reservations"),
            As::Key(&key),
            Some(body),
        )
        .await
        else {
            break;
        };
        let Some(id) = reply["reservation_id"].as_str().filter(|_| status == 200) else {
            log.unexpected.push((status, reply));
            break;
        };
        log.ack(id, Acked::Reserved);
        let (path, body, done) = match n % 4 {
            0 => {
                let body = json!({"idempotency_key": format!("{name}-x{n}"), "reason": "done"});
                ("release", body, Acked::Released)
            }
            _ => {
                let actual = 1 + (n as i64 * 37) % ESTIMATE;
                let body = json!({
                    "idempotency_key": format!("{name}-c{n}"),
                    "actual": {"unit": UNIT, "amount": actual},
                });
                ("commit", body, Acked::Committed { charged: actual })
            }
        };
        let url = format!("{base}/v1/reservations/{id}/{path}");
        let Ok((status, reply)) = send(&http, url, As::Key(&key), Some(body)).await else {
            break;
        };
        match (status, done) {
            (200, Acked::Committed { .. }) => {
                let charged = amount(&reply, "charged");
                log.ack(id, Acked::Committed { charged });
            }
            (200, _) => log.ack(id, done),
            _ => {
                log.unexpected.push((status, reply));
                break;
            }
        }
    }
    log
}

/// Runs `CLIENTS` lifecycle clients against the server at `base`, calls `interrupt` (which
/// kills or stops the server) after `after`, and returns what each client saw once they
/// have all stopped.
async fn load(
    base: &str,
    key: &str,
    round: usize,
    after: Duration,
    interrupt: impl FnOnce(),
) -> Vec<ClientLog> {
    let until = Instant::now() + after + Duration::from_secs(20);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let name = format!("round{round}-client{c}");
            tokio::spawn(lifecycles(base.to_string(), key.to_string(), name, until))
        })
        .collect();
    tokio::time::sleep(after).await;
    interrupt();
    let mut logs = Vec::new();
    for task in tasks {
        logs.push(task.await.expect("client task"));
    }
    logs
}

/// Folds client logs into the acknowledged state of every reservation.
fn record(acked: &mut BTreeMap<String, Acked>, logs: &[ClientLog]) {
    for log in logs {
        assert!(
            log.unexpected.is_empty(),
            "unexpected answers: {:?}",
            log.unexpected
        );
        for (id, what) in &log.acks {
            acked.insert(id.clone(), *what);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Checks after a restart
// ---------------------------------------------------------------------------------------

/// What the server says about one reservation: (HTTP status, its status, committed amount,
/// reserved amount).
async fn read_reservation(http: &reqwest::Client, base: &str, id: &str) -> (u16, String, i64, i64) {
    let (status, body) = send(
        http,
        format!("{base}/v1/reservations/{id}"),
        As::Admin,
        None,
    )
    .await
    .expect("read reservation");
    let text = |f: &str| body[f].as_str().unwrap_or_default().to_string();
    let num = |f: &str| body[f]["amount"].as_i64().unwrap_or(0);
    (status, text("status"), num("committed"), num("reserved"))
}

/// Every acknowledged reservation is there with its acknowledged outcome, and the budget
/// reconciles with the reservations exactly.
async fn assert_acknowledged(server: &Server, acked: &BTreeMap<String, Acked>) {
    let ids: Vec<(String, Acked)> = acked.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let chunks: Vec<Vec<(String, Acked)>> = ids
        .chunks(ids.len().div_ceil(CLIENTS).max(1))
        .map(<[_]>::to_vec)
        .collect();
    let tasks: Vec<_> = chunks
        .into_iter()
        .map(|chunk| {
            let base = server.base.clone();
            tokio::spawn(async move {
                let http = client();
                let (mut committed, mut held) = (0i64, 0i64);
                for (id, what) in chunk {
                    let (status, state, charged, reserved) =
                        read_reservation(&http, &base, &id).await;
                    match (what, status, state.as_str()) {
                        (Acked::Committed { charged: c }, 200, "COMMITTED") => {
                            assert_eq!(charged, c, "{id}: committed amount")
                        }
                        (Acked::Released, 200, "RELEASED") => {}
                        // A settlement may have been in flight: either outcome, or none.
                        (Acked::Reserved, 200, "ACTIVE" | "COMMITTED" | "RELEASED") => {}
                        (Acked::Reserved, 410, _) => {}
                        _ => panic!("{id}: acknowledged {what:?}, now {status} {state}"),
                    }
                    match state.as_str() {
                        "COMMITTED" => committed += charged,
                        "ACTIVE" => held += reserved,
                        _ => {}
                    }
                }
                (committed, held)
            })
        })
        .collect();
    let (mut committed, mut held) = (0i64, 0i64);
    for task in tasks {
        let (c, h) = task.await.expect("check task");
        committed += c;
        held += h;
    }
    let acked_charges: i64 = acked
        .values()
        .map(|a| match a {
            Acked::Committed { charged } => *charged,
            _ => 0,
        })
        .sum();

    let path = format!("/v1/admin/budgets/lookup?scope={SCOPE}&unit={UNIT}");
    let budget = expect(server, &path, As::Admin, None, 200).await;
    let [allocated, remaining, reserved, spent, debt] =
        ["allocated", "remaining", "reserved", "spent", "debt"].map(|f| amount(&budget, f));
    assert_eq!(
        remaining,
        allocated - spent - reserved - debt,
        "invariant: {budget}"
    );
    assert!(
        spent >= acked_charges,
        "spent {spent} < acknowledged charges {acked_charges}"
    );
    // Only clients that know a reservation's id can commit it, and every id a client
    // learned is in `acked`: the spend is exactly what those reservations committed.
    assert_eq!(spent, committed, "spent vs committed reservations");
    assert_eq!(debt, 0);
    // Holds beyond the known ACTIVE reservations come from reserves whose reply was lost
    // in a crash: whole estimates, at most one per client per crash.
    let phantom = reserved - held;
    assert!(
        phantom >= 0
            && phantom % ESTIMATE == 0
            && phantom <= (CLIENTS * KILL_CYCLES) as i64 * ESTIMATE,
        "reserved {reserved} vs ACTIVE holds {held}"
    );
}

/// Restarts the server on `data_dir`, checks everything acknowledged so far, stops it with
/// SIGTERM (which must exit 0), and runs `cycles verify` on the directory.
async fn restart_and_check(data_dir: &Path, logs: &Path, acked: &BTreeMap<String, Acked>) {
    let server = Server::start(data_dir, logs).await;
    assert_acknowledged(&server, acked).await;
    // Reservations were moving to the history store under the load: the reads above found
    // archived ones there.
    let metrics = client()
        .get(format!("{}/metrics", server.base))
        .header("X-Admin-API-Key", ADMIN_KEY)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let archived: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cycles_reservations_archived "))
        .and_then(|v| v.trim().parse().ok())
        .expect("cycles_reservations_archived");
    assert!(archived > 0, "nothing was archived");
    server.terminate().await;
    assert_verify_data_dir_ok(data_dir);
}

struct Dirs {
    data: TempDir,
    logs: TempDir,
}

impl Dirs {
    fn new() -> Self {
        Dirs {
            data: tempfile::tempdir().expect("data dir"),
            logs: tempfile::tempdir().expect("log dir"),
        }
    }

    fn data(&self) -> PathBuf {
        self.data.path().join("data")
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Three rounds of: load from concurrent clients, SIGKILL mid-flight, restart, and check
/// that every acknowledged operation survived, the budget reconciles, SIGTERM exits 0 and
/// `cycles verify` agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_under_load_loses_nothing_acknowledged() {
    let dirs = Dirs::new();
    let data = dirs.data();
    let mut acked = BTreeMap::new();
    let mut key = None;
    for round in 0..KILL_CYCLES {
        let server = Server::start(&data, dirs.logs.path()).await;
        let secret = match &key {
            Some(k) => k,
            None => key.insert(provision(&server).await),
        };
        let before = acked.len();
        let base = server.base.clone();
        let logs = load(&base, secret, round, LOAD, move || server.kill()).await;
        record(&mut acked, &logs);
        assert!(
            acked.len() > before + CLIENTS,
            "round {round}: too little load got through"
        );
        restart_and_check(&data, dirs.logs.path(), &acked).await;
    }
}

/// SIGTERM under load: requests already in flight are answered (no 5xx, no "shutting
/// down"), the process exits 0, and everything acknowledged is there after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_finishes_in_flight_requests_and_exits_cleanly() {
    let dirs = Dirs::new();
    let data = dirs.data();
    let server = Server::start(&data, dirs.logs.path()).await;
    let key = provision(&server).await;
    let mut term_sent = None;
    let logs = load(&server.base, &key, 0, Duration::from_millis(500), || {
        term_sent = Some(Instant::now());
        server.signal_term();
    })
    .await;
    let status = server.wait_exit().await;
    assert!(status.success(), "SIGTERM exited with {status}");
    let term_sent = term_sent.expect("SIGTERM sent");
    assert!(
        logs.iter()
            .any(|l| l.last_ack.is_some_and(|t| t > term_sent)),
        "no request was answered after SIGTERM"
    );
    let mut acked = BTreeMap::new();
    record(&mut acked, &logs);
    restart_and_check(&data, dirs.logs.path(), &acked).await;
}

/// A data directory serves one process: a second server on it is refused at start, saying
/// why, and the first goes on serving.
#[tokio::test]
async fn a_second_server_on_a_data_directory_is_refused() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, dir.path()).await;
    assert_serve_refused_in_use(&data, &[]);
    let health = client()
        .get(format!("{}/actuator/health", server.base))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);
}
