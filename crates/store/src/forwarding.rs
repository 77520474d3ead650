//! Which requests may be handed to another instance of the ledger.
//!
//! On the Redis engine, an instance without the writer's lease while a peer holds it may
//! answer an operation with [`crate::StoreError::Forward`] instead of waiting for the
//! lease, and the server sends the request to that peer. Only a request the server can send
//! again, whole and unchanged, may be handed on: the server runs it within [`allow`].
//! Everything else (a request a peer sent here, the server's own background jobs) waits
//! for the lease, so nothing is handed on twice.

use std::future::Future;

/// When an operation may be handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handing {
    /// Once it is found to change something (a read is answered here). For requests that
    /// read (`GET`).
    IfItWrites,
    /// Whenever a peer holds the lease, without trying it here first: for requests meant to
    /// change something, whose dry run here would cost reading the peer's latest writes
    /// for nothing.
    Always,
}

tokio::task_local! {
    static FORWARDABLE: Handing;
}

/// Runs `request` (the rest of a request's handling) with its operations allowed to be
/// answered [`crate::StoreError::Forward`], as `handing` says.
pub async fn allow<F: Future>(handing: Handing, request: F) -> F::Output {
    FORWARDABLE.scope(handing, request).await
}

/// Whether, and when, the current task's operations may be handed on.
pub fn allowed() -> Option<Handing> {
    FORWARDABLE.try_with(|handing| *handing).ok()
}
