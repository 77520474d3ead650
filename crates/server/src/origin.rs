//! The origin of the request a task serves: what its operations' events carry (request and
//! trace ids, the caller's address).

use ledger::Origin;

tokio::task_local! {
    static ORIGIN: Origin;
}

/// The current request's origin (empty outside a request: the background jobs).
pub fn current() -> Origin {
    ORIGIN.try_with(Origin::clone).unwrap_or_default()
}

/// Runs `future` (the rest of the request) with `origin`.
pub async fn within<F: std::future::Future>(origin: Origin, future: F) -> F::Output {
    ORIGIN.scope(origin, future).await
}
