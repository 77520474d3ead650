//! Bounds on what clients can hold: connections, the size and count of a request's headers,
//! the time to send headers and a body, and requests in flight, overall and per credential.
//!
//! Each bound answers clearly when it bites and counts it for `/metrics`:
//! - over [`Limits::max_connections`], a new connection gets a 503 with `Retry-After` and
//!   is closed (`crate::conn`);
//! - headers over [`Limits::max_header_bytes`] or [`Limits::max_headers`]: 431, by hyper;
//! - headers not complete within [`Limits::header_read_timeout`]: the connection is
//!   closed. The same timer runs while a kept-alive connection waits for its next request,
//!   so it is also the idle keep-alive limit;
//! - a body not complete within [`Limits::body_read_timeout`] of its headers: 408
//!   ([`DeadlineBody`], answered by `routes::body::RawBody`);
//! - over [`Limits::max_in_flight`] requests in flight: 503 with `Retry-After`, at once
//!   (shedding, not queueing);
//! - over [`Limits::max_in_flight_per_key`] in flight for one credential: 429
//!   `LIMIT_EXCEEDED` with `Retry-After`, so one tenant's burst leaves room for the others.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use tokio::time::{Instant, Sleep};

use crate::auth::{ADMIN_KEY_HEADER, API_KEY_HEADER};

/// The bounds, each a `cycles serve` flag (see [`Limits::DEFAULT`] for the defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Bytes a request's line and headers may take (hyper's read buffer; at least 8 192).
    pub max_header_bytes: usize,
    /// Headers a request may carry.
    pub max_headers: usize,
    /// Time a client has to send a request's headers, and an idle kept-alive connection to
    /// start its next request.
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's body, from the end of its headers.
    pub body_read_timeout: Duration,
    /// Requests answered at once, at most; more are shed with 503.
    pub max_in_flight: usize,
    /// Requests one credential (an API key, the admin key, or an address that presents
    /// none) may have in flight; more are refused with 429.
    pub max_in_flight_per_key: usize,
}

impl Limits {
    /// Sized for a server of this kind: far above what the benchmarks' 200 clients hold, low
    /// enough that a flood is refused before it costs memory. hyper's own defaults for the
    /// header size (about 400 KiB of buffer) and time (30 s) are kept where they suit; the
    /// header buffer is cut to 64 KiB, which no client of this protocol comes near.
    pub const DEFAULT: Limits = Limits {
        max_connections: 8_192,
        max_header_bytes: 64 * 1024,
        max_headers: 100,
        header_read_timeout: Duration::from_secs(30),
        body_read_timeout: Duration::from_secs(30),
        max_in_flight: 4_096,
        max_in_flight_per_key: 1_024,
    };

    /// hyper's smallest read buffer.
    pub const MIN_HEADER_BYTES: usize = 8_192;
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// How often each bound bit, and the connections open, for `/metrics`.
#[derive(Debug, Default)]
pub struct LimitCounters {
    pub connections_open: AtomicU64,
    pub connections_refused: AtomicU64,
    pub header_timeouts: AtomicU64,
    pub headers_too_large: AtomicU64,
    pub body_timeouts: AtomicU64,
    pub shed: AtomicU64,
    pub shed_per_key: AtomicU64,
}

impl LimitCounters {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The error a [`DeadlineBody`] ends with when its deadline passes.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeout(pub Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within {} ms",
            self.0.as_millis()
        )
    }
}

impl std::error::Error for BodyTimeout {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body that must arrive by a deadline. A body that is already there (the usual
/// case: it came with the headers) never starts a timer, so this costs the hot path nothing.
pub struct DeadlineBody<B> {
    inner: B,
    deadline: Instant,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> DeadlineBody<B> {
    /// `inner`, which must arrive within `timeout` from now.
    pub fn new(inner: B, timeout: Duration) -> Self {
        DeadlineBody {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            sleep: None,
        }
    }
}

impl<B> http_body::Body for DeadlineBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = this.deadline;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Shards of the per-credential counts: few enough to stay small, enough that two cores
/// rarely meet on one lock.
const SHARDS: usize = 16;

/// Requests in flight per credential. A credential's entry exists only while it has
/// requests in flight, so this holds at most one entry per request being answered.
pub struct KeyShares {
    cap: usize,
    hasher: RandomState,
    shards: [Mutex<HashMap<u64, usize>>; SHARDS],
}

impl KeyShares {
    pub fn new(cap: usize) -> Self {
        KeyShares {
            cap,
            // Seeded per process: a client cannot pick keys that share another's count.
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    /// Counts a request of the credential in `headers` (or of `peer`, when it presents none)
    /// until the guard drops; `None` when that credential already has its share in flight.
    pub fn enter(&self, headers: &HeaderMap, peer: Option<std::net::IpAddr>) -> Option<Share<'_>> {
        let presented = headers
            .get(API_KEY_HEADER)
            .or_else(|| headers.get(ADMIN_KEY_HEADER))
            .map(|v| v.as_bytes());
        let who = match (presented, peer) {
            (Some(key), _) => self.hasher.hash_one(key),
            (None, Some(ip)) => self.hasher.hash_one(ip),
            (None, None) => self.hasher.hash_one(()),
        };
        let shard = &self.shards[who as usize % SHARDS];
        let mut counts = shard.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(who).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(Share { shard, who })
    }
}

/// One request counted against its credential's share.
pub struct Share<'a> {
    shard: &'a Mutex<HashMap<u64, usize>>,
    who: u64,
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let mut counts = self.shard.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.who) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.who);
            }
        }
    }
}

/// Shared by the accept loop and the request path.
pub struct Bounds {
    pub limits: Limits,
    pub counters: Arc<LimitCounters>,
    pub shares: KeyShares,
}

impl Bounds {
    pub fn new(limits: Limits) -> Self {
        Bounds {
            shares: KeyShares::new(limits.max_in_flight_per_key),
            limits,
            counters: Arc::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_credential_has_at_most_its_share_in_flight() {
        let shares = KeyShares::new(2);
        let mut a = HeaderMap::new();
        a.insert(API_KEY_HEADER, HeaderValue::from_static("key-a"));
        let mut b = HeaderMap::new();
        b.insert(API_KEY_HEADER, HeaderValue::from_static("key-b"));
        let first = shares.enter(&a, None).expect("first");
        let second = shares.enter(&a, None).expect("second");
        assert!(shares.enter(&a, None).is_none(), "a third of key a");
        let other = shares.enter(&b, None).expect("key b has its own share");
        drop(first);
        let again = shares.enter(&a, None).expect("room again once one ended");
        drop((second, other, again));
        assert!(
            shares.shards.iter().all(|s| s.lock().unwrap().is_empty()),
            "no entry outlives its requests"
        );
    }

    #[test]
    fn without_a_key_the_address_is_the_credential() {
        let shares = KeyShares::new(1);
        let none = HeaderMap::new();
        let ip1 = Some("10.0.0.1".parse().unwrap());
        let ip2 = Some("10.0.0.2".parse().unwrap());
        let _held = shares.enter(&none, ip1).expect("first address");
        assert!(shares.enter(&none, ip1).is_none());
        assert!(shares.enter(&none, ip2).is_some());
    }
}
