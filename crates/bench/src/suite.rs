//! The suite: provisioning through the admin API; the audit cells, at each size of the audit
//! log in turn; then per trial the floors, the write and read paths, the lifecycle cells and
//! the fan-out cells; the 100k/1M list cells after all trials (their fixtures, like the audit
//! log's, are built once through the API and timed apart).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::sync::Semaphore;

use crate::api::{Admin, Runtime, Tenant, ESTIMATE};
use crate::envinfo::Environment;
use crate::floors;
use crate::http::{Conn, Target};
use crate::measure::{self, LoadOp, Timed};
use crate::progress::{Phase, Progress};
use crate::report::{
    rows_label, CaseMeta, Class, Collector, Fixture, Method, Report, Resources, TargetInfo,
    FSYNC_APPEND_FLOOR, FSYNC_FLOOR, HISTORY_CELLS, HTTP_FLOOR, REDIS_FLOOR, SCHEMA, SETTLED_CELLS,
};
use crate::server::{self, Counters, CpuClock, PerOp};
use crate::stats::Sample;
use crate::text;

/// Budgets are large enough never to run dry during a run.
const ALLOCATED: i64 = 1_000_000_000_000_000;
/// The reference's fan-out budgets: 10^12 each.
const FANOUT_ALLOCATED: i64 = 1_000_000_000_000;
const SORTED_QUERY: &str = "limit=20&sort_by=created_at_ms&sort_dir=desc";
/// List populations above this are built after the trials (see the module comment).
const LARGE_ROWS: u64 = 10_000;
/// Tenants, each with a root budget, behind the governance list cells: an operator's
/// inventory, built once in the first trial.
const INVENTORY_TENANTS: usize = 1_000;
/// The budget list cell: a filter that keeps most budgets and the dashboard's default sort.
const BUDGET_LIST_QUERY: &str =
    "/v1/admin/budgets?has_debt=false&utilization_max=0.5&sort_by=utilization&limit=50";

/// The resolved settings of one run.
#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    /// Further instances of the same ledger the concurrent cells' clients are spread over.
    pub spread_urls: Vec<String>,
    pub admin_key: String,
    pub data_dir: Option<PathBuf>,
    pub redis_url: Option<String>,
    pub server_pid: Option<u32>,
    pub durability: Option<String>,
    pub method: Method,
}

pub struct Suite {
    cfg: Config,
    target: Target,
    /// The instances the concurrent cells' clients connect to in turn: `target` first.
    spread: Vec<Target>,
    admin: Admin,
    progress: Progress,
    run_id: String,
    floors: Collector,
    cases: Collector,
    overhead: PerOp,
    durability: Option<String>,
    engine: String,
    fixtures: Vec<Fixture>,
    lists: Vec<(u64, Tenant)>,
    notes: Vec<String>,
    audit: AuditMemory,
    settled: SettledMemory,
    /// The webhooks phase's deliveries and their rate.
    deliveries: Option<(u64, f64)>,
}

/// The server's memory around the audit fixtures.
#[derive(Default)]
struct AuditMemory {
    rss_before: Option<u64>,
    rss_after: Option<u64>,
    entries_after: Option<u64>,
}

/// The server's memory around the settled fixtures.
#[derive(Default)]
struct SettledMemory {
    rss_before: Option<u64>,
    rss_after: Option<u64>,
    settled: Option<u64>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Shared,
    Isolated,
}

/// A runtime client of `tenant` (as `agent`, if given), connected to `target`.
async fn connected(
    target: &Target,
    tenant: &Tenant,
    agent: Option<&str>,
) -> anyhow::Result<Runtime> {
    let mut rt = Runtime::new(target, tenant, agent);
    rt.connect().await?;
    Ok(rt)
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Shared => "shared",
            Shape::Isolated => "isolated",
        }
    }
}

impl Suite {
    pub async fn new(cfg: Config) -> anyhow::Result<Suite> {
        let target = Target::resolve(&cfg.url).await?;
        let mut spread = vec![target.clone()];
        for url in &cfg.spread_urls {
            spread.push(Target::resolve(url).await?);
        }
        let admin = Admin::new(&target, &cfg.admin_key);
        let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        Ok(Suite {
            durability: cfg.durability.clone(),
            cfg,
            target,
            spread,
            admin,
            progress: Progress::new(),
            run_id,
            floors: Collector::default(),
            cases: Collector::default(),
            overhead: PerOp::default(),
            engine: "unknown".into(),
            fixtures: Vec::new(),
            lists: Vec::new(),
            notes: Vec::new(),
            audit: AuditMemory::default(),
            settled: SettledMemory::default(),
            deliveries: None,
        })
    }

    pub async fn run(mut self) -> anyhow::Result<Report> {
        let trials = self.cfg.method.trials;
        let metrics = self.admin.metrics().await?;
        let exported = |name| metrics.as_deref().and_then(|t| server::metric(t, name));
        if exported(server::REDIS_ROUNDS).is_some() {
            self.engine = "redis".into();
        } else if exported(server::COMMANDS).is_some() {
            self.engine = "embedded".into();
        }
        if metrics.is_none() {
            self.notes.push("the server exposes no /metrics to the admin key: allocations, journal counters and (remote) peak RSS are n/a".into());
        }
        let load_start = crate::envinfo::load_average();
        let counters_start = metrics;
        // First, while the audit log is only the provisioning's few entries: its smallest
        // size must be the size its cells are labelled with.
        if self.runs("audit") {
            self.audit().await?;
        }
        if self.runs("webhooks") {
            self.webhooks().await?;
        }
        if self.runs("settled") {
            self.settled().await?;
        }
        for trial in 1..=trials {
            self.progress.note(&format!("trial {trial}/{trials}"));
            self.floors(trial).await?;
            self.calibrate().await;
            if self.runs("write") {
                self.write_path(trial).await?;
            }
            if self.runs("read") {
                self.read_path(trial).await?;
            }
            if self.runs("lifecycles") {
                self.lifecycles(trial).await?;
            }
            if self.runs("fanout") {
                self.fanout(trial).await?;
            }
        }
        let (peak_rss_bytes, peak_rss_source) = self.peak_rss().await;
        let large: Vec<u64> = self.large_rows();
        if !large.is_empty() {
            for &rows in &large {
                self.list_population(rows).await?;
            }
            for trial in 1..=trials {
                self.progress
                    .note(&format!("large list cells, trial {trial}/{trials}"));
                for &rows in &large {
                    self.sorted_list(rows).await?;
                }
            }
        }
        let after_large = if large.is_empty() {
            None
        } else {
            self.peak_rss().await.0
        };

        let counters_end = self.admin.metrics().await.ok().flatten();
        let server_counters =
            server::run_deltas(counters_start.as_deref(), counters_end.as_deref());
        let durability = self.durability.clone().unwrap_or_else(|| "unknown".into());
        let mut report = Report {
            schema: SCHEMA,
            generated_at_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            target: TargetInfo {
                url: self.target.url.clone(),
                spread_urls: self.cfg.spread_urls.clone(),
                engine: self.engine.clone(),
                durability,
                server_pid: self.cfg.server_pid,
            },
            environment: Environment {
                load_average_start: load_start,
                ..Environment::detect()
            },
            method: self.cfg.method.clone(),
            floors: self.floors.finish(),
            cases: self.cases.finish(),
            fixtures: self.fixtures,
            resources: Resources {
                peak_rss_bytes,
                peak_rss_source,
                peak_rss_after_large_fixtures_bytes: after_large,
                server_counters,
                audit_rss_before_bytes: self.audit.rss_before,
                audit_rss_after_bytes: self.audit.rss_after,
                audit_entries_after: self.audit.entries_after,
                webhook_deliveries_per_sec: self.deliveries.map(|(_, rate)| rate),
                webhook_deliveries: self.deliveries.map(|(n, _)| n),
                settled_rss_before_bytes: self.settled.rss_before,
                settled_rss_after_bytes: self.settled.rss_after,
                settled_reservations: self.settled.settled,
                ..Resources::default()
            },
            targets: Vec::new(),
            notes: self.notes,
        };
        report.finalize();
        Ok(report)
    }

    fn runs(&self, phase: &str) -> bool {
        self.cfg.method.phases.iter().any(|p| p == phase)
    }

    fn large_rows(&self) -> Vec<u64> {
        if !self.runs("large-lists") {
            return Vec::new();
        }
        let rows = &self.cfg.method.list_rows;
        rows.iter().copied().filter(|r| *r > LARGE_ROWS).collect()
    }

    async fn counters(&mut self) -> Counters {
        let text = self.admin.metrics().await.ok().flatten();
        Counters {
            cpu: self.cfg.server_pid.and_then(CpuClock::read),
            ..Counters::parse(text.as_deref())
        }
    }

    /// What reading the counters costs by itself (two reads back to back; the cheapest of
    /// three pairs), subtracted from every per-operation figure.
    async fn calibrate(&mut self) {
        let mut best: Option<PerOp> = None;
        for _ in 0..3 {
            let a = self.counters().await;
            let b = self.counters().await;
            let d = b.per_op(&a, &PerOp::default(), 1);
            if best.is_none_or(|x| d.metered.allocations < x.metered.allocations) {
                best = Some(d);
            }
        }
        self.overhead = best.unwrap_or_default();
    }

    async fn tenant(&mut self, what: &str) -> anyhow::Result<Tenant> {
        let id = format!("bench-{}-{what}", self.run_id);
        self.admin.tenant(&id).await
    }

    /// A tenant with one budget at its root.
    async fn funded_tenant(&mut self, what: &str, allocated: i64) -> anyhow::Result<Tenant> {
        let t = self.tenant(what).await?;
        self.admin
            .budget(&t.id, &format!("tenant:{}", t.id), allocated)
            .await?;
        Ok(t)
    }

    async fn client(&self, tenant: &Tenant, agent: Option<&str>) -> anyhow::Result<Runtime> {
        connected(&self.target, tenant, agent).await
    }

    /// A client for reserve→commit lifecycles.
    async fn lifecycle_client(&self, tenant: &Tenant) -> anyhow::Result<Runtime> {
        let mut rt = self.client(tenant, None).await?;
        self.for_lifecycles(&mut rt);
        Ok(rt)
    }

    /// Makes `rt`'s estimates vary if the run asks so (`--varied-estimates`).
    fn for_lifecycles(&self, rt: &mut Runtime) {
        if self.cfg.method.varied_estimates {
            rt.vary_estimates();
        }
    }

    fn record(&mut self, meta: CaseMeta, sample: Sample, error: Option<String>) {
        self.cases.add(meta, sample, error);
    }

    // ---- floors ----

    async fn floors(&mut self, trial: usize) -> anyhow::Result<()> {
        let (w, n) = (self.cfg.method.warmup, self.cfg.method.iterations);
        let mut conn = Conn::new(&self.target, None);
        conn.connect().await?;
        let mut op = async |_| floors::health(&mut conn).await;
        let timed = self.timed(HTTP_FLOOR, &mut op).await;
        let sample = Sample::from_timings(&timed.0.timings, timed.0.errors);
        self.floor_line(
            CaseMeta::new(HTTP_FLOOR, Class::Floor, 1, 0),
            sample,
            timed.0.first_error,
        );
        if let Some(dir) = self.cfg.data_dir.clone() {
            for (probe, name) in [
                (floors::Probe::Overwrite, FSYNC_FLOOR),
                (floors::Probe::Append, FSYNC_APPEND_FLOOR),
            ] {
                let dir = dir.clone();
                let timings =
                    tokio::task::spawn_blocking(move || floors::fdatasync(&dir, probe, w, n))
                        .await
                        .context("fdatasync probe")??;
                let sample = Sample::from_timings(&timings, 0);
                self.floor_line(CaseMeta::new(name, Class::Floor, 0, 1), sample, None);
            }
        } else if trial == 1 {
            self.notes
                .push("fdatasync floor: n/a (no --data-dir)".into());
        }
        if let Some(url) = self.cfg.redis_url.clone() {
            let mut redis = floors::Redis::connect(&url).await?;
            let mut op = async |_| redis.ping().await;
            let timed = self.timed(REDIS_FLOOR, &mut op).await;
            let sample = Sample::from_timings(&timed.0.timings, timed.0.errors);
            self.floor_line(
                CaseMeta::new(REDIS_FLOOR, Class::Floor, 0, 0),
                sample,
                timed.0.first_error,
            );
        }
        Ok(())
    }

    fn floor_line(&mut self, meta: CaseMeta, sample: Sample, error: Option<String>) {
        self.progress
            .line(&text::benchmark_line(&meta.name, &sample));
        self.floors.add(meta, sample, error);
    }

    // ---- sequential cases ----

    /// Warm-up then measured iterations of `op`; the server's counters are read around the
    /// measured block. Returns the measured loop (with the warm-up's errors) and the
    /// counters per measured operation.
    async fn timed(
        &mut self,
        name: &str,
        op: &mut impl AsyncFnMut(usize) -> anyhow::Result<()>,
    ) -> (Timed, PerOp) {
        let (w, n) = (self.cfg.method.warmup, self.cfg.method.iterations);
        let phase = self.progress.phase(name, (w + n) as u64);
        let warm = measure::sequential(0..w, &phase, op).await;
        let before = self.counters().await;
        let mut timed = measure::sequential(w..w + n, &phase, op).await;
        let after = self.counters().await;
        phase.finish();
        timed.absorb_errors(warm);
        let per_op = after.per_op(&before, &self.overhead, n);
        (timed, per_op)
    }

    async fn case(
        &mut self,
        meta: CaseMeta,
        op: &mut impl AsyncFnMut(usize) -> anyhow::Result<()>,
    ) {
        let (timed, per_op) = self.timed(&meta.name, op).await;
        let mut sample = Sample::from_timings(&timed.timings, timed.errors);
        sample.set_server(&per_op);
        if meta.name == "Reserve" && self.durability.is_none() {
            self.durability = per_op
                .metered
                .syncs
                .map(|s| if s >= 0.5 { "strict" } else { "none" }.to_string());
        }
        self.progress
            .line(&text::benchmark_line(&meta.name, &sample));
        self.record(meta, sample, timed.first_error);
    }

    /// `count` reservations made ahead of a case, outside its timing.
    async fn reservations(&self, rt: &mut Runtime, count: usize) -> anyhow::Result<Vec<String>> {
        let mut ids = Vec::with_capacity(count);
        for _ in 0..count {
            ids.push(
                rt.reserve()
                    .await
                    .context("creating reservations for a case")?,
            );
        }
        Ok(ids)
    }

    async fn write_path(&mut self, trial: usize) -> anyhow::Result<()> {
        let tenant = self
            .funded_tenant(&format!("t{trial}-write"), ALLOCATED)
            .await?;
        let mut rt = self.client(&tenant, None).await?;
        let total = self.cfg.method.warmup + self.cfg.method.iterations;
        let w = |name: &str, calls| CaseMeta::new(name, Class::Write, calls, calls);

        self.case(w("Reserve", 1), &mut async |_| rt.reserve().await.map(drop))
            .await;
        let ids = self.reservations(&mut rt, total).await?;
        self.case(w("Commit", 1), &mut async |i| rt.commit(&ids[i]).await)
            .await;
        let ids = self.reservations(&mut rt, total).await?;
        self.case(w("Release", 1), &mut async |i| rt.release(&ids[i]).await)
            .await;
        let ids = self.reservations(&mut rt, total).await?;
        self.case(w("Extend", 1), &mut async |i| rt.extend(&ids[i]).await)
            .await;
        self.case(w("Decide", 1), &mut async |_| rt.decide().await)
            .await;
        self.case(w("Event", 1), &mut async |_| rt.event().await)
            .await;
        self.case(w("Reserve→Commit", 2), &mut async |_| {
            let id = rt.reserve().await?;
            rt.commit(&id).await
        })
        .await;
        self.case(w("Reserve→Release", 2), &mut async |_| {
            let id = rt.reserve().await?;
            rt.release(&id).await
        })
        .await;
        Ok(())
    }

    async fn read_path(&mut self, trial: usize) -> anyhow::Result<()> {
        let tenant = self
            .funded_tenant(&format!("t{trial}-read"), ALLOCATED)
            .await?;
        let mut rt = self.client(&tenant, None).await?;
        let ids = self.reservations(&mut rt, 10).await?;
        let r = |name: &str| CaseMeta::new(name, Class::Read, 1, 0);
        self.case(r("GET reservation"), &mut async |_| {
            rt.get_reservation(&ids[0]).await
        })
        .await;
        self.case(r("GET balances"), &mut async |_| rt.balances().await)
            .await;
        self.case(r("LIST reservations"), &mut async |_| {
            rt.list("limit=10", Some(10)).await
        })
        .await;
        if trial == 1 {
            self.inventory().await?;
        }
        let mut admin = Admin::new(&self.target, &self.cfg.admin_key);
        let tenants = format!(
            "/v1/admin/tenants?search=bench-{}-inv-&sort_by=name&sort_dir=asc&limit=50",
            self.run_id
        );
        self.case(r("LIST tenants (search, by name)"), &mut async |_| {
            admin.get_ok(&tenants).await
        })
        .await;
        self.case(
            r("LIST budgets (filtered, by utilization)"),
            &mut async |_| admin.get_ok(BUDGET_LIST_QUERY).await,
        )
        .await;
        // The reference's second Decide cell ("Decide (pipelined)"): the same request,
        // measured in the read class. Decide records its idempotency key, so it is a write.
        let decide = CaseMeta::new("Decide (read class)", Class::Read, 1, 1);
        self.case(decide, &mut async |_| rt.decide().await).await;
        let small: Vec<u64> = self
            .cfg
            .method
            .list_rows
            .iter()
            .copied()
            .filter(|r| *r <= LARGE_ROWS)
            .collect();
        for rows in small {
            if trial == 1 {
                self.list_population(rows).await?;
            }
            self.sorted_list(rows).await?;
        }
        Ok(())
    }

    // ---- sorted lists ----

    /// A tenant holding `rows` ACTIVE reservations, created through the API by concurrent
    /// clients (the user's path), timed as a fixture.
    /// [`INVENTORY_TENANTS`] tenants with a root budget each, for the governance lists.
    async fn inventory(&mut self) -> anyhow::Result<()> {
        let phase = self
            .progress
            .phase("fixture tenant inventory", INVENTORY_TENANTS as u64);
        for i in 0..INVENTORY_TENANTS {
            self.funded_tenant(&format!("inv-{i:04}"), ALLOCATED)
                .await?;
            phase.inc(1);
        }
        phase.finish();
        Ok(())
    }

    async fn list_population(&mut self, rows: u64) -> anyhow::Result<()> {
        let label = rows_label(rows);
        let tenant = self
            .funded_tenant(&format!("list-{}", label.to_lowercase()), ALLOCATED)
            .await?;
        let clients = self.cfg.method.fixture_clients.max(1);
        let phase = self.progress.phase(&format!("fixture {label} rows"), rows);
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let mut rt = self.client(&tenant, None).await?;
            let (next, errors, phase) = (next.clone(), errors.clone(), phase.clone());
            tasks.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < rows {
                    loop {
                        match rt.reserve_fixture().await {
                            Ok(_) => break,
                            Err(e) if errors.fetch_add(1, Ordering::Relaxed) >= 100 => {
                                return Err(e.context("building a list fixture"))
                            }
                            Err(_) => {}
                        }
                    }
                    phase.inc(1);
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        let seconds = phase.finish().as_secs_f64();
        let built = started.elapsed().as_secs_f64().max(seconds);
        let fixture = Fixture {
            kind: "list".into(),
            rows,
            clients,
            seconds: built,
            rows_per_sec: rows as f64 / built,
            errors: errors.load(Ordering::Relaxed),
        };
        self.progress.note(&format!(
            "fixture of {rows} rows built in {built:.1} s ({:.0} rows/s)",
            fixture.rows_per_sec
        ));
        self.fixtures.push(fixture);
        self.lists.push((rows, tenant));
        // A large build may have started a snapshot; measure the idle server, not that.
        server::settle(self.cfg.server_pid, Duration::from_secs(120)).await;
        Ok(())
    }

    async fn sorted_list(&mut self, rows: u64) -> anyhow::Result<()> {
        let tenant = self
            .lists
            .iter()
            .find(|(r, _)| *r == rows)
            .map(|(_, t)| t.clone())
            .context("the list fixture exists (invariant)")?;
        let mut rt = self.client(&tenant, None).await?;
        let meta = CaseMeta::new(
            format!("LIST sorted @{}", rows_label(rows)),
            Class::Read,
            1,
            0,
        )
        .rows(rows);
        self.case(meta, &mut async |_| rt.list(SORTED_QUERY, Some(20)).await)
            .await;
        Ok(())
    }

    // ---- settled reservations ----

    /// The settled cells at each number of settled reservations in turn (they only grow),
    /// and the server's settled RSS after the first fixture and after the last: the first
    /// warms the server as a running one is warm (its allocator's pages, SQLite's page
    /// caches, the reservations in flight before they are archived), so what grows after
    /// it is what settled reservations cost. With one size, from before it. Runs before the
    /// trials, on a server that holds little else.
    async fn settled(&mut self) -> anyhow::Result<()> {
        self.calibrate().await;
        let tenant = self.funded_tenant("settled", ALLOCATED).await?;
        let mut rt = self.client(&tenant, None).await?;
        // ACTIVE for the longest TTL: it outlives the largest fixture.
        let live = rt.reserve_fixture().await?;
        let base = self.wait_archived(0).await?;
        let mut sizes = self.cfg.method.settled_rows.clone();
        sizes.sort_unstable();
        let rss = |pid: Option<u32>| pid.and_then(server::rss);
        if sizes.len() < 2 {
            server::settle(self.cfg.server_pid, Duration::from_secs(120)).await;
            self.settled.rss_before = rss(self.cfg.server_pid);
        }
        let (trials, mut grown, mut oldest, mut counted_from) =
            (self.cfg.method.trials, 0, None, 0);
        for (i, size) in sizes.into_iter().enumerate() {
            let first = self.grow_settled(&tenant, size - grown.min(size)).await?;
            oldest = oldest.or(first);
            grown = grown.max(size);
            self.wait_archived(base + grown).await?;
            server::settle(self.cfg.server_pid, Duration::from_secs(120)).await;
            if i == 0 && self.settled.rss_before.is_none() {
                self.settled.rss_before = rss(self.cfg.server_pid);
                counted_from = grown;
            }
            let archived = oldest.clone().context("a settled reservation")?;
            let label = rows_label(size);
            for trial in 1..=trials {
                self.progress
                    .note(&format!("settled cells @{label}, trial {trial}/{trials}"));
                let [live_cell, archived_cell, list_cell] = SETTLED_CELLS.map(|cell| {
                    CaseMeta::new(format!("{cell} @{label}"), Class::Read, 1, 0).rows(size)
                });
                self.case(live_cell, &mut async |_| rt.get_reservation(&live).await)
                    .await;
                self.case(archived_cell, &mut async |_| {
                    rt.get_reservation(&archived).await
                })
                .await;
                self.case(list_cell, &mut async |_| {
                    rt.list(SORTED_QUERY, Some(20)).await
                })
                .await;
            }
        }
        self.settled.rss_after = rss(self.cfg.server_pid);
        self.settled.settled = Some(grown - counted_from);
        Ok(())
    }

    /// Waits until the server has archived `total` reservations (none of this run's
    /// settled ones left in memory); answers how many it has archived. Without the
    /// engine's metric (another engine), waits nothing.
    async fn wait_archived(&mut self, total: u64) -> anyhow::Result<u64> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let text = self.admin.metrics().await.ok().flatten();
            let Some(archived) = text
                .as_deref()
                .and_then(|t| server::metric(t, server::ARCHIVED))
                .map(|v| v as u64)
            else {
                return Ok(0);
            };
            if archived >= total {
                return Ok(archived);
            }
            if Instant::now() > deadline {
                bail!("the server archived {archived} reservations, not {total}, in 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `count` reserve → commit lifecycles in `tenant` from the fixture clients, timed as a
    /// fixture; answers the first reservation settled.
    async fn grow_settled(
        &mut self,
        tenant: &Tenant,
        count: u64,
    ) -> anyhow::Result<Option<String>> {
        let clients = self.cfg.method.fixture_clients.max(1);
        let phase = self
            .progress
            .phase(&format!("fixture {count} settled reservations"), count);
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let mut rt = self.lifecycle_client(tenant).await?;
            let (next, errors, phase) = (next.clone(), errors.clone(), phase.clone());
            tasks.push(tokio::spawn(async move {
                let mut first = None;
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    loop {
                        let settled = async {
                            let id = rt.reserve().await?;
                            rt.commit(&id).await?;
                            anyhow::Ok(id)
                        };
                        match settled.await {
                            Ok(id) => {
                                first.get_or_insert(id);
                                break;
                            }
                            Err(e) if errors.fetch_add(1, Ordering::Relaxed) >= 100 => {
                                return Err(e.context("settling reservations for a fixture"))
                            }
                            Err(_) => {}
                        }
                    }
                    phase.inc(1);
                }
                anyhow::Ok(first)
            }));
        }
        let mut first = None;
        for task in tasks {
            first = first.or(task.await??);
        }
        let seconds = phase.finish().as_secs_f64();
        let built = started.elapsed().as_secs_f64().max(seconds);
        self.fixtures.push(Fixture {
            kind: "settled".into(),
            rows: count,
            clients,
            seconds: built,
            rows_per_sec: count as f64 / built,
            errors: errors.load(Ordering::Relaxed),
        });
        Ok(first)
    }

    // ---- the audit log ----

    /// The audit cells at each audit log size in turn (the log only grows), and the
    /// server's settled RSS before the first fixture and after the last. Runs before the
    /// trials, so the smallest size is not already passed by the suite's own writes.
    async fn audit(&mut self) -> anyhow::Result<()> {
        self.calibrate().await;
        let tenant = self.funded_tenant("audit", ALLOCATED).await?;
        // A second tenant with one refused write, so the refusals page is not empty.
        let (path, body) = Admin::credit("no-such-tenant")?;
        let _ = self.admin.post_ok(&path, body).await;
        server::settle(self.cfg.server_pid, Duration::from_secs(120)).await;
        self.audit.rss_before = self.cfg.server_pid.and_then(server::rss);
        let mut sizes = self.cfg.method.audit_entries.clone();
        sizes.sort_unstable();
        let trials = self.cfg.method.trials;
        for size in sizes {
            self.grow_audit_log(&tenant, size).await?;
            let label = rows_label(size);
            let pages = [
                "/v1/admin/audit/logs?limit=50".to_string(),
                format!(
                    "/v1/admin/audit/logs?tenant_id={}&operation=fundBudget&limit=50",
                    tenant.id
                ),
                "/v1/admin/audit/logs?status_min=400&limit=50".to_string(),
                "/v1/admin/events?limit=50".to_string(),
                format!(
                    "/v1/admin/events?tenant_id={}&event_type=budget.funded&limit=50",
                    tenant.id
                ),
            ];
            let mut admin = Admin::new(&self.target, &self.cfg.admin_key);
            for trial in 1..=trials {
                self.progress
                    .note(&format!("audit cells @{label}, trial {trial}/{trials}"));
                for (cell, page) in HISTORY_CELLS.iter().zip(&pages) {
                    let meta =
                        CaseMeta::new(format!("{cell} @{label}"), Class::Read, 1, 0).rows(size);
                    self.case(meta, &mut async |_| admin.get_ok(page).await)
                        .await;
                }
            }
        }
        self.audit.rss_after = self.cfg.server_pid.and_then(server::rss);
        self.audit.entries_after = self.audit_entries().await;
        Ok(())
    }

    async fn audit_entries(&mut self) -> Option<u64> {
        let text = self.admin.metrics().await.ok().flatten()?;
        server::metric(&text, server::AUDIT_ENTRIES).map(|v| v as u64)
    }

    /// Grows the audit log to `size` entries with credits to `tenant`'s budget, from the
    /// fixture clients (each an audited write through the API), timed as a fixture.
    async fn grow_audit_log(&mut self, tenant: &Tenant, size: u64) -> anyhow::Result<()> {
        let have = self
            .audit_entries()
            .await
            .context("the server reports cycles_audit_entries on /metrics")?;
        if have > size {
            bail!("the audit log already holds {have} entries, more than the {size} asked for: run the audit cells on a fresh server");
        }
        let writes = size - have;
        let clients = self.cfg.method.fixture_clients.max(1);
        let label = rows_label(size);
        let phase = self
            .progress
            .phase(&format!("fixture audit log of {label}"), writes);
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let (path, body) = Admin::credit(&tenant.id)?;
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let mut admin = Admin::new(&self.target, &self.cfg.admin_key);
            let (next, errors, phase) = (next.clone(), errors.clone(), phase.clone());
            let (path, body) = (path.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < writes {
                    while let Err(e) = admin.post_ok(&path, body.clone()).await {
                        if errors.fetch_add(1, Ordering::Relaxed) >= 100 {
                            return Err(e.context("building the audit fixture"));
                        }
                    }
                    phase.inc(1);
                }
                anyhow::Ok(())
            }));
        }
        for task in tasks {
            task.await??;
        }
        phase.finish();
        let built = started.elapsed().as_secs_f64();
        self.fixtures.push(Fixture {
            kind: "audit".into(),
            rows: size,
            clients,
            seconds: built,
            rows_per_sec: writes as f64 / built.max(1e-9),
            errors: errors.load(Ordering::Relaxed),
        });
        let now = self.audit_entries().await.unwrap_or(0);
        self.progress.note(&format!(
            "audit log grown to {now} entries in {built:.1} s ({writes} writes)"
        ));
        server::settle(self.cfg.server_pid, Duration::from_secs(120)).await;
        Ok(())
    }

    // ---- webhook deliveries ----

    /// Deliveries per second: a tenant's `REPLAY_EVENTS` events are replayed
    /// `REPLAY_ROUNDS` times to a subscription whose receiver runs in this process, and
    /// the rate is the deliveries over the time from the first replay to the last delivery
    /// received.
    async fn webhooks(&mut self) -> anyhow::Result<()> {
        const REPLAY_EVENTS: u64 = 1_000;
        const REPLAY_ROUNDS: u64 = 20;
        let tenant = self.funded_tenant("webhooks", ALLOCATED).await?;
        let phase = self
            .progress
            .phase("fixture events to replay", REPLAY_EVENTS);
        let (path, body) = Admin::credit(&tenant.id)?;
        for _ in 0..REPLAY_EVENTS {
            self.admin.post_ok(&path, body.clone()).await?;
            phase.inc(1);
        }
        phase.finish();
        let receiver = crate::receiver::Receiver::start().await?;
        self.admin
            .send_json(
                hyper::Method::PUT,
                "/v1/admin/config/webhook-security",
                r#"{"blocked_cidr_ranges": [], "allow_http": true}"#.into(),
                200,
            )
            .await?;
        let created = self
            .admin
            .send_json(
                hyper::Method::POST,
                &format!("/v1/admin/webhooks?tenant_id={}", tenant.id),
                serde_json::json!({"url": receiver.url(), "event_types": ["budget.funded"]})
                    .to_string(),
                201,
            )
            .await?;
        let id = created["subscription"]["subscription_id"]
            .as_str()
            .context("the created subscription's id")?
            .to_string();
        let want = REPLAY_EVENTS * REPLAY_ROUNDS;
        let phase = self.progress.phase("webhook deliveries", want);
        let started = Instant::now();
        for _ in 0..REPLAY_ROUNDS {
            let queued = self
                .admin
                .send_json(
                    hyper::Method::POST,
                    &format!("/v1/admin/webhooks/{id}/replay"),
                    format!(r#"{{"max_events": {REPLAY_EVENTS}}}"#),
                    202,
                )
                .await?;
            if queued["events_queued"].as_u64() != Some(REPLAY_EVENTS) {
                bail!(
                    "a replay queued {} deliveries, not {REPLAY_EVENTS}",
                    queued["events_queued"]
                );
            }
        }
        let deadline = started + Duration::from_secs(300);
        let mut shown = 0;
        loop {
            let got = receiver.count();
            phase.inc(got.min(want) - shown);
            shown = got.min(want);
            if got >= want {
                break;
            }
            if Instant::now() > deadline {
                bail!("only {got} of {want} webhook deliveries arrived in 300 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        phase.finish();
        let rate = want as f64 / seconds.max(1e-9);
        self.progress.note(&format!(
            "{want} webhook deliveries in {seconds:.2} s: {rate:.0}/s"
        ));
        self.deliveries = Some((want, rate));
        server::settle(self.cfg.server_pid, Duration::from_secs(60)).await;
        Ok(())
    }

    // ---- concurrent cells ----

    fn window(&self) -> Duration {
        Duration::from_secs_f64(self.cfg.method.window_secs)
    }

    async fn clients(
        &self,
        tenant: &Tenant,
        agents: Option<usize>,
        n: usize,
    ) -> anyhow::Result<Vec<Runtime>> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let agent = agents.map(|_| format!("fanout-{i}"));
            let target = &self.spread[i % self.spread.len()];
            out.push(connected(target, tenant, agent.as_deref()).await?);
        }
        Ok(out)
    }

    /// Runs a load while a phase bar shows the elapsed window.
    /// One concurrent cell, with the server's counters per successful operation.
    async fn load(
        &mut self,
        name: &str,
        clients: Vec<Runtime>,
        op: LoadOp,
    ) -> (measure::Load, PerOp) {
        let window = self.window();
        let phase = self.progress.phase(name, (window.as_millis() / 100) as u64);
        let ticker = tick(phase.clone());
        let before = self.counters().await;
        let load = measure::concurrent(clients, op, window).await;
        let after = self.counters().await;
        ticker.abort();
        phase.finish();
        // Spread over instances, the work is not all in the one whose counters are read.
        let per_op = match self.spread.len() {
            1 => after.per_op(&before, &self.overhead, load.histogram.len() as usize),
            _ => PerOp::default(),
        };
        (load, per_op)
    }

    async fn lifecycles(&mut self, trial: usize) -> anyhow::Result<()> {
        let tenant = self
            .funded_tenant(&format!("t{trial}-lifecycles"), ALLOCATED)
            .await?;
        for n in self.cfg.method.concurrency_clients.clone() {
            let name = format!("Lifecycles {n} clients");
            let mut rt = self.lifecycle_client(&tenant).await?;
            let mut warm = Timed::default();
            for _ in 0..self.cfg.method.warmup {
                if let Err(e) = LoadOp::Lifecycle.once(&mut rt).await {
                    warm = Timed {
                        errors: warm.errors + 1,
                        first_error: warm.first_error.or(Some(format!("{e:#}"))),
                        ..warm
                    };
                }
            }
            let mut clients = self.clients(&tenant, None, n).await?;
            clients.iter_mut().for_each(|rt| self.for_lifecycles(rt));
            let (load, per_op) = self.load(&name, clients, LoadOp::Lifecycle).await;
            let mut sample =
                Sample::from_histogram(&load.histogram, self.window(), load.errors + warm.errors);
            sample.set_server(&per_op);
            self.progress.line(&text::concurrent_line(
                n,
                self.cfg.method.window_secs,
                &sample,
            ));
            let meta = CaseMeta::new(name, Class::Concurrent, 2, 2).clients(n);
            self.record(meta, sample, load.first_error.or(warm.first_error));
        }
        Ok(())
    }

    async fn fanout(&mut self, trial: usize) -> anyhow::Result<()> {
        for shape in [Shape::Shared, Shape::Isolated] {
            for n in self.cfg.method.fanout_clients.clone() {
                self.fanout_cell(trial, shape, n).await?;
            }
        }
        Ok(())
    }

    /// Reserve-only at `n` clients on one shared budget or one budget per client, then the
    /// ledger reconciliation: each budget's `reserved` grew by exactly successes × 100.
    async fn fanout_cell(&mut self, trial: usize, shape: Shape, n: usize) -> anyhow::Result<()> {
        let name = format!("Fan-out {} {n}", shape.name());
        let tenant = self
            .tenant(&format!("t{trial}-{}-{n}", shape.name()))
            .await?;
        let scopes: Vec<String> = match shape {
            Shape::Shared => vec![format!("tenant:{}", tenant.id)],
            Shape::Isolated => (0..n)
                .map(|i| format!("tenant:{}/agent:fanout-{i}", tenant.id))
                .collect(),
        };
        for scope in &scopes {
            self.admin
                .budget(&tenant.id, scope, FANOUT_ALLOCATED)
                .await?;
        }
        let agents = (shape == Shape::Isolated).then_some(n);
        let clients = self.clients(&tenant, agents, n).await?;
        let (clients, warm) = warm_up(clients, self.cfg.method.warmup.max(n), n.min(50)).await;
        let mut before = Vec::with_capacity(scopes.len());
        for scope in &scopes {
            before.push(self.admin.reserved(scope).await?);
        }
        let (load, per_op) = self.load(&name, clients, LoadOp::Reserve).await;
        let expected: Vec<i64> = match shape {
            Shape::Shared => vec![load.per_client.iter().sum::<u64>() as i64 * ESTIMATE],
            Shape::Isolated => load
                .per_client
                .iter()
                .map(|s| *s as i64 * ESTIMATE)
                .collect(),
        };
        let mut mismatches = 0;
        for ((scope, before), expected) in scopes.iter().zip(&before).zip(&expected) {
            let delta = self.admin.reserved(scope).await? - before;
            if delta != *expected {
                mismatches += 1;
                self.notes.push(format!("{name} (trial {trial}): {scope} reserved grew by {delta}, successes × {ESTIMATE} = {expected}"));
            }
        }
        let mut sample =
            Sample::from_histogram(&load.histogram, self.window(), load.errors + warm.errors);
        sample.ledger_mismatches = mismatches;
        sample.set_server(&per_op);
        self.progress.line(&text::fanout_line(
            shape.name(),
            n,
            self.cfg.method.window_secs,
            &sample,
        ));
        let meta = CaseMeta::new(name, Class::Fanout, 1, 1).clients(n);
        self.record(meta, sample, load.first_error.or(warm.first_error));
        Ok(())
    }

    async fn peak_rss(&mut self) -> (Option<u64>, String) {
        if let Some(pid) = self.cfg.server_pid {
            if let Some(v) = server::peak_rss(pid) {
                return (Some(v), format!("/proc/{pid}/status VmHWM"));
            }
        }
        let text = self.admin.metrics().await.ok().flatten();
        match text
            .as_deref()
            .and_then(|t| server::metric(t, server::PEAK_RSS))
        {
            Some(v) => (Some(v as u64), format!("/metrics {}", server::PEAK_RSS)),
            None => (None, "n/a".into()),
        }
    }
}

/// Advances a phase bar every 100 ms until aborted.
fn tick(phase: Phase) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            phase.inc(1);
        }
    })
}

/// The fan-out warm-up: `total` reserves round-robin over the clients, at most `parallel`
/// at a time. Returns the clients and the warm-up's failures.
async fn warm_up(clients: Vec<Runtime>, total: usize, parallel: usize) -> (Vec<Runtime>, Timed) {
    let n = clients.len().max(1);
    let gate = Arc::new(Semaphore::new(parallel.max(1)));
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut rt)| {
            let gate = gate.clone();
            let share = total / n + usize::from(i < total % n);
            tokio::spawn(async move {
                let mut failed = Timed::default();
                for _ in 0..share {
                    let _permit = gate.acquire().await;
                    if let Err(e) = rt.reserve().await {
                        failed.errors += 1;
                        failed.first_error.get_or_insert(format!("{e:#}"));
                    }
                }
                (rt, failed)
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    let mut failed = Timed::default();
    for task in tasks {
        match task.await {
            Ok((rt, f)) => {
                out.push(rt);
                failed.absorb_errors(f);
            }
            Err(e) => {
                failed.errors += 1;
                failed
                    .first_error
                    .get_or_insert(format!("warm-up task: {e}"));
            }
        }
    }
    (out, failed)
}

/// Fails a run that cannot be trusted.
pub fn verdict(report: &Report) -> anyhow::Result<()> {
    let (errors, mismatches) = (report.errors(), report.ledger_mismatches());
    if errors > 0 || mismatches > 0 {
        bail!("the run had {errors} errors and {mismatches} ledger mismatches (see the report)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rows_label;

    #[test]
    fn row_labels() {
        assert_eq!(rows_label(1_000), "1k");
        assert_eq!(rows_label(10_000), "10k");
        assert_eq!(rows_label(100_000), "100k");
        assert_eq!(rows_label(1_000_000), "1M");
        assert_eq!(rows_label(1_500), "1500");
    }
}
