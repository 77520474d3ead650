//! The [`Store`] trait and its engines.
//!
//! A store takes high-level commands (reserve, commit, fund, …) and returns their outcomes;
//! it never exposes get/put. That is what lets the embedded engine apply each command under
//! one ledger lock and a Redis engine run each as one script.

mod clock;
pub mod embedded;

use std::future::Future;
use std::pin::Pin;

pub use clock::{Clock, ManualClock, SystemClock};
use ledger::{Command, Outcome, Rejection};

/// A boxed future, so the trait stays object-safe (`Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The answer to one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub result: Result<Outcome, Rejection>,
    /// The caller's effective tenant, once authenticated.
    pub tenant: Option<String>,
}

/// Why a store could not answer (as opposed to answering with a rejection).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot make writes durable; it refuses everything until restarted
    /// (a budget authority must not approve spend it cannot record).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The store is shutting down.
    #[error("storage is shutting down")]
    ShuttingDown,
}

/// The store's health, for readiness probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub ready: bool,
    pub detail: String,
}

/// One value an engine reports for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    /// Counters only grow; gauges go up and down.
    pub counter: bool,
    pub value: u64,
}

pub trait Store: Send + Sync + 'static {
    /// Applies a command. A successful reply is durable under the store's durability mode.
    fn execute(&self, command: Command) -> BoxFuture<'_, Result<Reply, StoreError>>;

    fn health(&self) -> Health;

    /// The engine's own counters and gauges.
    fn metrics(&self) -> Vec<Metric>;

    /// Stops accepting commands, finishes the ones in flight and flushes everything.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}
