//! Per-credential request rate limiting (optional; off unless configured).
//!
//! Each credential (the digest of the presented API or admin key; the client address when
//! none is presented) gets a token bucket refilled at `per_second` up to `burst`. An empty
//! bucket answers 429 `LIMIT_EXCEEDED` with `Retry-After` (delta-seconds) and
//! `X-RateLimit-Reset` (Unix seconds). Buckets live in this process: with several instances
//! each enforces its own share, except for the requests an instance hands to the Redis
//! engine's lease holder (`crate::forward`): one sent before its handler ran takes no
//! token, one handed on at its first operation gives its token back, and the holder counts
//! them, so every write of a credential is counted by one instance, whichever instance it
//! reached.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use protocol::{ApiError, ErrorCode};
use sha2::{Digest, Sha256};

use crate::auth::{ADMIN_KEY_HEADER, API_KEY_HEADER};
use crate::reply::{unix_now_s, Failure, ForwardTo, RATE_LIMIT_RESET};

/// Buckets kept at most; past this, full (idle) buckets are dropped first.
const MAX_BUCKETS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: f64,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

pub struct Limiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<[u8; 32], Bucket>>,
}

/// The verdict for one request.
enum Verdict {
    Allowed { remaining: u64 },
    Limited { retry_after_s: u64 },
}

impl Limiter {
    pub fn new(limit: RateLimit) -> Self {
        Limiter {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `who` has a token now (and takes it).
    pub fn allow(&self, who: [u8; 32]) -> bool {
        matches!(self.take(who, Instant::now()), Verdict::Allowed { .. })
    }

    fn take(&self, who: [u8; 32], now: Instant) -> Verdict {
        let RateLimit { per_second, burst } = self.limit;
        let Ok(mut buckets) = self.buckets.lock() else {
            return Verdict::Allowed { remaining: 0 };
        };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&who) {
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.at).as_secs_f64() * per_second < burst
            });
        }
        let bucket = buckets.entry(who).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * per_second).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Verdict::Allowed {
                remaining: bucket.tokens as u64,
            }
        } else {
            let wait = (1.0 - bucket.tokens) / per_second;
            Verdict::Limited {
                retry_after_s: wait.ceil().max(1.0) as u64,
            }
        }
    }

    /// Gives back the token `who` took for a request another instance counts.
    fn give_back(&self, who: [u8; 32]) {
        let Ok(mut buckets) = self.buckets.lock() else {
            return;
        };
        if let Some(bucket) = buckets.get_mut(&who) {
            bucket.tokens = (bucket.tokens + 1.0).min(self.limit.burst);
        }
    }
}

/// Who is asking: the presented key (hashed), else the peer address.
fn credential(request: &Request) -> [u8; 32] {
    let headers = request.headers();
    let presented = headers
        .get(API_KEY_HEADER)
        .or_else(|| headers.get(ADMIN_KEY_HEADER))
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| {
            request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip().to_string().into_bytes())
        })
        .unwrap_or_default();
    Sha256::digest(&presented).into()
}

const REMAINING_HEADER: HeaderName = HeaderName::from_static("x-ratelimit-remaining");

pub async fn layer(State(limiter): State<Arc<Limiter>>, request: Request, next: Next) -> Response {
    let who = credential(&request);
    match limiter.take(who, Instant::now()) {
        Verdict::Allowed { remaining } => {
            let mut response = next.run(request).await;
            if response.extensions().get::<ForwardTo>().is_some() {
                // Handed to the lease's holder, whose rate limit counts it.
                limiter.give_back(who);
                return response;
            }
            let headers = response.headers_mut();
            headers.insert(REMAINING_HEADER, HeaderValue::from(remaining));
            headers.insert(RATE_LIMIT_RESET, HeaderValue::from(unix_now_s() + 1));
            response
        }
        Verdict::Limited { retry_after_s } => Failure::from(
            ApiError::new(
                429,
                ErrorCode::LimitExceeded,
                format!("Rate limit exceeded: retry after {retry_after_s} s"),
            )
            .retry_after(retry_after_s),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bucket_refills_over_time() {
        let l = Limiter::new(RateLimit {
            per_second: 2.0,
            burst: 2.0,
        });
        let t0 = Instant::now();
        let who = [1u8; 32];
        assert!(matches!(l.take(who, t0), Verdict::Allowed { remaining: 1 }));
        assert!(matches!(l.take(who, t0), Verdict::Allowed { remaining: 0 }));
        assert!(matches!(
            l.take(who, t0),
            Verdict::Limited { retry_after_s: 1 }
        ));
        assert!(matches!(l.take([2u8; 32], t0), Verdict::Allowed { .. }));
        assert!(matches!(
            l.take(who, t0 + Duration::from_millis(500)),
            Verdict::Allowed { .. }
        ));
    }

    #[test]
    fn a_token_given_back_is_there_again_never_past_the_burst() {
        let l = Limiter::new(RateLimit {
            per_second: 0.001,
            burst: 2.0,
        });
        let t0 = Instant::now();
        let who = [3u8; 32];
        assert!(matches!(l.take(who, t0), Verdict::Allowed { remaining: 1 }));
        l.give_back(who);
        assert!(matches!(l.take(who, t0), Verdict::Allowed { remaining: 1 }));
        assert!(matches!(l.take(who, t0), Verdict::Allowed { remaining: 0 }));
        assert!(matches!(l.take(who, t0), Verdict::Limited { .. }));
        for _ in 0..3 {
            l.give_back(who);
        }
        assert!(matches!(l.take(who, t0), Verdict::Allowed { remaining: 1 }));
        // A credential never seen gets nothing back (its bucket starts full anyway).
        l.give_back([4u8; 32]);
        assert!(matches!(
            l.take([4u8; 32], t0),
            Verdict::Allowed { remaining: 1 }
        ));
    }
}
