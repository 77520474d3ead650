//! The behaviour-test harness: a real server on port 0, driven over real HTTP.
//!
//! Every behaviour test is written once against [`TestServer`] and stamped out per storage
//! engine by [`engine_tests!`]. Time is a [`ManualClock`]: tests move it instead of sleeping.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use server::{BoundServer, ServerOptions};
use store::embedded::{Durability, EmbeddedConfig, EmbeddedStore};
use store::redis::{RedisConfig, RedisDurability, RedisStore, ScratchLedger, Topology};
use store::ManualClock;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const ADMIN_KEY: &str = "test-admin-key";
/// Points the Redis engine's tests at a Redis (`.ci/run` always sets it).
pub const REDIS_URL_ENV: &str = "CYCLES_TEST_REDIS_URL";
/// Points them at a Redis Cluster too (`.ci/run` starts one and sets it).
pub const REDIS_CLUSTER_URL_ENV: &str = "CYCLES_TEST_REDIS_CLUSTER_URL";

/// A fixed start time, so expiry arithmetic in tests is exact.
pub const T0: i64 = 1_800_000_000_000;

/// The storage engines the behaviour suite runs against.
///
/// Adding one: a variant here, its arms in [`Engine::open`] and [`Engine::server_env`], and
/// one line in the list at the top of [`engine_tests!`]. No test changes.
#[derive(Debug, Clone, Copy)]
pub enum Engine {
    /// The embedded engine with strict durability in a temporary data directory.
    Embedded,
    /// The Redis engine on the Redis at `CYCLES_TEST_REDIS_URL`, each test on a ledger of
    /// its own (its namespace is the test's temporary directory's name).
    Redis,
    /// The Redis engine on the Redis Cluster at `CYCLES_TEST_REDIS_CLUSTER_URL` (its nodes,
    /// comma-separated).
    RedisCluster,
}

impl Engine {
    /// Opens this engine's store, keeping any files in `dir` and reading time from `clock`
    /// (a Redis engine's on `ledger`).
    fn open(
        self,
        dir: &Path,
        clock: Arc<ManualClock>,
        ledger: Option<&ScratchLedger>,
    ) -> store::Engine {
        match self {
            Engine::Embedded => {
                let config = EmbeddedConfig::new(dir, Durability::Strict, clock);
                EmbeddedStore::open(config).expect("open store").0.into()
            }
            Engine::Redis | Engine::RedisCluster => {
                let ledger = ledger.expect("a Redis engine has a ledger");
                let mut config = RedisConfig::new(ledger.url.clone(), dir.join("history"), clock);
                // The tests set the time.
                config.clock_from_redis = false;
                config.topology = ledger.topology.clone();
                config.namespace = ledger.namespace.clone();
                // The test Redis need not persist anything: what is tested is the engine.
                config.durability = RedisDurability::None;
                // Generous: the machines that run the suite are shared and loaded.
                config.timeout = Duration::from_secs(2);
                RedisStore::open(config).expect("open redis store").0.into()
            }
        }
    }

    /// The ledger a test on a Redis engine runs on: its own, named after the test's
    /// temporary directory.
    fn ledger(self, dir: &Path) -> Option<ScratchLedger> {
        let topology = match self {
            Engine::Embedded => return None,
            Engine::Redis => Topology::Single,
            Engine::RedisCluster => Topology::Cluster,
        };
        let var = self.server_env()?;
        let url = std::env::var(var).expect("checked by is_available");
        let dir_name = dir.file_name().expect("a temporary directory's name");
        let name = format!("test-{}", dir_name.to_string_lossy());
        Some(ScratchLedger::new(&url, topology, &name))
    }

    /// The environment variable that points this engine at its outside server, for an engine
    /// that needs one (a Redis engine: `CYCLES_TEST_REDIS_URL`). Where it is unset, the
    /// engine's tests pass without running, so the suite runs anywhere.
    fn server_env(self) -> Option<&'static str> {
        match self {
            Engine::Embedded => None,
            Engine::Redis => Some(REDIS_URL_ENV),
            Engine::RedisCluster => Some(REDIS_CLUSTER_URL_ENV),
        }
    }

    /// Whether this engine can run here; says on stderr why not when it cannot. In CI
    /// (`CI` set) every engine must run: a missing server is a failure, not a skip.
    pub fn is_available(self) -> bool {
        match self.server_env() {
            Some(var) if std::env::var_os(var).is_none() => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "{var} is not set: in CI the {self:?} engine's tests must run"
                );
                eprintln!("skipped: the {self:?} engine needs {var}");
                false
            }
            _ => true,
        }
    }
}

/// Stamps each listed `async fn name(engine: Engine)` out as one `#[tokio::test]` per engine,
/// in one module per engine (`lifecycle::embedded::reserve_commit_round_trip`).
#[macro_export]
macro_rules! engine_tests {
    ($($name:ident),* $(,)?) => {
        // The engines, as `module => Engine variant`, one line each (say, `redis => Redis,`).
        $crate::engine_tests!(@engines [$($name),*]
            embedded => Embedded,
            redis => Redis,
            redis_cluster => RedisCluster,
        );
    };
    (@engines $names:tt $($module:ident => $engine:ident,)*) => {
        $($crate::engine_tests!(@module $module $engine $names);)*
    };
    (@module $module:ident $engine:ident [$($name:ident),*]) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let engine = $crate::common::Engine::$engine;
                    if engine.is_available() {
                        super::$name(engine).await
                    }
                }
            )*
        }
    };
}

/// Who a request is sent as.
#[derive(Clone, Copy)]
pub enum As<'a> {
    Nobody,
    Admin,
    Key(&'a str),
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Resp {
    /// The status, headers and body (JSON, or the text when it is not) of a response.
    async fn read(resp: reqwest::Response) -> Resp {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        Resp {
            status,
            headers,
            body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `error` code of an error body.
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    /// Asserts the status and, for errors, the code; returns the body.
    #[track_caller]
    pub fn expect(&self, status: u16, code: Option<&str>) -> &Value {
        assert_eq!(
            self.status, status,
            "unexpected status; body: {}",
            self.body
        );
        if let Some(code) = code {
            assert_eq!(
                self.code(),
                code,
                "unexpected error code; body: {}",
                self.body
            );
        }
        &self.body
    }
}

pub struct TestServer {
    pub base: String,
    pub clock: Arc<ManualClock>,
    http: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    /// The data directory, removed when the server is dropped.
    _dir: TempDir,
    /// A Redis engine's ledger, deleted when the server is dropped.
    _ledger: Option<ScratchLedger>,
}

impl TestServer {
    pub async fn start(engine: Engine) -> Self {
        Self::start_with(engine, |_| {}).await
    }

    /// A server whose options `configure` changes from the defaults (a rate limit, say).
    pub async fn start_with(engine: Engine, configure: impl FnOnce(&mut ServerOptions)) -> Self {
        let open = |dir: &Path, clock| {
            let ledger = engine.ledger(dir);
            (engine.open(dir, clock, ledger.as_ref()), ledger)
        };
        Self::start_on(open, configure).await
    }

    /// A server on the embedded engine whose store `configure` changes (injected disk
    /// faults, say).
    pub async fn start_embedded(configure: impl FnOnce(&mut EmbeddedConfig)) -> Self {
        let open = |dir: &Path, clock: Arc<ManualClock>| {
            let mut config = EmbeddedConfig::new(dir, Durability::Strict, clock);
            configure(&mut config);
            let store = EmbeddedStore::open(config).expect("open store").0.into();
            (store, None)
        };
        Self::start_on(open, |_| {}).await
    }

    async fn start_on(
        open: impl FnOnce(&Path, Arc<ManualClock>) -> (store::Engine, Option<ScratchLedger>),
        configure: impl FnOnce(&mut ServerOptions),
    ) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Arc::new(ManualClock::new(T0));
        let (store, ledger) = open(dir.path(), clock.clone());
        let mut options = ServerOptions {
            listen: "127.0.0.1:0".parse().expect("addr"),
            admin_api_key: ADMIN_KEY.into(),
            sweep_interval: Duration::from_millis(20),
            archive_after: Duration::from_secs(2),
            rate_limit: None,
            public_metrics: false,
            dashboard: None,
            audit_unauthenticated_per_minute: 0,
            webhook_keys: Vec::new(),
            limits: server::Limits::default(),
            // Ticks often, so tests wait for windows to close in milliseconds.
            detector: server::DetectorOptions {
                tick: Duration::from_millis(20),
                ..server::DetectorOptions::default()
            },
        };
        configure(&mut options);
        let bound = BoundServer::bind(store, options).await.expect("bind");
        let base = format!("http://{}", bound.local_addr().expect("addr"));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(bound.run(async {
            let _ = rx.await;
        }));
        TestServer {
            base,
            clock,
            http: reqwest::Client::new(),
            shutdown: Some(tx),
            task: Some(task),
            _dir: dir,
            _ledger: ledger,
        }
    }

    /// Stops the server gracefully (flushing the store).
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task").expect("server run");
        }
    }

    pub fn advance(&self, ms: i64) {
        self.clock.advance(ms);
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        who: As<'_>,
        body: Option<&Value>,
    ) -> Resp {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        req = match who {
            As::Nobody => req,
            As::Admin => req.header("X-Admin-API-Key", ADMIN_KEY),
            As::Key(k) => req.header("X-Cycles-API-Key", k),
        };
        if let Some(body) = body {
            if let Some(key) = body.get("idempotency_key").and_then(Value::as_str) {
                req = req.header("X-Idempotency-Key", key);
            }
            req = req.json(body);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Resp {
            status,
            headers,
            body,
        }
    }

    /// A GET with one header set by hand (e.g. a wrong admin key).
    pub async fn http_get_with(&self, path: &str, header: &str, value: &str) -> Resp {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .header(header, value)
            .send()
            .await
            .expect("request");
        Resp::read(resp).await
    }

    pub async fn post(&self, path: &str, who: As<'_>, body: Value) -> Resp {
        self.send(reqwest::Method::POST, path, who, Some(&body))
            .await
    }

    pub async fn get(&self, path: &str, who: As<'_>) -> Resp {
        self.send(reqwest::Method::GET, path, who, None).await
    }

    /// Sends raw bytes (for malformed-body tests).
    pub async fn post_raw(&self, path: &str, who: As<'_>, body: Vec<u8>) -> Resp {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .body(body);
        if let As::Key(k) = who {
            req = req.header("X-Cycles-API-Key", k);
        }
        if let As::Admin = who {
            req = req.header("X-Admin-API-Key", ADMIN_KEY);
        }
        Resp::read(req.send().await.expect("request")).await
    }

    /// Creates a tenant (admin).
    pub async fn tenant(&self, id: &str) {
        self.tenant_with(json!({"tenant_id": id, "name": id})).await;
    }

    pub async fn tenant_with(&self, body: Value) {
        let r = self.post("/v1/admin/tenants", As::Admin, body).await;
        assert!(r.status == 201 || r.status == 200, "tenant: {}", r.body);
    }

    /// Creates an API key for a tenant with the default permissions; returns its secret.
    pub async fn key(&self, tenant: &str) -> String {
        let r = self
            .post(
                "/v1/admin/api-keys",
                As::Admin,
                json!({"tenant_id": tenant, "name": "test"}),
            )
            .await;
        r.expect(201, None)["key_secret"]
            .as_str()
            .expect("secret")
            .to_string()
    }

    /// A key for `tenant` created with `extra`'s fields merged into the body (permissions, a
    /// scope filter, an expiry); returns `(secret, key_id)`.
    pub async fn key_with(&self, tenant: &str, extra: Value) -> (String, String) {
        let mut body = json!({"tenant_id": tenant, "name": format!("{tenant}-key")});
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        let r = self.post("/v1/admin/api-keys", As::Admin, body).await;
        let k = r.expect(201, None);
        (
            k["key_secret"].as_str().expect("secret").to_string(),
            k["key_id"].as_str().expect("key_id").to_string(),
        )
    }

    /// Creates a budget (admin) with optional extra fields merged into the body.
    pub async fn budget(&self, scope: &str, unit: &str, allocated: i64, extra: Value) -> Value {
        let tenant = scope
            .split('/')
            .next()
            .unwrap()
            .trim_start_matches("tenant:");
        let mut body = json!({
            "tenant_id": tenant,
            "scope": scope,
            "unit": unit,
            "allocated": {"unit": unit, "amount": allocated},
        });
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        let r = self.post("/v1/admin/budgets", As::Admin, body).await;
        r.expect(201, None).clone()
    }

    /// A tenant, a key and a USD_MICROCENTS budget at `tenant:<id>`; returns the key.
    pub async fn setup(&self, tenant: &str, allocated: i64) -> String {
        self.tenant(tenant).await;
        let key = self.key(tenant).await;
        self.budget(
            &format!("tenant:{tenant}"),
            "USD_MICROCENTS",
            allocated,
            json!({}),
        )
        .await;
        key
    }

    /// The budget at `(scope, unit)`, via the admin lookup.
    pub async fn ledger(&self, scope: &str, unit: &str) -> Value {
        let r = self
            .get(
                &format!("/v1/admin/budgets/lookup?scope={scope}&unit={unit}"),
                As::Admin,
            )
            .await;
        let b = r.expect(200, None).clone();
        assert_invariant(&b);
        b
    }
}

/// `remaining = allocated − spent − reserved − debt` on a Balance or BudgetLedger body.
#[track_caller]
pub fn assert_invariant(b: &Value) {
    let n = |f: &str| {
        b[f]["amount"]
            .as_i64()
            .unwrap_or_else(|| panic!("{f} missing in {b}"))
    };
    assert_eq!(
        n("remaining"),
        n("allocated") - n("spent") - n("reserved") - n("debt"),
        "ledger invariant broken: {b}"
    );
}

/// The amount of a named Amount field.
pub fn amount(b: &Value, field: &str) -> i64 {
    b[field]["amount"]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} missing in {b}"))
}

/// A reserve body for `subject` and `estimate` USD_MICROCENTS.
pub fn reserve_body(key: &str, subject: Value, estimate: i64) -> Value {
    json!({
        "idempotency_key": key,
        "subject": subject,
        "action": {"kind": "llm.completion", "name": "gpt-4o-mini"},
        "estimate": {"unit": "USD_MICROCENTS", "amount": estimate},
    })
}

/// The value of a metric on `/metrics`.
pub async fn metric(server: &TestServer, name: &str) -> u64 {
    let text = server.get("/metrics", As::Admin).await;
    let text = text.body.as_str().expect("metrics text").to_string();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
        .trim()
        .parse()
        .expect("a number")
}
