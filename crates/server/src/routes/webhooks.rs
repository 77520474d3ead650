//! Webhook subscriptions: the admin plane (`/v1/admin/webhooks`, any owner, and the security
//! configuration) and the tenant plane (`/v1/webhooks`, the caller's own tenant), their
//! deliveries, test probes and replays.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use ledger::{
    Actor, CreateWebhook, DeleteWebhook, EventFilter, EventQuery, EventSort, GetWebhook,
    GetWebhookSecurity, ListWebhooks, NewWebhook, Permission, QueueReplay, SetWebhookSecurity,
    UpdateWebhook, WebhookPatch, WebhookPlane, WebhookSecurity, WebhookSubscription, Window,
};
use protocol::webhook::{
    DeliveryListParams, DeliveryListResponse, EventResponse, ReplayRequest, ReplayResponse,
    TenantWebhookListParams, WebhookCreateRequest, WebhookCreateResponse, WebhookListParams,
    WebhookListResponse, WebhookOwnerParams, WebhookPath, WebhookResponse, WebhookSecurityBody,
    WebhookTestResponse, WebhookUpdateRequest,
};
use protocol::{parse_query, ApiError, ErrorCode, Plane};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::{self, Headers};
use crate::openapi::{BadRequest, Conflict, Errors, Forbidden, NotFound};
use crate::reply::{json, Answer, Failure};
use crate::routes::body::{admin_body, bulk_action, RawBody};
use crate::webhooks::{Outbound, TEST_TIMEOUT};

/// Most events a replay may select from (the reference's scan limit).
const REPLAY_SCAN_LIMIT: usize = 20_000;

pub fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_webhook, list_webhooks))
        .routes(routes!(bulk_action_webhooks))
        .routes(routes!(get_webhook, update_webhook, delete_webhook))
        .routes(routes!(test_webhook))
        .routes(routes!(list_deliveries))
        .routes(routes!(replay_events))
        .routes(routes!(get_security, put_security))
        .routes(routes!(create_tenant_webhook, list_tenant_webhooks))
        .routes(routes!(
            get_tenant_webhook,
            update_tenant_webhook,
            delete_tenant_webhook
        ))
        .routes(routes!(test_tenant_webhook))
        .routes(routes!(list_tenant_deliveries))
}

fn webhook_answer(w: &WebhookSubscription, status: StatusCode) -> Answer {
    Ok(json(status, &WebhookResponse::from(w)))
}

/// The stored security configuration (the dispatcher and resolver enforce it too).
async fn security(app: &App) -> Result<WebhookSecurity, Failure> {
    let (config, _) = app
        .run(
            GetWebhookSecurity {
                actor: Actor::Admin,
            },
            Plane::Admin,
        )
        .await?;
    app.webhooks().enforce(config.clone());
    Ok(config)
}

/// 400 `WEBHOOK_URL_INVALID` unless `url` passes the security configuration.
async fn check_url(app: &App, url: &str) -> Result<(), Failure> {
    let config = security(app).await?;
    app.webhooks()
        .check_url(url, &config)
        .await
        .map_err(|why| ApiError::new(400, ErrorCode::WebhookUrlInvalid, why).into())
}

/// A new signing secret: `whsec_` and 32 random characters.
fn new_secret() -> String {
    crate::ids::new_key_secret().replacen("cyc_live_", "whsec_", 1)
}

async fn create(
    app: &App,
    headers: &HeaderMap,
    plane: WebhookPlane,
    owner: Option<String>,
    bytes: &Bytes,
) -> Answer {
    let actor = match plane {
        WebhookPlane::Admin => auth::admin(app.admin_key(), headers)?,
        WebhookPlane::Tenant => auth::tenant(headers)?,
    };
    let request: WebhookCreateRequest = admin_body(app, &actor, bytes).await?;
    let draft = request.into_draft()?;
    authorized_to_write(app, &actor).await?;
    check_url(app, &draft.url).await?;
    let secret = draft.signing_secret.unwrap_or_else(new_secret);
    let webhooks = app.webhooks();
    let operation = CreateWebhook {
        actor,
        plane,
        owner,
        webhook: NewWebhook {
            subscription_id: crate::ids::subscription_id(),
            name: draft.name,
            description: draft.description,
            url: draft.url,
            event_types: draft.event_types,
            event_categories: draft.event_categories,
            scope_filter: draft.scope_filter,
            thresholds: draft.thresholds,
            sealed_secret: webhooks.seal(&secret),
            headers: draft
                .headers
                .into_iter()
                .map(|(k, v)| (k, webhooks.seal(&v)))
                .collect(),
            retry_policy: draft.retry_policy,
            disable_after_failures: draft.disable_after_failures,
            metadata: draft.metadata,
        },
    };
    let (w, _) = app.mutate(operation, Plane::Admin).await?;
    let response = WebhookCreateResponse {
        subscription: WebhookResponse::from(&*w),
        signing_secret: secret,
    };
    Ok(json(StatusCode::CREATED, &response))
}

/// Refuses a caller that may not write webhooks before a URL is looked up: resolving it is
/// work done for the caller, and its answer (where a name resolves, that it does not) is
/// not for a stranger or a key without `webhooks:write` to learn.
async fn authorized_to_write(app: &App, actor: &Actor) -> Result<(), Failure> {
    let operation = ledger::Authorize {
        actor: actor.clone(),
        permission: Permission::WebhooksWrite,
    };
    app.run(operation, Plane::Admin).await.map(|_| ())
}

async fn update(app: &App, actor: Actor, plane: WebhookPlane, id: String, bytes: &Bytes) -> Answer {
    let request: WebhookUpdateRequest = admin_body(app, &actor, bytes).await?;
    let mut patch: WebhookPatch = request.into_patch()?;
    authorized_to_write(app, &actor).await?;
    if let Some(url) = &patch.url {
        check_url(app, url).await?;
    }
    let webhooks = app.webhooks();
    patch.sealed_secret = patch.sealed_secret.map(|s| webhooks.seal(&s));
    patch.headers = patch
        .headers
        .map(|h| h.into_iter().map(|(k, v)| (k, webhooks.seal(&v))).collect());
    let operation = UpdateWebhook {
        actor,
        plane,
        subscription_id: id,
        patch,
    };
    let (w, _) = app.mutate(operation, Plane::Admin).await?;
    webhook_answer(&w, StatusCode::OK)
}

async fn delete(app: &App, actor: Actor, plane: WebhookPlane, id: String) -> Answer {
    let operation = DeleteWebhook {
        actor,
        plane,
        subscription_id: id,
    };
    app.mutate(operation, Plane::Admin).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn get(app: &App, actor: Actor, plane: WebhookPlane, id: String) -> Answer {
    let operation = GetWebhook {
        actor,
        plane,
        subscription_id: id,
        permission: Permission::WebhooksRead,
    };
    let (w, _) = app.run(operation, Plane::Admin).await?;
    webhook_answer(&w, StatusCode::OK)
}

async fn list(app: &App, actor: Actor, plane: WebhookPlane, params: WebhookListParams) -> Answer {
    let parsed = app
        .validated(&actor, Plane::Admin, || params.into_query())
        .await?;
    let (filter, sort_by, window, next) = parsed;
    let operation = ListWebhooks {
        actor,
        plane,
        filter,
        sort_by,
        window,
    };
    let (page, _) = app.run(operation, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &WebhookListResponse::new(&next, page)))
}

/// Sends one synthetic `system.webhook_test` event straight to the subscription's URL: no
/// queue, no effect on its failure count or status.
async fn test(app: &App, actor: Actor, plane: WebhookPlane, id: String) -> Answer {
    let operation = GetWebhook {
        actor,
        plane,
        subscription_id: id,
        permission: Permission::WebhooksWrite,
    };
    // Audited like every admin-plane POST (the entry names the subscription probed).
    let (w, _) = app.mutate(operation, Plane::Admin).await?;
    let event_id = format!("evt_test_{}", &crate::ids::event_id()[4..16]);
    // The probe carries the request's own ids, as every event of a request does.
    let origin = crate::origin::current();
    let trace_id = origin
        .trace_id
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    let event = ledger::Event {
        event_id: event_id.clone(),
        event_type: ledger::EventType::SystemWebhookTest,
        timestamp_ms: now_ms(),
        tenant_id: w.tenant_id.clone(),
        scope: None,
        actor: ledger::EventActor {
            kind: ledger::ActorKind::Admin,
            key_id: None,
            source_ip: origin.source_ip,
        },
        source: "cycles-admin".into(),
        data: serde_json::json!({ "subscription_id": w.subscription_id, "test": true }).to_string(),
        correlation_id: None,
        request_id: origin.request_id.clone(),
        trace_id: Some(trace_id.clone()),
    };
    security(app).await?;
    let attempt = match app.webhooks().credentials(&w) {
        Ok(credentials) => {
            let out = Outbound {
                url: &w.url,
                body: serde_json::to_vec(&EventResponse::from(event)).unwrap_or_default(),
                event_id: &event_id,
                event_type: ledger::EventType::SystemWebhookTest.name(),
                trace_id: &trace_id,
                request_id: origin.request_id.as_deref(),
                credentials,
            };
            app.webhooks().send(out, TEST_TIMEOUT).await
        }
        Err(why) => crate::webhooks::unsent(why),
    };
    let response = WebhookTestResponse {
        success: attempt.success,
        response_status: attempt.response_status,
        response_time_ms: Some(attempt.response_time_ms),
        error_message: attempt.error_message,
        event_id: Some(event_id),
    };
    Ok(json(StatusCode::OK, &response))
}

/// The test probe's timestamp (it is never stored).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn deliveries(
    app: &App,
    actor: Actor,
    plane: WebhookPlane,
    id: String,
    raw: Option<String>,
) -> Answer {
    let query = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<DeliveryListParams>(raw.as_deref())?.into_query(id.clone())
        })
        .await?;
    // The subscription must exist and be the caller's.
    let operation = GetWebhook {
        actor,
        plane,
        subscription_id: id,
        permission: Permission::WebhooksRead,
    };
    app.run(operation, Plane::Admin).await?;
    let page = app
        .store_history(move |history| history.delivery_page(&query))
        .await?;
    Ok(json(StatusCode::OK, &DeliveryListResponse::from(page)))
}

#[utoipa::path(
    post, path = "/v1/admin/webhooks", tag = "Webhooks", operation_id = "createWebhookSubscription",
    summary = "Create a webhook subscription (system-wide, or for the tenant given)",
    params(WebhookOwnerParams),
    request_body = WebhookCreateRequest,
    responses(
        (status = 201, description = "Created; the signing secret is shown only here",
            body = WebhookCreateResponse),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn create_webhook(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let owner = parse_query::<WebhookOwnerParams>(raw.as_deref())?.tenant_id;
    create(&app, &headers, WebhookPlane::Admin, owner, &bytes).await
}

#[utoipa::path(
    post, path = "/v1/admin/webhooks/bulk-action", tag = "Webhooks",
    operation_id = "bulkActionWebhooks",
    summary = "Pause, resume or delete every subscription a filter matches",
    description = "At most 500 rows; refused before any change when the filter matches more, \
        or not `expected_count`. Each row is all or nothing. RESUME never re-enables a \
        DISABLED subscription (failed INVALID_TRANSITION: a PATCH can). Idempotent by key \
        for 15 minutes.",
    request_body = protocol::bulk::WebhookBulkActionRequest,
    responses(
        (status = 200, description = "What was done, row by row",
            body = protocol::bulk::BulkActionResponse),
        Errors<(BadRequest, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn bulk_action_webhooks(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    bulk_action::<protocol::bulk::WebhookBulkActionRequest>(&app, actor, &bytes).await
}

#[utoipa::path(
    get, path = "/v1/admin/webhooks", tag = "Webhooks", operation_id = "listWebhookSubscriptions",
    summary = "List webhook subscriptions",
    params(WebhookListParams),
    responses(
        (status = 200, description = "A page of subscriptions", body = WebhookListResponse),
        Errors<(BadRequest,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn list_webhooks(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let params = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<WebhookListParams>(raw.as_deref())
        })
        .await?;
    list(&app, actor, WebhookPlane::Admin, params).await
}

#[utoipa::path(
    get, path = "/v1/admin/webhooks/{subscription_id}", tag = "Webhooks",
    operation_id = "getWebhookSubscription",
    summary = "Get a webhook subscription (no secret; custom header values masked)",
    params(WebhookPath),
    responses(
        (status = 200, description = "The subscription", body = WebhookResponse),
        Errors<(NotFound,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn get_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    get(&app, actor, WebhookPlane::Admin, subscription_id).await
}

#[utoipa::path(
    patch, path = "/v1/admin/webhooks/{subscription_id}", tag = "Webhooks",
    operation_id = "updateWebhookSubscription",
    summary = "Update a webhook subscription (pause, resume, re-enable, rotate its secret)",
    params(WebhookPath),
    request_body = WebhookUpdateRequest,
    responses(
        (status = 200, description = "The updated subscription", body = WebhookResponse),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn update_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    update(&app, actor, WebhookPlane::Admin, subscription_id, &bytes).await
}

#[utoipa::path(
    delete, path = "/v1/admin/webhooks/{subscription_id}", tag = "Webhooks",
    operation_id = "deleteWebhookSubscription",
    summary = "Delete a webhook subscription; its pending deliveries are cancelled",
    params(WebhookPath),
    responses(
        (status = 204, description = "Deleted"),
        Errors<(NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn delete_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    delete(&app, actor, WebhookPlane::Admin, subscription_id).await
}

#[utoipa::path(
    post, path = "/v1/admin/webhooks/{subscription_id}/test", tag = "Webhooks",
    operation_id = "testWebhookSubscription",
    summary = "Send a signed system.webhook_test event to the subscription's URL",
    params(WebhookPath),
    responses(
        (status = 200, description = "What the receiver answered", body = WebhookTestResponse),
        Errors<(NotFound,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn test_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    test(&app, actor, WebhookPlane::Admin, subscription_id).await
}

#[utoipa::path(
    get, path = "/v1/admin/webhooks/{subscription_id}/deliveries", tag = "Webhooks",
    operation_id = "listWebhookDeliveries",
    summary = "A subscription's deliveries, newest first",
    params(WebhookPath, DeliveryListParams),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveryListResponse),
        Errors<(BadRequest, NotFound)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn list_deliveries(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    deliveries(&app, actor, WebhookPlane::Admin, subscription_id, raw).await
}

#[utoipa::path(
    post, path = "/v1/admin/webhooks/{subscription_id}/replay", tag = "Webhooks",
    operation_id = "replayEvents",
    summary = "Queue past events again for a subscription",
    description = "Selects every deliverable event in the window (all or nothing: a window \
        holding more than max_events deliverable events, or more than 20 000 candidates, is \
        refused with 400) and queues a new delivery of each, oldest first. A subscription \
        that is not ACTIVE queues none. One replay per subscription at a time (409).",
    params(WebhookPath),
    request_body = ReplayRequest,
    responses(
        (status = 202, description = "Queued", body = ReplayResponse),
        Errors<(BadRequest, NotFound, Conflict)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn replay_events(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let request: ReplayRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        ReplayRequest {
            from: None,
            to: None,
            event_types: None,
            max_events: None,
        }
    } else {
        admin_body(&app, &actor, &bytes).await?
    };
    let get = GetWebhook {
        actor: actor.clone(),
        plane: WebhookPlane::Admin,
        subscription_id: subscription_id.clone(),
        permission: Permission::WebhooksWrite,
    };
    let (w, _) = app.run(get, Plane::Admin).await?;
    // Filed under the subscription's tenant, as its other writes are.
    let tenant = (!w.is_system()).then(|| w.tenant_id.clone());
    crate::audit::annotate(serde_json::Map::new(), tenant);
    if !app.webhooks().start_replay(&subscription_id) {
        return Err(ApiError::new(
            409,
            ErrorCode::ReplayInProgress,
            format!("A replay of {subscription_id} is already running"),
        )
        .into());
    }
    let replayed = replay(&app, actor, &w, &request).await;
    app.webhooks().end_replay(&subscription_id);
    let queued = replayed?;
    let response = ReplayResponse {
        replay_id: format!("rpl_{}", &crate::ids::event_id()[4..20]),
        events_queued: queued,
        estimated_completion_seconds: if queued == 0 { 0 } else { (queued / 10).max(1) },
    };
    Ok(json(StatusCode::ACCEPTED, &response))
}

/// Selects the replay's events, oldest first, and queues them.
async fn replay(
    app: &App,
    actor: Actor,
    w: &WebhookSubscription,
    request: &ReplayRequest,
) -> Result<usize, Failure> {
    let (from_ms, to_ms) = request.window()?;
    let requested = request.types()?;
    let max = request.max_events();
    let filter = EventFilter {
        tenant_id: (!w.is_system()).then(|| w.tenant_id.clone()),
        tenant_accessible_only: !w.is_system(),
        from_ms,
        to_ms,
        ..EventFilter::default()
    };
    let query = EventQuery {
        filter,
        sort: EventSort::Timestamp,
        window: Window {
            descending: false,
            after: None,
            limit: REPLAY_SCAN_LIMIT,
        },
    };
    let page = app
        .store_history(move |history| history.event_page(&query))
        .await?;
    if page.next.is_some() {
        return Err(ApiError::invalid(format!(
            "The window holds more than {REPLAY_SCAN_LIMIT} events: narrow from/to"
        ))
        .into());
    }
    let selected: Vec<ledger::Event> = page
        .events
        .into_iter()
        .filter(|e| requested.is_empty() || requested.contains(&e.event_type))
        .filter(|e| w.wants_event(e))
        .collect();
    if selected.len() > max {
        return Err(ApiError::invalid(format!(
            "The window holds {} deliverable events, more than max_events ({max}): narrow \
             from/to or raise max_events",
            selected.len()
        ))
        .into());
    }
    let operation = QueueReplay {
        actor,
        subscription_id: w.subscription_id.clone(),
        events: selected,
    };
    let (queued, _) = app.mutate(operation, Plane::Admin).await?;
    Ok(queued)
}

#[utoipa::path(
    get, path = "/v1/admin/config/webhook-security", tag = "Webhooks",
    operation_id = "getWebhookSecurityConfig",
    summary = "The webhook URL security configuration (SSRF guard)",
    responses(
        (status = 200, description = "The configuration", body = WebhookSecurityBody),
        Errors<()>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn get_security(State(app): State<Arc<App>>, Headers(headers): Headers) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let (config, _) = app.run(GetWebhookSecurity { actor }, Plane::Admin).await?;
    Ok(json(StatusCode::OK, &WebhookSecurityBody::of(config)))
}

#[utoipa::path(
    put, path = "/v1/admin/config/webhook-security", tag = "Webhooks",
    operation_id = "updateWebhookSecurityConfig",
    summary = "Replace the webhook URL security configuration",
    description = "Applies to subscriptions created or updated after it, and to every \
        delivery from now on (existing subscriptions are not re-validated).",
    request_body = WebhookSecurityBody,
    responses(
        (status = 200, description = "The configuration now in force", body = WebhookSecurityBody),
        Errors<(BadRequest,)>,
    ),
    security(("AdminKeyAuth" = [])),
)]
pub async fn put_security(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = auth::admin(app.admin_key(), &headers)?;
    let body: WebhookSecurityBody = admin_body(&app, &actor, &bytes).await?;
    let operation = SetWebhookSecurity {
        actor,
        config: body.into_config(),
    };
    let (config, _) = app.mutate(operation, Plane::Admin).await?;
    app.webhooks().enforce(config.clone());
    Ok(json(StatusCode::OK, &WebhookSecurityBody::of(config)))
}

/// A tenant-plane caller: a tenant key (its permissions are checked with the operation) or
/// the admin key.
fn tenant_plane_actor(app: &App, headers: &HeaderMap) -> Result<Actor, Failure> {
    Ok(auth::admin_or_tenant(app.admin_key(), headers)?)
}

#[utoipa::path(
    post, path = "/v1/webhooks", tag = "Tenant webhooks", operation_id = "createTenantWebhook",
    summary = "Create a webhook subscription for the caller's tenant",
    description = "Only tenant-accessible selectors (budget, reservation, tenant).",
    request_body = WebhookCreateRequest,
    responses(
        (status = 201, description = "Created; the signing secret is shown only here",
            body = WebhookCreateResponse),
        Errors<(BadRequest, Forbidden, Conflict)>,
    ),
    security(("ApiKeyAuth" = [])),
)]
pub async fn create_tenant_webhook(
    State(app): State<Arc<App>>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    create(&app, &headers, WebhookPlane::Tenant, None, &bytes).await
}

#[utoipa::path(
    get, path = "/v1/webhooks", tag = "Tenant webhooks", operation_id = "listTenantWebhooks",
    summary = "List a tenant's webhook subscriptions",
    params(TenantWebhookListParams),
    responses(
        (status = 200, description = "A page of subscriptions", body = WebhookListResponse),
        Errors<(BadRequest, Forbidden)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn list_tenant_webhooks(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = tenant_plane_actor(&app, &headers)?;
    let params = app
        .validated(&actor, Plane::Admin, || {
            parse_query::<TenantWebhookListParams>(raw.as_deref())
        })
        .await?;
    list(&app, actor, WebhookPlane::Tenant, params.into()).await
}

#[utoipa::path(
    get, path = "/v1/webhooks/{subscription_id}", tag = "Tenant webhooks",
    operation_id = "getTenantWebhook",
    summary = "Get one of the tenant's webhook subscriptions",
    params(WebhookPath),
    responses(
        (status = 200, description = "The subscription", body = WebhookResponse),
        Errors<(Forbidden, NotFound)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn get_tenant_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = tenant_plane_actor(&app, &headers)?;
    get(&app, actor, WebhookPlane::Tenant, subscription_id).await
}

#[utoipa::path(
    patch, path = "/v1/webhooks/{subscription_id}", tag = "Tenant webhooks",
    operation_id = "updateTenantWebhook",
    summary = "Update one of the tenant's webhook subscriptions",
    params(WebhookPath),
    request_body = WebhookUpdateRequest,
    responses(
        (status = 200, description = "The updated subscription", body = WebhookResponse),
        Errors<(Forbidden, BadRequest, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn update_tenant_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
    RawBody(bytes): RawBody,
) -> Answer {
    let actor = tenant_plane_actor(&app, &headers)?;
    update(&app, actor, WebhookPlane::Tenant, subscription_id, &bytes).await
}

#[utoipa::path(
    delete, path = "/v1/webhooks/{subscription_id}", tag = "Tenant webhooks",
    operation_id = "deleteTenantWebhook",
    summary = "Delete one of the tenant's webhook subscriptions",
    params(WebhookPath),
    responses(
        (status = 204, description = "Deleted"),
        Errors<(Forbidden, NotFound, Conflict)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn delete_tenant_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = tenant_plane_actor(&app, &headers)?;
    delete(&app, actor, WebhookPlane::Tenant, subscription_id).await
}

#[utoipa::path(
    post, path = "/v1/webhooks/{subscription_id}/test", tag = "Tenant webhooks",
    operation_id = "testTenantWebhook",
    summary = "Send a signed system.webhook_test event to the subscription's URL",
    params(WebhookPath),
    responses(
        (status = 200, description = "What the receiver answered", body = WebhookTestResponse),
        Errors<(Forbidden, NotFound)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn test_tenant_webhook(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    Headers(headers): Headers,
) -> Answer {
    let actor = tenant_plane_actor(&app, &headers)?;
    test(&app, actor, WebhookPlane::Tenant, subscription_id).await
}

#[utoipa::path(
    get, path = "/v1/webhooks/{subscription_id}/deliveries", tag = "Tenant webhooks",
    operation_id = "listTenantWebhookDeliveries",
    summary = "One of the tenant's subscriptions' deliveries, newest first",
    params(WebhookPath, DeliveryListParams),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveryListResponse),
        Errors<(Forbidden, BadRequest, NotFound)>,
    ),
    security(("ApiKeyAuth" = []), ("AdminKeyAuth" = [])),
)]
pub async fn list_tenant_deliveries(
    State(app): State<Arc<App>>,
    Path(WebhookPath { subscription_id }): Path<WebhookPath>,
    RawQuery(raw): RawQuery,
    Headers(headers): Headers,
) -> Answer {
    let actor = tenant_plane_actor(&app, &headers)?;
    deliveries(&app, actor, WebhookPlane::Tenant, subscription_id, raw).await
}
