//! `cycles serve`.

use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use server::{BoundServer, Dashboard, DetectorOptions, Limits, RateLimit, ServerOptions};
use store::embedded::{Durability, EmbeddedConfig, EmbeddedStore};
use store::history::Retention;
use store::redis::{RedisConfig, RedisDurability, RedisStore, Topology};
use store::SystemClock;

/// The file in the data directory that keeps a generated admin key.
pub const ADMIN_KEY_FILE: &str = "admin.key";
/// Where the data directory is unless one is named (`cycles admin` looks there too).
pub const DEFAULT_DATA_DIR: &str = "./cycles-data";

/// The keys webhook secrets are sealed with (see `--webhook-keys`).
pub const WEBHOOK_KEY_FILE: &str = "webhook.key";

#[derive(Clone, Copy, ValueEnum)]
pub enum DurabilityArg {
    /// fdatasync before every reply (default).
    Strict,
    /// Memory only: nothing survives a restart. For tests and measuring the floor.
    None,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreArg {
    /// This process's data directory: a journal and snapshots (the default).
    Embedded,
    /// A Redis or Redis Cluster that any number of `cycles serve` processes share.
    Redis,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum RedisDurabilityArg {
    /// Redis must keep an append-only file (appendonly yes); refused otherwise.
    Aof,
    /// Redis may keep nothing: a Redis restart loses the ledger. For tests and the floor.
    None,
}

/// Which ledger in which Redis (`--store redis`, and `cycles verify --store redis`).
#[derive(Args)]
pub struct RedisTarget {
    /// The Redis to keep the ledger in (`redis://[user:password@]host:port[/db]`); for a
    /// Redis Cluster, any of its nodes, comma-separated.
    #[arg(
        long,
        env = "CYCLES_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,
    /// The Redis is a Redis Cluster.
    #[arg(long, env = "CYCLES_REDIS_CLUSTER")]
    pub redis_cluster: bool,
    /// The URL lists Redis Sentinels (comma-separated), which watch the primary of this
    /// name: the engine writes to whichever Redis they name primary, and follows a failover
    /// (the primary is reached with the first URL's credentials and database).
    #[arg(
        long,
        env = "CYCLES_REDIS_SENTINEL_MASTER",
        conflicts_with = "redis_cluster"
    )]
    pub redis_sentinel_master: Option<String>,
    /// Names the ledger in Redis: its keys are `{NAMESPACE}:…` (one hash slot). Instances
    /// with the same namespace serve the same ledger.
    #[arg(long, env = "CYCLES_REDIS_NAMESPACE", default_value = "cycles")]
    pub redis_namespace: String,
}

impl RedisTarget {
    pub fn topology(&self) -> Topology {
        match (&self.redis_sentinel_master, self.redis_cluster) {
            (Some(primary), _) => Topology::Sentinel(primary.clone()),
            (None, true) => Topology::Cluster,
            (None, false) => Topology::Single,
        }
    }
}

/// The Redis engine (`--store redis`).
#[derive(Args)]
struct RedisArgs {
    #[command(flatten)]
    target: RedisTarget,
    /// What Redis must keep on disk.
    #[arg(
        long,
        env = "CYCLES_REDIS_DURABILITY",
        value_enum,
        default_value = "aof"
    )]
    redis_durability: RedisDurabilityArg,
    /// Milliseconds one Redis command may take before Redis counts as down: operations are
    /// then answered 503 at once until it answers again.
    #[arg(long, env = "CYCLES_REDIS_TIMEOUT_MS",
        default_value_t = store::redis::DEFAULT_TIMEOUT.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(1..))]
    redis_timeout_ms: u64,
    /// Milliseconds the writer's lease lasts without a write: how long a writer that died
    /// holds the others up, at most.
    #[arg(long, env = "CYCLES_REDIS_LEASE_MS",
        default_value_t = store::redis::DEFAULT_LEASE.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(100..))]
    redis_lease_ms: u64,
    /// Replicas every write must reach before it is acknowledged (Redis `WAIT`, once per
    /// round, within --redis-timeout-ms); short of them, the answer is 503 "outcome
    /// unknown". 0: the primary's acknowledgement is enough. Not with --redis-cluster.
    #[arg(long, env = "CYCLES_REDIS_REPLICAS", default_value_t = 0)]
    redis_replicas: u32,
    /// Records the ledger's log in Redis may hold past its snapshot before a compaction
    /// replaces them by a new snapshot (its history moves to streams trimmed by retention):
    /// this bounds Redis's memory and what an instance replays to start.
    #[arg(long, env = "CYCLES_REDIS_SNAPSHOT_RECORDS",
        default_value_t = store::redis::DEFAULT_SNAPSHOT_RECORDS,
        value_parser = clap::value_parser!(u64).range(1..))]
    redis_snapshot_records: u64,
    /// The base URL other instances reach this one at (`http://HOST:PORT`). With it, an
    /// instance hands its writes to the one holding the writer's lease instead of waiting
    /// for its turn, so the fleet's writes are decided together: give it to every instance.
    #[arg(long, env = "CYCLES_REDIS_ADVERTISE_URL", value_parser = advertise_url)]
    redis_advertise_url: Option<String>,
}

/// A base URL for peers: `http://` a host and a port, nothing after (a final `/` dropped).
fn advertise_url(text: &str) -> Result<String, String> {
    let base = text.trim_end_matches('/');
    let rest = base
        .strip_prefix("http://")
        .ok_or("must start with http://")?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or("must name a port (http://HOST:PORT)")?;
    if host.is_empty() || host.contains(['/', '?', '#', '@', ' ']) {
        return Err("must be http://HOST:PORT, with no path".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(base.to_string()),
        _ => Err(format!("'{port}' is not a port")),
    }
}

/// Bounds on what clients can hold (see the README's "Limits").
#[derive(Args)]
struct LimitArgs {
    /// Open connections at most; more are answered 503 and closed.
    #[arg(long, env = "CYCLES_MAX_CONNECTIONS", default_value_t = Limits::DEFAULT.max_connections as u32,
        value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Bytes a request's line and headers may take (at least 8192); more are answered 431.
    #[arg(long, env = "CYCLES_MAX_HEADER_BYTES", default_value_t = Limits::DEFAULT.max_header_bytes as u32,
        value_parser = clap::value_parser!(u32).range(Limits::MIN_HEADER_BYTES as i64..))]
    max_header_bytes: u32,
    /// Headers a request may carry; more are answered 431.
    #[arg(long, env = "CYCLES_MAX_HEADERS", default_value_t = Limits::DEFAULT.max_headers as u32,
        value_parser = clap::value_parser!(u32).range(1..))]
    max_headers: u32,
    /// Milliseconds a client has to send a request's headers, and an idle kept-alive
    /// connection to start its next request; the connection is closed after that.
    #[arg(long, env = "CYCLES_HEADER_READ_TIMEOUT_MS",
        default_value_t = Limits::DEFAULT.header_read_timeout.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(1..))]
    header_read_timeout_ms: u64,
    /// Milliseconds a client has to send a request's body, from its headers; 408 after that.
    #[arg(long, env = "CYCLES_BODY_READ_TIMEOUT_MS",
        default_value_t = Limits::DEFAULT.body_read_timeout.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(1..))]
    body_read_timeout_ms: u64,
    /// Requests answered at once, at most; more are answered 503 with Retry-After at once.
    #[arg(long, env = "CYCLES_MAX_IN_FLIGHT", default_value_t = Limits::DEFAULT.max_in_flight as u32,
        value_parser = clap::value_parser!(u32).range(1..))]
    max_in_flight: u32,
    /// Requests one credential (an API key, the admin key, or an address that presents
    /// none) may have in flight; more are answered 429 with Retry-After.
    #[arg(long, env = "CYCLES_MAX_IN_FLIGHT_PER_KEY", default_value_t = Limits::DEFAULT.max_in_flight_per_key as u32,
        value_parser = clap::value_parser!(u32).range(1..))]
    max_in_flight_per_key: u32,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_connections: self.max_connections as usize,
            max_header_bytes: self.max_header_bytes as usize,
            max_headers: self.max_headers as usize,
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(self.body_read_timeout_ms),
            max_in_flight: self.max_in_flight as usize,
            max_in_flight_per_key: self.max_in_flight_per_key as usize,
        }
    }
}

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on (every plane): an IP address or a host name, and a port.
    #[arg(long, env = "CYCLES_LISTEN", default_value = "127.0.0.1:7878", value_parser = listen_address)]
    listen: SocketAddr,
    /// Where the ledger is kept.
    #[arg(long, env = "CYCLES_STORE", value_enum, default_value = "embedded")]
    store: StoreArg,
    #[command(flatten)]
    redis: RedisArgs,
    /// Where the journal, snapshots and the generated admin key live (with `--store
    /// redis`: the generated keys and this instance's history cache).
    #[arg(long, env = "CYCLES_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// The admin key (X-Admin-API-Key). If unset, one is generated on first start, stored in
    /// the data directory and printed once.
    #[arg(long, env = "CYCLES_ADMIN_API_KEY", hide_env_values = true)]
    admin_api_key: Option<String>,
    /// When a write is acknowledged (the embedded store).
    #[arg(long, env = "CYCLES_DURABILITY", value_enum, default_value = "strict")]
    durability: DurabilityArg,
    /// How often lapsed reservations and keys are expired and old records evicted, in
    /// milliseconds.
    #[arg(long, env = "CYCLES_SWEEP_INTERVAL_MS", default_value_t = 1_000)]
    sweep_interval_ms: u64,
    /// How long a settled (committed, released or expired) reservation stays in memory, in
    /// milliseconds, before it is archived to the history store on disk, where it stays
    /// readable and replayable for its 30-day retention.
    #[arg(long, env = "CYCLES_ARCHIVE_AFTER_MS", default_value_t = 2_000)]
    archive_after_ms: u64,
    /// Journal size (MiB) after which a snapshot is written and older journal dropped (the
    /// journal must also have grown by the last snapshot's size).
    #[arg(long, env = "CYCLES_SNAPSHOT_AFTER_MIB", default_value_t = 256)]
    snapshot_after_mib: u64,
    /// Journal records after which a snapshot is written, even short of
    /// `--snapshot-after-mib` (the journal must also have grown by the last snapshot's
    /// size): a restart after a crash replays at most about this many.
    #[arg(long, env = "CYCLES_SNAPSHOT_AFTER_RECORDS",
        default_value_t = store::embedded::DEFAULT_SNAPSHOT_AFTER_RECORDS,
        value_parser = clap::value_parser!(u64).range(1..))]
    snapshot_after_records: u64,
    /// Days audit entries are kept (0 = forever).
    #[arg(long, env = "CYCLES_AUDIT_RETENTION_DAYS", default_value_t = Retention::DEFAULT.authenticated_days)]
    audit_retention_days: u32,
    /// Days the audit entries of requests refused before their caller was known are kept
    /// (0 = forever).
    #[arg(
        long,
        env = "CYCLES_AUDIT_RETENTION_UNAUTHENTICATED_DAYS",
        default_value_t = Retention::DEFAULT.unauthenticated_days
    )]
    audit_retention_unauthenticated_days: u32,
    /// Days events are kept (0 = forever).
    #[arg(long, env = "CYCLES_EVENT_RETENTION_DAYS", default_value_t = Retention::DEFAULT.events_days)]
    event_retention_days: u32,
    /// Days webhook delivery records are kept (0 = forever).
    #[arg(
        long,
        env = "CYCLES_DELIVERY_RETENTION_DAYS",
        default_value_t = Retention::DEFAULT.deliveries_days
    )]
    delivery_retention_days: u32,
    /// Keys that seal webhook signing secrets and custom headers at rest: 64 hex characters
    /// each, comma-separated; the first seals new secrets and every one opens. Without it
    /// they are read from `webhook.key` in the data directory (one per line), which is
    /// created with a fresh key when missing. To rotate, put a new key first and keep the
    /// old ones until every secret has been rotated (PATCH `signing_secret`).
    #[arg(long, env = "CYCLES_WEBHOOK_KEYS", hide_env_values = true)]
    webhook_keys: Option<String>,
    /// Audit entries one client address may leave per minute for requests refused before
    /// their caller was known (0 = every one); past it they are counted, not written.
    #[arg(
        long,
        env = "CYCLES_AUDIT_UNAUTHENTICATED_PER_MINUTE",
        default_value_t = 300
    )]
    audit_unauthenticated_per_minute: u32,
    /// Requests per second allowed per credential: each API key, the admin key too, and per
    /// client address for requests without one (0 = no limit). Over it: 429 LIMIT_EXCEEDED.
    #[arg(long, env = "CYCLES_RATE_LIMIT_PER_SECOND", default_value_t = 0.0)]
    rate_limit_per_second: f64,
    /// Requests a key may burst above its rate (default: one second's worth).
    #[arg(long, env = "CYCLES_RATE_LIMIT_BURST")]
    rate_limit_burst: Option<f64>,
    #[command(flatten)]
    limits: LimitArgs,
    /// How often the anomaly detector closes its windows and looks for burn-rate
    /// anomalies, rate spikes and high latency, in milliseconds.
    #[arg(long, env = "CYCLES_ANOMALY_TICK_MS", default_value_t = 5_000,
        value_parser = clap::value_parser!(u64).range(10..))]
    anomaly_tick_ms: u64,
    /// The p99 latency over a minute above which system.high_latency is emitted, in
    /// milliseconds (0: never).
    #[arg(long, env = "CYCLES_HIGH_LATENCY_MS", default_value_t = 1_000)]
    high_latency_ms: u64,
    /// Serve /metrics without the admin key (for scrapers that cannot send headers).
    #[arg(long, env = "CYCLES_PUBLIC_METRICS")]
    public_metrics: bool,
    /// A build of the operator dashboard (its `dist` directory, holding `index.html`) to serve
    /// at `/` on the same listener as the API.
    #[arg(long, env = "CYCLES_DASHBOARD_DIR")]
    dashboard_dir: Option<PathBuf>,
    /// Log filter (e.g. info, debug, server=debug).
    #[arg(long, env = "CYCLES_LOG", default_value = "info")]
    log: String,
    /// Log lines as text (coloured only on a terminal) or as one JSON object each.
    #[arg(long, env = "CYCLES_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log))
        .with_writer(std::io::stderr);
    match args.log_format {
        // Colour codes only where a person reads them, never in a file or a collector.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().init(),
    }
    disable_transparent_huge_pages();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(args))
}

/// Opts the server out of transparent huge pages. The ledger's state grows with every
/// reservation, and with huge pages each first touch of a 2 MiB region has the kernel zero all
/// of it while the allocator uses a fraction: under 200 concurrent clients the page faults were
/// a fifth of the server's CPU, and zeroed several times the resident memory (BENCHMARKS.md).
/// With 4 KiB pages only what is used is zeroed. Failure (an old kernel) changes nothing else.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and only sets a flag on
        // this process's memory map; no pointer is passed.
        let status = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if status != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "transparent huge pages stay on");
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let key = admin_key(&args.data_dir, args.admin_api_key.clone())?;
    let mut shown = false;
    let served = serve_with(args, &key, &mut shown).await;
    if served.is_err() && key.generated && !shown {
        // Stored already, and later starts only say where: shown with the failure.
        eprintln!("{}", key.note);
    }
    served
}

/// [`serve`] with its admin key; `shown` is set once the key's note is printed.
async fn serve_with(args: ServeArgs, key: &StartKey, shown: &mut bool) -> anyhow::Result<()> {
    let durability = match args.durability {
        DurabilityArg::Strict => Durability::Strict,
        DurabilityArg::None => Durability::None,
    };
    // Checked before the store is opened: a wrong path fails at once, not after recovery.
    let dashboard = args
        .dashboard_dir
        .as_deref()
        .map(Dashboard::open)
        .transpose()
        .context("--dashboard-dir / CYCLES_DASHBOARD_DIR")?;
    let retention = Retention {
        authenticated_days: args.audit_retention_days,
        unauthenticated_days: args.audit_retention_unauthenticated_days,
        events_days: args.event_retention_days,
        deliveries_days: args.delivery_retention_days,
    };
    // A memory-only server keeps nothing on disk: without given keys, its secrets are sealed
    // with a key of this process (they go when it does).
    let webhook_keys = match (args.store, durability) {
        (StoreArg::Embedded, Durability::None) => {
            given_webhook_keys(args.webhook_keys.as_deref())?.unwrap_or_default()
        }
        _ => webhook_keys(&args.data_dir, args.webhook_keys.as_deref())?,
    };
    let (store, storage) = match args.store {
        StoreArg::Embedded => open_embedded(&args, durability, retention)?,
        StoreArg::Redis => open_redis(&args, retention)?,
    };
    let options = ServerOptions {
        listen: args.listen,
        admin_api_key: key.key.clone(),
        sweep_interval: Duration::from_millis(args.sweep_interval_ms.max(10)),
        archive_after: Duration::from_millis(args.archive_after_ms),
        rate_limit: (args.rate_limit_per_second > 0.0).then(|| RateLimit {
            per_second: args.rate_limit_per_second,
            burst: args
                .rate_limit_burst
                .unwrap_or(args.rate_limit_per_second)
                .max(1.0),
        }),
        public_metrics: args.public_metrics,
        dashboard,
        audit_unauthenticated_per_minute: args.audit_unauthenticated_per_minute,
        webhook_keys,
        limits: args.limits.limits(),
        detector: DetectorOptions {
            tick: Duration::from_millis(args.anomaly_tick_ms),
            high_latency: (args.high_latency_ms > 0)
                .then(|| Duration::from_millis(args.high_latency_ms)),
        },
    };
    let bound = BoundServer::bind(store, options)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = bound.local_addr()?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Cycles is listening on http://{addr} (storage: {storage})"
    )?;
    if let Some(dir) = &args.dashboard_dir {
        writeln!(
            out,
            "Dashboard: http://{addr}/ (from {}; log in with the admin key)",
            dir.display()
        )?;
    }
    writeln!(out, "{}", key.note)?;
    *shown = true;
    // `quickstart` finds the admin key where this server took it from.
    let key_from = if args
        .admin_api_key
        .as_deref()
        .is_some_and(|k| !k.trim().is_empty())
    {
        "   (with CYCLES_ADMIN_API_KEY or --admin-key set to the admin key)".to_string()
    } else if args.data_dir != Path::new(DEFAULT_DATA_DIR) {
        format!(" --data-dir {}", args.data_dir.display())
    } else {
        String::new()
    };
    writeln!(
        out,
        "Get a tenant API key:  cycles quickstart --url http://{addr}{key_from}"
    )?;
    drop(out);
    bound.run(shutdown_signal()).await?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// `--listen`: `ip:port`, or `host:port` resolved here (its IPv4 address, if it has one:
/// `localhost` may resolve to `::1` first, where clients mostly try `127.0.0.1`).
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    if let Ok(address) = text.parse() {
        return Ok(address);
    }
    let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(text)
        .map_err(|e| format!("expected host:port, e.g. 127.0.0.1:7878 ({e})"))?
        .collect();
    resolved
        .iter()
        .find(|a| a.is_ipv4())
        .or(resolved.first())
        .copied()
        .ok_or_else(|| format!("{text} resolves to no address"))
}

/// Opens the embedded store; answers it with how the startup line names it.
fn open_embedded(
    args: &ServeArgs,
    durability: Durability,
    retention: Retention,
) -> anyhow::Result<(store::Engine, String)> {
    let mut config = EmbeddedConfig::new(&args.data_dir, durability, Arc::new(SystemClock));
    config.snapshot_after_bytes = args.snapshot_after_mib.max(1) << 20;
    config.snapshot_after_records = args.snapshot_after_records;
    config.retention = retention;
    let opening = std::time::Instant::now();
    let (store, report) = EmbeddedStore::open(config)
        .with_context(|| format!("opening data directory {}", args.data_dir.display()))?;
    tracing::info!(
        durability = durability.as_str(),
        snapshot_seq = ?report.snapshot_seq,
        replayed = report.records_replayed,
        truncated_bytes = report.truncated_bytes,
        reservations = report.reservations,
        history_reprojected = report.history_reprojected,
        elapsed_ms = opening.elapsed().as_millis() as u64,
        "store recovered"
    );
    let storage = if durability == Durability::None {
        if store::embedded::holds_ledger(&args.data_dir).unwrap_or(false) {
            tracing::warn!(
                dir = %args.data_dir.display(),
                "--durability none keeps the ledger in memory only: the ledger in this \
                 directory is neither read nor written"
            );
        }
        "embedded, in memory only (--durability none: nothing is kept)".to_string()
    } else {
        format!(
            "embedded, {} durability, data in {}",
            durability.as_str(),
            args.data_dir.display()
        )
    };
    Ok((store.into(), storage))
}

/// Opens the Redis engine; answers it with how the startup line names it.
fn open_redis(args: &ServeArgs, retention: Retention) -> anyhow::Result<(store::Engine, String)> {
    let r = &args.redis;
    let t = &r.target;
    let mut config = RedisConfig::new(
        t.redis_url.clone(),
        args.data_dir.join("redis-history"),
        Arc::new(SystemClock),
    );
    config.topology = t.topology();
    config.namespace = t.redis_namespace.clone();
    config.durability = r.durability();
    config.timeout = Duration::from_millis(r.redis_timeout_ms);
    config.lease = Duration::from_millis(r.redis_lease_ms);
    config.replicas = r.redis_replicas;
    config.snapshot_records = r.redis_snapshot_records;
    config.advertise = r.redis_advertise_url.clone();
    config.retention = retention;
    let opening = std::time::Instant::now();
    let (store, report) = RedisStore::open(config).context("opening the Redis engine")?;
    if let Some(settings) = &report.settings {
        tracing::info!(
            ledger = %report.ledger,
            created = report.created,
            records = report.records,
            appendonly = %settings.appendonly,
            appendfsync = %settings.appendfsync,
            elapsed_ms = opening.elapsed().as_millis() as u64,
            "store loaded from redis"
        );
    }
    if args.admin_api_key.is_none() || args.webhook_keys.is_none() {
        tracing::warn!(
            "every instance on one ledger needs the same admin key and webhook keys: give \
             --admin-api-key and --webhook-keys to each (generated ones are this instance's)"
        );
    }
    let forwarding = match &r.redis_advertise_url {
        Some(url) => format!(", writes handed to the lease's holder (this one at {url})"),
        None => String::new(),
    };
    let storage = format!(
        "redis, ledger '{}' at {}, {} durability{forwarding}",
        t.redis_namespace,
        redacted(&t.redis_url),
        r.durability().as_str()
    );
    Ok((store.into(), storage))
}

impl RedisArgs {
    fn durability(&self) -> RedisDurability {
        match self.redis_durability {
            RedisDurabilityArg::Aof => RedisDurability::Aof,
            RedisDurabilityArg::None => RedisDurability::None,
        }
    }
}

/// A Redis URL without its password, for the startup line.
fn redacted(url: &str) -> String {
    url.split(',')
        .map(|node| match (node.find("://"), node.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}***{}", &node[..scheme + 3], &node[at..])
            }
            _ => node.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The admin key this start serves with (the server keeps only its digest, to check keys
/// against), and what the startup output says of it.
struct StartKey {
    key: String,
    note: String,
    /// Generated by this start: the note shows it, once.
    generated: bool,
}

/// The admin key: given, or stored in the data directory, or generated (and stored).
fn admin_key(data_dir: &Path, given: Option<String>) -> anyhow::Result<StartKey> {
    if let Some(key) = given.filter(|k| !k.trim().is_empty()) {
        return Ok(StartKey {
            key,
            note: "Admin key: from CYCLES_ADMIN_API_KEY / --admin-api-key".into(),
            generated: false,
        });
    }
    let path = data_dir.join(ADMIN_KEY_FILE);
    if let Ok(key) = fs::read_to_string(&path) {
        let key = key.trim().to_string();
        if !key.is_empty() {
            let note = format!("Admin key: stored in {}", path.display());
            return Ok(StartKey {
                key,
                note,
                generated: false,
            });
        }
    }
    store::embedded::create_private_dir(data_dir)
        .with_context(|| format!("creating data directory {}", data_dir.display()))?;
    let key = format!(
        "cyc_admin_{}",
        server::new_key_secret().trim_start_matches("cyc_live_")
    );
    write_private(&path, &key).with_context(|| format!("writing {}", path.display()))?;
    let note = format!(
        "Generated an admin key (shown once; kept in {}):\n  X-Admin-API-Key: {key}",
        path.display()
    );
    Ok(StartKey {
        key,
        note,
        generated: true,
    })
}

/// Hex keys, one per line or comma-separated.
fn parse_webhook_keys(text: &str, from: &str) -> anyhow::Result<Vec<[u8; 32]>> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(|k| {
            let bytes = hex::decode(k).ok().filter(|b| b.len() == 32);
            bytes
                .map(|b| b.try_into().expect("32 bytes"))
                .with_context(|| format!("{from}: a key is 64 hex characters"))
        })
        .collect()
}

/// The keys given by flag or environment, if any.
fn given_webhook_keys(given: Option<&str>) -> anyhow::Result<Option<Vec<[u8; 32]>>> {
    given
        .filter(|g| !g.trim().is_empty())
        .map(|g| parse_webhook_keys(g, "CYCLES_WEBHOOK_KEYS / --webhook-keys"))
        .transpose()
}

/// The keys that seal webhook secrets: given, or read from (or first written to) the data
/// directory's `webhook.key`.
fn webhook_keys(data_dir: &Path, given: Option<&str>) -> anyhow::Result<Vec<[u8; 32]>> {
    if let Some(keys) = given_webhook_keys(given)? {
        return Ok(keys);
    }
    let path = data_dir.join(WEBHOOK_KEY_FILE);
    if let Ok(text) = fs::read_to_string(&path) {
        let keys = parse_webhook_keys(&text, &path.display().to_string())?;
        if !keys.is_empty() {
            return Ok(keys);
        }
    }
    if store::embedded::holds_ledger(data_dir).unwrap_or(false) {
        tracing::warn!(
            path = %path.display(),
            "no webhook key in a data directory that holds a ledger: a new one is made; the \
             secrets of subscriptions sealed with the old one cannot be opened, so their \
             deliveries fail until it is given back (--webhook-keys, or restore the file)"
        );
    }
    store::embedded::create_private_dir(data_dir)
        .with_context(|| format!("creating data directory {}", data_dir.display()))?;
    let key = server::new_webhook_key();
    write_private(&path, &format!("{}\n", hex::encode(key)))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(vec![key])
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

#[cfg(test)]
mod tests {
    use super::{advertise_url, listen_address};

    #[test]
    fn a_listen_address_may_name_its_host() {
        let given = listen_address("127.0.0.1:7878").unwrap();
        assert_eq!(given.to_string(), "127.0.0.1:7878");
        assert_eq!(listen_address("[::1]:9").unwrap().to_string(), "[::1]:9");
        let local = listen_address("localhost:7879").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 7879, "{local}");
        for bad in ["localhost", "127.0.0.1", "no such host.invalid:1"] {
            assert!(listen_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_advertised_url_is_a_base_url_for_http() {
        assert_eq!(
            advertise_url("http://10.0.0.5:7878/").unwrap(),
            "http://10.0.0.5:7878"
        );
        assert_eq!(
            advertise_url("http://cycles-1:7878").unwrap(),
            "http://cycles-1:7878"
        );
        assert_eq!(
            advertise_url("http://[::1]:7878").unwrap(),
            "http://[::1]:7878"
        );
        for bad in [
            "https://a:1",
            "http://a",
            "http://:1",
            "http://a:0",
            "http://a:99999",
            "http://a:1/v1",
            "http://u@a:1",
            "a:1",
        ] {
            assert!(advertise_url(bad).is_err(), "{bad}");
        }
    }
}
