//! `cycles admin …`: provisioning through the HTTP admin API.

use anyhow::Context;
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};

use crate::client::{q, Client, Target};

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
        #[arg(long, default_value = "USD_MICROCENTS")]
        unit: String,
        #[arg(long)]
        allocated: i64,
        #[arg(long)]
        overdraft_limit: Option<i64>,
        /// REJECT, ALLOW_IF_AVAILABLE or ALLOW_WITH_OVERDRAFT.
        #[arg(long)]
        overage_policy: Option<String>,
    },
    /// Fund a budget: CREDIT, DEBIT, RESET, RESET_SPENT or REPAY_DEBT.
    Fund {
        #[arg(long)]
        scope: String,
        #[arg(long, default_value = "USD_MICROCENTS")]
        unit: String,
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
        #[arg(long, default_value = "USD_MICROCENTS")]
        unit: String,
    },
}

/// The tenant a scope belongs to (`tenant:<id>/…`).
fn scope_tenant(scope: &str) -> anyhow::Result<String> {
    ledger::scope_tenant(&scope.to_lowercase())
        .map(str::to_string)
        .context("a budget scope starts with tenant:<id>")
}

pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.target)?;
    let out = match args.what {
        What::Tenant(TenantCmd::Create { id, name }) => client.call(
            Method::POST,
            "/v1/admin/tenants",
            Some(&json!({"tenant_id": id, "name": name})),
        )?,
        What::Key(KeyCmd::Create {
            tenant,
            name,
            permissions,
        }) => {
            let mut body = json!({"tenant_id": tenant, "name": name});
            if !permissions.is_empty() {
                body["permissions"] = json!(permissions);
            }
            client.call(Method::POST, "/v1/admin/api-keys", Some(&body))?
        }
        What::Key(KeyCmd::Revoke { key_id, reason }) => {
            let mut path = format!("/v1/admin/api-keys/{}", q(&key_id));
            if let Some(r) = reason {
                path.push_str(&format!("?reason={}", q(&r)));
            }
            client.call(Method::DELETE, &path, None)?
        }
        What::Budget(BudgetCmd::Create {
            scope,
            unit,
            allocated,
            overdraft_limit,
            overage_policy,
        }) => {
            let mut body = json!({
                "tenant_id": scope_tenant(&scope)?,
                "scope": scope,
                "unit": unit,
                "allocated": {"unit": unit, "amount": allocated},
            });
            if let Some(limit) = overdraft_limit {
                body["overdraft_limit"] = json!({"unit": unit, "amount": limit});
            }
            if let Some(p) = overage_policy {
                body["commit_overage_policy"] = Value::String(p);
            }
            client.call(Method::POST, "/v1/admin/budgets", Some(&body))?
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
                q(&unit),
                q(&scope_tenant(&scope)?)
            );
            let mut body = json!({"operation": op, "amount": {"unit": unit, "amount": amount}});
            if let Some(k) = idempotency_key {
                body["idempotency_key"] = Value::String(k);
            }
            client.call(Method::POST, &path, Some(&body))?
        }
        What::Budget(BudgetCmd::Show { scope, unit }) => client.call(
            Method::GET,
            &format!(
                "/v1/admin/budgets/lookup?scope={}&unit={}",
                q(&scope),
                q(&unit)
            ),
            None,
        )?,
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
