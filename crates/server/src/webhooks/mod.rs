//! Webhooks: sealing secrets, the SSRF guard, the outbound client that signs and sends a
//! delivery, and the dispatcher that works through the due deliveries.

mod dispatch;
pub mod guard;
mod seal;

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use ledger::{Attempt, WebhookSecurity, WebhookSubscription};
use sha2::Sha256;

pub use dispatch::{spawn_dispatcher, DispatchCounters};
pub use seal::new_key;

use guard::{GuardedResolver, Policy};
use seal::Sealer;

/// Reference timeouts: 5 s to connect, 30 s for the whole request (the test probe: 10 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
pub const TEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections kept per receiver between deliveries.
const IDLE_PER_HOST: usize = 32;

pub const USER_AGENT: &str = concat!("cycles-server/", env!("CARGO_PKG_VERSION"));

/// What the server needs to seal, check and send webhooks.
pub struct Webhooks {
    sealer: Sealer,
    policy: Policy,
    client: reqwest::Client,
    /// Subscriptions with a replay being selected and queued (one at a time each).
    replays: Mutex<HashSet<String>>,
}

/// A delivery's request, ready to send.
pub struct Outbound<'a> {
    pub url: &'a str,
    pub body: Vec<u8>,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub trace_id: &'a str,
    pub request_id: Option<&'a str>,
    pub credentials: Credentials,
}

/// A subscription's signing secret and custom headers, opened.
pub struct Credentials {
    pub secret: String,
    pub headers: Vec<(String, String)>,
}

impl Webhooks {
    /// With `keys` (the first seals, all open; none: a fresh key for this process only).
    pub fn new(keys: &[[u8; 32]]) -> Self {
        let policy = Policy::default();
        let client = reqwest::Client::builder()
            .dns_resolver(std::sync::Arc::new(GuardedResolver {
                policy: policy.clone(),
            }))
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .pool_max_idle_per_host(IDLE_PER_HOST)
            // A redirect is a failed delivery: following it would leave the checked URL.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(USER_AGENT)
            .build()
            .expect("the webhook client's configuration is valid");
        let keys = if keys.is_empty() {
            vec![new_key()]
        } else {
            keys.to_vec()
        };
        Webhooks {
            sealer: Sealer::new(&keys),
            policy,
            client,
            replays: Mutex::default(),
        }
    }

    pub fn seal(&self, plain: &str) -> String {
        self.sealer.seal(plain)
    }

    pub fn open(&self, sealed: &str) -> Option<String> {
        self.sealer.open(sealed)
    }

    /// Makes `config` the one the resolver enforces (the routes and the dispatcher keep it
    /// in step with the stored one).
    pub fn enforce(&self, config: WebhookSecurity) {
        self.policy.set(config);
    }

    /// Checks a URL against `config`; the error is the protocol's message.
    pub async fn check_url(&self, url: &str, config: &WebhookSecurity) -> Result<(), String> {
        guard::check_url(url, config)
            .await
            .map(drop)
            .map_err(|why| format!("Webhook URL invalid: {url} ({why})"))
    }

    /// Takes the replay slot of a subscription (`false`: a replay of it is running).
    pub fn start_replay(&self, subscription_id: &str) -> bool {
        let mut replays = self.replays.lock().unwrap_or_else(|e| e.into_inner());
        replays.insert(subscription_id.to_string())
    }

    pub fn end_replay(&self, subscription_id: &str) {
        let mut replays = self.replays.lock().unwrap_or_else(|e| e.into_inner());
        replays.remove(subscription_id);
    }

    /// The subscription's secret and custom headers, opened; the operator's message when one
    /// cannot be (sealed with a key this server was not given). Nothing is sent then: a
    /// delivery without its signature or its headers would reach a receiver that may not
    /// insist on either, and look like any other.
    pub fn credentials(&self, w: &WebhookSubscription) -> Result<Credentials, String> {
        let unopened = |what: &str| {
            format!(
                "{what} cannot be opened with this server's webhook keys (it was sealed with \
                 a key not in --webhook-keys or webhook.key); nothing was sent"
            )
        };
        let secret = self
            .open(&w.sealed_secret)
            .ok_or_else(|| unopened("the subscription's signing secret"))?;
        let headers = w
            .headers
            .iter()
            .map(|(name, sealed)| match self.open(sealed) {
                Some(value) => Ok((name.clone(), value)),
                None => Err(unopened(&format!("the custom header {name}"))),
            })
            .collect::<Result<_, _>>()?;
        Ok(Credentials { secret, headers })
    }

    /// Signs and sends one delivery; any 2xx is a success. The response body is never read.
    pub async fn send(&self, out: Outbound<'_>, timeout: Duration) -> Attempt {
        let started = Instant::now();
        let config = self.policy.get();
        let failed = |message: String, started: Instant| Attempt {
            response_time_ms: started.elapsed().as_millis() as u64,
            ..unsent(message)
        };
        // Re-checked on every delivery: the configuration may have changed since. The URL's
        // lookup and the request share the one `timeout`, so an attempt never takes longer
        // (a claimed delivery's hold counts on it: `dispatch`).
        match tokio::time::timeout(timeout, guard::check_url(out.url, &config)).await {
            Ok(Ok(_)) => {}
            Ok(Err(why)) => {
                return failed(format!("Webhook URL invalid: {} ({why})", out.url), started)
            }
            Err(_) => {
                let why = format!("its host was not resolved within {} s", timeout.as_secs());
                return failed(format!("Webhook URL invalid: {} ({why})", out.url), started);
            }
        }
        let span: u64 = rand::random();
        let mut request = self
            .client
            .post(out.url)
            .timeout(timeout.saturating_sub(started.elapsed()))
            .header("content-type", "application/json")
            .header("x-cycles-event-id", out.event_id)
            .header("x-cycles-event-type", out.event_type)
            .header("x-cycles-trace-id", out.trace_id)
            .header("traceparent", format!("00-{}-{span:016x}-01", out.trace_id));
        if let Some(id) = out.request_id {
            request = request.header("x-request-id", id);
        }
        let Credentials { secret, headers } = &out.credentials;
        request = request.header("x-cycles-signature", signature(secret, &out.body));
        for (name, value) in headers {
            request = request.header(name.as_str(), value.as_str());
        }
        match request.body(out.body).send().await {
            Ok(response) => {
                let status = response.status();
                Attempt {
                    success: status.is_success(),
                    response_status: Some(status.as_u16()),
                    response_time_ms: started.elapsed().as_millis() as u64,
                    error_message: (!status.is_success())
                        .then(|| format!("the receiver answered {status}")),
                }
            }
            Err(e) => failed(describe(&e), started),
        }
    }
}

/// A failed attempt that sent nothing, and why.
pub fn unsent(message: String) -> Attempt {
    Attempt {
        success: false,
        response_status: None,
        response_time_ms: 0,
        error_message: Some(message),
    }
}

/// `X-Cycles-Signature`: `sha256=` and the lowercase hex HMAC-SHA256 of the exact body.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any size");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// A failed request as an operator reads it.
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "could not connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn signatures_are_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        assert_eq!(
            super::signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
