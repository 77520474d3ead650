//! `cycles quickstart`: a demo tenant, key and budget on a running server, and the exact
//! commands to try a reservation with them.

use anyhow::bail;
use reqwest::Method;
use serde_json::json;

use crate::client::{Client, Target};

const TENANT: &str = "demo";
/// $1.00 in USD_MICROCENTS (1 USD = 10^8).
const BUDGET: i64 = 100_000_000;

pub fn run(target: Target) -> anyhow::Result<()> {
    let client = Client::new(&target)?;
    let (status, body) = client.send(
        Method::POST,
        "/v1/admin/tenants",
        Some(&json!({"tenant_id": TENANT, "name": "Demo tenant"})),
    )?;
    if !(200..300).contains(&status) {
        bail!("creating the demo tenant failed: HTTP {status}: {body}");
    }
    let key = client.call(
        Method::POST,
        "/v1/admin/api-keys",
        Some(&json!({"tenant_id": TENANT, "name": "quickstart"})),
    )?;
    let secret = key["key_secret"].as_str().unwrap_or_default().to_string();
    let scope = format!("tenant:{TENANT}");
    let (status, body) = client.send(
        Method::POST,
        "/v1/admin/budgets",
        Some(&json!({
            "tenant_id": TENANT,
            "scope": scope,
            "unit": "USD_MICROCENTS",
            "allocated": {"unit": "USD_MICROCENTS", "amount": BUDGET},
        })),
    )?;
    match status {
        200..=299 => {}
        409 => println!("(the demo budget already exists; keeping it)"),
        _ => bail!("creating the demo budget failed: HTTP {status}: {body}"),
    }
    let url = target.url.trim_end_matches('/');
    println!(
        r#"Tenant "{TENANT}" has a $1.00 budget at {scope} (USD_MICROCENTS).
Its API key (shown once):

  export CYCLES_BASE_URL={url}
  export CYCLES_API_KEY={secret}
  export CYCLES_TENANT={TENANT}

Reserve 0.1 cent, then commit what was really spent:

  curl -s -X POST $CYCLES_BASE_URL/v1/reservations \
    -H "X-Cycles-API-Key: $CYCLES_API_KEY" -H 'Content-Type: application/json' \
    -d '{{"idempotency_key":"demo-1","subject":{{"tenant":"{TENANT}","agent":"bot"}},
         "action":{{"kind":"llm.completion","name":"gpt-4o-mini"}},
         "estimate":{{"unit":"USD_MICROCENTS","amount":100000}}}}'

  curl -s -X POST $CYCLES_BASE_URL/v1/reservations/<reservation_id>/commit \
    -H "X-Cycles-API-Key: $CYCLES_API_KEY" -H 'Content-Type: application/json' \
    -d '{{"idempotency_key":"demo-1-commit","actual":{{"unit":"USD_MICROCENTS","amount":42000}}}}'

  curl -s "$CYCLES_BASE_URL/v1/balances?tenant={TENANT}" -H "X-Cycles-API-Key: $CYCLES_API_KEY"

Or with the Python SDK (pip install runcycles):

  from runcycles import CyclesClient, CyclesConfig, cycles
  client = CyclesClient(CyclesConfig.from_env())

  @cycles(estimate=100_000, client=client, action_kind="llm.completion", action_name="gpt-4o-mini")
  def answer(question: str) -> str:
      return "..."  # call your model here
"#
    );
    Ok(())
}
