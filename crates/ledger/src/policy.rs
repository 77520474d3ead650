//! Policies: per-tenant rules matched to scopes by pattern. The highest-priority ACTIVE
//! policy in effect for a reservation's scope path supplies its caps (answering
//! `ALLOW_WITH_CAPS`), its commit overage policy and its TTL/extension limits.

use serde::{Deserialize, Serialize};

use crate::{Millis, OveragePolicy};

/// Soft-landing constraints returned with `ALLOW_WITH_CAPS`; the client is expected to honour
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caps {
    pub max_tokens: Option<i64>,
    pub max_steps_remaining: Option<i64>,
    pub tool_allowlist: Option<Vec<String>>,
    pub tool_denylist: Option<Vec<String>>,
    pub cooldown_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtlOverride {
    pub default_ttl_ms: Option<i64>,
    pub max_ttl_ms: Option<i64>,
    pub max_extensions: Option<u32>,
}

/// How many reservations a policy admits, and commits it settles, in each minute (UTC clock
/// minutes) across all the scopes it governs; enforced by [`RateCount`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    pub max_reservations_per_minute: Option<i64>,
    pub max_commits_per_minute: Option<i64>,
}

impl RateLimits {
    /// The limit on `kind` per minute, if one is set.
    pub fn per_minute(&self, kind: RateKind) -> Option<i64> {
        match kind {
            RateKind::Reserve => self.max_reservations_per_minute,
            RateKind::Commit => self.max_commits_per_minute,
        }
    }
}

/// What a policy's `rate_limits` count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RateKind {
    Reserve,
    Commit,
}

impl RateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RateKind::Reserve => "reservations",
            RateKind::Commit => "commits",
        }
    }
}

/// Whose count a [`RateCount`] is: one policy's, of one kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RateKey {
    pub tenant_id: String,
    pub policy_id: String,
    pub kind: RateKind,
}

/// How many a policy counted in one clock minute (`minute`: milliseconds since the epoch
/// divided by 60 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateCount {
    pub minute: i64,
    pub count: u64,
}

/// One minute, in milliseconds.
pub const MINUTE_MS: Millis = 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyStatus {
    Active,
    Disabled,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub policy_id: String,
    pub tenant_id: String,
    pub name: String,
    pub description: Option<String>,
    pub scope_pattern: String,
    pub priority: i64,
    pub caps: Option<Caps>,
    pub commit_overage_policy: Option<OveragePolicy>,
    pub reservation_ttl_override: Option<TtlOverride>,
    pub rate_limits: Option<RateLimits>,
    pub status: PolicyStatus,
    pub effective_from_ms: Option<Millis>,
    pub effective_until_ms: Option<Millis>,
    pub created_at_ms: Millis,
    pub updated_at_ms: Millis,
}

impl Policy {
    /// ACTIVE and within its effective window (`from` inclusive, `until` exclusive).
    pub fn in_effect(&self, now: Millis) -> bool {
        self.status == PolicyStatus::Active
            && self.effective_from_ms.is_none_or(|f| now >= f)
            && self.effective_until_ms.is_none_or(|u| now < u)
    }
}

/// Does `pattern` match `scope`? Segments compare one to one; a `level:*` segment matches
/// any value of that level, and a final `*` segment matches one or more further segments
/// (so `tenant:acme/*` is every descendant of `tenant:acme`, not the tenant itself).
pub fn pattern_matches(pattern: &str, scope: &str) -> bool {
    let pattern: Vec<&str> = pattern.split('/').collect();
    let scope: Vec<&str> = scope.split('/').collect();
    for (i, p) in pattern.iter().enumerate() {
        if *p == "*" && i + 1 == pattern.len() {
            return scope.len() > i;
        }
        let Some(s) = scope.get(i) else {
            return false;
        };
        let matched = match p.strip_suffix(":*") {
            Some(level) => s.split_once(':').is_some_and(|(l, _)| l == level),
            None => p == s,
        };
        if !matched {
            return false;
        }
    }
    pattern.len() == scope.len()
}

#[cfg(test)]
mod tests {
    use super::pattern_matches;

    #[test]
    fn patterns() {
        assert!(pattern_matches("tenant:a", "tenant:a"));
        assert!(!pattern_matches("tenant:a", "tenant:a/agent:x"));
        assert!(pattern_matches("tenant:a/*", "tenant:a/agent:x"));
        assert!(pattern_matches("tenant:a/*", "tenant:a/app:b/agent:x"));
        assert!(!pattern_matches("tenant:a/*", "tenant:a"));
        assert!(pattern_matches("tenant:a/agent:*", "tenant:a/agent:x"));
        assert!(!pattern_matches("tenant:a/agent:*", "tenant:a/app:x"));
        assert!(!pattern_matches(
            "tenant:a/agent:*",
            "tenant:a/agent:x/toolset:t"
        ));
        assert!(!pattern_matches("tenant:b/*", "tenant:a/agent:x"));
    }
}
