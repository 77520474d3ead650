//! Policies of the admin plane, and the one that applies to a reservation.

use std::ops::Bound;

use crate::{
    pattern_matches, Actor, Effect, NewPolicy, Outcome, Permission, Policy, PolicyListQuery,
    PolicyPatch, PolicyStatus, Rejection,
};

use super::Tx;

impl Tx<'_> {
    pub(crate) fn create_policy(
        &mut self,
        actor: &Actor,
        new: NewPolicy,
    ) -> Result<Outcome, Rejection> {
        let tenant_id =
            self.creating_tenant(actor, Permission::PoliciesWrite, new.tenant_id.clone())?;
        self.writable_tenant(&tenant_id)?;
        check_pattern(&new.scope_pattern, &tenant_id)?;
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
        Ok(Outcome::Policy(policy))
    }

    pub(crate) fn list_policies(
        &mut self,
        actor: &Actor,
        q: PolicyListQuery,
    ) -> Result<Outcome, Rejection> {
        let tenant_id = self.acting_tenant(actor, Permission::PoliciesRead, q.tenant_id.clone())?;
        let start = (tenant_id.clone(), q.after.clone().unwrap_or_default());
        let lower = if q.after.is_some() {
            Bound::Excluded(start)
        } else {
            Bound::Included(start)
        };
        let pattern = q.scope_pattern.map(|p| p.to_lowercase());
        let mut page: Vec<Policy> = self
            .state
            .policies
            .range((lower, Bound::Unbounded))
            .take_while(|((t, _), _)| *t == tenant_id)
            .map(|(_, p)| p)
            .filter(|p| q.status.is_none_or(|s| p.status == s))
            .filter(|p| pattern.as_ref().is_none_or(|sp| &p.scope_pattern == sp))
            .take(q.limit + 1)
            .cloned()
            .collect();
        let has_more = page.len() > q.limit;
        page.truncate(q.limit);
        Ok(Outcome::Policies {
            policies: page,
            has_more,
        })
    }

    pub(crate) fn update_policy(
        &mut self,
        actor: &Actor,
        policy_id: &str,
        patch: PolicyPatch,
    ) -> Result<Outcome, Rejection> {
        let caller = self.admin_or_tenant(actor, Permission::PoliciesWrite)?;
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
        self.writable_tenant(&p.tenant_id)?;
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
        p.description = description.or(p.description);
        p.priority = priority.unwrap_or(p.priority);
        p.caps = caps.or(p.caps);
        p.commit_overage_policy = commit_overage_policy.or(p.commit_overage_policy);
        p.reservation_ttl_override = reservation_ttl_override.or(p.reservation_ttl_override);
        p.rate_limits = rate_limits.or(p.rate_limits);
        p.effective_from_ms = effective_from_ms.or(p.effective_from_ms);
        p.effective_until_ms = effective_until_ms.or(p.effective_until_ms);
        p.status = status.unwrap_or(p.status);
        p.updated_at_ms = self.now;
        self.put(Effect::PutPolicy(p.clone()));
        Ok(Outcome::Policy(p))
    }

    /// The policy governing `scope_path` now: the highest priority among the tenant's
    /// policies in effect whose pattern matches; ties go to the oldest (then lowest id).
    pub(crate) fn governing_policy(&self, tenant_id: &str, scope_path: &str) -> Option<&Policy> {
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

/// A tenant's policy patterns must be rooted at that tenant (`tenant:<id>` or below).
fn check_pattern(pattern: &str, tenant_id: &str) -> Result<(), Rejection> {
    let lower = pattern.to_lowercase();
    let root = format!("tenant:{tenant_id}");
    if lower == root || lower.starts_with(&format!("{root}/")) {
        Ok(())
    } else {
        Err(Rejection::InvalidRequest(format!(
            "scope_pattern '{pattern}' must be rooted at {root}"
        )))
    }
}
