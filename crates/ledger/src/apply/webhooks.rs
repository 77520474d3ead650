//! Webhook subscriptions (admin and tenant planes), the security configuration, and the
//! deliveries the dispatcher works through.
//!
//! The two WEBHOOK SUBSCRIPTION INVARIANTS (admin spec §4.1) are checked here, on the state
//! a create or update would persist, so no path can store a subscription that breaks them:
//! at least one selector, and no admin-only selector on a tenant-owned subscription.

use std::collections::HashSet;
use std::sync::Arc;

use crate::{
    Delivery, DeliveryStatus, Effect, Event, EventCategory, EventType, Millis, Permission,
    Position, Rejection, RetryPolicy, SortValue, WebhookSecurity, WebhookStatus,
    WebhookSubscription, MAX_DELIVERY_AGE_MS, SYSTEM_TENANT,
};

use super::emit::{changed, upper, NewEvent, ADMIN_SOURCE, DISPATCH_SOURCE};
use super::sorted::{matches_search, sorted_page, text, SortedPage, Window};
use super::{operation, Actor, Tx};

/// Which surface a webhook request came through: the tenant plane's writes emit no
/// lifecycle events (as the reference), and hide other tenants' subscriptions as 404.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookPlane {
    Admin,
    Tenant,
}

/// `POST /v1/admin/webhooks` and `POST /v1/webhooks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateWebhook {
    pub actor: Actor,
    pub plane: WebhookPlane,
    /// The owner the admin asked for (`None`: a system-wide subscription); ignored for a
    /// tenant key, whose own tenant owns it.
    pub owner: Option<String>,
    pub webhook: NewWebhook,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWebhook {
    pub subscription_id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub url: String,
    pub event_types: Vec<EventType>,
    pub event_categories: Vec<EventCategory>,
    pub scope_filter: Option<String>,
    pub thresholds: Option<String>,
    pub sealed_secret: String,
    pub headers: Vec<(String, String)>,
    pub retry_policy: RetryPolicy,
    pub disable_after_failures: u32,
    pub metadata: Option<String>,
}

/// Fields of a subscription update; `None` leaves a field as it is (arrays replace).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookPatch {
    /// Here and below, `Some(None)` clears the field.
    pub name: Option<Option<String>>,
    pub description: Option<Option<String>>,
    pub url: Option<String>,
    pub event_types: Option<Vec<EventType>>,
    pub event_categories: Option<Vec<EventCategory>>,
    pub scope_filter: Option<Option<String>>,
    pub thresholds: Option<String>,
    pub sealed_secret: Option<String>,
    pub headers: Option<Vec<(String, String)>>,
    pub retry_policy: Option<RetryPolicy>,
    pub disable_after_failures: Option<u32>,
    /// ACTIVE or PAUSED (DISABLED is the server's alone).
    pub status: Option<WebhookStatus>,
    pub metadata: Option<Option<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateWebhook {
    pub actor: Actor,
    pub plane: WebhookPlane,
    pub subscription_id: String,
    pub patch: WebhookPatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetWebhook {
    pub actor: Actor,
    pub plane: WebhookPlane,
    pub subscription_id: String,
    /// What a tenant key needs: read to see it, write to send it a test probe (which a
    /// closed tenant's webhook refuses, 409 TENANT_CLOSED, as every mutation of it).
    pub permission: Permission,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteWebhook {
    pub actor: Actor,
    pub plane: WebhookPlane,
    pub subscription_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookSort {
    Url,
    TenantId,
    Status,
    ConsecutiveFailures,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookFilter {
    pub tenant_id: Option<String>,
    pub status: Option<WebhookStatus>,
    pub event_type: Option<EventType>,
    /// Lower-cased: a substring of the id or the URL.
    pub search: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListWebhooks {
    pub actor: Actor,
    pub plane: WebhookPlane,
    pub filter: WebhookFilter,
    pub sort_by: WebhookSort,
    pub window: Window,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetWebhookSecurity {
    pub actor: Actor,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetWebhookSecurity {
    pub actor: Actor,
    pub config: WebhookSecurity,
}

/// The deliveries due at the operation's time (the dispatcher's next work), oldest first,
/// each with its subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueDeliveries {
    pub limit: usize,
    /// Subscriptions whose deliveries are being sent: theirs are passed over, so one
    /// subscription's backlog never hides the others'.
    pub skip: Vec<String>,
    /// How long a claimed delivery is held (see [`ClaimDelivery`]), where deliveries are
    /// claimed: a subscription's deliveries after one that is held wait for it, so its
    /// first attempts go out in order whichever instance sends them.
    pub hold_ms: Option<u64>,
}

pub type DueDelivery = (Arc<Delivery>, Arc<WebhookSubscription>);

/// What one delivery attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub success: bool,
    pub response_status: Option<u16>,
    pub response_time_ms: u64,
    pub error_message: Option<String>,
}

/// Records an attempt of a due delivery: SUCCESS; RETRYING after `retry_in_ms` (the
/// policy's delay with the dispatcher's jitter); or FAILED once its retries are spent, which
/// counts against the subscription and may disable it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordAttempt {
    pub delivery_id: String,
    pub attempt: Attempt,
    pub retry_in_ms: u64,
}

/// Whether a delivery the dispatcher took is still to be sent: still due, not attempted
/// since it was taken (`attempts` as it was then), its subscription still ACTIVE. Asked
/// before each send after a lane's first, so a pause, a delete or an auto-disable since the
/// lane was taken stops the rest of it.
///
/// With `hold_ms` it is also claimed, for that long: it is stamped attempted now (its place
/// among the due deliveries unchanged), so another dispatcher on the same ledger (the Redis
/// engine's other instances) passes over it and the subscription's later deliveries, and of
/// two that took it only the first to claim it sends it. Its attempt ends the hold; a hold
/// that runs out (its dispatcher gone) leaves it due again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDelivery {
    pub delivery_id: String,
    pub attempts: u32,
    pub hold_ms: Option<u64>,
}

/// Queues deliveries of events already selected from the event log (a replay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueReplay {
    pub actor: Actor,
    pub subscription_id: String,
    pub events: Vec<Event>,
}

operation!(CreateWebhook => Arc<WebhookSubscription>, create_webhook);
operation!(UpdateWebhook => Arc<WebhookSubscription>, update_webhook);
operation!(GetWebhook => Arc<WebhookSubscription>, get_webhook);
operation!(DeleteWebhook => Arc<WebhookSubscription>, delete_webhook);
operation!(ListWebhooks => SortedPage<Arc<WebhookSubscription>>, list_webhooks);
operation!(GetWebhookSecurity => WebhookSecurity, get_webhook_security);
operation!(SetWebhookSecurity => WebhookSecurity, set_webhook_security);
operation!(DueDeliveries => Vec<DueDelivery>, due_deliveries);
operation!(RecordAttempt => Option<Arc<Delivery>>, record_attempt);
operation!(ClaimDelivery => bool, claim_delivery);
operation!(QueueReplay => usize, queue_replay);

impl WebhookSort {
    fn position(self, w: &WebhookSubscription) -> Position {
        let value = match self {
            WebhookSort::Url => text(&w.url),
            WebhookSort::TenantId => text(&w.tenant_id),
            WebhookSort::Status => SortValue::Int(w.status as i64),
            WebhookSort::ConsecutiveFailures => SortValue::Int(i64::from(w.consecutive_failures)),
        };
        (value, w.subscription_id.clone())
    }
}

impl WebhookFilter {
    pub(crate) fn admits(&self, w: &WebhookSubscription) -> bool {
        self.tenant_id.as_ref().is_none_or(|t| *t == w.tenant_id)
            && self.status.is_none_or(|s| s == w.status)
            && self.event_type.is_none_or(|t| w.event_types.contains(&t))
            && matches_search(self.search.as_deref(), &[&w.subscription_id, &w.url])
    }
}

/// INVARIANT 1 and 2 on the selectors a subscription owned by `owner` would persist.
fn check_selectors(
    owner: &str,
    types: &[EventType],
    categories: &[EventCategory],
) -> Result<(), Rejection> {
    if types.is_empty() && categories.is_empty() {
        return Err(Rejection::InvalidRequest(
            "event_types: a subscription needs at least one event type or category".into(),
        ));
    }
    if owner == SYSTEM_TENANT {
        return Ok(());
    }
    if let Some(t) = types.iter().find(|t| !t.category().tenant_accessible()) {
        return Err(Rejection::InvalidRequest(format!(
            "event_types: {} is admin-only; a tenant's subscription may carry only budget.*, \
             reservation.* and tenant.* types",
            t.name()
        )));
    }
    if let Some(c) = categories.iter().find(|c| !c.tenant_accessible()) {
        return Err(Rejection::InvalidRequest(format!(
            "event_categories: {} is admin-only; a tenant's subscription may carry only \
             budget, reservation and tenant",
            c.name()
        )));
    }
    Ok(())
}

impl Tx<'_> {
    /// The owner of a new subscription: the caller's tenant for a tenant key, else the
    /// admin's choice (none or `__system__`: system-wide), which must exist and be open.
    fn webhook_owner(&mut self, op: &CreateWebhook) -> Result<String, Rejection> {
        match op.plane {
            WebhookPlane::Tenant => {
                let caller = self.tenant_caller(&op.actor, Permission::WebhooksWrite)?;
                Ok(caller.tenant_id.to_string())
            }
            WebhookPlane::Admin => {
                self.require_admin(&op.actor)?;
                match op.owner.as_deref() {
                    None | Some(SYSTEM_TENANT) => Ok(SYSTEM_TENANT.to_string()),
                    Some(tenant) => {
                        self.existing_tenant(tenant)?;
                        Ok(tenant.to_string())
                    }
                }
            }
        }
    }

    fn create_webhook(&mut self, op: CreateWebhook) -> Result<Arc<WebhookSubscription>, Rejection> {
        let owner = self.webhook_owner(&op)?;
        if owner != SYSTEM_TENANT {
            self.writable_by(&op.actor, &owner)?;
        }
        let new = op.webhook;
        check_selectors(&owner, &new.event_types, &new.event_categories)?;
        let w = Arc::new(WebhookSubscription {
            subscription_id: new.subscription_id,
            tenant_id: owner,
            name: new.name,
            description: new.description,
            url: new.url,
            event_types: new.event_types,
            event_categories: new.event_categories,
            scope_filter: new.scope_filter,
            thresholds: new.thresholds,
            sealed_secret: new.sealed_secret,
            headers: new.headers,
            status: WebhookStatus::Active,
            retry_policy: new.retry_policy,
            disable_after_failures: new.disable_after_failures,
            consecutive_failures: 0,
            created_at_ms: self.now,
            updated_at_ms: self.now,
            last_triggered_at_ms: None,
            last_success_at_ms: None,
            last_failure_at_ms: None,
            metadata: new.metadata,
        });
        self.put(Effect::PutWebhook(w.clone()));
        if op.plane == WebhookPlane::Admin {
            let correlation = format!("webhook_create:{}", w.subscription_id);
            self.webhook_event(
                &op.actor,
                EventType::WebhookCreated,
                None,
                &w,
                Vec::new(),
                correlation,
            );
        }
        Ok(w)
    }

    /// A subscription the caller may see: any for the admin; for a tenant key (which needs
    /// `permission`) only its own tenant's, another tenant's being a 404.
    fn visible_webhook(
        &mut self,
        actor: &Actor,
        plane: WebhookPlane,
        id: &str,
        permission: Permission,
    ) -> Result<Arc<WebhookSubscription>, Rejection> {
        let caller = match plane {
            WebhookPlane::Admin => {
                self.require_admin(actor)?;
                None
            }
            WebhookPlane::Tenant => self.admin_or_tenant(actor, permission)?,
        };
        let not_found = || Rejection::WebhookNotFound(id.to_string());
        let w = self
            .state
            .webhooks
            .subscriptions
            .get(id)
            .cloned()
            .ok_or_else(not_found)?;
        match caller {
            Some(c) if *c.tenant_id != *w.tenant_id => Err(not_found()),
            _ => Ok(w),
        }
    }

    fn get_webhook(&mut self, op: GetWebhook) -> Result<Arc<WebhookSubscription>, Rejection> {
        let id = &op.subscription_id;
        let w = self.visible_webhook(&op.actor, op.plane, id, op.permission)?;
        // Asked with write to send a test probe: a mutation of a closed tenant's webhook.
        if op.permission == Permission::WebhooksWrite && !w.is_system() {
            self.writable_by(&op.actor, &w.tenant_id)?;
        }
        Ok(w)
    }

    fn update_webhook(&mut self, op: UpdateWebhook) -> Result<Arc<WebhookSubscription>, Rejection> {
        let id = &op.subscription_id;
        let before = self.visible_webhook(&op.actor, op.plane, id, Permission::WebhooksWrite)?;
        if !before.is_system() {
            self.writable_by(&op.actor, &before.tenant_id)?;
        }
        let p = op.patch;
        let mut w = (*before).clone();
        w.name = p.name.unwrap_or(w.name);
        w.description = p.description.unwrap_or(w.description);
        w.url = p.url.unwrap_or(w.url);
        w.event_types = p.event_types.unwrap_or(w.event_types);
        w.event_categories = p.event_categories.unwrap_or(w.event_categories);
        w.scope_filter = p.scope_filter.unwrap_or(w.scope_filter);
        w.thresholds = p.thresholds.or(w.thresholds);
        w.sealed_secret = p.sealed_secret.unwrap_or(w.sealed_secret);
        w.headers = p.headers.unwrap_or(w.headers);
        w.retry_policy = p.retry_policy.unwrap_or(w.retry_policy);
        w.disable_after_failures = p.disable_after_failures.unwrap_or(w.disable_after_failures);
        w.metadata = p.metadata.unwrap_or(w.metadata);
        if let Some(status) = p.status {
            if status == WebhookStatus::Active && w.status != WebhookStatus::Active {
                w.consecutive_failures = 0;
            }
            w.status = status;
        }
        // The stored owner and the effective selectors (a status-only PATCH cannot revive
        // a subscription that breaks the invariants either).
        check_selectors(&w.tenant_id, &w.event_types, &w.event_categories)?;
        let fields = changed(&[
            ("name", w.name != before.name),
            ("description", w.description != before.description),
            ("url", w.url != before.url),
            ("event_types", w.event_types != before.event_types),
            (
                "event_categories",
                w.event_categories != before.event_categories,
            ),
            ("scope_filter", w.scope_filter != before.scope_filter),
            ("thresholds", w.thresholds != before.thresholds),
            ("signing_secret", w.sealed_secret != before.sealed_secret),
            ("headers", w.headers != before.headers),
            ("retry_policy", w.retry_policy != before.retry_policy),
            (
                "disable_after_failures",
                w.disable_after_failures != before.disable_after_failures,
            ),
            ("metadata", w.metadata != before.metadata),
        ]);
        let status_changed = w.status != before.status;
        if fields.is_empty() && !status_changed {
            // A no-op PATCH changes nothing and emits nothing.
            return Ok(before);
        }
        w.updated_at_ms = self.now;
        let w = Arc::new(w);
        self.put(Effect::PutWebhook(w.clone()));
        if op.plane == WebhookPlane::Admin {
            let event_type = match (status_changed, w.status) {
                (false, _) => EventType::WebhookUpdated,
                (true, WebhookStatus::Paused) => EventType::WebhookPaused,
                (true, _) => EventType::WebhookResumed,
            };
            let correlation = format!("webhook_update:{id}:{}", self.request_id());
            self.webhook_event(
                &op.actor,
                event_type,
                Some(&before),
                &w,
                fields,
                correlation,
            );
        }
        Ok(w)
    }

    fn delete_webhook(&mut self, op: DeleteWebhook) -> Result<Arc<WebhookSubscription>, Rejection> {
        let id = &op.subscription_id;
        let w = self.visible_webhook(&op.actor, op.plane, id, Permission::WebhooksWrite)?;
        if !w.is_system() {
            self.writable_by(&op.actor, &w.tenant_id)?;
        }
        self.put(Effect::RemoveWebhook(id.clone()));
        self.cancel_deliveries(id);
        if op.plane == WebhookPlane::Admin {
            let correlation = format!("webhook_delete:{id}");
            self.webhook_event(
                &op.actor,
                EventType::WebhookDeleted,
                Some(&w),
                &w,
                Vec::new(),
                correlation,
            );
        }
        Ok(w)
    }

    fn list_webhooks(
        &mut self,
        op: ListWebhooks,
    ) -> Result<SortedPage<Arc<WebhookSubscription>>, Rejection> {
        let mut filter = op.filter;
        match op.plane {
            WebhookPlane::Admin => self.require_admin(&op.actor)?,
            WebhookPlane::Tenant => {
                match self.admin_or_tenant(&op.actor, Permission::WebhooksRead)? {
                    Some(caller) => {
                        if filter
                            .tenant_id
                            .as_ref()
                            .is_some_and(|t| **t != *caller.tenant_id)
                        {
                            return Err(Rejection::Forbidden(
                                "tenant: a tenant key lists only its own tenant's webhooks".into(),
                            ));
                        }
                        filter.tenant_id = Some(caller.tenant_id.to_string());
                    }
                    None if filter.tenant_id.is_none() => {
                        // The spec's own words (listTenantWebhooks).
                        return Err(Rejection::InvalidRequest(
                            "tenant query parameter is required when using admin key authentication"
                                .into(),
                        ));
                    }
                    None => {}
                }
            }
        }
        let rows = self
            .state
            .webhooks
            .subscriptions
            .values()
            .filter(|w| filter.admits(w));
        Ok(sorted_page(rows, |w| op.sort_by.position(w), &op.window).map(Arc::clone))
    }

    fn get_webhook_security(
        &mut self,
        op: GetWebhookSecurity,
    ) -> Result<WebhookSecurity, Rejection> {
        self.require_admin(&op.actor)?;
        Ok(self.state.webhooks.security.clone().unwrap_or_default())
    }

    fn set_webhook_security(
        &mut self,
        op: SetWebhookSecurity,
    ) -> Result<WebhookSecurity, Rejection> {
        self.require_admin(&op.actor)?;
        self.put(Effect::PutWebhookSecurity(op.config.clone()));
        Ok(op.config)
    }

    /// Also ends, FAILED, the due deliveries of a subscription that is no longer ACTIVE
    /// (paused or disabled since they were queued), as the reference does on pickup.
    fn due_deliveries(&mut self, op: DueDeliveries) -> Result<Vec<DueDelivery>, Rejection> {
        let (state, now) = (self.state, self.now);
        let webhooks = &state.webhooks;
        let skip: HashSet<&str> = op.skip.iter().map(String::as_str).collect();
        // Subscription by subscription, earliest first, each one's due deliveries in turn;
        // those being served are passed over whole.
        let waiting = webhooks
            .due_subscriptions
            .iter()
            .take_while(|(at, _)| *at <= now)
            .filter(|(_, subscription)| !skip.contains(subscription.as_str()))
            .filter_map(|(_, subscription)| webhooks.due_by_subscription.get(subscription))
            .flat_map(|due| {
                due.iter().take_while(|(at, id)| {
                    *at <= now
                        && !op.hold_ms.is_some_and(|hold_ms| {
                            webhooks.due.get(id).is_some_and(|d| held(d, hold_ms, now))
                        })
                })
            });
        let mut due = Vec::new();
        for (_, id) in waiting {
            if due.len() == op.limit {
                break;
            }
            let Some(d) = webhooks.due.get(id) else {
                continue;
            };
            let age_ms = now.saturating_sub(d.created_at_ms);
            let failure = match webhooks.subscriptions.get(&d.subscription_id) {
                // An alert a day late misleads more than it helps (the reference's cutoff):
                // a delivery that could not be made within a day, across retries or while
                // the server was down, is failed, not sent.
                _ if age_ms > MAX_DELIVERY_AGE_MS => format!(
                    "Delivery expired: {}h old (max {}h)",
                    age_ms / 3_600_000,
                    MAX_DELIVERY_AGE_MS / 3_600_000
                ),
                Some(w) if w.status == WebhookStatus::Active => {
                    due.push((d.clone(), w.clone()));
                    continue;
                }
                _ => "subscription is not ACTIVE".into(),
            };
            let ended = Delivery {
                status: DeliveryStatus::Failed,
                completed_at_ms: Some(now),
                error_message: Some(failure),
                ..(**d).clone()
            };
            self.put(Effect::PutDelivery(Arc::new(ended)));
        }
        Ok(due)
    }

    fn claim_delivery(&mut self, op: ClaimDelivery) -> Result<bool, Rejection> {
        let webhooks = &self.state.webhooks;
        let Some(d) = webhooks.due.get(&op.delivery_id) else {
            return Ok(false);
        };
        let active = webhooks
            .subscriptions
            .get(&d.subscription_id)
            .is_some_and(|w| w.status == WebhookStatus::Active);
        if !active || d.attempts != op.attempts || d.next_attempt_at_ms > self.now {
            return Ok(false);
        }
        if let Some(hold_ms) = op.hold_ms {
            if held(d, hold_ms, self.now) {
                return Ok(false);
            }
            let mut claimed = (**d).clone();
            claimed.attempted_at_ms = Some(self.now);
            self.put(Effect::PutDelivery(Arc::new(claimed)));
        }
        Ok(true)
    }

    fn record_attempt(&mut self, op: RecordAttempt) -> Result<Option<Arc<Delivery>>, Rejection> {
        let Some(d) = self.state.webhooks.due.get(&op.delivery_id).cloned() else {
            // Finished meanwhile (its subscription deleted): nothing to record.
            return Ok(None);
        };
        let Some(w) = self
            .state
            .webhooks
            .subscriptions
            .get(&d.subscription_id)
            .cloned()
        else {
            return Ok(None);
        };
        let a = op.attempt;
        let mut d = (*d).clone();
        d.attempts += 1;
        d.attempted_at_ms = Some(self.now);
        d.response_status = a.response_status;
        d.response_time_ms = Some(a.response_time_ms);
        d.error_message = a.error_message;
        let mut sub = (*w).clone();
        sub.last_triggered_at_ms = Some(self.now);
        if a.success {
            d.status = DeliveryStatus::Success;
            d.completed_at_ms = Some(self.now);
            sub.consecutive_failures = 0;
            sub.last_success_at_ms = Some(self.now);
        } else if d.attempts > w.retry_policy.max_retries {
            d.status = DeliveryStatus::Failed;
            d.completed_at_ms = Some(self.now);
            sub.consecutive_failures += 1;
            sub.last_failure_at_ms = Some(self.now);
        } else {
            d.status = DeliveryStatus::Retrying;
            d.next_attempt_at_ms = self.now.saturating_add(op.retry_in_ms as Millis);
            sub.last_failure_at_ms = Some(self.now);
        }
        let d = Arc::new(d);
        self.put(Effect::PutDelivery(d.clone()));
        let disable = d.status == DeliveryStatus::Failed
            && sub.status != WebhookStatus::Disabled
            && sub.consecutive_failures >= sub.disable_after_failures;
        let previous = sub.status;
        if disable {
            sub.status = WebhookStatus::Disabled;
            sub.updated_at_ms = self.now;
        }
        let sub = Arc::new(sub);
        self.put(Effect::PutWebhook(sub.clone()));
        if d.status == DeliveryStatus::Failed {
            self.delivery_failed_event(&d, &sub);
        }
        if disable {
            let correlation = format!(
                "webhook_auto_disable:{}:{}",
                sub.subscription_id, d.delivery_id
            );
            let mut data = lifecycle_data(Some(previous), Some(sub.status), &sub, Vec::new());
            data["disable_reason"] = "consecutive_failures_exceeded_threshold".into();
            self.emit(NewEvent {
                event_type: EventType::WebhookDisabled,
                tenant_id: sub.tenant_id.clone(),
                scope: None,
                actor: Self::system_actor(),
                source: DISPATCH_SOURCE,
                data,
                correlation_id: Some(correlation),
            });
        }
        Ok(Some(d))
    }

    /// `system.webhook_delivery_failed`: a delivery spent its retries (a system event, so
    /// only system-wide subscriptions may hear of it).
    fn delivery_failed_event(&mut self, d: &Delivery, w: &WebhookSubscription) {
        let data = serde_json::json!({
            "component": "webhook_dispatcher",
            "message": format!("Delivery {} of {} to {} failed after {} attempts",
                d.delivery_id, d.event_id, w.subscription_id, d.attempts),
            "severity": "warning",
            "details": {
                "delivery_id": d.delivery_id,
                "subscription_id": w.subscription_id,
                "event_id": d.event_id,
                "attempts": d.attempts,
                "response_status": d.response_status,
                "error_message": d.error_message,
            },
        });
        self.emit(NewEvent {
            event_type: EventType::SystemWebhookDeliveryFailed,
            tenant_id: SYSTEM_TENANT.to_string(),
            scope: None,
            actor: Self::system_actor(),
            source: DISPATCH_SOURCE,
            data,
            correlation_id: None,
        });
    }

    fn queue_replay(&mut self, op: QueueReplay) -> Result<usize, Rejection> {
        self.require_admin(&op.actor)?;
        let id = &op.subscription_id;
        let w = self.visible_webhook(
            &op.actor,
            WebhookPlane::Admin,
            id,
            Permission::WebhooksWrite,
        )?;
        if !w.is_system() {
            self.writable_by(&op.actor, &w.tenant_id)?;
        }
        if w.status != WebhookStatus::Active {
            return Ok(0);
        }
        let mut queued = 0;
        for event in &op.events {
            // The delivery-time guard: only what the subscription may receive.
            if !w.wants_event(event) || (!w.is_system() && event.tenant_id != w.tenant_id) {
                continue;
            }
            let delivery = self.new_delivery(event, w.subscription_id.clone());
            self.put(Effect::PutDelivery(Arc::new(delivery)));
            queued += 1;
        }
        Ok(queued)
    }

    /// One row of a webhook bulk action: `Ok(false)` when it is already where the action
    /// takes it.
    pub(crate) fn webhook_row(
        &mut self,
        actor: &Actor,
        w: &Arc<WebhookSubscription>,
        action: super::bulk::WebhookAction,
        correlation: &str,
    ) -> Result<bool, Rejection> {
        use super::bulk::WebhookAction as A;
        if !w.is_system() {
            self.writable_by(actor, &w.tenant_id)?;
        }
        let (target, event_type) = match (action, w.status) {
            (A::Delete, _) => {
                self.put(Effect::RemoveWebhook(w.subscription_id.clone()));
                self.cancel_deliveries(&w.subscription_id);
                let correlation = correlation.to_string();
                self.webhook_event(
                    actor,
                    EventType::WebhookDeleted,
                    Some(w),
                    w,
                    Vec::new(),
                    correlation,
                );
                return Ok(true);
            }
            (A::Pause, WebhookStatus::Active) => (WebhookStatus::Paused, EventType::WebhookPaused),
            (A::Pause, _) | (A::Resume, WebhookStatus::Active) => return Ok(false),
            (A::Resume, WebhookStatus::Disabled) => {
                return Err(Rejection::Conflict(format!(
                    "Webhook {} is DISABLED: re-enable it with a PATCH",
                    w.subscription_id
                )))
            }
            (A::Resume, WebhookStatus::Paused) => {
                // A legacy subscription that breaks the invariants stays paused.
                check_selectors(&w.tenant_id, &w.event_types, &w.event_categories)?;
                (WebhookStatus::Active, EventType::WebhookResumed)
            }
        };
        let after = Arc::new(WebhookSubscription {
            status: target,
            updated_at_ms: self.now,
            ..(**w).clone()
        });
        self.put(Effect::PutWebhook(after.clone()));
        let correlation = correlation.to_string();
        self.webhook_event(actor, event_type, Some(w), &after, Vec::new(), correlation);
        Ok(true)
    }

    /// Ends the due deliveries of a deleted subscription: final, FAILED, with the reason.
    fn cancel_deliveries(&mut self, subscription_id: &str) {
        let state = self.state;
        let due = state.webhooks.due.values();
        for d in due.filter(|d| d.subscription_id == subscription_id) {
            let cancelled = Delivery {
                status: DeliveryStatus::Failed,
                completed_at_ms: Some(self.now),
                error_message: Some("subscription deleted".into()),
                ..(**d).clone()
            };
            self.put(Effect::PutDelivery(Arc::new(cancelled)));
        }
    }

    /// Stages one `webhook.*` lifecycle event of `w`.
    fn webhook_event(
        &mut self,
        actor: &Actor,
        event_type: EventType,
        before: Option<&WebhookSubscription>,
        w: &WebhookSubscription,
        changed_fields: Vec<String>,
        correlation: String,
    ) {
        let new_status = (event_type != EventType::WebhookDeleted).then_some(w.status);
        let data = lifecycle_data(before.map(|b| b.status), new_status, w, changed_fields);
        // The admin plane's webhook operations are the operator's own (not dual-auth), as
        // their audit entries say; the tenant plane's emit no lifecycle events.
        let actor = self.event_actor(actor, false);
        self.emit(NewEvent {
            event_type,
            tenant_id: w.tenant_id.clone(),
            scope: None,
            actor,
            source: ADMIN_SOURCE,
            data,
            correlation_id: Some(correlation),
        });
    }
}

/// `EventDataWebhookLifecycle`.
fn lifecycle_data(
    previous: Option<WebhookStatus>,
    new: Option<WebhookStatus>,
    w: &WebhookSubscription,
    changed_fields: Vec<String>,
) -> serde_json::Value {
    let mut data = serde_json::json!({
        "subscription_id": w.subscription_id,
        "tenant_id": w.tenant_id,
        "changed_fields": changed_fields,
    });
    if let Some(p) = previous {
        data["previous_status"] = upper(p).into();
    }
    if let Some(n) = new {
        data["new_status"] = upper(n).into();
    }
    data
}

/// Whether a delivery is claimed by a dispatcher, for `hold_ms` from its claim: stamped
/// attempted at or after it fell due, and not long ago. An attempt recorded since stamps it
/// before its next due time (or ends it), so it is held no more.
fn held(d: &Delivery, hold_ms: u64, now: Millis) -> bool {
    d.attempted_at_ms
        .is_some_and(|at| at >= d.next_attempt_at_ms && now < at.saturating_add(hold_ms as Millis))
}
