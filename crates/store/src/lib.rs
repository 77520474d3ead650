//! The [`Store`] trait and its engines.
//!
//! A store takes the ledger's operations (reserve, commit, fund, …: [`ledger::Operation`])
//! and returns each one's own output; it never exposes get/put. That is what lets the
//! embedded engine apply each operation under one ledger lock and a Redis engine run each
//! as one script. [`Engine`] is the one type the server holds: one variant per engine.

mod clock;
pub mod embedded;
pub mod forwarding;
pub mod history;
pub mod redis;

use std::future::Future;
use std::sync::Arc;

pub use clock::{Clock, ManualClock, SystemClock};
use ledger::{AuditEntry, Millis, Operation, Origin, Rejection, State};

pub use history::History;

use embedded::EmbeddedStore;
use redis::RedisStore;

/// The answer to one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<T> {
    pub result: Result<T, Rejection>,
    /// The caller's effective tenant, once authenticated.
    pub tenant: Option<Arc<str>>,
}

/// What an operation's audit entry is made from, under the ledger lock, once it has run.
pub struct AuditFacts<'a, T> {
    pub result: &'a Result<T, Rejection>,
    /// The caller's tenant, once authenticated.
    pub tenant: Option<&'a Arc<str>>,
    /// The state after the operation (to name the caller's key, say).
    pub state: &'a State,
    /// The ledger's time of the operation.
    pub now: Millis,
}

/// Makes an operation's audit entry from its result: the caller knows the request (ids,
/// addresses, the operation's name) and how a result is answered; the store supplies the
/// result and writes the entry in the same durable step as the operation's effects. `None`:
/// the caller decided, on the result, that this one is not audited.
pub type AuditFn<T> = Box<dyn FnOnce(AuditFacts<'_, T>) -> Option<AuditEntry> + Send>;

/// What a request brings to its operation besides the operation: the origin its events
/// carry, and the maker of its audit entry.
pub struct RequestContext<T> {
    /// Asked only if the operation emits an event (a function, so a request that emits
    /// none pays nothing for it).
    pub origin: fn() -> Origin,
    pub audit: Option<AuditFn<T>>,
}

impl<T> Default for RequestContext<T> {
    fn default() -> Self {
        RequestContext {
            origin: Origin::default,
            audit: None,
        }
    }
}

/// Why a store could not answer (as opposed to answering with a rejection).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store cannot make writes durable (a budget authority must not approve spend it
    /// cannot record): nothing was recorded. The embedded engine serves reads meanwhile and
    /// takes writes again once its disk does.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The store lost its answer from storage that may have recorded the operation (a
    /// timeout, a dropped connection): whether it did is unknown. A retry with the same
    /// idempotency key answers it either way, never twice.
    #[error("storage did not answer: {0}")]
    OutcomeUnknown(String),
    /// The store is shutting down.
    #[error("storage is shutting down")]
    ShuttingDown,
    /// Nothing was run here: another instance of the ledger holds its writer's lease, at
    /// this base URL, and the request is to be sent there ([`forwarding`]). Only for a
    /// request that allowed it.
    #[error("another instance writes the ledger now: {0}")]
    Forward(Arc<str>),
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

/// What every engine does.
pub trait Store: Send + Sync + 'static {
    /// Applies an operation. A successful reply is durable under the store's durability
    /// mode.
    fn execute<O: Operation>(
        &self,
        operation: O,
        load: Load,
    ) -> impl Future<Output = Result<Reply<O::Output>, StoreError>> + Send;

    /// Applies an operation on behalf of a request: its events carry the request's origin,
    /// and its audit entry (made by `context.audit` from its result) is written in the same
    /// durable step: a crash never keeps one without the other.
    fn execute_in<O: Operation>(
        &self,
        operation: O,
        load: Load,
        context: RequestContext<O::Output>,
    ) -> impl Future<Output = Result<Reply<O::Output>, StoreError>> + Send;

    /// Reads the history store (the audit log, events, deliveries), never through the
    /// ledger. What it reads includes the history of every change acknowledged before.
    fn read_history<T, F>(&self, read: F) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&dyn History) -> std::io::Result<T> + Send + 'static;

    /// Deletes the audit entries past their retention now (it also runs hourly).
    fn expire_history(&self) -> impl Future<Output = ()> + Send;

    fn health(&self) -> Health;

    /// The engine's own counters and gauges.
    fn metrics(&self) -> Vec<Metric>;

    /// Stops accepting operations, finishes the ones in flight and flushes everything.
    fn shutdown(&self) -> impl Future<Output = ()> + Send;
}

/// The engine a server runs on. An enum rather than a trait object: [`Store::execute`] is
/// generic over the operation, so each call is typed end to end (and costs no boxed future).
pub enum Engine {
    Embedded(EmbeddedStore),
    Redis(RedisStore),
}

impl From<RedisStore> for Engine {
    fn from(store: RedisStore) -> Self {
        Engine::Redis(store)
    }
}

impl From<EmbeddedStore> for Engine {
    fn from(store: EmbeddedStore) -> Self {
        Engine::Embedded(store)
    }
}

impl Engine {
    /// The secret this ledger's instances present when they hand each other a request
    /// (`--redis-advertise-url`), once the engine has read it; none on the embedded engine.
    pub fn peer_secret(&self) -> Option<Arc<str>> {
        match self {
            Engine::Embedded(_) => None,
            Engine::Redis(store) => store.peer_secret(),
        }
    }

    /// Whether a write may be answered [`StoreError::Forward`] (the Redis engine, with an
    /// address for its peers).
    pub fn forwards(&self) -> bool {
        matches!(self, Engine::Redis(store) if store.forwards())
    }

    /// The address of the peer holding the writer's lease, as read a moment ago, when
    /// this instance hands writes on: a write sent there at once is run there, as one
    /// answered [`StoreError::Forward`] at its first operation would be.
    pub fn holder_address(&self) -> Option<Arc<str>> {
        match self {
            Engine::Redis(store) if store.forwards() => store.holder_address(),
            _ => None,
        }
    }
}

impl Store for Engine {
    async fn execute<O: Operation>(
        &self,
        operation: O,
        load: Load,
    ) -> Result<Reply<O::Output>, StoreError> {
        match self {
            Engine::Embedded(store) => store.execute(operation, load).await,
            Engine::Redis(store) => store.execute(operation, load).await,
        }
    }

    async fn execute_in<O: Operation>(
        &self,
        operation: O,
        load: Load,
        context: RequestContext<O::Output>,
    ) -> Result<Reply<O::Output>, StoreError> {
        match self {
            Engine::Embedded(store) => store.execute_in(operation, load, context).await,
            Engine::Redis(store) => store.execute_in(operation, load, context).await,
        }
    }

    async fn read_history<T, F>(&self, read: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn History) -> std::io::Result<T> + Send + 'static,
    {
        match self {
            Engine::Embedded(store) => store.read_history(read).await,
            Engine::Redis(store) => store.read_history(read).await,
        }
    }

    async fn expire_history(&self) {
        match self {
            Engine::Embedded(store) => store.expire_history().await,
            Engine::Redis(store) => store.expire_history().await,
        }
    }

    fn health(&self) -> Health {
        match self {
            Engine::Embedded(store) => store.health(),
            Engine::Redis(store) => store.health(),
        }
    }

    fn metrics(&self) -> Vec<Metric> {
        match self {
            Engine::Embedded(store) => store.metrics(),
            Engine::Redis(store) => store.metrics(),
        }
    }

    async fn shutdown(&self) {
        match self {
            Engine::Embedded(store) => store.shutdown().await,
            Engine::Redis(store) => store.shutdown().await,
        }
    }
}
