//! The audit log's entries: one per audited request, written in the same durable step as the
//! change it made.
//!
//! Audited are the admin plane's writes (every non-GET under `/v1/admin`, and
//! `/v1/auth/validate`), a tenant's own webhook writes (`/v1/webhooks`: governance, not
//! spend) and the runtime writes made with the admin key (an operator's release on a
//! tenant's behalf), whether they succeed or not. Reads are not audited: the dashboard
//! polls, and an audit log full of page views hides the changes.
//!
//! The route layer opens an [`AuditScope`] for such a request (the request's facts: its
//! operation, ids, caller, addresses). A handler that changes something runs its operation
//! with `App::mutate`, which hands the store a closure made from the scope
//! ([`AuditScope::entry`]); the store calls it with the operation's result under the ledger
//! lock and journals the entry with the operation's effects. A request that ends without
//! that (refused before it reached the store: bad body, wrong key) gets its entry from the
//! layer afterwards, made the same way from the answer it got.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, HeaderValue, Method};
use ledger::{
    Actor, ApiKey, AuditEntry, Budget, BulkResult, FundResult, Idempotent, KeyValidation, Policy,
    Rejection, ReleaseResult, Tenant, TenantWritten, ADMIN_TENANT, UNAUTH_TENANT,
};
use protocol::bulk::{row_code, SKIPPED_REASON};
use protocol::{ApiError, Plane, WireName};
use serde_json::{json, Map, Value};
use sha2::Digest;
use store::AuditFacts;
use utoipa::openapi::path::Operation;
use utoipa::openapi::OpenApi;

use crate::auth::{self, AdminKey};
use crate::ids;
use crate::ratelimit::{Limiter, RateLimit};

/// How many entries of unauthenticated refusals one client address may leave: a flood of
/// requests with no key or a wrong one must not become a flood of disk writes. Past its
/// budget such a request is still refused, and counted instead of audited.
pub struct UnauthenticatedBudget {
    /// `None`: no limit.
    limiter: Option<Limiter>,
    skipped: AtomicU64,
}

impl UnauthenticatedBudget {
    /// `per_minute` entries per address, in bursts of as many (0: no limit).
    pub fn new(per_minute: u32) -> Self {
        let limiter = (per_minute > 0).then(|| {
            Limiter::new(RateLimit {
                per_second: f64::from(per_minute) / 60.0,
                burst: f64::from(per_minute),
            })
        });
        UnauthenticatedBudget {
            limiter,
            skipped: AtomicU64::new(0),
        }
    }

    fn admit(&self, source_ip: Option<&str>) -> bool {
        let Some(limiter) = &self.limiter else {
            return true;
        };
        let who: [u8; 32] = sha2::Sha256::digest(source_ip.unwrap_or_default().as_bytes()).into();
        let admitted = limiter.allow(who);
        if !admitted {
            self.skipped.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Unauthenticated refusals not audited for being over their address's budget.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

/// An operation of the route table, as the audit log names it.
#[derive(Debug, Clone)]
pub struct Audited {
    /// The operation's id (`createBudget`).
    pub operation: String,
    /// The status it answers on success, when its result does not say otherwise.
    pub success: u16,
    /// What it acts on (`budget`, `api_key`, …).
    pub resource_type: &'static str,
}

/// The route table's operations by method and path template, from the OpenAPI document the
/// routes declare (so the names are the document's `operationId`s, declared once).
#[derive(Debug, Default)]
pub struct OperationIndex(HashMap<(Method, String), Audited>);

impl OperationIndex {
    pub fn new(document: &OpenApi) -> Self {
        let mut index = HashMap::new();
        for (path, item) in &document.paths.paths {
            let methods = [
                (Method::POST, &item.post),
                (Method::PUT, &item.put),
                (Method::PATCH, &item.patch),
                (Method::DELETE, &item.delete),
            ];
            for (method, operation) in methods {
                if let Some(op) = operation {
                    index.insert((method, path.clone()), audited(path, op));
                }
            }
        }
        OperationIndex(index)
    }

    pub fn get(&self, method: &Method, path: &str) -> Option<&Audited> {
        self.0.get(&(method.clone(), path.to_string()))
    }
}

fn audited(path: &str, op: &Operation) -> Audited {
    let success = op
        .responses
        .responses
        .keys()
        .filter_map(|s| s.parse::<u16>().ok())
        .find(|s| (200..300).contains(s))
        .unwrap_or(200);
    Audited {
        operation: op.operation_id.clone().unwrap_or_else(|| path.to_string()),
        success,
        resource_type: resource_type(path),
    }
}

/// The resource a path acts on: its first segment after the plane's prefix.
fn resource_type(path: &str) -> &'static str {
    let rest = path
        .strip_prefix("/v1/admin/")
        .or_else(|| path.strip_prefix("/v1/"))
        .unwrap_or(path);
    match rest.split('/').next().unwrap_or_default() {
        "tenants" => "tenant",
        "budgets" => "budget",
        "api-keys" | "auth" => "api_key",
        "policies" => "policy",
        "reservations" => "reservation",
        "webhooks" => "webhook",
        "config" => "config",
        _ => "other",
    }
}

/// Whether a request is audited (see the module's documentation); decided before routing,
/// from the method, the path and whether the admin key is presented.
pub fn applies(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return false;
    }
    path.starts_with("/v1/admin/")
        || path == "/v1/auth/validate"
        || path.starts_with("/v1/webhooks")
        || (path.starts_with("/v1/") && headers.contains_key(auth::ADMIN_KEY_HEADER))
}

/// The correlation ids of an audited request, handed from the outer middleware (which makes
/// them) to the route layer (which knows the operation).
#[derive(Debug, Clone)]
pub struct AuditIds {
    pub request_id: HeaderValue,
    pub trace_id: HeaderValue,
}

/// Who presented which credential, as far as the headers tell before the ledger is asked.
#[derive(Debug, Clone)]
pub enum Presented {
    Admin,
    TenantKey([u8; 32]),
    /// No credential, or a wrong admin key.
    Nothing,
}

impl Presented {
    pub fn of(admin_key: &AdminKey, headers: &HeaderMap) -> Self {
        if auth::admin(admin_key, headers).is_ok() {
            Presented::Admin
        } else if headers.contains_key(auth::ADMIN_KEY_HEADER) {
            Presented::Nothing
        } else {
            match auth::tenant(headers) {
                Ok(Actor::ApiKey(digest)) => Presented::TenantKey(digest),
                _ => Presented::Nothing,
            }
        }
    }

    /// The actor to resolve the caller with, if there is one.
    pub fn actor(&self) -> Option<Actor> {
        match self {
            Presented::Admin => Some(Actor::Admin),
            Presented::TenantKey(digest) => Some(Actor::ApiKey(*digest)),
            Presented::Nothing => None,
        }
    }
}

/// One audited request in progress.
pub struct AuditScope {
    audited: Audited,
    ids: AuditIds,
    presented: Presented,
    user_agent: Option<String>,
    source_ip: Option<String>,
    /// The path's last parameter (`{tenant_id}`, `{key_id}`, …), the resource when the
    /// result names none.
    path_resource: Option<String>,
    method: Method,
    path: String,
    unauthenticated: Arc<UnauthenticatedBudget>,
    /// Set once the entry is made: one entry per request.
    written: AtomicBool,
    /// What the handler added that neither the path nor the result says.
    notes: Mutex<Notes>,
}

/// A handler's additions to its request's entry (see [`annotate`]).
#[derive(Default)]
struct Notes {
    metadata: Map<String, Value>,
    /// The tenant the request acts for, when the request names it.
    tenant: Option<String>,
    /// The resource a create names in its body, so that its refusal names it too.
    resource: Option<String>,
}

/// Names the resource the current audited request acts on, when only its body says (a
/// create): its entry names it even when the create is refused.
pub fn about(resource_id: &str) {
    if let Some(scope) = current() {
        let mut notes = scope.notes.lock().unwrap_or_else(|e| e.into_inner());
        notes.resource = Some(resource_id.to_string());
    }
}

/// Adds `metadata` to the current audited request's entry, and the tenant it acts for when
/// the request names one (a bulk action's filter); nothing outside an audited request.
pub fn annotate(metadata: Map<String, Value>, tenant: Option<String>) {
    if let Some(scope) = current() {
        let mut notes = scope.notes.lock().unwrap_or_else(|e| e.into_inner());
        notes.metadata.extend(metadata);
        notes.tenant = tenant.or(notes.tenant.take());
    }
}

tokio::task_local! {
    static SCOPE: Arc<AuditScope>;
}

/// The audited request the current task serves, if any.
pub fn current() -> Option<Arc<AuditScope>> {
    SCOPE.try_with(Arc::clone).ok()
}

/// Runs `future` (the rest of the request) inside `scope`.
pub async fn within<F: std::future::Future>(scope: Arc<AuditScope>, future: F) -> F::Output {
    SCOPE.scope(scope, future).await
}

/// The request facts a scope is opened with.
pub struct RequestFacts {
    pub ids: AuditIds,
    pub presented: Presented,
    pub user_agent: Option<String>,
    pub source_ip: Option<String>,
    pub path_resource: Option<String>,
    pub method: Method,
    pub path: String,
    pub unauthenticated: Arc<UnauthenticatedBudget>,
}

impl AuditScope {
    pub fn new(audited: Audited, facts: RequestFacts) -> Self {
        AuditScope {
            audited,
            ids: facts.ids,
            presented: facts.presented,
            user_agent: facts.user_agent,
            source_ip: facts.source_ip,
            path_resource: facts.path_resource,
            method: facts.method,
            path: facts.path,
            unauthenticated: facts.unauthenticated,
            written: AtomicBool::new(false),
            notes: Mutex::default(),
        }
    }

    pub fn presented(&self) -> &Presented {
        &self.presented
    }

    /// Whether the request's entry is made (by the store, with the change).
    pub fn written(&self) -> bool {
        self.written.load(Ordering::Acquire)
    }

    /// The entry of an operation that reached the store, from its result (`None`: an
    /// unauthenticated refusal over its address's budget).
    pub fn entry<T: AuditDetail>(
        &self,
        facts: AuditFacts<'_, T>,
        plane: Plane,
    ) -> Option<AuditEntry> {
        let (status, error_code, detail) = match facts.result {
            Ok(output) => {
                let resource_id = output.resource_id();
                let tenant_id = output.tenant_id().or_else(|| {
                    let id = resource_id.as_ref().or(self.path_resource.as_ref())?;
                    self.resource_tenant(facts.state, id)
                });
                let detail = Detail {
                    resource_id,
                    tenant_id,
                    metadata: output.metadata(),
                };
                (
                    output.status().unwrap_or(self.audited.success),
                    None,
                    detail,
                )
            }
            Err(rejection) => {
                let error = ApiError::from_rejection(rejection.clone(), plane);
                let detail = Detail::refused(&error);
                (error.status, Some(code_name(&error)), detail)
            }
        };
        let authenticated = match facts.result {
            Err(Rejection::Unauthorized(_)) => false,
            _ => !matches!(self.presented, Presented::Nothing),
        };
        self.make(Made {
            status,
            error_code,
            detail,
            tenant: facts.tenant.map(|t| t.to_string()),
            key_id: self.key_id(facts.state),
            authenticated,
            now: facts.now,
        })
    }

    /// The entry of a request answered without its operation reaching the store (a bad
    /// body, a wrong key): `error` is its answer, `caller` who the ledger found the caller to
    /// be (`None`: nobody).
    pub fn refusal_entry(
        &self,
        error: &ApiError,
        caller: Option<&Arc<str>>,
        state: &ledger::State,
        now: ledger::Millis,
    ) -> Option<AuditEntry> {
        let authenticated = match self.presented {
            Presented::Admin => true,
            Presented::TenantKey(_) => caller.is_some(),
            Presented::Nothing => false,
        };
        self.make(Made {
            status: error.status,
            error_code: Some(code_name(error)),
            detail: Detail::refused(error),
            tenant: caller.map(|t| t.to_string()),
            key_id: self.key_id(state),
            authenticated,
            now,
        })
    }

    /// Whether the admin key acts here on a tenant's behalf: on what a tenant's own key may
    /// also change (budgets, policies, its reservations), and in bulk actions, which act on
    /// many tenants' resources at once. Tenants and keys are the operator's own.
    fn on_behalf_of(&self, resource_id: Option<&str>) -> bool {
        matches!(
            self.audited.resource_type,
            "budget" | "policy" | "reservation"
        ) || resource_id == Some(BULK_RESOURCE)
            // The tenant plane's webhooks, changed with the admin key (admin spec §2.6).
            || self.path.starts_with("/v1/webhooks")
    }

    /// The tenant a resource belongs to, when its operation's result does not say: a
    /// budget's scope names it, a reservation records it.
    fn resource_tenant(&self, state: &ledger::State, id: &str) -> Option<String> {
        match self.audited.resource_type {
            "budget" => ledger::scope_tenant(id).map(str::to_string),
            "reservation" => state.reservation(id).map(|r| r.tenant_id.to_string()),
            _ => None,
        }
    }

    fn key_id(&self, state: &ledger::State) -> Option<String> {
        match &self.presented {
            Presented::TenantKey(digest) => state.key_id_by_digest(digest).map(str::to_string),
            _ => None,
        }
    }

    fn make(&self, mut made: Made) -> Option<AuditEntry> {
        self.written.store(true, Ordering::Release);
        if !made.authenticated && !self.unauthenticated.admit(self.source_ip.as_deref()) {
            return None;
        }
        let notes = std::mem::take(&mut *self.notes.lock().unwrap_or_else(|e| e.into_inner()));
        if made.error_code.is_none() {
            made.detail.tenant_id = made.detail.tenant_id.or(notes.tenant);
        }
        let admin = matches!(self.presented, Presented::Admin);
        let tenant_id = match (made.authenticated, admin) {
            (false, _) => UNAUTH_TENANT.to_string(),
            // The admin acting on one tenant's resource: filed under that tenant.
            (true, true) => made
                .detail
                .tenant_id
                .clone()
                .unwrap_or_else(|| ADMIN_TENANT.to_string()),
            (true, false) => made
                .tenant
                .or(made.detail.tenant_id.clone())
                .unwrap_or_else(|| UNAUTH_TENANT.to_string()),
        };
        let mut metadata = notes.metadata;
        metadata.extend(made.detail.metadata.unwrap_or_default());
        let resource_id = made
            .detail
            .resource_id
            .or(notes.resource)
            .or_else(|| self.path_resource.clone());
        let actor = match (made.authenticated, admin) {
            (true, true) if self.on_behalf_of(resource_id.as_deref()) => "admin_on_behalf_of",
            (true, true) => "admin",
            (true, false) => "api_key",
            (false, _) => "unauthenticated",
        };
        metadata.insert("actor_type".into(), actor.into());
        if made.error_code.is_some() {
            metadata.insert("method".into(), self.method.as_str().into());
            metadata.insert("path".into(), self.path.clone().into());
        }
        let text = |v: &HeaderValue| v.to_str().ok().map(str::to_string);
        Some(AuditEntry {
            log_id: ids::log_id(),
            timestamp_ms: made.now,
            tenant_id,
            key_id: made.key_id,
            user_agent: self.user_agent.clone(),
            source_ip: self.source_ip.clone(),
            operation: self.audited.operation.clone(),
            resource_type: Some(self.audited.resource_type.to_string()),
            resource_id,
            request_id: text(&self.ids.request_id),
            trace_id: text(&self.ids.trace_id),
            status: made.status,
            error_code: made.error_code,
            metadata: Some(Value::Object(metadata).to_string()),
        })
    }
}

/// What one entry is made of.
struct Made {
    status: u16,
    error_code: Option<String>,
    detail: Detail,
    /// The caller's tenant, when a tenant key was resolved.
    tenant: Option<String>,
    key_id: Option<String>,
    authenticated: bool,
    now: ledger::Millis,
}

/// What an operation's result says of itself.
struct Detail {
    resource_id: Option<String>,
    tenant_id: Option<String>,
    metadata: Option<Map<String, Value>>,
}

impl Detail {
    fn refused(error: &ApiError) -> Self {
        let mut metadata = Map::new();
        // As the reference does: one line, bounded.
        let message: String = error
            .message
            .replace(['\r', '\n'], " ")
            .chars()
            .take(1024)
            .collect();
        metadata.insert("error_message".into(), message.into());
        Detail {
            resource_id: None,
            tenant_id: None,
            metadata: Some(metadata),
        }
    }
}

fn code_name(error: &ApiError) -> String {
    match serde_json::to_value(error.code) {
        Ok(Value::String(name)) => name,
        _ => "INTERNAL_ERROR".into(),
    }
}

/// What an operation's output tells its audit entry beyond what the request does.
pub trait AuditDetail {
    /// The status answered, when it depends on the result.
    fn status(&self) -> Option<u16> {
        None
    }
    fn resource_id(&self) -> Option<String> {
        None
    }
    /// The tenant the resource belongs to.
    fn tenant_id(&self) -> Option<String> {
        None
    }
    fn metadata(&self) -> Option<Map<String, Value>> {
        None
    }
}

impl AuditDetail for Tenant {
    fn resource_id(&self) -> Option<String> {
        Some(self.tenant_id.to_string())
    }
    fn tenant_id(&self) -> Option<String> {
        Some(self.tenant_id.to_string())
    }
}

impl AuditDetail for TenantWritten {
    fn status(&self) -> Option<u16> {
        Some(if self.created { 201 } else { 200 })
    }
    fn resource_id(&self) -> Option<String> {
        self.tenant.resource_id()
    }
    fn tenant_id(&self) -> Option<String> {
        self.tenant.tenant_id()
    }
}

impl AuditDetail for ApiKey {
    fn resource_id(&self) -> Option<String> {
        Some(self.key_id.clone())
    }
    fn tenant_id(&self) -> Option<String> {
        Some(self.tenant_id.to_string())
    }
}

impl AuditDetail for KeyValidation {
    fn metadata(&self) -> Option<Map<String, Value>> {
        let valid = matches!(self, KeyValidation::Valid(_));
        Some(Map::from_iter([("valid".to_string(), valid.into())]))
    }
}

/// A budget is named by its scope, as the dashboard's drill-down asks for it (its ledger id
/// and unit go in the metadata).
impl AuditDetail for Budget {
    fn resource_id(&self) -> Option<String> {
        Some(self.scope.to_string())
    }
    fn metadata(&self) -> Option<Map<String, Value>> {
        Some(Map::from_iter([
            ("ledger_id".to_string(), self.ledger_id.to_string().into()),
            ("unit".to_string(), self.unit.as_str().into()),
        ]))
    }
    fn tenant_id(&self) -> Option<String> {
        Some(self.tenant_id.to_string())
    }
}

impl AuditDetail for Policy {
    fn resource_id(&self) -> Option<String> {
        Some(self.policy_id.clone())
    }
    fn tenant_id(&self) -> Option<String> {
        Some(self.tenant_id.to_string())
    }
}

impl<R: AuditDetail> AuditDetail for Idempotent<R> {
    fn status(&self) -> Option<u16> {
        self.result.status()
    }
    fn resource_id(&self) -> Option<String> {
        self.result.resource_id()
    }
    fn tenant_id(&self) -> Option<String> {
        self.result.tenant_id()
    }
    fn metadata(&self) -> Option<Map<String, Value>> {
        let mut metadata = self.result.metadata().unwrap_or_default();
        if self.replayed {
            metadata.insert("replayed".into(), true.into());
        }
        Some(metadata)
    }
}

impl AuditDetail for FundResult {
    fn metadata(&self) -> Option<Map<String, Value>> {
        Some(Map::from_iter([(
            "operation".to_string(),
            self.operation.wire_name().into(),
        )]))
    }
}

impl AuditDetail for ReleaseResult {
    /// The reservation's tenant, which its budgets' scopes name: so an admin's release, and
    /// its replay once the reservation is archived (no longer in the state), are filed
    /// under it.
    fn tenant_id(&self) -> Option<String> {
        let scope = &self.balances.first()?.scope;
        ledger::scope_tenant(scope).map(str::to_string)
    }
    fn metadata(&self) -> Option<Map<String, Value>> {
        Some(Map::from_iter([(
            "released".to_string(),
            self.released.into(),
        )]))
    }
}

/// The resource id of a bulk action's entry (as the reference names it).
const BULK_RESOURCE: &str = "bulk-action";

impl AuditDetail for BulkResult {
    fn resource_id(&self) -> Option<String> {
        Some(BULK_RESOURCE.into())
    }
    fn metadata(&self) -> Option<Map<String, Value>> {
        let failed: Vec<Value> = self
            .failed
            .iter()
            .map(|f| json!({"id": f.id, "error_code": row_code(f.error), "message": f.message}))
            .collect();
        let skipped: Vec<Value> = self
            .skipped
            .iter()
            .map(|id| json!({"id": id, "reason": SKIPPED_REASON}))
            .collect();
        Some(Map::from_iter([
            ("total_matched".to_string(), self.total_matched.into()),
            ("succeeded".to_string(), self.succeeded.len().into()),
            ("failed".to_string(), self.failed.len().into()),
            ("skipped".to_string(), self.skipped.len().into()),
            ("succeeded_ids".to_string(), self.succeeded.clone().into()),
            ("failed_rows".to_string(), failed.into()),
            ("skipped_rows".to_string(), skipped.into()),
        ]))
    }
}

/// Runtime writes other than the release carry nothing more (and are audited only when the
/// admin key is presented, which they refuse).
impl AuditDetail for std::sync::Arc<ledger::WebhookSubscription> {
    fn resource_id(&self) -> Option<String> {
        Some(self.subscription_id.clone())
    }
    fn tenant_id(&self) -> Option<String> {
        (!self.is_system()).then(|| self.tenant_id.clone())
    }
}

impl AuditDetail for ledger::WebhookSecurity {}

/// A replay: the deliveries it queued.
impl AuditDetail for usize {
    fn status(&self) -> Option<u16> {
        Some(202)
    }
    fn metadata(&self) -> Option<Map<String, Value>> {
        Some(Map::from_iter([(
            "events_queued".to_string(),
            (*self).into(),
        )]))
    }
}

impl AuditDetail for ledger::CommitResult {}
impl AuditDetail for ledger::Extended {}
