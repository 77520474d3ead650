//! The [`Store`] trait and its engines.
//!
//! A store takes high-level commands (reserve, commit, fund, …) and returns their outcomes;
//! it never exposes get/put. That is what lets the embedded engine apply each command under
//! one ledger lock and a Redis engine run each as one script.

mod clock;
pub mod embedded;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use clock::{Clock, ManualClock, SystemClock};
use ledger::{Command, Outcome, Rejection};

/// A boxed future, so the trait stays object-safe (`Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The answer to one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub result: Result<Outcome, Rejection>,
    /// The caller's effective tenant, once authenticated.
    pub tenant: Option<Arc<str>>,
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

/// What the caller knows of the load when it sends a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Nothing else is in progress (the only request in the server): an engine may make the
    /// command durable on the caller's thread instead of handing it to a background writer
    /// and waiting to be woken, since no one else would share that write.
    Alone,
    /// Other requests are in progress: one background group commit serves them all.
    Busy,
}

pub trait Store: Send + Sync + 'static {
    /// Applies a command. A successful reply is durable under the store's durability mode.
    fn execute(&self, command: Command, load: Load) -> BoxFuture<'_, Result<Reply, StoreError>>;

    fn health(&self) -> Health;

    /// The engine's own counters and gauges.
    fn metrics(&self) -> Vec<Metric>;

    /// Stops accepting commands, finishes the ones in flight and flushes everything.
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}
