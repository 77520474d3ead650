//! `cycles quickstart`: a demo tenant, key and budget on a running server, and the exact
//! commands to try a reservation with them.

use anyhow::bail;
use protocol::api_key::{ApiKeyCreateRequest, ApiKeyCreateResponse};
use protocol::budget::BudgetCreateRequest;
use protocol::runtime::{CommitRequest, ReservationCreateRequest};
use protocol::tenant::TenantCreateRequest;
use protocol::{Action, Amount, Subject, WireUnit};
use reqwest::Method;

use crate::client::{Client, Target};
use crate::output::say;

const TENANT: &str = "demo";
/// $1.00 in USD_MICROCENTS (1 USD = 10^8).
const BUDGET: i64 = 100_000_000;

fn usd_microcents(amount: i64) -> Amount {
    Amount {
        unit: WireUnit::UsdMicrocents,
        amount,
    }
}

/// The example reservation: 0.1 cent for one model call by the demo tenant's agent.
fn example_reservation() -> ReservationCreateRequest {
    ReservationCreateRequest {
        idempotency_key: "demo-1".into(),
        subject: Subject {
            tenant: Some(TENANT.into()),
            agent: Some("bot".into()),
            ..Subject::default()
        },
        action: Action {
            kind: "llm.completion".into(),
            name: "gpt-4o-mini".into(),
            tags: None,
            policy_keys: None,
        },
        estimate: usd_microcents(100_000),
        ttl_ms: None,
        grace_period_ms: None,
        overage_policy: None,
        dry_run: None,
        metadata: None,
        observe_mode: None,
    }
}

/// The example commit of what that call really spent.
fn example_commit() -> CommitRequest {
    CommitRequest {
        idempotency_key: "demo-1-commit".into(),
        actual: usd_microcents(42_000),
        metrics: None,
        metadata: None,
    }
}

pub fn run(target: Target) -> anyhow::Result<()> {
    let client = Client::new(&target)?;
    let tenant = TenantCreateRequest::new(TENANT.into(), "Demo tenant".into());
    let (status, body) = client.send(Method::POST, "/v1/admin/tenants", Some(&tenant))?;
    if !(200..300).contains(&status) {
        bail!("creating the demo tenant failed: HTTP {status}: {body}");
    }
    let key: ApiKeyCreateResponse = client.call(
        Method::POST,
        "/v1/admin/api-keys",
        Some(&ApiKeyCreateRequest::new(
            TENANT.into(),
            "quickstart".into(),
        )),
    )?;
    let secret = key.key_secret;
    let scope = format!("tenant:{TENANT}");
    let budget =
        BudgetCreateRequest::new(Some(TENANT.into()), scope.clone(), usd_microcents(BUDGET));
    let (status, body) = client.send(Method::POST, "/v1/admin/budgets", Some(&budget))?;
    match status {
        200..=299 => {}
        409 => say!("(the demo budget already exists; keeping it)")?,
        _ => bail!("creating the demo budget failed: HTTP {status}: {body}"),
    }
    let url = target.url.trim_end_matches('/');
    let reservation = serde_json::to_string(&example_reservation())?;
    let commit = serde_json::to_string(&example_commit())?;
    say!(
        r#"Tenant "{TENANT}" has a $1.00 budget at {scope} (USD_MICROCENTS).
Its API key (shown once):

  export CYCLES_BASE_URL={url}
  export CYCLES_API_KEY={secret}
  export CYCLES_TENANT={TENANT}

Reserve 0.1 cent, then commit what was really spent:

  curl -s -X POST $CYCLES_BASE_URL/v1/reservations \
    -H "X-Cycles-API-Key: $CYCLES_API_KEY" -H 'Content-Type: application/json' \
    -d '{reservation}'

  curl -s -X POST $CYCLES_BASE_URL/v1/reservations/<reservation_id>/commit \
    -H "X-Cycles-API-Key: $CYCLES_API_KEY" -H 'Content-Type: application/json' \
    -d '{commit}'

  curl -s "$CYCLES_BASE_URL/v1/balances?tenant={TENANT}" -H "X-Cycles-API-Key: $CYCLES_API_KEY"

Or with the Python SDK (pip install runcycles):

  from runcycles import CyclesClient, CyclesConfig, cycles
  client = CyclesClient(CyclesConfig.from_env())

  @cycles(estimate=100_000, client=client, action_kind="llm.completion", action_name="gpt-4o-mini")
  def answer(question: str) -> str:
      return "..."  # call your model here
"#
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use protocol::parse_body;

    use super::*;

    /// What the quickstart tells people to send is what the server accepts.
    #[test]
    fn the_printed_examples_are_valid_requests() {
        let reservation = serde_json::to_vec(&example_reservation()).unwrap();
        parse_body::<ReservationCreateRequest>(&reservation).unwrap();
        let commit = serde_json::to_vec(&example_commit()).unwrap();
        parse_body::<CommitRequest>(&commit).unwrap();
    }
}
