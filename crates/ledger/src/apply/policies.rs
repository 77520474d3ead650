//! Policies of the admin plane, and the one that applies to a reservation.

use std::ops::Bound;

use crate::{
    pattern_matches, Caps, Effect, EventType, Millis, OveragePolicy, Permission, Policy,
    PolicyStatus, RateCount, RateKey, RateKind, RateLimits, Rejection, TtlOverride, MINUTE_MS,
    SCOPE_LEVELS,
};

use super::auth::scope_filter_allows;
use super::budgets::valid_scope_value;
use super::emit::{changed, NewEvent, ADMIN_SOURCE};
use super::{operation, Actor, Page, Tx};

/// `POST /v1/admin/policies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePolicy {
    pub actor: Actor,
    pub policy: NewPolicy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPolicy {
    pub policy_id: String,
    /// Required with the admin key, forbidden with a tenant key.
    pub tenant_id: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub scope_pattern: String,
    pub priority: i64,
    pub caps: Option<Caps>,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub reservation_ttl_override: Option<TtlOverride>,
    pub rate_limits: Option<RateLimits>,
    pub effective_from_ms: Option<Millis>,
    pub effective_until_ms: Option<Millis>,
}

/// `GET /v1/admin/policies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPolicies {
    pub actor: Actor,
    pub query: PolicyListQuery,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyListQuery {
    /// Required with the admin key; ignored with a tenant key.
    pub tenant_id: Option<String>,
    pub scope_pattern: Option<String>,
    pub status: Option<PolicyStatus>,
    pub limit: usize,
    /// Exclusive lower bound: the last policy id of the previous page.
    pub after: Option<String>,
}

/// `PATCH /v1/admin/policies/{id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdatePolicy {
    pub actor: Actor,
    pub policy_id: String,
    pub patch: PolicyPatch,
}

/// Fields of a policy update; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyPatch {
    pub name: Option<String>,
    /// For each optional setting: absent (`None`), removed (`Some(None)`) or set.
    pub description: Option<Option<String>>,
    pub priority: Option<i64>,
    pub caps: Option<Option<Caps>>,
    pub commit_overage_policy: Option<Option<OveragePolicy>>,
    pub reservation_ttl_override: Option<Option<TtlOverride>>,
    pub rate_limits: Option<Option<RateLimits>>,
    pub effective_from_ms: Option<Option<Millis>>,
    pub effective_until_ms: Option<Option<Millis>>,
    pub status: Option<PolicyStatus>,
}

operation!(CreatePolicy => Policy, create_policy);
operation!(ListPolicies => Page<Policy>, list_policies);
operation!(UpdatePolicy => Policy, update_policy);

impl Tx<'_> {
    fn create_policy(&mut self, op: CreatePolicy) -> Result<Policy, Rejection> {
        let new = op.policy;
        let tenant_id =
            self.creating_tenant(&op.actor, Permission::PoliciesWrite, new.tenant_id.clone())?;
        self.writable_tenant(&tenant_id)?;
        check_pattern(&new.scope_pattern, &tenant_id)?;
        self.within_scope_filter(&op.actor, &new.scope_pattern)?;
        let policy = Policy {
            policy_id: new.policy_id,
            tenant_id,
            name: new.name,
            description: new.description,
            scope_pattern: new.scope_pattern.to_lowercase(),
            priority: new.priority,
            caps: new.caps,
            commit_overage_policy: new.commit_overage_policy,
            reservation_ttl_override: new.reservation_ttl_override,
            rate_limits: new.rate_limits,
            status: PolicyStatus::Active,
            effective_from_ms: new.effective_from_ms,
            effective_until_ms: new.effective_until_ms,
            created_at_ms: self.now,
            updated_at_ms: self.now,
        };
        self.put(Effect::PutPolicy(policy.clone()));
        self.policy_event(&op.actor, EventType::PolicyCreated, &policy, Vec::new());
        Ok(policy)
    }

    /// Stages one `policy.*` event (`EventDataPolicy`; its scope is the pattern).
    fn policy_event(
        &mut self,
        actor: &Actor,
        event_type: EventType,
        p: &Policy,
        changed_fields: Vec<String>,
    ) {
        let actor = self.event_actor(actor, true);
        let data = serde_json::json!({
            "policy_id": p.policy_id,
            "name": p.name,
            "scope_pattern": p.scope_pattern,
            "changed_fields": changed_fields,
        });
        self.emit(NewEvent {
            event_type,
            tenant_id: p.tenant_id.clone(),
            scope: Some(p.scope_pattern.clone()),
            actor,
            source: ADMIN_SOURCE,
            data,
            correlation_id: None,
        });
    }

    fn list_policies(&mut self, op: ListPolicies) -> Result<Page<Policy>, Rejection> {
        let q = op.query;
        let tenant_id =
            self.acting_tenant(&op.actor, Permission::PoliciesRead, q.tenant_id.clone())?;
        let start = (tenant_id.clone(), q.after.clone().unwrap_or_default());
        // A cursor is the last row's id, and policies are never deleted: one naming no
        // policy of this tenant was not issued for this list.
        if q.after.is_some() && !self.state.policies.contains_key(&start) {
            return Err(Rejection::InvalidRequest(
                "cursor: not valid for this result set; restart pagination without a cursor".into(),
            ));
        }
        let lower = if q.after.is_some() {
            Bound::Excluded(start)
        } else {
            Bound::Included(start)
        };
        let pattern = q.scope_pattern.map(|p| p.to_lowercase());
        if let Some(p) = &pattern {
            self.within_scope_filter(&op.actor, p)?;
        }
        let reach = self.caller_scope_filter(&op.actor);
        let page = self
            .state
            .policies
            .range((lower, Bound::Unbounded))
            .take_while(|((t, _), _)| *t == tenant_id)
            .map(|(_, p)| p)
            .filter(|p| q.status.is_none_or(|s| p.status == s))
            .filter(|p| pattern.as_ref().is_none_or(|sp| &p.scope_pattern == sp))
            .filter(|p| scope_filter_allows(reach, &p.scope_pattern))
            .cloned();
        Ok(Page::of(page, q.limit))
    }

    fn update_policy(&mut self, op: UpdatePolicy) -> Result<Policy, Rejection> {
        let (policy_id, patch) = (op.policy_id.as_str(), op.patch);
        let caller = self.admin_or_tenant(&op.actor, Permission::PoliciesWrite)?;
        let not_found = || Rejection::NotFound(format!("Policy not found: {policy_id}"));
        let mut p = self
            .state
            .policies
            .values()
            .find(|p| p.policy_id == policy_id)
            .cloned()
            .ok_or_else(not_found)?;
        if caller.is_some_and(|c| *c.tenant_id != *p.tenant_id) {
            return Err(not_found());
        }
        self.within_scope_filter(&op.actor, &p.scope_pattern)?;
        self.writable_by(&op.actor, &p.tenant_id)?;
        let before = p.clone();
        let PolicyPatch {
            name,
            description,
            priority,
            caps,
            commit_overage_policy,
            reservation_ttl_override,
            rate_limits,
            effective_from_ms,
            effective_until_ms,
            status,
        } = patch;
        p.name = name.unwrap_or(p.name);
        p.description = description.unwrap_or(p.description);
        p.priority = priority.unwrap_or(p.priority);
        p.caps = caps.unwrap_or(p.caps);
        p.commit_overage_policy = commit_overage_policy.unwrap_or(p.commit_overage_policy);
        p.reservation_ttl_override = reservation_ttl_override.unwrap_or(p.reservation_ttl_override);
        p.rate_limits = rate_limits.unwrap_or(p.rate_limits);
        p.effective_from_ms = effective_from_ms.unwrap_or(p.effective_from_ms);
        p.effective_until_ms = effective_until_ms.unwrap_or(p.effective_until_ms);
        p.status = status.unwrap_or(p.status);
        if let (Some(from), Some(until)) = (p.effective_from_ms, p.effective_until_ms) {
            // As create refuses it: a policy whose window is empty never takes effect.
            if from >= until {
                return Err(Rejection::InvalidRequest(
                    "effective_from must be before effective_until".into(),
                ));
            }
        }
        if p == before {
            // Nothing changes: nothing is stamped, stored or announced (admin spec §4.3).
            return Ok(p);
        }
        p.updated_at_ms = self.now;
        self.put(Effect::PutPolicy(p.clone()));
        let b = &before;
        let fields = changed(&[
            ("name", b.name != p.name),
            ("description", b.description != p.description),
            ("priority", b.priority != p.priority),
            ("caps", b.caps != p.caps),
            (
                "commit_overage_policy",
                b.commit_overage_policy != p.commit_overage_policy,
            ),
            (
                "reservation_ttl_override",
                b.reservation_ttl_override != p.reservation_ttl_override,
            ),
            ("rate_limits", b.rate_limits != p.rate_limits),
            ("effective_from", b.effective_from_ms != p.effective_from_ms),
            (
                "effective_until",
                b.effective_until_ms != p.effective_until_ms,
            ),
            ("status", b.status != p.status),
        ]);
        self.policy_event(&op.actor, EventType::PolicyUpdated, &p, fields);
        Ok(p)
    }

    /// Counts one of `kind` against the `rate_limits` of `policy` (the one governing the
    /// request's scope), refusing it when the policy's count for this clock minute is
    /// already at its limit. Staged like any effect, so a request refused for another reason
    /// counts nothing, and a replay (which does not run its fresh path) nothing again.
    pub(crate) fn count_rate(&mut self, limited: Option<(RateKey, i64)>) -> Result<(), Rejection> {
        let Some((key, limit)) = limited else {
            return Ok(());
        };
        let minute = self.now.div_euclid(MINUTE_MS);
        let count = match self.state.rate_counts.get(&key) {
            Some(c) if c.minute == minute => c.count,
            _ => 0,
        };
        if count >= limit.max(0) as u64 {
            return Err(Rejection::RateLimited {
                policy_id: key.policy_id,
                kind: key.kind.as_str(),
                limit,
                retry_after_ms: (minute + 1) * MINUTE_MS - self.now,
            });
        }
        let counted = RateCount {
            minute,
            count: count + 1,
        };
        self.put(Effect::PutRateCount(key, counted));
        Ok(())
    }

    /// The rate of `kind` that `policy` limits, and its limit (`None`: it sets none).
    pub(crate) fn rate_limit(policy: Option<&Policy>, kind: RateKind) -> Option<(RateKey, i64)> {
        let p = policy?;
        let limit = p.rate_limits?.per_minute(kind)?;
        let key = RateKey {
            tenant_id: p.tenant_id.clone(),
            policy_id: p.policy_id.clone(),
            kind,
        };
        Some((key, limit))
    }

    /// The policy governing `scope_path` now: the highest priority among the tenant's
    /// policies in effect whose pattern matches; ties go to the oldest (then lowest id).
    pub(crate) fn governing_policy(&self, tenant_id: &str, scope_path: &str) -> Option<&Policy> {
        if !self.state.policy_tenants.contains(tenant_id) {
            return None;
        }
        self.state
            .policies
            .range((tenant_id.to_string(), String::new())..)
            .take_while(|((t, _), _)| t == tenant_id)
            .map(|(_, p)| p)
            .filter(|p| p.in_effect(self.now) && pattern_matches(&p.scope_pattern, scope_path))
            .min_by(|a, b| {
                b.priority
                    .cmp(&a.priority)
                    .then(a.created_at_ms.cmp(&b.created_at_ms))
                    .then(a.policy_id.cmp(&b.policy_id))
            })
    }
}

/// Checks a policy's scope pattern: rooted at its tenant (`tenant:<id>`), then levels in the
/// scopes' order, each `level:value` or `level:*`, and a bare `*` (every descendant) only as
/// the last segment. Anything else would be stored and then never match a scope.
fn check_pattern(pattern: &str, tenant_id: &str) -> Result<(), Rejection> {
    let invalid =
        |why: String| Rejection::InvalidRequest(format!("scope_pattern '{pattern}' {why}"));
    let lower = pattern.to_lowercase();
    let mut segments = lower.split('/').peekable();
    let root = format!("tenant:{tenant_id}");
    if segments.next() != Some(root.as_str()) {
        return Err(invalid(format!("must be rooted at {root}")));
    }
    let mut last_level = 0;
    while let Some(segment) = segments.next() {
        if segment == "*" {
            if segments.peek().is_some() {
                return Err(invalid("may have a bare * only as its last segment".into()));
            }
            if last_level + 1 == SCOPE_LEVELS.len() {
                return Err(invalid("has a * below toolset, where no scope goes".into()));
            }
            break;
        }
        let Some((level, value)) = segment.split_once(':') else {
            return Err(invalid(format!(
                "has '{segment}': each segment is level:value, level:* or a last *"
            )));
        };
        let position = SCOPE_LEVELS.iter().position(|l| *l == level);
        match position {
            Some(p) if p > last_level => last_level = p,
            Some(_) => {
                return Err(invalid(
                    "must follow the tenant/workspace/app/workflow/agent/toolset order \
                     without repeats"
                        .into(),
                ))
            }
            None => return Err(invalid(format!("names an unknown level '{level}'"))),
        }
        if value != "*" && !valid_scope_value(value) {
            return Err(invalid(
                "has a value that is neither * nor 1-128 characters of [A-Za-z0-9_.-]".into(),
            ));
        }
    }
    Ok(())
}
