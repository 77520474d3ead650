//! `cycles bench`: the reference's benchmark suite against any Cycles server, measured the
//! reference's way (`reference-behaviour.md` §19), with the physical floors of the same run,
//! allocations and memory per operation, and comparisons and budgets for CI.
//!
//! The suite drives exactly the path a user's request takes: real HTTP (one keep-alive
//! connection per simulated client), real tenant keys provisioned through the admin API,
//! whatever durability the server runs with. It has no special endpoint and the server has
//! no benchmark code path.

mod api;
pub mod compare;
mod envinfo;
mod floors;
mod http;
mod measure;
mod progress;
mod receiver;
pub mod report;
mod server;
pub mod stats;
mod suite;
mod svg;
mod text;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

pub use report::Report;

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Run the suite against a server and write the JSON report, a text table and an SVG chart.
    Run(Box<RunArgs>),
    /// Compare two reports; exits non-zero when a gating metric (p50s, concurrent ops/s)
    /// regressed beyond the threshold. p99s are shown but do not gate.
    Compare(CompareArgs),
    /// Check one report against absolute budgets (for CI): errors, ledger mismatches,
    /// allocations per request, latency ceilings.
    Check(CheckArgs),
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The server's base URL (http only).
    #[arg(long, env = "CYCLES_URL", default_value = "http://127.0.0.1:7878")]
    pub url: String,
    /// Other instances serving the same ledger (Redis engine): the clients of the
    /// lifecycle and fan-out cells connect to `--url` and these in turn, as behind a load
    /// balancer. Everything else goes to `--url`, whose counters are the only ones read, so
    /// those cells' server figures per operation are not given.
    #[arg(long, value_delimiter = ',')]
    pub spread_url: Vec<String>,
    /// The admin key: the suite provisions its own tenants, keys and budgets.
    #[arg(long, env = "CYCLES_ADMIN_API_KEY", hide_env_values = true)]
    pub admin_key: String,
    /// The server's data directory: the fdatasync floor is measured on its file system
    /// (n/a without it).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Run everything N times; the report gives each metric's median and min–max
    /// [default: 3, or 1 with --quick].
    #[arg(long)]
    pub trials: Option<usize>,
    /// Measured iterations per sequential case.
    #[arg(long, default_value_t = 200)]
    pub iterations: usize,
    /// Warm-up iterations per sequential case (untimed).
    #[arg(long, default_value_t = 50)]
    pub warmup: usize,
    /// Length of each concurrent cell in seconds [default: 5, or 1 with --quick].
    #[arg(long)]
    pub duration_secs: Option<f64>,
    /// Client counts of the reserve→commit lifecycle cells.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32")]
    pub concurrency_clients: Vec<usize>,
    /// Client counts of the fan-out cells (shared and isolated budgets).
    #[arg(long, value_delimiter = ',', default_value = "1,10,50,200")]
    pub fanout_clients: Vec<usize>,
    /// Populations of the sorted-list cells [default: 1000,10000,100000,1000000, or
    /// 1000,10000 with --quick].
    #[arg(long, value_delimiter = ',')]
    pub list_rows: Option<Vec<u64>>,
    /// Sizes of the audit log the audit cells run at, grown in turn by audited writes
    /// [default: 1000,1000000, or 1000,10000 with --quick].
    #[arg(long, value_delimiter = ',')]
    pub audit_entries: Option<Vec<u64>>,
    /// Settled reservations the settled cells run at, each grown in turn by reserve →
    /// commit lifecycles; the memory they cost is measured from the first to the last
    /// [default: 1000,1000000, or 50000,150000 with --quick: the first large enough to warm
    /// the server].
    #[arg(long, value_delimiter = ',')]
    pub settled_rows: Option<Vec<u64>>,
    /// Reserve→commit lifecycles (the lifecycle cells and the settled fixtures) reserve an
    /// amount drawn from 100–1 000 000 each, as real estimates vary, instead of 100 every
    /// time: each settled reservation then lands at a random place in the history's index
    /// by amount rather than at its end.
    #[arg(long)]
    pub varied_estimates: bool,
    /// Concurrent clients that build the list fixtures through the API.
    #[arg(long, default_value_t = 64)]
    pub fixture_clients: usize,
    /// Short run: skips the 100k and 1M list cells; one trial and 1 s windows unless given.
    #[arg(long)]
    pub quick: bool,
    /// Where to write the JSON report (the .txt table and .svg chart go beside it).
    #[arg(long, default_value = "bench-report.json")]
    pub out: PathBuf,
    /// The server's process id when it runs on this machine: peak RSS is then read from
    /// /proc (else from its /metrics), and the suite waits for it to idle after fixtures.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// A Redis URL: its PING round trip is measured as a floor.
    #[arg(long, env = "CYCLES_BENCH_REDIS_URL")]
    pub redis_url: Option<String>,
    /// The server's durability mode, if it cannot be inferred from its /metrics.
    #[arg(long, value_parser = ["strict", "none"])]
    pub durability: Option<String>,
    /// Run only these phases (the floors always run) [default: all].
    #[arg(long, value_delimiter = ',', value_enum)]
    pub only: Vec<Phase>,
    /// Threads of the client's async runtime (1 = a single-threaded client).
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
}

/// A phase of the suite.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The 8 sequential write cases.
    Write,
    /// The sequential read cases, with the sorted lists up to 10k rows.
    Read,
    /// Reserve→commit lifecycles at the concurrency levels.
    Lifecycles,
    /// Reserve-only fan-out, shared and isolated budgets, with ledger reconciliation.
    Fanout,
    /// The sorted lists above 10k rows (100k, 1M).
    LargeLists,
    /// Audit log and event log queries as they grow (1k, then 1M entries each), and the
    /// memory they cost.
    Audit,
    /// Webhook deliveries per second to a receiver in this process (the server must be
    /// able to reach it: the phase opens its webhook security configuration to loopback).
    Webhooks,
    /// Settled reservations as they accumulate (1k, then 1M reserve → commit lifecycles):
    /// reads of archived against live ones, sorted lists, and the memory they cost.
    Settled,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Write => "write",
            Phase::Read => "read",
            Phase::Lifecycles => "lifecycles",
            Phase::Fanout => "fanout",
            Phase::LargeLists => "large-lists",
            Phase::Audit => "audit",
            Phase::Webhooks => "webhooks",
            Phase::Settled => "settled",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The baseline report.
    pub old: PathBuf,
    /// The current report.
    pub new: PathBuf,
    /// Relative change beyond which a gating metric fails (0.25 = 25%).
    #[arg(long, default_value_t = 0.25)]
    pub threshold: f64,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// The report to check.
    pub report: PathBuf,
    /// Most heap allocations allowed per reserve request in the server.
    #[arg(long)]
    pub max_allocations_per_reserve: Option<f64>,
    /// Most heap allocations allowed per commit request in the server.
    #[arg(long)]
    pub max_allocations_per_commit: Option<f64>,
    /// Ceiling for every case's p50, in ms (a catastrophe ceiling, not a target).
    #[arg(long)]
    pub max_p50_ms: Option<f64>,
    /// Ceiling for every case's p99, in ms.
    #[arg(long)]
    pub max_p99_ms: Option<f64>,
    /// Most RSS growth allowed per settled reservation over the settled phase, in bytes
    /// (`VmRSS`, which counts allocator slack that heap counters miss).
    #[arg(long)]
    pub max_rss_per_settled_bytes: Option<f64>,
}

/// Entry point of `cycles bench`.
pub fn main(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Run(args) => run(*args).map(drop),
        BenchCmd::Compare(args) => compare(args),
        BenchCmd::Check(args) => check(args),
    }
}

fn config(args: &RunArgs) -> anyhow::Result<suite::Config> {
    if args.iterations == 0 || args.trials == Some(0) {
        bail!("--iterations and --trials must be at least 1");
    }
    let quick = args.quick;
    let list_rows = args.list_rows.clone().unwrap_or_else(|| {
        if quick {
            vec![1_000, 10_000]
        } else {
            vec![1_000, 10_000, 100_000, 1_000_000]
        }
    });
    Ok(suite::Config {
        url: args.url.clone(),
        spread_urls: args.spread_url.clone(),
        admin_key: args.admin_key.clone(),
        data_dir: args.data_dir.clone(),
        redis_url: args.redis_url.clone(),
        server_pid: args.server_pid,
        durability: args.durability.clone(),
        method: report::Method {
            warmup: args.warmup,
            iterations: args.iterations,
            trials: args.trials.unwrap_or(if quick { 1 } else { 3 }),
            window_secs: args.duration_secs.unwrap_or(if quick { 1.0 } else { 5.0 }),
            concurrency_clients: args.concurrency_clients.clone(),
            varied_estimates: args.varied_estimates,
            fanout_clients: args.fanout_clients.clone(),
            list_rows,
            audit_entries: args.audit_entries.clone().unwrap_or_else(|| {
                if quick {
                    vec![1_000, 10_000]
                } else {
                    vec![1_000, 1_000_000]
                }
            }),
            settled_rows: args.settled_rows.clone().unwrap_or_else(|| {
                if quick {
                    vec![50_000, 150_000]
                } else {
                    vec![1_000, 1_000_000]
                }
            }),
            fixture_clients: args.fixture_clients,
            client_threads: args.client_threads.max(1),
            phases: if args.only.is_empty() {
                [
                    Phase::Write,
                    Phase::Read,
                    Phase::Lifecycles,
                    Phase::Fanout,
                    Phase::LargeLists,
                    Phase::Audit,
                    Phase::Webhooks,
                    Phase::Settled,
                ]
                .iter()
                .map(|p| p.name().to_string())
                .collect()
            } else {
                args.only.iter().map(|p| p.name().to_string()).collect()
            },
            quick,
        },
    })
}

/// Runs the suite, writes the report files, prints the table; fails on any error or
/// ledger mismatch (after writing the report).
pub fn run(args: RunArgs) -> anyhow::Result<Report> {
    let cfg = config(&args)?;
    let runtime = match cfg.method.client_threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build()?,
    };
    let report = runtime.block_on(async { suite::Suite::new(cfg).await?.run().await })?;
    write_outputs(&report, &args.out)?;
    suite::verdict(&report)?;
    Ok(report)
}

fn write_outputs(report: &Report, out: &Path) -> anyhow::Result<()> {
    let table = text::render(report);
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(out, json + "\n").with_context(|| format!("writing {}", out.display()))?;
    std::fs::write(out.with_extension("txt"), &table)?;
    std::fs::write(out.with_extension("svg"), svg::render(report))?;
    eprintln!("[bench] wrote {} (and .txt, .svg beside it)", out.display());
    // Written last: a reader that stops reading (`| head`) does not lose the report.
    progress::say(&format!("\n{table}"));
    Ok(())
}

pub fn load(path: &Path) -> anyhow::Result<Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a cycles bench report", path.display()))
}

fn compare(args: CompareArgs) -> anyhow::Result<()> {
    let (old, new) = (load(&args.old)?, load(&args.new)?);
    let (table, breaches) = compare::compare(&old, &new, args.threshold);
    progress::say(&table);
    if !breaches.is_empty() {
        bail!(
            "{} gating metric(s) regressed beyond {:.0}%: {}",
            breaches.len(),
            args.threshold * 100.0,
            breaches.join("; ")
        );
    }
    Ok(())
}

fn check(args: CheckArgs) -> anyhow::Result<()> {
    let report = load(&args.report)?;
    let budgets = compare::Budgets {
        max_allocations_per_reserve: args.max_allocations_per_reserve,
        max_allocations_per_commit: args.max_allocations_per_commit,
        max_p50_ms: args.max_p50_ms,
        max_p99_ms: args.max_p99_ms,
        max_rss_per_settled_bytes: args.max_rss_per_settled_bytes,
    };
    let failures = compare::check(&report, &budgets);
    let alloc = |s: Option<stats::Spread>| s.map_or("n/a".into(), |s| format!("{:.1}", s.median));
    progress::say(&format!(
        "allocations per reserve {}, per commit {}; errors {}; ledger mismatches {}",
        alloc(report.resources.allocations_per_reserve),
        alloc(report.resources.allocations_per_commit),
        report.errors(),
        report.ledger_mismatches()
    ));
    if failures.is_empty() {
        progress::say("all budgets hold");
        return Ok(());
    }
    for f in &failures {
        progress::say(&format!("FAIL {f}"));
    }
    bail!("{} budget(s) broken", failures.len())
}
