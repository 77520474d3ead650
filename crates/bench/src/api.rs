//! The protocol calls the suite makes, with the reference benchmark's request shapes
//! (`reference-behaviour.md` §19.1): 100 TOKENS, REJECT, ttl 60 s, commit 80, event 50.

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::http::{Conn, Reply, Target};

pub const UNIT: &str = "TOKENS";
pub const ESTIMATE: i64 = 100;
const COMMIT: i64 = 80;
const EVENT: i64 = 50;
/// The reference's reserve TTL.
pub const TTL_MS: i64 = 60_000;
/// The longest TTL the protocol allows: list fixtures stay ACTIVE for the whole run.
pub const FIXTURE_TTL_MS: i64 = 86_400_000;
const ACTION: &str = r#"{"kind":"llm.completion","name":"test-model"}"#;

/// A provisioned tenant and its API key.
#[derive(Clone)]
pub struct Tenant {
    pub id: String,
    pub key: String,
}

fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The runtime plane as one client: its own connection, tenant key and subject.
pub struct Runtime {
    conn: Conn,
    tenant: String,
    subject: String,
}

#[derive(Deserialize)]
struct Reserved {
    reservation_id: Option<String>,
    decision: Option<String>,
}

#[derive(Deserialize)]
struct Listed {
    reservations: Vec<serde::de::IgnoredAny>,
}

impl Runtime {
    /// A client for `tenant`; with `agent`, its subject is that agent (a leaf scope).
    pub fn new(target: &Target, tenant: &Tenant, agent: Option<&str>) -> Runtime {
        let subject = match agent {
            Some(agent) => format!(r#"{{"tenant":"{}","agent":"{agent}"}}"#, tenant.id),
            None => format!(r#"{{"tenant":"{}"}}"#, tenant.id),
        };
        Runtime {
            conn: Conn::new(target, Some(("X-Cycles-API-Key", tenant.key.clone()))),
            tenant: tenant.id.clone(),
            subject,
        }
    }

    pub async fn connect(&mut self) -> anyhow::Result<()> {
        self.conn.connect().await
    }

    /// Reserve 100 TOKENS (REJECT, ttl 60 s); the reservation id of an ALLOW decision.
    pub async fn reserve(&mut self) -> anyhow::Result<String> {
        self.reserve_for(TTL_MS).await
    }

    pub async fn reserve_for(&mut self, ttl_ms: i64) -> anyhow::Result<String> {
        let body = format!(
            r#"{{"idempotency_key":"{}","subject":{},"action":{ACTION},"estimate":{{"unit":"{UNIT}","amount":{ESTIMATE}}},"ttl_ms":{ttl_ms},"overage_policy":"REJECT"}}"#,
            new_key(),
            self.subject
        );
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
        let body = format!(
            r#"{{"idempotency_key":"{}","actual":{{"unit":"{UNIT}","amount":{COMMIT}}}}}"#,
            new_key()
        );
        self.post_ok(&format!("/v1/reservations/{id}/commit"), body, 200)
            .await
    }

    pub async fn release(&mut self, id: &str) -> anyhow::Result<()> {
        let body = format!(
            r#"{{"idempotency_key":"{}","reason":"test-release"}}"#,
            new_key()
        );
        self.post_ok(&format!("/v1/reservations/{id}/release"), body, 200)
            .await
    }

    pub async fn extend(&mut self, id: &str) -> anyhow::Result<()> {
        let body = format!(
            r#"{{"idempotency_key":"{}","extend_by_ms":10000}}"#,
            new_key()
        );
        self.post_ok(&format!("/v1/reservations/{id}/extend"), body, 200)
            .await
    }

    /// POST /v1/decide: the reserve body without ttl and policy.
    pub async fn decide(&mut self) -> anyhow::Result<()> {
        let body = format!(
            r#"{{"idempotency_key":"{}","subject":{},"action":{ACTION},"estimate":{{"unit":"{UNIT}","amount":{ESTIMATE}}}}}"#,
            new_key(),
            self.subject
        );
        self.post_ok("/v1/decide", body, 200).await
    }

    /// POST /v1/events: 50 TOKENS, no policy (the tenant default applies).
    pub async fn event(&mut self) -> anyhow::Result<()> {
        let body = format!(
            r#"{{"idempotency_key":"{}","subject":{},"action":{ACTION},"actual":{{"unit":"{UNIT}","amount":{EVENT}}}}}"#,
            new_key(),
            self.subject
        );
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

#[derive(Deserialize)]
struct KeyCreated {
    key_secret: String,
}

#[derive(Deserialize)]
struct AmountJson {
    amount: i64,
}

#[derive(Deserialize)]
struct BudgetJson {
    reserved: AmountJson,
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
        let body = format!(
            r#"{{"tenant_id":"{id}","name":"cycles bench {id}","max_reservation_ttl_ms":{FIXTURE_TTL_MS}}}"#
        );
        self.conn
            .post("/v1/admin/tenants", body)
            .await?
            .expect(201)
            .with_context(|| format!("creating tenant {id} (is the admin key right?)"))?;
        let body = format!(r#"{{"tenant_id":"{id}","name":"cycles-bench"}}"#);
        let reply = self
            .conn
            .post("/v1/admin/api-keys", body)
            .await?
            .expect(201)
            .context("creating an API key")?;
        let key: KeyCreated = serde_json::from_slice(&reply.body)?;
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
        let body = format!(
            r#"{{"tenant_id":"{tenant}","scope":"{scope}","unit":"{UNIT}","allocated":{{"unit":"{UNIT}","amount":{allocated}}}}}"#
        );
        self.conn
            .post("/v1/admin/budgets", body)
            .await?
            .expect(201)
            .with_context(|| format!("creating the budget at {scope}"))
            .map(drop)
    }

    /// The `reserved` amount of the budget at `scope`.
    pub async fn reserved(&mut self, scope: &str) -> anyhow::Result<i64> {
        let path = format!(
            "/v1/admin/budgets/lookup?scope={}&unit={UNIT}",
            scope.replace(':', "%3A").replace('/', "%2F")
        );
        let reply = self.conn.get(&path).await?.expect(200)?;
        let budget: BudgetJson = serde_json::from_slice(&reply.body)?;
        Ok(budget.reserved.amount)
    }

    /// The Prometheus text of `/metrics`, or `None` when the server has none for us.
    pub async fn metrics(&mut self) -> anyhow::Result<Option<String>> {
        let reply: Reply = self.conn.get("/metrics").await?;
        Ok((reply.status == 200).then(|| String::from_utf8_lossy(&reply.body).into_owned()))
    }
}
