//! Resolving actors to principals, and the permission and tenancy checks.

use std::sync::Arc;

use crate::{ApiKey, ApiKeyStatus, Permission, Rejection, Tenant};

use super::{operation, Tx};

/// Who is calling, as presented. The ledger resolves it to a [`Principal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// The operator's admin key, already verified by the server against its configuration.
    Admin,
    /// A tenant API key, identified by the SHA-256 digest of its secret.
    ApiKey([u8; 32]),
}

/// Who the caller turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    Tenant {
        tenant_id: String,
        key_id: String,
        permissions: Vec<Permission>,
        scope_filter: Vec<String>,
    },
}

/// Resolves an actor without doing anything else: `GET /v1/auth/introspect`, and the
/// server's 401-before-400 check of a malformed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticate(pub Actor);

operation!(Authenticate => Principal, authenticate_only);

/// Resolves an actor and checks that it holds `permission` (the admin holds every one),
/// doing nothing else: a route that has work of its own to do before the operation (a
/// webhook URL's lookup) refuses a caller without the permission first, so that work is
/// never done for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorize {
    pub actor: Actor,
    pub permission: Permission,
}

operation!(Authorize => (), authorize_only);

/// A tenant-key caller, resolved.
pub(crate) struct Caller {
    pub tenant_id: Arc<str>,
}

impl Tx<'_> {
    fn authenticate_only(&mut self, op: Authenticate) -> Result<Principal, Rejection> {
        self.authenticate(&op.0)
    }

    fn authorize_only(&mut self, op: Authorize) -> Result<(), Rejection> {
        self.admin_or_tenant(&op.actor, op.permission).map(|_| ())
    }

    /// Resolves an actor. The admin key was verified by the server; a tenant key must exist,
    /// be ACTIVE and unexpired, and belong to an existing tenant.
    pub(crate) fn authenticate(&mut self, actor: &Actor) -> Result<Principal, Rejection> {
        let digest = match actor {
            Actor::Admin => return Ok(Principal::Admin),
            Actor::ApiKey(digest) => digest,
        };
        let key = self.live_key(digest)?;
        let principal = Principal::Tenant {
            tenant_id: key.tenant_id.to_string(),
            key_id: key.key_id.clone(),
            permissions: key.permissions.clone(),
            scope_filter: key.scope_filter.clone(),
        };
        self.tenant = Some(key.tenant_id.clone());
        Ok(principal)
    }

    /// The tenant key with `digest`, if it exists, is ACTIVE and unexpired, and belongs to
    /// an existing tenant.
    fn live_key(&self, digest: &[u8; 32]) -> Result<&ApiKey, Rejection> {
        let key = self
            .state
            .key_by_digest
            .get(digest)
            .and_then(|id| self.state.api_keys.get(id))
            .ok_or_else(|| Rejection::Unauthorized("Invalid API key".into()))?;
        match key.effective_status(self.now) {
            ApiKeyStatus::Active => {}
            ApiKeyStatus::Revoked => {
                return Err(Rejection::Unauthorized("API key has been revoked".into()))
            }
            ApiKeyStatus::Expired => {
                return Err(Rejection::Unauthorized("API key has expired".into()))
            }
        }
        if !self.state.tenants.contains_key(&*key.tenant_id) {
            return Err(Rejection::Unauthorized(
                "API key belongs to an unknown tenant".into(),
            ));
        }
        Ok(key)
    }

    /// A tenant-key caller holding `permission`. The admin key is refused: these operations
    /// act as a tenant and the admin key has none. (The hot path of every runtime request:
    /// it copies the tenant id and nothing else.)
    pub(crate) fn tenant_caller(
        &mut self,
        actor: &Actor,
        permission: Permission,
    ) -> Result<Caller, Rejection> {
        let Actor::ApiKey(digest) = actor else {
            return Err(Rejection::Unauthorized(
                "This operation requires a tenant API key (X-Cycles-API-Key)".into(),
            ));
        };
        let key = self.live_key(digest)?;
        let granted = permission.granted_by(&key.permissions);
        let tenant_id = key.tenant_id.clone();
        self.tenant = Some(tenant_id.clone());
        if granted {
            Ok(Caller { tenant_id })
        } else {
            Err(Rejection::InsufficientPermissions(permission))
        }
    }

    /// The admin, or a tenant-key caller holding `permission`. `None` means the admin.
    pub(crate) fn admin_or_tenant(
        &mut self,
        actor: &Actor,
        permission: Permission,
    ) -> Result<Option<Caller>, Rejection> {
        match actor {
            Actor::Admin => Ok(None),
            Actor::ApiKey(_) => self.tenant_caller(actor, permission).map(Some),
        }
    }

    pub(crate) fn require_admin(&mut self, actor: &Actor) -> Result<(), Rejection> {
        match actor {
            Actor::Admin => Ok(()),
            Actor::ApiKey(_) => Err(Rejection::Unauthorized(
                "This operation requires the admin key (X-Admin-API-Key)".into(),
            )),
        }
    }

    /// The tenant an operation acts for: the key's tenant, or with the admin key the
    /// `tenant_id` the request names (required).
    pub(crate) fn acting_tenant(
        &mut self,
        actor: &Actor,
        permission: Permission,
        named: Option<String>,
    ) -> Result<String, Rejection> {
        match self.admin_or_tenant(actor, permission)? {
            Some(caller) => Ok(caller.tenant_id.to_string()),
            None => named.ok_or_else(|| {
                Rejection::InvalidRequest(
                    "tenant_id is required when using admin key authentication".into(),
                )
            }),
        }
    }

    /// The tenant a create request acts for: the key's own, or with the admin key the body's
    /// `tenant_id` (required there, and refused with a tenant key).
    pub(crate) fn creating_tenant(
        &mut self,
        actor: &Actor,
        permission: Permission,
        named: Option<String>,
    ) -> Result<String, Rejection> {
        if matches!(actor, Actor::ApiKey(_)) && named.is_some() {
            self.authenticate(actor)?;
            return Err(Rejection::InvalidRequest(
                "tenant_id must not be set when using a tenant API key".into(),
            ));
        }
        self.acting_tenant(actor, permission, named)
    }

    /// The scope filter of the calling key: empty (no limit) for the admin key.
    pub(crate) fn caller_scope_filter(&self, actor: &Actor) -> &[String] {
        match actor {
            Actor::Admin => &[],
            Actor::ApiKey(digest) => self
                .live_key(digest)
                .map_or(&[][..], |key| key.scope_filter.as_slice()),
        }
    }

    /// Refuses (403) a tenant-key caller whose scope filter does not reach `scope` (admin
    /// spec §1.1: budgets, policies and balances are guarded by it).
    pub(crate) fn within_scope_filter(&self, actor: &Actor, scope: &str) -> Result<(), Rejection> {
        if scope_filter_allows(self.caller_scope_filter(actor), scope) {
            Ok(())
        } else {
            Err(Rejection::Forbidden(format!(
                "API key scope_filter does not permit access to scope: {scope}"
            )))
        }
    }

    pub(crate) fn existing_tenant(&self, tenant_id: &str) -> Result<&Tenant, Rejection> {
        self.state
            .tenants
            .get(tenant_id)
            .ok_or_else(|| Rejection::TenantNotFound(tenant_id.to_string()))
    }
}

/// Whether a scope filter reaches `scope` (a scope, scope prefix or policy pattern, split on
/// `/`): an entry `kind:id` matches a segment equal to it, `kind:*` any segment of that kind,
/// and any entry matching is enough. An empty filter reaches everything.
pub(crate) fn scope_filter_allows(filter: &[String], scope: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    let scope = scope.to_lowercase();
    filter.iter().any(|entry| {
        let entry = entry.to_lowercase();
        scope
            .split('/')
            .any(|segment| match entry.strip_suffix(":*") {
                Some(kind) => segment.split_once(':').is_some_and(|(k, _)| k == kind),
                None => segment == entry,
            })
    })
}

#[cfg(test)]
mod tests {
    use super::scope_filter_allows;

    #[test]
    fn scope_filters_match_segments_by_id_or_kind() {
        let f = |entries: &[&str]| entries.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        let scope = "tenant:acme/workspace:eng/agent:bot";
        assert!(scope_filter_allows(&[], scope));
        assert!(scope_filter_allows(&f(&["workspace:eng"]), scope));
        assert!(scope_filter_allows(&f(&["agent:*"]), scope));
        assert!(scope_filter_allows(
            &f(&["workspace:ops", "agent:bot"]),
            scope
        ));
        assert!(!scope_filter_allows(&f(&["workspace:ops"]), scope));
        assert!(
            !scope_filter_allows(&f(&["workspace:en"]), scope),
            "whole segments only"
        );
        assert!(!scope_filter_allows(&f(&["app:*"]), scope));
        assert!(!scope_filter_allows(&f(&["workspace:eng"]), "tenant:acme"));
        assert!(scope_filter_allows(
            &f(&["Workspace:ENG"]),
            "tenant:acme/workspace:eng/*"
        ));
    }
}
