//! Events and webhooks on the wire: the event log's query and entries, subscriptions (admin
//! and tenant planes), deliveries, replay and the webhook security configuration.

use std::collections::BTreeMap;

use ledger::{
    Delivery, DeliveryQuery, DeliveryStatus, Event, EventCategory, EventFilter, EventPage,
    EventQuery, EventSort, EventType, RetryPolicy, WebhookFilter, WebhookPatch, WebhookSecurity,
    WebhookSort, WebhookStatus, WebhookSubscription, DEFAULT_DISABLE_AFTER_FAILURES,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::cursor::SortedRequest;
use crate::query::{check_trace_id, time_window as window};
use crate::validate::{max_len, nullable};
use crate::wire::parse_wire;
use crate::{format_rfc3339, ApiError, ClampedLimit, NextPage, Search, Validate};

/// An event type by its name, else 400 naming `field`.
pub fn parse_event_type(field: &str, name: &str) -> Result<EventType, ApiError> {
    EventType::parse(name)
        .ok_or_else(|| ApiError::invalid(format!("{field}: unknown event type '{name}'")))
}

fn parse_category(field: &str, name: &str) -> Result<EventCategory, ApiError> {
    EventCategory::parse(name).ok_or_else(|| {
        ApiError::invalid(format!(
            "{field}: unknown event category '{name}' (expected one of budget, tenant, \
             api_key, policy, reservation, system, webhook)"
        ))
    })
}

/// The query of `GET /v1/admin/events` (and, without the admin-only filters, of
/// `GET /v1/events`).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventListParams {
    pub tenant_id: Option<String>,
    /// An `EventType`.
    pub event_type: Option<String>,
    /// An `EventCategory`.
    pub category: Option<String>,
    /// A prefix of the event's scope.
    pub scope: Option<String>,
    pub correlation_id: Option<String>,
    #[param(pattern = "^[0-9a-f]{32}$")]
    pub trace_id: Option<String>,
    pub request_id: Option<String>,
    #[param(format = DateTime)]
    pub from: Option<String>,
    #[param(format = DateTime)]
    pub to: Option<String>,
    /// Case-insensitive substring of the correlation id or scope, at most 128 characters.
    #[serde(default)]
    #[param(value_type = Option<String>, max_length = 128)]
    pub search: Search,
    /// `event_type`, `category`, `scope`, `tenant_id` or `timestamp` (the default).
    pub sort_by: Option<String>,
    /// `asc` or `desc` (the default).
    pub sort_dir: Option<String>,
    pub cursor: Option<String>,
    #[param(value_type = Option<i64>, minimum = 1)]
    pub limit: Option<ClampedLimit>,
}

impl EventListParams {
    /// The query; `tenant`: a tenant key's own tenant (only its tenant-accessible events,
    /// and none of the admin-only parameters).
    pub fn into_query(self, tenant: Option<String>) -> Result<(EventQuery, NextPage), ApiError> {
        let (from_ms, to_ms) = window(&self.from, &self.to)?;
        check_trace_id(&self.trace_id)?;
        let filter = EventFilter {
            tenant_accessible_only: tenant.is_some(),
            tenant_id: tenant.or(self.tenant_id),
            event_type: self
                .event_type
                .as_deref()
                .map(|t| parse_event_type("event_type", t))
                .transpose()?,
            category: self
                .category
                .as_deref()
                .map(|c| parse_category("category", c))
                .transpose()?,
            scope_prefix: self.scope.map(|s| s.to_lowercase()),
            correlation_id: self.correlation_id,
            trace_id: self.trace_id,
            request_id: self.request_id,
            from_ms,
            to_ms,
            search: self.search.0,
        };
        let order = SortedRequest {
            sort_by: self.sort_by.as_deref(),
            default: EventSort::Timestamp,
            sort_dir: self.sort_dir.as_deref(),
            cursor: self.cursor.as_deref(),
            limit: self.limit.unwrap_or_default().0,
            filters: format!("{filter:?}"),
            text: EventSort::is_text,
        }
        .parse()?;
        Ok((
            EventQuery {
                filter,
                sort: order.sort_by,
                window: order.window,
            },
            NextPage(Some(order.binding)),
        ))
    }
}

/// `GET /v1/events`: what a tenant key may filter by.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TenantEventListParams {
    pub event_type: Option<String>,
    pub category: Option<String>,
    pub scope: Option<String>,
    pub correlation_id: Option<String>,
    #[param(format = DateTime)]
    pub from: Option<String>,
    #[param(format = DateTime)]
    pub to: Option<String>,
    pub cursor: Option<String>,
    #[param(value_type = Option<i64>, minimum = 1)]
    pub limit: Option<ClampedLimit>,
}

impl From<TenantEventListParams> for EventListParams {
    fn from(p: TenantEventListParams) -> Self {
        EventListParams {
            tenant_id: None,
            event_type: p.event_type,
            category: p.category,
            scope: p.scope,
            correlation_id: p.correlation_id,
            trace_id: None,
            request_id: None,
            from: p.from,
            to: p.to,
            search: Search(None),
            sort_by: None,
            sort_dir: None,
            cursor: p.cursor,
            limit: p.limit,
        }
    }
}

/// `Event.actor`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventActorResponse {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_ip: Option<String>,
}

/// `Event`: as listed and as delivered to webhooks (the delivered body is exactly this).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Event)]
pub struct EventResponse {
    pub event_id: String,
    pub event_type: String,
    pub category: String,
    pub timestamp: String,
    pub tenant_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    pub actor: EventActorResponse,
    pub source: String,
    #[schema(value_type = Object)]
    pub data: Box<RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl From<Event> for EventResponse {
    fn from(e: Event) -> Self {
        EventResponse {
            category: e.category().name().into(),
            event_type: e.event_type.name().into(),
            event_id: e.event_id,
            timestamp: format_rfc3339(e.timestamp_ms),
            tenant_id: e.tenant_id,
            scope: e.scope,
            actor: EventActorResponse {
                kind: e.actor.kind.name().into(),
                key_id: e.actor.key_id,
                source_ip: e.actor.source_ip,
            },
            source: e.source,
            data: RawValue::from_string(e.data)
                .unwrap_or_else(|_| RawValue::from_string("{}".into()).expect("valid JSON")),
            correlation_id: e.correlation_id,
            request_id: e.request_id,
            trace_id: e.trace_id,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = EventListResponse)]
pub struct EventListResponse {
    pub events: Vec<EventResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

impl EventListResponse {
    pub fn new(next: &NextPage, page: EventPage) -> Self {
        let next_cursor = next.after(page.next);
        EventListResponse {
            has_more: next_cursor.is_some(),
            events: page.events.into_iter().map(Into::into).collect(),
            next_cursor,
        }
    }
}

/// `WebhookRetryPolicy`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicyBody {
    #[schema(minimum = 0, maximum = 10)]
    pub max_retries: Option<i64>,
    #[schema(minimum = 100, maximum = 60000)]
    pub initial_delay_ms: Option<i64>,
    #[schema(minimum = 1.0, maximum = 10.0)]
    pub backoff_multiplier: Option<f64>,
    #[schema(minimum = 1000, maximum = 3600000)]
    pub max_delay_ms: Option<i64>,
}

impl RetryPolicyBody {
    fn check(&self) -> Result<RetryPolicy, ApiError> {
        let d = RetryPolicy::default();
        let ranged = |name: &str, v: Option<i64>, lo: i64, hi: i64, default: u64| match v {
            None => Ok(default),
            Some(v) if (lo..=hi).contains(&v) => Ok(v as u64),
            Some(_) => Err(ApiError::invalid(format!(
                "retry_policy.{name}: must be {lo} to {hi}"
            ))),
        };
        let multiplier = match self.backoff_multiplier {
            None => d.backoff_multiplier_milli,
            Some(m) if (1.0..=10.0).contains(&m) => (m * 1000.0).round() as u32,
            Some(_) => {
                return Err(ApiError::invalid(
                    "retry_policy.backoff_multiplier: must be 1.0 to 10.0",
                ))
            }
        };
        Ok(RetryPolicy {
            max_retries: ranged("max_retries", self.max_retries, 0, 10, d.max_retries.into())?
                as u32,
            initial_delay_ms: ranged(
                "initial_delay_ms",
                self.initial_delay_ms,
                100,
                60_000,
                d.initial_delay_ms,
            )?,
            backoff_multiplier_milli: multiplier,
            max_delay_ms: ranged(
                "max_delay_ms",
                self.max_delay_ms,
                1_000,
                3_600_000,
                d.max_delay_ms,
            )?,
        })
    }

    fn of(p: RetryPolicy) -> Self {
        RetryPolicyBody {
            max_retries: Some(p.max_retries.into()),
            initial_delay_ms: Some(p.initial_delay_ms as i64),
            backoff_multiplier: Some(f64::from(p.backoff_multiplier_milli) / 1000.0),
            max_delay_ms: Some(p.max_delay_ms as i64),
        }
    }
}

fn check_thresholds(t: &Option<Value>) -> Result<Option<String>, ApiError> {
    let Some(t) = t else { return Ok(None) };
    let Value::Object(map) = t else {
        return Err(ApiError::invalid("thresholds: must be an object"));
    };
    let unit = |name: &str, v: &Value, lo: f64, hi: f64| match v.as_f64() {
        Some(x) if (lo..=hi).contains(&x) => Ok(()),
        _ => Err(ApiError::invalid(format!(
            "thresholds.{name}: must be {lo} to {hi}"
        ))),
    };
    for (name, v) in map {
        match name.as_str() {
            "budget_utilization" => {
                let list = v.as_array().ok_or_else(|| {
                    ApiError::invalid("thresholds.budget_utilization: must be an array")
                })?;
                for x in list {
                    unit("budget_utilization[]", x, 0.0, 1.0)?;
                }
            }
            "burn_rate_multiplier" => unit(name, v, 1.5, f64::MAX)?,
            // Integers (the spec's type, and what the detector reads).
            "burn_rate_window_seconds" | "rate_window_seconds" => match v.as_u64() {
                Some(60..=86_400) => {}
                _ => {
                    return Err(ApiError::invalid(format!(
                        "thresholds.{name}: must be an integer from 60 to 86400"
                    )))
                }
            },
            "denial_rate_threshold" | "expiry_rate_threshold" | "auth_failure_rate_threshold" => {
                unit(name, v, 0.0, 1.0)?
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "thresholds.{other}: unknown field"
                )))
            }
        }
    }
    Ok(Some(t.to_string()))
}

fn check_headers(headers: &Option<BTreeMap<String, String>>) -> Result<(), ApiError> {
    for (name, value) in headers.iter().flatten() {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token {
            return Err(ApiError::invalid(format!(
                "headers: '{name}' is not a header name"
            )));
        }
        let reserved = [
            "content-type",
            "content-length",
            "host",
            "user-agent",
            "traceparent",
        ];
        let lower = name.to_ascii_lowercase();
        if reserved.contains(&lower.as_str()) || lower.starts_with("x-cycles-") {
            return Err(ApiError::invalid(format!(
                "headers: '{name}' is set by the server and cannot be overridden"
            )));
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(ApiError::invalid(format!(
                "headers.{name}: must be one line"
            )));
        }
        max_len(format!("headers.{name}"), value, 4096)?;
    }
    Ok(())
}

fn event_types(list: &[String]) -> Result<Vec<EventType>, ApiError> {
    let mut out: Vec<EventType> = Vec::new();
    for t in list {
        let t = parse_event_type("event_types[]", t)?;
        if !out.contains(&t) {
            out.push(t);
        }
    }
    Ok(out)
}

fn categories(list: &[String]) -> Result<Vec<EventCategory>, ApiError> {
    let mut out: Vec<EventCategory> = Vec::new();
    for c in list {
        let c = parse_category("event_categories[]", c)?;
        if !out.contains(&c) {
            out.push(c);
        }
    }
    Ok(out)
}

/// `WebhookCreateRequest`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookCreateRequest {
    #[schema(max_length = 256)]
    pub name: Option<String>,
    #[schema(max_length = 1024)]
    pub description: Option<String>,
    #[schema(max_length = 2048)]
    pub url: String,
    #[schema(min_items = 1)]
    pub event_types: Vec<String>,
    pub event_categories: Option<Vec<String>>,
    pub scope_filter: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub thresholds: Option<Value>,
    pub signing_secret: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub retry_policy: Option<RetryPolicyBody>,
    #[schema(minimum = 1)]
    pub disable_after_failures: Option<i64>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
}

fn check_common(
    name: Option<&str>,
    description: Option<&str>,
    url: Option<&str>,
    secret: &Option<String>,
    metadata: Option<&Value>,
    disable_after_failures: Option<i64>,
) -> Result<(), ApiError> {
    if let Some(n) = name {
        max_len("name", n, 256)?;
    }
    if let Some(d) = description {
        max_len("description", d, 1024)?;
    }
    if let Some(u) = url {
        max_len("url", u, 2048)?;
    }
    if let Some(s) = secret {
        if s.len() < 16 || s.len() > 512 {
            return Err(ApiError::invalid(
                "signing_secret: must be 16 to 512 characters",
            ));
        }
    }
    if metadata.is_some_and(|m| !m.is_object()) {
        return Err(ApiError::invalid("metadata: must be an object"));
    }
    if disable_after_failures.is_some_and(|n| !(1..=1_000_000).contains(&n)) {
        return Err(ApiError::invalid(
            "disable_after_failures: must be at least 1",
        ));
    }
    Ok(())
}

impl Validate for WebhookCreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        check_common(
            self.name.as_deref(),
            self.description.as_deref(),
            Some(&self.url),
            &self.signing_secret,
            self.metadata.as_ref(),
            self.disable_after_failures,
        )?;
        if self.event_types.is_empty() {
            return Err(ApiError::invalid(
                "event_types: at least one event type is required",
            ));
        }
        event_types(&self.event_types)?;
        categories(self.event_categories.as_deref().unwrap_or_default())?;
        check_thresholds(&self.thresholds)?;
        check_headers(&self.headers)?;
        if let Some(p) = &self.retry_policy {
            p.check()?;
        }
        Ok(())
    }
}

/// A create request's parts, with its secret and header values for the server to seal.
pub struct WebhookDraft {
    pub name: Option<String>,
    pub description: Option<String>,
    pub url: String,
    pub event_types: Vec<EventType>,
    pub event_categories: Vec<EventCategory>,
    pub scope_filter: Option<String>,
    pub thresholds: Option<String>,
    pub signing_secret: Option<String>,
    pub headers: Vec<(String, String)>,
    pub retry_policy: RetryPolicy,
    pub disable_after_failures: u32,
    pub metadata: Option<String>,
}

impl WebhookCreateRequest {
    /// The validated request as a draft (call after [`Validate::validate`]).
    pub fn into_draft(self) -> Result<WebhookDraft, ApiError> {
        Ok(WebhookDraft {
            event_types: event_types(&self.event_types)?,
            event_categories: categories(self.event_categories.as_deref().unwrap_or_default())?,
            thresholds: check_thresholds(&self.thresholds)?,
            retry_policy: self
                .retry_policy
                .map(|p| p.check())
                .transpose()?
                .unwrap_or_default(),
            name: self.name,
            description: self.description,
            url: self.url,
            scope_filter: self
                .scope_filter
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.to_lowercase()),
            signing_secret: self.signing_secret,
            headers: self.headers.unwrap_or_default().into_iter().collect(),
            disable_after_failures: self
                .disable_after_failures
                .map_or(DEFAULT_DISABLE_AFTER_FAILURES, |n| n as u32),
            metadata: self.metadata.map(|m| m.to_string()),
        })
    }
}

/// `WebhookUpdateRequest`. `name`, `description`, `scope_filter` and `metadata` may be
/// `null`, which clears them: the official dashboard sends that when an operator empties
/// one.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookUpdateRequest {
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, nullable)]
    pub name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, nullable)]
    pub description: Option<Option<String>>,
    pub url: Option<String>,
    pub event_types: Option<Vec<String>>,
    pub event_categories: Option<Vec<String>>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<String>, nullable)]
    pub scope_filter: Option<Option<String>>,
    #[schema(value_type = Option<Object>)]
    pub thresholds: Option<Value>,
    pub signing_secret: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub retry_policy: Option<RetryPolicyBody>,
    pub disable_after_failures: Option<i64>,
    /// `ACTIVE` or `PAUSED`.
    pub status: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(value_type = Option<Object>, nullable)]
    pub metadata: Option<Option<Value>>,
}

impl Validate for WebhookUpdateRequest {
    const CLEARABLE: &'static [&'static str] = &["name", "description", "scope_filter", "metadata"];

    fn validate(&self) -> Result<(), ApiError> {
        check_common(
            self.name.as_ref().and_then(Option::as_deref),
            self.description.as_ref().and_then(Option::as_deref),
            self.url.as_deref(),
            &self.signing_secret,
            self.metadata.as_ref().and_then(Option::as_ref),
            self.disable_after_failures,
        )?;
        event_types(self.event_types.as_deref().unwrap_or_default())?;
        categories(self.event_categories.as_deref().unwrap_or_default())?;
        check_thresholds(&self.thresholds)?;
        check_headers(&self.headers)?;
        if let Some(p) = &self.retry_policy {
            p.check()?;
        }
        self.status()?;
        Ok(())
    }
}

impl WebhookUpdateRequest {
    fn status(&self) -> Result<Option<WebhookStatus>, ApiError> {
        match self.status.as_deref() {
            None => Ok(None),
            Some("ACTIVE") => Ok(Some(WebhookStatus::Active)),
            Some("PAUSED") => Ok(Some(WebhookStatus::Paused)),
            Some(other) => Err(ApiError::invalid(format!(
                "status: '{other}' cannot be set (expected ACTIVE or PAUSED)"
            ))),
        }
    }

    /// The patch, with the secret and header values still to be sealed by the server
    /// (`sealed_secret` and `headers` hold them in the clear until then).
    pub fn into_patch(self) -> Result<WebhookPatch, ApiError> {
        Ok(WebhookPatch {
            status: self.status()?,
            event_types: self.event_types.as_deref().map(event_types).transpose()?,
            event_categories: self
                .event_categories
                .as_deref()
                .map(categories)
                .transpose()?,
            thresholds: check_thresholds(&self.thresholds)?,
            retry_policy: self.retry_policy.map(|p| p.check()).transpose()?,
            name: self.name,
            description: self.description,
            url: self.url,
            scope_filter: self.scope_filter.map(|s| s.map(|s| s.to_lowercase())),
            sealed_secret: self.signing_secret,
            headers: self.headers.map(|h| h.into_iter().collect()),
            disable_after_failures: self.disable_after_failures.map(|n| n as u32),
            metadata: self.metadata.map(|m| m.map(|m| m.to_string())),
        })
    }
}

/// `WebhookSubscription` as read: no secret, custom header values masked.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = WebhookSubscription)]
pub struct WebhookResponse {
    pub subscription_id: String,
    pub tenant_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub url: String,
    pub event_types: Vec<String>,
    pub event_categories: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope_filter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub thresholds: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    pub status: String,
    pub retry_policy: RetryPolicyBody,
    pub disable_after_failures: u32,
    pub consecutive_failures: u32,
    pub created_at: String,
    pub updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_triggered_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_failure_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Box<RawValue>>,
}

fn raw(json: Option<String>) -> Option<Box<RawValue>> {
    json.and_then(|j| RawValue::from_string(j).ok())
}

impl From<&WebhookSubscription> for WebhookResponse {
    fn from(w: &WebhookSubscription) -> Self {
        let time = |t: Option<i64>| t.map(format_rfc3339);
        WebhookResponse {
            subscription_id: w.subscription_id.clone(),
            tenant_id: w.tenant_id.clone(),
            name: w.name.clone(),
            description: w.description.clone(),
            url: w.url.clone(),
            event_types: w.event_types.iter().map(|t| t.name().into()).collect(),
            event_categories: w.event_categories.iter().map(|c| c.name().into()).collect(),
            scope_filter: w.scope_filter.clone(),
            thresholds: raw(w.thresholds.clone()),
            headers: w
                .headers
                .iter()
                .map(|(k, _)| (k.clone(), "********".to_string()))
                .collect(),
            status: crate::WireName::wire_name(w.status).into(),
            retry_policy: RetryPolicyBody::of(w.retry_policy),
            disable_after_failures: w.disable_after_failures,
            consecutive_failures: w.consecutive_failures,
            created_at: format_rfc3339(w.created_at_ms),
            updated_at: format_rfc3339(w.updated_at_ms),
            last_triggered_at: time(w.last_triggered_at_ms),
            last_success_at: time(w.last_success_at_ms),
            last_failure_at: time(w.last_failure_at_ms),
            metadata: raw(w.metadata.clone()),
        }
    }
}

/// `WebhookCreateResponse`: the only time the signing secret is shown.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = WebhookCreateResponse)]
pub struct WebhookCreateResponse {
    pub subscription: WebhookResponse,
    pub signing_secret: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = WebhookListResponse)]
pub struct WebhookListResponse {
    pub subscriptions: Vec<WebhookResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

impl WebhookListResponse {
    pub fn new(
        next: &NextPage,
        page: ledger::SortedPage<std::sync::Arc<WebhookSubscription>>,
    ) -> Self {
        let next_cursor = next.sorted(&page);
        WebhookListResponse {
            has_more: page.page.has_more,
            subscriptions: page
                .page
                .items
                .iter()
                .map(|w| WebhookResponse::from(&**w))
                .collect(),
            next_cursor,
        }
    }
}

/// The query of `GET /v1/admin/webhooks`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WebhookListParams {
    pub tenant_id: Option<String>,
    /// `ACTIVE`, `PAUSED` or `DISABLED`.
    pub status: Option<String>,
    /// Subscriptions listing this `EventType`.
    pub event_type: Option<String>,
    #[serde(default)]
    #[param(value_type = Option<String>, max_length = 128)]
    pub search: Search,
    /// `url`, `tenant_id`, `status` or `consecutive_failures` (the default).
    pub sort_by: Option<String>,
    pub sort_dir: Option<String>,
    pub cursor: Option<String>,
    #[param(value_type = Option<i64>, minimum = 1)]
    pub limit: Option<ClampedLimit>,
}

/// The query of `GET /v1/webhooks`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TenantWebhookListParams {
    /// Required with the admin key; a tenant key's own tenant otherwise.
    pub tenant: Option<String>,
    pub status: Option<String>,
    pub cursor: Option<String>,
    #[param(value_type = Option<i64>, minimum = 1)]
    pub limit: Option<ClampedLimit>,
}

impl From<TenantWebhookListParams> for WebhookListParams {
    fn from(p: TenantWebhookListParams) -> Self {
        WebhookListParams {
            tenant_id: p.tenant,
            status: p.status,
            event_type: None,
            search: Search(None),
            sort_by: None,
            sort_dir: None,
            cursor: p.cursor,
            limit: p.limit,
        }
    }
}

impl WebhookListParams {
    pub fn into_query(
        self,
    ) -> Result<(WebhookFilter, WebhookSort, ledger::Window, NextPage), ApiError> {
        let filter = WebhookFilter {
            tenant_id: self.tenant_id,
            status: self
                .status
                .as_deref()
                .map(|s| parse_wire::<WebhookStatus>("status", s))
                .transpose()?,
            event_type: self
                .event_type
                .as_deref()
                .map(|t| parse_event_type("event_type", t))
                .transpose()?,
            search: self.search.0.map(|s| s.to_lowercase()),
        };
        let order = SortedRequest {
            sort_by: self.sort_by.as_deref(),
            default: WebhookSort::ConsecutiveFailures,
            sort_dir: self.sort_dir.as_deref(),
            cursor: self.cursor.as_deref(),
            limit: self.limit.unwrap_or_default().0,
            filters: format!("{filter:?}"),
            text: |s| matches!(s, WebhookSort::Url | WebhookSort::TenantId),
        }
        .parse()?;
        Ok((
            filter,
            order.sort_by,
            order.window,
            NextPage(Some(order.binding)),
        ))
    }
}

/// `?tenant_id=` of `POST /v1/admin/webhooks`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WebhookOwnerParams {
    /// The owning tenant; omitted (or `__system__`): a system-wide subscription.
    pub tenant_id: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WebhookPath {
    pub subscription_id: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct EventPath {
    pub event_id: String,
}

/// The query of a subscription's deliveries.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryListParams {
    /// `PENDING`, `SUCCESS`, `FAILED` or `RETRYING`.
    pub status: Option<String>,
    #[param(format = DateTime)]
    pub from: Option<String>,
    #[param(format = DateTime)]
    pub to: Option<String>,
    pub cursor: Option<String>,
    #[param(value_type = Option<i64>, minimum = 1)]
    pub limit: Option<ClampedLimit>,
}

impl DeliveryListParams {
    pub fn into_query(self, subscription_id: String) -> Result<DeliveryQuery, ApiError> {
        let (from_ms, to_ms) = window(&self.from, &self.to)?;
        let after = self
            .cursor
            .map(|c| {
                let ok = c.starts_with("del_") && c.len() == 20;
                ok.then_some(c).ok_or_else(|| {
                    ApiError::invalid("cursor: malformed; restart pagination without a cursor")
                })
            })
            .transpose()?;
        Ok(DeliveryQuery {
            subscription_id,
            status: self
                .status
                .as_deref()
                .map(|s| parse_wire::<DeliveryStatus>("status", s))
                .transpose()?,
            from_ms,
            to_ms,
            after,
            limit: self.limit.unwrap_or_default().0,
        })
    }
}

/// `WebhookDelivery`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = WebhookDelivery)]
pub struct DeliveryResponse {
    pub delivery_id: String,
    pub subscription_id: String,
    pub event_id: String,
    pub event_type: String,
    pub status: String,
    pub attempted_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_time_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_retry_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

impl From<Delivery> for DeliveryResponse {
    fn from(d: Delivery) -> Self {
        DeliveryResponse {
            status: crate::WireName::wire_name(d.status).into(),
            next_retry_at: (d.status == DeliveryStatus::Retrying)
                .then(|| format_rfc3339(d.next_attempt_at_ms)),
            attempted_at: format_rfc3339(d.attempted_at_ms.unwrap_or(d.created_at_ms)),
            completed_at: d.completed_at_ms.map(format_rfc3339),
            delivery_id: d.delivery_id,
            subscription_id: d.subscription_id,
            event_id: d.event_id,
            event_type: d.event_type.name().into(),
            attempts: d.attempts,
            response_status: d.response_status,
            response_time_ms: d.response_time_ms,
            error_message: d.error_message,
            trace_id: d.trace_id,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = WebhookDeliveryListResponse)]
pub struct DeliveryListResponse {
    pub deliveries: Vec<DeliveryResponse>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

impl From<ledger::DeliveryPage> for DeliveryListResponse {
    fn from(page: ledger::DeliveryPage) -> Self {
        let next_cursor = page
            .has_more
            .then(|| page.deliveries.last().map(|d| d.delivery_id.clone()))
            .flatten();
        DeliveryListResponse {
            deliveries: page.deliveries.into_iter().map(Into::into).collect(),
            next_cursor,
            has_more: page.has_more,
        }
    }
}

/// `WebhookSecurityConfig`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = WebhookSecurityConfig)]
#[serde(deny_unknown_fields)]
pub struct WebhookSecurityBody {
    pub blocked_cidr_ranges: Option<Vec<String>>,
    pub allowed_url_patterns: Option<Vec<String>>,
    pub allow_http: Option<bool>,
}

impl Validate for WebhookSecurityBody {
    fn validate(&self) -> Result<(), ApiError> {
        for range in self.blocked_cidr_ranges.iter().flatten() {
            if range.parse::<ipnet::IpNet>().is_err() {
                return Err(ApiError::invalid(format!(
                    "blocked_cidr_ranges: '{range}' is not a CIDR range"
                )));
            }
        }
        for pattern in self.allowed_url_patterns.iter().flatten() {
            max_len("allowed_url_patterns[]", pattern, 2048)?;
            if pattern.is_empty() {
                return Err(ApiError::invalid(
                    "allowed_url_patterns[]: must not be empty",
                ));
            }
        }
        Ok(())
    }
}

impl WebhookSecurityBody {
    /// The whole configuration a PUT replaces the stored one with (omitted fields take
    /// their defaults).
    pub fn into_config(self) -> WebhookSecurity {
        let d = WebhookSecurity::default();
        WebhookSecurity {
            blocked_cidr_ranges: self.blocked_cidr_ranges.unwrap_or(d.blocked_cidr_ranges),
            allowed_url_patterns: self.allowed_url_patterns.unwrap_or(d.allowed_url_patterns),
            allow_http: self.allow_http.unwrap_or(d.allow_http),
        }
    }

    pub fn of(c: WebhookSecurity) -> Self {
        WebhookSecurityBody {
            blocked_cidr_ranges: Some(c.blocked_cidr_ranges),
            allowed_url_patterns: Some(c.allowed_url_patterns),
            allow_http: Some(c.allow_http),
        }
    }
}

/// `WebhookTestResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = WebhookTestResponse)]
pub struct WebhookTestResponse {
    pub success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_time_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
}

/// `ReplayRequest`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    pub from: Option<String>,
    pub to: Option<String>,
    pub event_types: Option<Vec<String>>,
    #[schema(minimum = 1, maximum = 1000)]
    pub max_events: Option<i64>,
}

impl Validate for ReplayRequest {
    fn validate(&self) -> Result<(), ApiError> {
        self.window()?;
        event_types(self.event_types.as_deref().unwrap_or_default())?;
        if self.max_events.is_some_and(|n| !(1..=1000).contains(&n)) {
            return Err(ApiError::invalid("max_events: must be 1 to 1000"));
        }
        Ok(())
    }
}

impl ReplayRequest {
    pub fn window(&self) -> Result<(Option<i64>, Option<i64>), ApiError> {
        window(&self.from, &self.to)
    }

    pub fn types(&self) -> Result<Vec<EventType>, ApiError> {
        event_types(self.event_types.as_deref().unwrap_or_default())
    }

    pub fn max_events(&self) -> usize {
        self.max_events.unwrap_or(100) as usize
    }
}

/// `ReplayResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ReplayResponse)]
pub struct ReplayResponse {
    pub replay_id: String,
    pub events_queued: usize,
    pub estimated_completion_seconds: usize,
}
