//! `cycles`: the budget authority in one binary.

mod admin;
mod client;
mod output;
mod quickstart;
mod serve;
mod table;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// mimalloc: a request allocates a couple of hundred small blocks on whichever worker runs
/// it, and mimalloc's per-thread free lists serve them with less CPU than glibc malloc
/// (BENCHMARKS.md: ~18 % less server CPU per request with 200 clients).
#[cfg(not(feature = "alloc-count"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "alloc-count")]
#[global_allocator]
static ALLOCATOR: server::alloc_count::CountingAllocator<mimalloc::MiMalloc> =
    server::alloc_count::CountingAllocator(mimalloc::MiMalloc);

#[derive(Parser)]
#[command(
    name = "cycles",
    version,
    about = "Cycles: a budget authority for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server (runtime and admin planes on one listener).
    Serve(serve::ServeArgs),
    /// Provision tenants, API keys and budgets on a running server.
    Admin(admin::AdminArgs),
    /// Create a demo tenant, key and budget on a running server and print how to use them.
    Quickstart(client::Target),
    /// Check a ledger: recover a data directory read-only (or read a Redis engine's log)
    /// and verify every ledger rule.
    Verify {
        /// Where the ledger is kept.
        #[arg(long, env = "CYCLES_STORE", value_enum, default_value = "embedded")]
        store: serve::StoreArg,
        /// The data directory to check (the embedded store).
        #[arg(long, env = "CYCLES_DATA_DIR", default_value = crate::serve::DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
        #[command(flatten)]
        redis: serve::RedisTarget,
    },
    /// Benchmark any Cycles server: the reference's suite, floors, reports, comparisons.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Serve(args) => serve::run(args),
        Cmd::Admin(args) => admin::run(args),
        Cmd::Quickstart(target) => quickstart::run(target),
        Cmd::Verify {
            store,
            data_dir,
            redis,
        } => match store {
            serve::StoreArg::Embedded => verify::run(&data_dir),
            serve::StoreArg::Redis => verify::run_redis(&redis),
        },
        Cmd::Bench(cmd) => bench::main(cmd),
    }
}
