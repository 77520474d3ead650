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
use crate::output::say;
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
    /// Webhook subscriptions, their deliveries, test probes and replays.
    #[command(subcommand)]
    Webhook(WebhookCmd),
    /// The event log, newest first.
    Events(EventArgs),
}

#[derive(Subcommand)]
enum WebhookCmd {
    /// Subscribe a URL to events; the signing secret is printed once.
    Create {
        #[arg(long)]
        url: String,
        /// The owning tenant (default: a system-wide subscription).
        #[arg(long)]
        tenant: Option<String>,
        /// An event type to receive, e.g. budget.exhausted (repeatable; at least one).
        #[arg(long = "event-type", required = true)]
        event_types: Vec<String>,
        /// An event category to receive as well, e.g. budget (repeatable).
        #[arg(long = "category")]
        categories: Vec<String>,
        /// Only events at scopes matching this pattern (`tenant:acme/*`).
        #[arg(long)]
        scope_filter: Option<String>,
        #[arg(long)]
        name: Option<String>,
    },
    /// List subscriptions.
    List {
        #[arg(long)]
        tenant: Option<String>,
        /// ACTIVE, PAUSED or DISABLED.
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Pause a subscription (events meanwhile are not queued for it).
    Pause { id: String },
    /// Resume a paused subscription, or re-enable a disabled one.
    Resume { id: String },
    /// Delete a subscription; its pending deliveries are cancelled.
    Delete { id: String },
    /// Send it a signed system.webhook_test event now.
    Test { id: String },
    /// A subscription's deliveries, newest first.
    Deliveries {
        id: String,
        /// PENDING, SUCCESS, FAILED or RETRYING.
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Queue past events again (at most --max-events, all or nothing).
    Replay {
        id: String,
        #[arg(long)]
        from: Option<String>,
        #[arg(long)]
        to: Option<String>,
        #[arg(long, default_value_t = 100)]
        max_events: u32,
    },
    /// Show or set the URL security configuration (the SSRF guard).
    Security {
        /// Allow http:// URLs (development only).
        #[arg(long)]
        allow_http: Option<bool>,
        /// A CIDR range URLs may not resolve to (repeatable; replaces the list).
        #[arg(long = "blocked-cidr")]
        blocked: Vec<String>,
        /// Block nothing (for a receiver on this machine, in development).
        #[arg(long, conflicts_with = "blocked")]
        block_nothing: bool,
        /// A glob URLs must match (repeatable; replaces the list).
        #[arg(long = "allowed-url")]
        allowed: Vec<String>,
    },
}

/// The event log's filters (each AND-ed with the others).
#[derive(Args)]
struct EventArgs {
    #[arg(long)]
    tenant: Option<String>,
    #[arg(long)]
    event_type: Option<String>,
    #[arg(long)]
    category: Option<String>,
    /// A scope prefix.
    #[arg(long)]
    scope: Option<String>,
    #[arg(long)]
    correlation_id: Option<String>,
    #[arg(long)]
    request_id: Option<String>,
    #[arg(long)]
    from: Option<String>,
    #[arg(long)]
    to: Option<String>,
    #[command(flatten)]
    list: ListArgs,
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

const EVENT_COLUMNS: &[Column] = &[
    ("TIME", "/timestamp"),
    ("TYPE", "/event_type"),
    ("TENANT", "/tenant_id"),
    ("SCOPE", "/scope"),
    ("ACTOR", "/actor/type"),
    ("EVENT", "/event_id"),
    ("REQUEST", "/request_id"),
];

const WEBHOOK_COLUMNS: &[Column] = &[
    ("ID", "/subscription_id"),
    ("TENANT", "/tenant_id"),
    ("STATUS", "/status"),
    ("URL", "/url"),
    ("FAILURES", "/consecutive_failures"),
    ("LAST SUCCESS", "/last_success_at"),
];

const DELIVERY_COLUMNS: &[Column] = &[
    ("DELIVERY", "/delivery_id"),
    ("EVENT", "/event_type"),
    ("STATUS", "/status"),
    ("ATTEMPTS", "/attempts"),
    ("HTTP", "/response_status"),
    ("MS", "/response_time_ms"),
    ("ERROR", "/error_message"),
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
        What::Events(e) => {
            let query = params(&[
                ("tenant_id", e.tenant),
                ("event_type", e.event_type),
                ("category", e.category),
                ("scope", e.scope),
                ("correlation_id", e.correlation_id),
                ("request_id", e.request_id),
                ("from", e.from),
                ("to", e.to),
            ]);
            let rows = list_all(&client, "/v1/admin/events", query, "events", &e.list)?;
            return table::print(&rows, EVENT_COLUMNS, e.list.json);
        }
        What::Webhook(cmd) => match webhook(&client, cmd)? {
            // A list, already printed.
            Value::Null => return Ok(()),
            answer => answer,
        },
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
    say!("{}", serde_json::to_string_pretty(&out)?)?;
    Ok(())
}

/// `cycles admin webhook …`: what it answers (lists print their own table and answer
/// `Value::Null`).
fn webhook(client: &Client, cmd: WebhookCmd) -> anyhow::Result<Value> {
    let at = |id: &str| format!("/v1/admin/webhooks/{}", q(id));
    let patch = |id: &str, status: &str| {
        client.call(
            Method::PATCH,
            &at(id),
            Some(&serde_json::json!({ "status": status })),
        )
    };
    Ok(match cmd {
        WebhookCmd::Create {
            url,
            tenant,
            event_types,
            categories,
            scope_filter,
            name,
        } => {
            let mut body = serde_json::json!({ "url": url, "event_types": event_types });
            if !categories.is_empty() {
                body["event_categories"] = categories.into();
            }
            if let Some(f) = scope_filter {
                body["scope_filter"] = f.into();
            }
            if let Some(n) = name {
                body["name"] = n.into();
            }
            let path = match tenant {
                Some(t) => format!("/v1/admin/webhooks?tenant_id={}", q(&t)),
                None => "/v1/admin/webhooks".into(),
            };
            client.call(Method::POST, &path, Some(&body))?
        }
        WebhookCmd::List {
            tenant,
            status,
            list,
        } => {
            let query = params(&[("tenant_id", tenant), ("status", status)]);
            let rows = list_all(client, "/v1/admin/webhooks", query, "subscriptions", &list)?;
            table::print(&rows, WEBHOOK_COLUMNS, list.json)?;
            return Ok(Value::Null);
        }
        WebhookCmd::Pause { id } => patch(&id, "PAUSED")?,
        WebhookCmd::Resume { id } => patch(&id, "ACTIVE")?,
        WebhookCmd::Delete { id } => {
            client.call::<Value>(Method::DELETE, &at(&id), NO_BODY)?;
            serde_json::json!({ "deleted": id })
        }
        WebhookCmd::Test { id } => client.call(
            Method::POST,
            &format!("{}/test", at(&id)),
            Some(&serde_json::json!({})),
        )?,
        WebhookCmd::Deliveries { id, status, list } => {
            let query = params(&[("status", status)]);
            let path = format!("{}/deliveries", at(&id));
            let rows = list_all(client, &path, query, "deliveries", &list)?;
            table::print(&rows, DELIVERY_COLUMNS, list.json)?;
            return Ok(Value::Null);
        }
        WebhookCmd::Replay {
            id,
            from,
            to,
            max_events,
        } => {
            let mut body = serde_json::json!({ "max_events": max_events });
            if let Some(f) = from {
                body["from"] = f.into();
            }
            if let Some(t) = to {
                body["to"] = t.into();
            }
            client.call(Method::POST, &format!("{}/replay", at(&id)), Some(&body))?
        }
        WebhookCmd::Security {
            allow_http,
            blocked,
            block_nothing,
            allowed,
        } => {
            let path = "/v1/admin/config/webhook-security";
            let mut config = client.call(Method::GET, path, NO_BODY)?;
            let changing =
                allow_http.is_some() || !blocked.is_empty() || block_nothing || !allowed.is_empty();
            if !changing {
                return Ok(config);
            }
            if let Some(a) = allow_http {
                config["allow_http"] = a.into();
            }
            if block_nothing {
                config["blocked_cidr_ranges"] = serde_json::json!([]);
            } else if !blocked.is_empty() {
                config["blocked_cidr_ranges"] = blocked.into();
            }
            if !allowed.is_empty() {
                config["allowed_url_patterns"] = allowed.into();
            }
            client.call(Method::PUT, path, Some(&config))?
        }
    })
}
