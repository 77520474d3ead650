//! The protocol calls the suite makes, with the reference benchmark's request shapes
//! (`reference-behaviour.md` §19.1): 100 TOKENS, REJECT, ttl 60 s, commit 80, event 50.
//! Every body is built from the `protocol` request types.

use anyhow::{bail, Context};
use protocol::api_key::{ApiKeyCreateRequest, ApiKeyCreateResponse};
use protocol::budget::{BudgetCreateRequest, BudgetFundingRequest, BudgetLedger};
use protocol::runtime::{
    CommitRequest, DecisionRequest, EventCreateRequest, ReleaseRequest, ReservationCreateRequest,
    ReservationExtendRequest,
};
use protocol::tenant::TenantCreateRequest;
use protocol::{Action, Amount, Subject, WirePolicy, WireUnit};
use serde::{Deserialize, Serialize};

use crate::http::{Conn, Reply, Target};

const UNIT: WireUnit = WireUnit::Tokens;
pub const ESTIMATE: i64 = 100;
/// What a client told to vary its estimates reserves (`--varied-estimates`): never less
/// than [`ESTIMATE`], so that every commit ([`COMMIT`]) fits its hold.
pub const VARIED_ESTIMATES: std::ops::RangeInclusive<i64> = ESTIMATE..=1_000_000;
const COMMIT: i64 = 80;
const EVENT: i64 = 50;
/// The reference's reserve TTL.
const TTL_MS: i64 = 60_000;
/// The longest TTL the protocol allows: list fixtures stay ACTIVE for the whole run.
const FIXTURE_TTL_MS: i64 = 86_400_000;
const EXTEND_BY_MS: i64 = 10_000;

fn tokens(amount: i64) -> Amount {
    Amount { unit: UNIT, amount }
}

fn action() -> Action {
    Action {
        kind: "llm.completion".into(),
        name: "test-model".into(),
        tags: None,
        policy_keys: None,
    }
}

/// A provisioned tenant and its API key.
#[derive(Clone)]
pub struct Tenant {
    pub id: String,
    pub key: String,
}

/// The idempotency key a body is serialized with, then cut out of it.
const KEY_SLOT: &str = "{idempotency_key}";

/// A request body serialized once, at setup, with its idempotency key cut out: a request
/// splices a fresh key in, so it costs one allocation (the body) and no serialization. The
/// client shares the cores with the server, so what it spends per request is taken from the
/// server being measured.
struct KeyedBody {
    head: String,
    tail: String,
}

impl KeyedBody {
    /// `request` carries [`KEY_SLOT`] as its idempotency key.
    fn new(request: &impl Serialize) -> KeyedBody {
        let text = serde_json::to_string(request)
            .expect("a protocol request serializes (every map in it has string keys)");
        let (head, tail) = text
            .split_once(KEY_SLOT)
            .expect("the request carries the key slot as its idempotency key");
        KeyedBody {
            head: head.to_string(),
            tail: tail.to_string(),
        }
    }

    /// The body with a fresh random key.
    fn with_new_key(&self) -> String {
        let mut buffer = uuid::Uuid::encode_buffer();
        let key = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut buffer);
        [self.head.as_str(), key, self.tail.as_str()].concat()
    }

    /// A reserve's body with a fresh random key and `amount` as its estimate's amount.
    fn with_new_key_and_estimate(&self, amount: i64) -> String {
        self.with_new_key().replacen(
            &format!("\"amount\":{ESTIMATE}"),
            &format!("\"amount\":{amount}"),
            1,
        )
    }
}

/// Every body one runtime client sends.
struct Bodies {
    reserve: KeyedBody,
    reserve_fixture: KeyedBody,
    commit: KeyedBody,
    release: KeyedBody,
    extend: KeyedBody,
    decide: KeyedBody,
    event: KeyedBody,
}

impl Bodies {
    fn new(subject: &Subject) -> Bodies {
        let key = || KEY_SLOT.to_string();
        // 100 TOKENS under REJECT.
        let reserve = |ttl_ms| ReservationCreateRequest {
            idempotency_key: key(),
            subject: subject.clone(),
            action: action(),
            estimate: tokens(ESTIMATE),
            ttl_ms: Some(ttl_ms),
            grace_period_ms: None,
            overage_policy: Some(WirePolicy::Reject),
            dry_run: None,
            metadata: None,
            observe_mode: None,
        };
        Bodies {
            reserve: KeyedBody::new(&reserve(TTL_MS)),
            reserve_fixture: KeyedBody::new(&reserve(FIXTURE_TTL_MS)),
            commit: KeyedBody::new(&CommitRequest {
                idempotency_key: key(),
                actual: tokens(COMMIT),
                metrics: None,
                metadata: None,
            }),
            release: KeyedBody::new(&ReleaseRequest {
                idempotency_key: key(),
                reason: Some("test-release".into()),
            }),
            extend: KeyedBody::new(&ReservationExtendRequest {
                idempotency_key: key(),
                extend_by_ms: EXTEND_BY_MS,
                metadata: None,
            }),
            // The reserve body without ttl and policy.
            decide: KeyedBody::new(&DecisionRequest {
                idempotency_key: key(),
                subject: subject.clone(),
                action: action(),
                estimate: tokens(ESTIMATE),
                metadata: None,
            }),
            // 50 TOKENS, no policy (the tenant default applies).
            event: KeyedBody::new(&EventCreateRequest {
                idempotency_key: key(),
                subject: subject.clone(),
                action: action(),
                actual: tokens(EVENT),
                overage_policy: None,
                metrics: None,
                client_time_ms: None,
                metadata: None,
            }),
        }
    }
}

/// The runtime plane as one client: its own connection, tenant key and subject.
pub struct Runtime {
    conn: Conn,
    tenant: String,
    bodies: Bodies,
    /// Reserves draw their estimate from [`VARIED_ESTIMATES`] instead of [`ESTIMATE`].
    varied_estimates: bool,
}

/// What a reserve answer is checked for. Not `ReservationCreateResponse`: that type is
/// built to be rendered from the ledger's result (it borrows from it), and reading all its
/// fields would cost the client allocations on every request.
#[derive(Deserialize)]
struct Reserved {
    reservation_id: Option<String>,
    decision: Option<String>,
}

/// A listing page's rows, counted and skipped rather than built (as above, per request).
#[derive(Deserialize)]
struct Listed {
    reservations: Vec<serde::de::IgnoredAny>,
}

impl Runtime {
    /// A client for `tenant`; with `agent`, its subject is that agent (a leaf scope).
    pub fn new(target: &Target, tenant: &Tenant, agent: Option<&str>) -> Runtime {
        let subject = Subject {
            tenant: Some(tenant.id.clone()),
            agent: agent.map(str::to_string),
            ..Subject::default()
        };
        Runtime {
            conn: Conn::new(target, Some(("X-Cycles-API-Key", tenant.key.clone()))),
            tenant: tenant.id.clone(),
            bodies: Bodies::new(&subject),
            varied_estimates: false,
        }
    }

    /// From now on each reserve's estimate is drawn from [`VARIED_ESTIMATES`], as real
    /// estimates vary: a settled reservation then lands at a random place in the history's
    /// index by amount, where a fixed estimate always appends to its end.
    pub fn vary_estimates(&mut self) {
        self.varied_estimates = true;
    }

    pub async fn connect(&mut self) -> anyhow::Result<()> {
        self.conn.connect().await
    }

    /// Reserve 100 TOKENS, or an amount from [`VARIED_ESTIMATES`] (REJECT, ttl 60 s); the
    /// reservation id of an ALLOW decision.
    pub async fn reserve(&mut self) -> anyhow::Result<String> {
        let body = if self.varied_estimates {
            let amount = rand::random_range(VARIED_ESTIMATES);
            self.bodies.reserve.with_new_key_and_estimate(amount)
        } else {
            self.bodies.reserve.with_new_key()
        };
        self.reserve_with(body).await
    }

    /// Like [`Runtime::reserve`], with the longest TTL: for list fixtures.
    pub async fn reserve_fixture(&mut self) -> anyhow::Result<String> {
        let body = self.bodies.reserve_fixture.with_new_key();
        self.reserve_with(body).await
    }

    async fn reserve_with(&mut self, body: String) -> anyhow::Result<String> {
        let reply = self
            .conn
            .post("/v1/reservations", body)
            .await?
            .expect(200)?;
        let r: Reserved = serde_json::from_slice(&reply.body).context("reserve response")?;
        match (r.reservation_id, r.decision.as_deref()) {
            (Some(id), Some("ALLOW" | "ALLOW_WITH_CAPS")) => Ok(id),
            (_, decision) => bail!("reserve was not allowed: decision {decision:?}"),
        }
    }

    pub async fn commit(&mut self, id: &str) -> anyhow::Result<()> {
        let body = self.bodies.commit.with_new_key();
        self.post_ok(&format!("/v1/reservations/{id}/commit"), body, 200)
            .await
    }

    pub async fn release(&mut self, id: &str) -> anyhow::Result<()> {
        let body = self.bodies.release.with_new_key();
        self.post_ok(&format!("/v1/reservations/{id}/release"), body, 200)
            .await
    }

    pub async fn extend(&mut self, id: &str) -> anyhow::Result<()> {
        let body = self.bodies.extend.with_new_key();
        self.post_ok(&format!("/v1/reservations/{id}/extend"), body, 200)
            .await
    }

    /// POST /v1/decide: the reserve body without ttl and policy.
    pub async fn decide(&mut self) -> anyhow::Result<()> {
        let body = self.bodies.decide.with_new_key();
        self.post_ok("/v1/decide", body, 200).await
    }

    /// POST /v1/events: 50 TOKENS, no policy (the tenant default applies).
    pub async fn event(&mut self) -> anyhow::Result<()> {
        let body = self.bodies.event.with_new_key();
        self.post_ok("/v1/events", body, 201).await
    }

    pub async fn get_reservation(&mut self, id: &str) -> anyhow::Result<()> {
        self.get_ok(&format!("/v1/reservations/{id}")).await
    }

    pub async fn balances(&mut self) -> anyhow::Result<()> {
        let path = format!("/v1/balances?tenant={}", self.tenant);
        self.get_ok(&path).await
    }

    /// GET /v1/reservations?{query}; with `rows`, the page must hold exactly that many.
    pub async fn list(&mut self, query: &str, rows: Option<usize>) -> anyhow::Result<()> {
        let reply = self
            .conn
            .get(&format!("/v1/reservations?{query}"))
            .await?
            .expect(200)?;
        if let Some(rows) = rows {
            let listed: Listed = serde_json::from_slice(&reply.body).context("list response")?;
            if listed.reservations.len() != rows {
                bail!(
                    "list returned {} rows, expected {rows}",
                    listed.reservations.len()
                );
            }
        }
        Ok(())
    }

    async fn post_ok(&mut self, path: &str, body: String, status: u16) -> anyhow::Result<()> {
        self.conn.post(path, body).await?.expect(status).map(drop)
    }

    async fn get_ok(&mut self, path: &str) -> anyhow::Result<()> {
        self.conn.get(path).await?.expect(200).map(drop)
    }
}

/// The admin plane: provisioning, ledger reads for reconciliation, and `/metrics`.
pub struct Admin {
    conn: Conn,
}

impl Admin {
    pub fn new(target: &Target, admin_key: &str) -> Admin {
        Admin {
            conn: Conn::new(target, Some(("X-Admin-API-Key", admin_key.to_string()))),
        }
    }

    /// Creates a tenant (max reservation TTL 24 h, so list fixtures stay ACTIVE) and an API
    /// key with the default permissions.
    pub async fn tenant(&mut self, id: &str) -> anyhow::Result<Tenant> {
        let tenant = TenantCreateRequest {
            max_reservation_ttl_ms: Some(FIXTURE_TTL_MS),
            ..TenantCreateRequest::new(id.to_string(), format!("cycles bench {id}"))
        };
        self.conn
            .post("/v1/admin/tenants", serde_json::to_string(&tenant)?)
            .await?
            .expect(201)
            .with_context(|| format!("creating tenant {id} (is the admin key right?)"))?;
        let key = ApiKeyCreateRequest::new(id.to_string(), "cycles-bench".into());
        let reply = self
            .conn
            .post("/v1/admin/api-keys", serde_json::to_string(&key)?)
            .await?
            .expect(201)
            .context("creating an API key")?;
        let key: ApiKeyCreateResponse = serde_json::from_slice(&reply.body)?;
        Ok(Tenant {
            id: id.to_string(),
            key: key.key_secret,
        })
    }

    /// A TOKENS budget at `scope` (no overdraft).
    pub async fn budget(
        &mut self,
        tenant: &str,
        scope: &str,
        allocated: i64,
    ) -> anyhow::Result<()> {
        let budget = BudgetCreateRequest::new(
            Some(tenant.to_string()),
            scope.to_string(),
            tokens(allocated),
        );
        self.conn
            .post("/v1/admin/budgets", serde_json::to_string(&budget)?)
            .await?
            .expect(201)
            .with_context(|| format!("creating the budget at {scope}"))
            .map(drop)
    }

    /// The `reserved` amount of the budget at `scope`.
    pub async fn reserved(&mut self, scope: &str) -> anyhow::Result<i64> {
        let path = format!(
            "/v1/admin/budgets/lookup?scope={}&unit={}",
            scope.replace(':', "%3A").replace('/', "%2F"),
            UNIT.as_str()
        );
        let reply = self.conn.get(&path).await?.expect(200)?;
        let budget: BudgetLedger = serde_json::from_slice(&reply.body)?;
        Ok(budget.reserved.amount)
    }

    /// The path and body of a CREDIT of 1 token to `tenant`'s root budget: an operator's
    /// top-up, each one an audited write (the audit fixtures are made of them).
    pub fn credit(tenant: &str) -> anyhow::Result<(String, String)> {
        let path = format!(
            "/v1/admin/budgets/fund?scope=tenant%3A{tenant}&unit={}&tenant_id={tenant}",
            UNIT.as_str()
        );
        let body = BudgetFundingRequest {
            operation: "CREDIT".into(),
            amount: tokens(1),
            spent: None,
            reason: None,
            idempotency_key: None,
            metadata: None,
        };
        Ok((path, serde_json::to_string(&body)?))
    }

    /// A POST that must answer 200.
    pub async fn post_ok(&mut self, path: &str, body: String) -> anyhow::Result<()> {
        self.conn.post(path, body).await?.expect(200).map(drop)
    }

    /// A request with a JSON body that must answer `status`; answers the JSON body.
    pub async fn send_json(
        &mut self,
        method: hyper::Method,
        path: &str,
        body: String,
        status: u16,
    ) -> anyhow::Result<serde_json::Value> {
        let reply = self
            .conn
            .send(method, path, Some(body))
            .await?
            .expect(status)?;
        Ok(serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null))
    }

    /// A GET that must answer 200 (the governance list cells).
    pub async fn get_ok(&mut self, path: &str) -> anyhow::Result<()> {
        self.conn.get(path).await?.expect(200).map(drop)
    }

    /// The Prometheus text of `/metrics`, or `None` when the server has none for us.
    pub async fn metrics(&mut self) -> anyhow::Result<Option<String>> {
        let reply: Reply = self.conn.get("/metrics").await?;
        Ok((reply.status == 200).then(|| String::from_utf8_lossy(&reply.body).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use protocol::{parse_body, Validate};
    use serde::de::DeserializeOwned;

    use super::*;

    /// Two bodies from `body` pass the server's own parsing, each with its own random key.
    fn assert_valid_with_fresh_keys<T: DeserializeOwned + Validate>(
        body: &KeyedBody,
        key: fn(&T) -> &str,
    ) {
        let [a, b] = [(); 2].map(|()| parse_body::<T>(body.with_new_key().as_bytes()).unwrap());
        assert_ne!(key(&a), key(&b));
        assert!(uuid::Uuid::parse_str(key(&a)).is_ok(), "{}", key(&a));
    }

    #[test]
    fn every_body_is_a_valid_request_with_a_fresh_key() {
        let bodies = Bodies::new(&Subject {
            tenant: Some("bench-t".into()),
            agent: Some("agent-1".into()),
            ..Subject::default()
        });
        assert_valid_with_fresh_keys(&bodies.reserve, |r: &ReservationCreateRequest| {
            &r.idempotency_key
        });
        assert_valid_with_fresh_keys(&bodies.reserve_fixture, |r: &ReservationCreateRequest| {
            &r.idempotency_key
        });
        assert_valid_with_fresh_keys(&bodies.commit, |r: &CommitRequest| &r.idempotency_key);
        for amount in [*VARIED_ESTIMATES.start(), 4_321, *VARIED_ESTIMATES.end()] {
            let body = bodies.reserve.with_new_key_and_estimate(amount);
            let varied: ReservationCreateRequest = parse_body(body.as_bytes()).unwrap();
            assert_eq!(varied.estimate.amount, amount, "{body}");
        }
        assert_valid_with_fresh_keys(&bodies.release, |r: &ReleaseRequest| &r.idempotency_key);
        assert_valid_with_fresh_keys(&bodies.extend, |r: &ReservationExtendRequest| {
            &r.idempotency_key
        });
        assert_valid_with_fresh_keys(&bodies.decide, |r: &DecisionRequest| &r.idempotency_key);
        assert_valid_with_fresh_keys(&bodies.event, |r: &EventCreateRequest| &r.idempotency_key);
    }
}
