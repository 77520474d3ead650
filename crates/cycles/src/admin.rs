//! `cycles admin …`: provisioning through the HTTP admin API.

use anyhow::Context;
use clap::{Args, Subcommand};
use protocol::api_key::ApiKeyCreateRequest;
use protocol::budget::{BudgetCreateRequest, BudgetFundingRequest};
use protocol::tenant::TenantCreateRequest;
use protocol::{Amount, WirePolicy, WireUnit};
use reqwest::Method;
use serde::de::{DeserializeOwned, IntoDeserializer};
use serde_json::Value;

use crate::client::{q, Client, Target, NO_BODY};

#[derive(Args)]
pub struct AdminArgs {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Tenant API keys.
    #[command(subcommand)]
    Key(KeyCmd),
    /// Budgets.
    #[command(subcommand)]
    Budget(BudgetCmd),
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Create a tenant (idempotent for the same id and name).
    Create {
        /// Tenant id: 3-64 characters of [a-z0-9-].
        #[arg(long)]
        id: String,
        #[arg(long)]
        name: String,
    },
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Create an API key; its secret is printed once.
    Create {
        #[arg(long)]
        tenant: String,
        #[arg(long, default_value = "cli-key")]
        name: String,
        /// A permission to grant (repeatable). Default: the spec's default set.
        #[arg(long = "permission")]
        permissions: Vec<String>,
    },
    /// Revoke an API key: it stops working at once.
    Revoke {
        #[arg(long)]
        key_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
enum BudgetCmd {
    /// Create a budget at a scope, e.g. tenant:acme/agent:bot.
    Create {
        #[arg(long)]
        scope: String,
        #[arg(long, default_value = "USD_MICROCENTS", value_parser = wire_name::<WireUnit>)]
        unit: WireUnit,
        #[arg(long)]
        allocated: i64,
        #[arg(long)]
        overdraft_limit: Option<i64>,
        /// REJECT, ALLOW_IF_AVAILABLE or ALLOW_WITH_OVERDRAFT.
        #[arg(long, value_parser = wire_name::<WirePolicy>)]
        overage_policy: Option<WirePolicy>,
    },
    /// Fund a budget: CREDIT, DEBIT, RESET, RESET_SPENT or REPAY_DEBT.
    Fund {
        #[arg(long)]
        scope: String,
        #[arg(long, default_value = "USD_MICROCENTS", value_parser = wire_name::<WireUnit>)]
        unit: WireUnit,
        #[arg(long)]
        op: String,
        #[arg(long)]
        amount: i64,
        /// Makes retries safe: the same key is applied once.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Show a budget.
    Show {
        #[arg(long)]
        scope: String,
        #[arg(long, default_value = "USD_MICROCENTS", value_parser = wire_name::<WireUnit>)]
        unit: WireUnit,
    },
}

/// Parses a flag as a `protocol` enum by its wire name (e.g. `USD_MICROCENTS`): the CLI
/// accepts exactly the values the server does.
fn wire_name<T: DeserializeOwned>(value: &str) -> Result<T, String> {
    T::deserialize(value.into_deserializer()).map_err(|e: serde::de::value::Error| e.to_string())
}

/// The tenant a scope belongs to (`tenant:<id>/…`).
fn scope_tenant(scope: &str) -> anyhow::Result<String> {
    ledger::scope_tenant(&scope.to_lowercase())
        .map(str::to_string)
        .context("a budget scope starts with tenant:<id>")
}

pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.target)?;
    // The answer is shown whole: every field the server sent, not a response type's view.
    let out: Value = match args.what {
        What::Tenant(TenantCmd::Create { id, name }) => client.call(
            Method::POST,
            "/v1/admin/tenants",
            Some(&TenantCreateRequest::new(id, name)),
        )?,
        What::Key(KeyCmd::Create {
            tenant,
            name,
            permissions,
        }) => {
            let request = ApiKeyCreateRequest {
                permissions: (!permissions.is_empty()).then_some(permissions),
                ..ApiKeyCreateRequest::new(tenant, name)
            };
            client.call(Method::POST, "/v1/admin/api-keys", Some(&request))?
        }
        What::Key(KeyCmd::Revoke { key_id, reason }) => {
            let mut path = format!("/v1/admin/api-keys/{}", q(&key_id));
            if let Some(r) = reason {
                path.push_str(&format!("?reason={}", q(&r)));
            }
            client.call(Method::DELETE, &path, NO_BODY)?
        }
        What::Budget(BudgetCmd::Create {
            scope,
            unit,
            allocated,
            overdraft_limit,
            overage_policy,
        }) => {
            let tenant = scope_tenant(&scope)?;
            let request = BudgetCreateRequest {
                overdraft_limit: overdraft_limit.map(|amount| Amount { unit, amount }),
                commit_overage_policy: overage_policy,
                ..BudgetCreateRequest::new(
                    Some(tenant),
                    scope,
                    Amount {
                        unit,
                        amount: allocated,
                    },
                )
            };
            client.call(Method::POST, "/v1/admin/budgets", Some(&request))?
        }
        What::Budget(BudgetCmd::Fund {
            scope,
            unit,
            op,
            amount,
            idempotency_key,
        }) => {
            let path = format!(
                "/v1/admin/budgets/fund?scope={}&unit={}&tenant_id={}",
                q(&scope),
                unit.as_str(),
                q(&scope_tenant(&scope)?)
            );
            let request = BudgetFundingRequest {
                operation: op,
                amount: Amount { unit, amount },
                spent: None,
                reason: None,
                idempotency_key,
                metadata: None,
            };
            client.call(Method::POST, &path, Some(&request))?
        }
        What::Budget(BudgetCmd::Show { scope, unit }) => client.call(
            Method::GET,
            &format!(
                "/v1/admin/budgets/lookup?scope={}&unit={}",
                q(&scope),
                unit.as_str()
            ),
            NO_BODY,
        )?,
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
