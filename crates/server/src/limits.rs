//! Bounds on what clients can hold: connections, the size and count of a request's headers,
//! the time to send headers and a body, and requests in flight, overall and per credential.
//!
//! Each bound answers clearly when it bites and counts it for `/metrics`:
//! - over [`Limits::max_connections`], a new connection gets a 503 with `Retry-After` and
//!   is closed (`crate::conn`);
//! - headers over [`Limits::max_header_bytes`] or [`Limits::max_headers`]: 431, by hyper,
//!   and by [`Bounds::check_head`] for what hyper's buffer let through;
//! - headers not complete within [`Limits::header_read_timeout`]: the connection is
//!   closed. The same timer runs while a kept-alive connection waits for its next request,
//!   so it is also the idle keep-alive limit;
//! - a body not complete within [`Limits::body_read_timeout`] of its headers: 408
//!   ([`DeadlineBody`], answered by `routes::body::RawBody`);
//! - over [`Limits::max_in_flight`] requests in flight: 503 with `Retry-After`, at once
//!   (shedding, not queueing);
//! - over [`Limits::max_in_flight_per_key`] in flight for one credential: 429
//!   `LIMIT_EXCEEDED` with `Retry-After`, so one tenant's burst leaves room for the others
//!   (a key counts as itself once it was accepted, as its client's address until then:
//!   [`KeyShares`]).

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::header::{HOST, TRANSFER_ENCODING};
use axum::http::{HeaderMap, Version};
use protocol::{ApiError, ErrorCode};
use tokio::time::{Instant, Sleep};

use crate::auth::{AdminKey, ADMIN_KEY_HEADER, API_KEY_HEADER};

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
/// Credentials remembered as accepted, per shard; a full shard forgets them all (each is
/// accepted again at its next request).
const ACCEPTED_PER_SHARD: usize = 4_096;

tokio::task_local! {
    /// Whether the request's credential was found good, where it is checked: a tenant key
    /// by the ledger (`App`), one handed to the Redis engine's lease holder by the holder's
    /// success (`crate::forward`), the admin key before the request runs
    /// (`KeyShares::enter`). A refusal is not noted: a 401 may also refuse a good tenant key
    /// an admin-only operation, and a key revoked since keeps its share only until its
    /// shard is full.
    static ACCEPTED: Cell<bool>;
}

/// Notes that the request's credential was found good (nothing outside a request).
pub fn credential_accepted() {
    let _ = ACCEPTED.try_with(|accepted| accepted.set(true));
}

/// Requests in flight per credential. A credential's entry exists only while it has
/// requests in flight, so this holds at most one entry per request being answered.
///
/// A key counts as itself only once a request presenting it was accepted; until then its
/// requests count as their client address's. Otherwise every made-up key would get a share
/// of its own, and one client sending them (with bodies that never finish) could take every
/// request the server answers at once, the admin's included.
pub struct KeyShares {
    cap: usize,
    hasher: RandomState,
    shards: [Mutex<Shard>; SHARDS],
}

#[derive(Default)]
struct Shard {
    in_flight: HashMap<u64, usize>,
    accepted: HashSet<u64>,
}

impl KeyShares {
    pub fn new(cap: usize) -> Self {
        KeyShares {
            cap,
            // Seeded per process: a client cannot pick keys that share another's count.
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }

    fn shard(&self, who: u64) -> &Mutex<Shard> {
        &self.shards[who as usize % SHARDS]
    }

    /// Counts a request of the credential in `headers` (or of `peer`, when it presents none
    /// or one not accepted yet) until the guard drops; `None` when that credential already
    /// has its share in flight. `admin`: the admin key, which is checked here.
    pub fn enter(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::IpAddr>,
        admin: &AdminKey,
    ) -> Option<Share<'_>> {
        let key = headers
            .get(API_KEY_HEADER)
            .or_else(|| headers.get(ADMIN_KEY_HEADER))
            .map(|v| self.hasher.hash_one(v.as_bytes()));
        if let Some(key) = key {
            let is_admin = !headers.contains_key(API_KEY_HEADER)
                && headers
                    .get(ADMIN_KEY_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| admin.verify(v));
            if is_admin {
                self.accept(key);
            }
        }
        // A key accepted already counts as itself and has nothing left to learn.
        let (who, key) = match key {
            Some(key) if self.is_accepted(key) => (key, None),
            key => (self.hasher.hash_one(peer), key),
        };
        let mut shard = self.shard(who).lock().unwrap_or_else(|e| e.into_inner());
        let count = shard.in_flight.entry(who).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(Share {
            shares: self,
            who,
            key,
        })
    }

    fn is_accepted(&self, key: u64) -> bool {
        let shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        shard.accepted.contains(&key)
    }

    fn accept(&self, key: u64) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        if !shard.accepted.contains(&key) {
            if shard.accepted.len() >= ACCEPTED_PER_SHARD {
                shard.accepted.clear();
            }
            shard.accepted.insert(key);
        }
    }
}

/// One request counted against its credential's share.
pub struct Share<'a> {
    shares: &'a KeyShares,
    who: u64,
    /// The presented key, while it is not accepted yet.
    key: Option<u64>,
}

impl Share<'_> {
    /// Runs the request; a credential it found good has a share of its own from the next
    /// request on.
    pub async fn run<F: Future<Output = R>, R>(&self, request: F) -> R {
        let (answer, accepted) = ACCEPTED
            .scope(Cell::new(false), async {
                let answer = request.await;
                (answer, ACCEPTED.with(Cell::get))
            })
            .await;
        if let (Some(key), true) = (self.key, accepted) {
            self.shares.accept(key);
        }
        answer
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        let mut shard = self
            .shares
            .shard(self.who)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = shard.in_flight.get_mut(&self.who) {
            *count -= 1;
            if *count == 0 {
                shard.in_flight.remove(&self.who);
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

    /// Checks a request's head as it was sent. hyper refuses a head over
    /// [`Limits::max_header_bytes`] only once its read buffer, which grows in steps, is
    /// full, so heads up to about twice the limit reach here; they are refused 431 by their
    /// size as sent (each header line as `Name: value`, as clients write them). An HTTP/1.1
    /// request must name its `Host` exactly once (RFC 9112 §3.2): 400. A transfer coding
    /// other than `chunked`: 501.
    pub fn check_head<B>(&self, request: &axum::http::Request<B>) -> Result<(), ApiError> {
        let uri = request.uri();
        let target = uri.path_and_query().map_or(1, |pq| pq.as_str().len())
            + uri.authority().map_or(0, |a| a.as_str().len())
            + uri.scheme_str().map_or(0, |scheme| scheme.len() + 3);
        // "GET /path HTTP/1.1\r\n"
        let line = request.method().as_str().len() + target + 12;
        let headers: usize = request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum();
        if line + headers + 2 > self.limits.max_header_bytes {
            LimitCounters::count(&self.counters.headers_too_large);
            return Err(ApiError::new(
                431,
                ErrorCode::InvalidRequest,
                format!(
                    "The request line and headers are over {} bytes",
                    self.limits.max_header_bytes
                ),
            ));
        }
        let hosts = request.headers().get_all(HOST).iter().count();
        if request.version() == Version::HTTP_11 && hosts != 1 {
            return Err(ApiError::invalid(
                "An HTTP/1.1 request must carry exactly one Host header",
            ));
        }
        // hyper undoes `chunked` only; a body in any other coding would be read as it came
        // (RFC 9112 §6.1: 501).
        let codings = request.headers().get_all(TRANSFER_ENCODING).iter();
        let unknown = codings
            .flat_map(|v| v.to_str().unwrap_or("?").split(','))
            .any(|coding| !coding.trim().eq_ignore_ascii_case("chunked"));
        if unknown {
            return Err(ApiError::new(
                501,
                ErrorCode::InvalidRequest,
                "Only the chunked transfer coding is supported",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn admin() -> AdminKey {
        AdminKey::new("the-admin-key")
    }

    fn with(header: &'static str, value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header, HeaderValue::from_static(value));
        headers
    }

    /// Runs a request of `share` whose credential is found good.
    fn accepted(share: &Share<'_>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(share.run(async { credential_accepted() }));
    }

    #[test]
    fn an_accepted_credential_has_at_most_its_share_in_flight() {
        let shares = KeyShares::new(2);
        let (a, b) = (with(API_KEY_HEADER, "key-a"), with(API_KEY_HEADER, "key-b"));
        let ip = Some("10.0.0.1".parse().unwrap());
        for key in [&a, &b] {
            let share = shares.enter(key, ip, &admin()).expect("first");
            accepted(&share);
        }
        let first = shares.enter(&a, ip, &admin()).expect("first");
        let second = shares.enter(&a, ip, &admin()).expect("second");
        assert!(shares.enter(&a, ip, &admin()).is_none(), "a third of key a");
        let other = shares
            .enter(&b, ip, &admin())
            .expect("key b has its own share");
        drop(first);
        let again = shares
            .enter(&a, ip, &admin())
            .expect("room again once one ended");
        drop((second, other, again));
        assert!(
            shares
                .shards
                .iter()
                .all(|s| s.lock().unwrap().in_flight.is_empty()),
            "no entry outlives its requests"
        );
    }

    #[test]
    fn without_a_key_the_address_is_the_credential() {
        let shares = KeyShares::new(1);
        let none = HeaderMap::new();
        let ip1 = Some("10.0.0.1".parse().unwrap());
        let ip2 = Some("10.0.0.2".parse().unwrap());
        let _held = shares.enter(&none, ip1, &admin()).expect("first address");
        assert!(shares.enter(&none, ip1, &admin()).is_none());
        assert!(shares.enter(&none, ip2, &admin()).is_some());
    }

    #[test]
    fn keys_not_accepted_yet_share_their_address() {
        let shares = KeyShares::new(1);
        let ip = Some("10.0.0.1".parse().unwrap());
        let made_up = with(API_KEY_HEADER, "made-up-1");
        let first = shares.enter(&made_up, ip, &admin()).expect("first");
        let another = with(API_KEY_HEADER, "made-up-2");
        assert!(
            shares.enter(&another, ip, &admin()).is_none(),
            "a second made-up key from the address has no share of its own"
        );
        drop(first);
        // Accepted once, a key counts as itself.
        let good = with(API_KEY_HEADER, "good");
        let share = shares.enter(&good, ip, &admin()).expect("good");
        accepted(&share);
        drop(share);
        let _held = shares
            .enter(&good, ip, &admin())
            .expect("good, counted as itself");
        assert!(
            shares.enter(&another, ip, &admin()).is_some(),
            "the address has room"
        );
    }

    #[test]
    fn the_admin_key_counts_as_itself_at_once_and_a_wrong_one_as_its_address() {
        let shares = KeyShares::new(1);
        let ip = Some("10.0.0.1".parse().unwrap());
        let wrong = with(ADMIN_KEY_HEADER, "guess");
        let _guess = shares.enter(&wrong, ip, &admin()).expect("first guess");
        assert!(shares.enter(&wrong, ip, &admin()).is_none());
        let right = with(ADMIN_KEY_HEADER, "the-admin-key");
        assert!(shares.enter(&right, ip, &admin()).is_some());
    }
}
