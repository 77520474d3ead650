//! `cycles admin …`: provisioning through the HTTP admin API.

use anyhow::Context;
use clap::{Args, Subcommand};
use protocol::api_key::{ApiKeyCreateRequest, ApiKeyUpdateRequest};
use protocol::budget::{BudgetCreateRequest, BudgetFundingRequest};
use protocol::tenant::TenantCreateRequest;
use protocol::{Amount, WirePolicy, WireUnit};
use reqwest::Method;
use serde::de::{DeserializeOwned, IntoDeserializer};
use serde_json::Value;

use crate::client::{q, Client, Target, NO_BODY};
use crate::table::{self, Column};

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
    /// Counts of tenants and budgets by state, and the largest debts.
    Overview,
    /// The audit log: every admin write and every refused attempt, newest first.
    Audit(AuditArgs),
}

/// The audit log's filters (each AND-ed with the others).
#[derive(Args)]
struct AuditArgs {
    /// A tenant id, or __admin__ / __unauth__.
    #[arg(long)]
    tenant: Option<String>,
    /// Entries made with this API key.
    #[arg(long)]
    key_id: Option<String>,
    /// An operation id, e.g. createBudget (repeatable: any of them).
    #[arg(long = "operation")]
    operations: Vec<String>,
    /// tenant, budget, api_key, policy or reservation (repeatable: any of them).
    #[arg(long = "resource-type")]
    resource_types: Vec<String>,
    /// A tenant id, key id, budget scope, policy id or reservation id.
    #[arg(long)]
    resource_id: Option<String>,
    /// An error code, e.g. BUDGET_FROZEN (repeatable: any of them).
    #[arg(long = "error-code")]
    error_codes: Vec<String>,
    /// Only refused requests (status 400 and above).
    #[arg(long, conflicts_with = "status")]
    errors: bool,
    /// An exact HTTP status.
    #[arg(long)]
    status: Option<u16>,
    /// From this time on (RFC 3339).
    #[arg(long)]
    from: Option<String>,
    /// Up to this time (RFC 3339).
    #[arg(long)]
    to: Option<String>,
    #[arg(long)]
    request_id: Option<String>,
    #[arg(long)]
    trace_id: Option<String>,
    #[command(flatten)]
    list: ListArgs,
}

/// The filters and order every list takes, passed to the server as query parameters.
#[derive(Args)]
struct ListArgs {
    /// Case-insensitive substring (ids and names).
    #[arg(long)]
    search: Option<String>,
    /// The field to sort by (the server's `sort_by` values).
    #[arg(long)]
    sort_by: Option<String>,
    /// Ascending instead of descending (with --sort-by).
    #[arg(long)]
    asc: bool,
    /// Most rows to show (pages are followed up to this many).
    #[arg(long, default_value_t = 1_000)]
    limit: usize,
    /// JSON (the server's whole rows) even on a terminal.
    #[arg(long)]
    json: bool,
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
    /// List tenants.
    List {
        /// ACTIVE, SUSPENDED or CLOSED.
        #[arg(long)]
        status: Option<String>,
        /// Only the children of this tenant.
        #[arg(long)]
        parent: Option<String>,
        #[command(flatten)]
        list: ListArgs,
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
    /// List API keys (never their secrets).
    List {
        #[arg(long)]
        tenant: Option<String>,
        /// ACTIVE, REVOKED or EXPIRED.
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Change an ACTIVE key's name, description, permissions or scope filter.
    Update {
        #[arg(long)]
        key_id: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        description: Option<String>,
        /// The key's new permissions (repeatable): they replace the old ones.
        #[arg(long = "permission")]
        permissions: Vec<String>,
        /// The key's new scope filter (repeatable): it replaces the old one.
        #[arg(long = "scope-filter")]
        scope_filter: Vec<String>,
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
    /// List budgets.
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        scope_prefix: Option<String>,
        /// ACTIVE, FROZEN or CLOSED.
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        over_limit: Option<bool>,
        #[arg(long)]
        has_debt: Option<bool>,
        /// At least this utilization (spent / allocated), 0 to 1.
        #[arg(long)]
        utilization_min: Option<f64>,
        #[command(flatten)]
        list: ListArgs,
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

const TENANT_COLUMNS: &[Column] = &[
    ("TENANT", "/tenant_id"),
    ("NAME", "/name"),
    ("STATUS", "/status"),
    ("PARENT", "/parent_tenant_id"),
    ("CREATED", "/created_at"),
];

const KEY_COLUMNS: &[Column] = &[
    ("KEY", "/key_id"),
    ("TENANT", "/tenant_id"),
    ("NAME", "/name"),
    ("STATUS", "/status"),
    ("PERMISSIONS", "/permissions"),
    ("EXPIRES", "/expires_at"),
];

const AUDIT_COLUMNS: &[Column] = &[
    ("TIME", "/timestamp"),
    ("TENANT", "/tenant_id"),
    ("OPERATION", "/operation"),
    ("RESOURCE", "/resource_id"),
    ("STATUS", "/status"),
    ("ERROR", "/error_code"),
    ("KEY", "/key_id"),
    ("REQUEST", "/request_id"),
];

const BUDGET_COLUMNS: &[Column] = &[
    ("SCOPE", "/scope"),
    ("UNIT", "/unit"),
    ("STATUS", "/status"),
    ("ALLOCATED", "/allocated/amount"),
    ("REMAINING", "/remaining/amount"),
    ("SPENT", "/spent/amount"),
    ("DEBT", "/debt/amount"),
];

/// Every row of a list endpoint, following `next_cursor` until `limit` rows or the end.
fn list_all(
    client: &Client,
    path: &str,
    mut query: Vec<(&str, String)>,
    rows_field: &str,
    list: &ListArgs,
) -> anyhow::Result<Vec<Value>> {
    query.extend(list.search.clone().map(|s| ("search", s)));
    if let Some(sort_by) = &list.sort_by {
        query.push(("sort_by", sort_by.clone()));
        query.push(("sort_dir", if list.asc { "asc" } else { "desc" }.into()));
    }
    query.push(("limit", "100".into()));
    let mut rows = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut params = query.clone();
        params.extend(cursor.take().map(|c| ("cursor", c)));
        let encoded: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", q(v)))
            .collect();
        let page: Value = client.call(
            Method::GET,
            &format!("{path}?{}", encoded.join("&")),
            NO_BODY,
        )?;
        rows.extend(page[rows_field].as_array().cloned().unwrap_or_default());
        cursor = page["next_cursor"].as_str().map(str::to_string);
        if rows.len() >= list.limit || cursor.is_none() {
            rows.truncate(list.limit);
            return Ok(rows);
        }
    }
}

/// The query parameters that are set.
fn params<'a>(pairs: &[(&'a str, Option<String>)]) -> Vec<(&'a str, String)> {
    pairs
        .iter()
        .filter_map(|(k, v)| v.clone().map(|v| (*k, v)))
        .collect()
}

pub fn run(args: AdminArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.target)?;
    // The answer is shown whole: every field the server sent, not a response type's view.
    let out: Value = match args.what {
        What::Tenant(TenantCmd::List {
            status,
            parent,
            list,
        }) => {
            let query = params(&[("status", status), ("parent_tenant_id", parent)]);
            let rows = list_all(&client, "/v1/admin/tenants", query, "tenants", &list)?;
            return table::print(&rows, TENANT_COLUMNS, list.json);
        }
        What::Key(KeyCmd::List {
            tenant,
            status,
            list,
        }) => {
            let query = params(&[("tenant_id", tenant), ("status", status)]);
            let rows = list_all(&client, "/v1/admin/api-keys", query, "keys", &list)?;
            return table::print(&rows, KEY_COLUMNS, list.json);
        }
        What::Budget(BudgetCmd::List {
            tenant,
            scope_prefix,
            status,
            over_limit,
            has_debt,
            utilization_min,
            list,
        }) => {
            let query = params(&[
                ("tenant_id", tenant),
                ("scope_prefix", scope_prefix),
                ("status", status),
                ("over_limit", over_limit.map(|b| b.to_string())),
                ("has_debt", has_debt.map(|b| b.to_string())),
                ("utilization_min", utilization_min.map(|u| u.to_string())),
            ]);
            let rows = list_all(&client, "/v1/admin/budgets", query, "ledgers", &list)?;
            return table::print(&rows, BUDGET_COLUMNS, list.json);
        }
        What::Key(KeyCmd::Update {
            key_id,
            name,
            description,
            permissions,
            scope_filter,
        }) => {
            let request = ApiKeyUpdateRequest {
                name,
                description,
                permissions: (!permissions.is_empty()).then_some(permissions),
                scope_filter: (!scope_filter.is_empty()).then_some(scope_filter),
                metadata: None,
            };
            let path = format!("/v1/admin/api-keys/{}", q(&key_id));
            client.call(Method::PATCH, &path, Some(&request))?
        }
        What::Overview => client.call(Method::GET, "/v1/admin/overview", NO_BODY)?,
        What::Audit(a) => {
            let list = |values: Vec<String>| (!values.is_empty()).then(|| values.join(","));
            let query = params(&[
                ("tenant_id", a.tenant),
                ("key_id", a.key_id),
                ("operation", list(a.operations)),
                ("resource_type", list(a.resource_types)),
                ("resource_id", a.resource_id),
                ("error_code", list(a.error_codes)),
                ("status", a.status.map(|s| s.to_string())),
                ("status_min", a.errors.then(|| "400".to_string())),
                ("from", a.from),
                ("to", a.to),
                ("request_id", a.request_id),
                ("trace_id", a.trace_id),
            ]);
            let rows = list_all(&client, "/v1/admin/audit/logs", query, "logs", &a.list)?;
            return table::print(&rows, AUDIT_COLUMNS, a.list.json);
        }
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
