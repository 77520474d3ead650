//! Subjects and scope derivation (runtime spec §6.2).

use serde::{Deserialize, Serialize};

/// The scope levels in canonical order.
pub const SCOPE_LEVELS: [&str; 6] = ["tenant", "workspace", "app", "workflow", "agent", "toolset"];

/// Who is spending: up to six hierarchical levels plus opaque dimensions.
/// Values are kept as the client sent them (they round-trip); scopes use them lower-cased.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Subject {
    pub tenant: Option<String>,
    pub workspace: Option<String>,
    pub app: Option<String>,
    pub workflow: Option<String>,
    pub agent: Option<String>,
    pub toolset: Option<String>,
    /// Opaque key/value pairs, stored and echoed, never used for budgeting.
    pub dimensions: Vec<(String, String)>,
}

impl Subject {
    /// The six levels paired with their values, in canonical order.
    pub fn levels(&self) -> [(&'static str, Option<&str>); 6] {
        [
            ("tenant", self.tenant.as_deref()),
            ("workspace", self.workspace.as_deref()),
            ("app", self.app.as_deref()),
            ("workflow", self.workflow.as_deref()),
            ("agent", self.agent.as_deref()),
            ("toolset", self.toolset.as_deref()),
        ]
    }

    /// True when at least one standard level is present and non-blank.
    pub fn has_standard_level(&self) -> bool {
        names_a_level(self.levels().into_iter().map(|(_, v)| v))
    }
}

/// True when at least one of a subject's level values is present and non-blank.
pub fn names_a_level<'a>(values: impl IntoIterator<Item = Option<&'a str>>) -> bool {
    values
        .into_iter()
        .any(|v| v.is_some_and(|v| !v.trim().is_empty()))
}

/// The affected scopes of a subject: cumulative prefixes of `level:value` segments in
/// canonical order, gaps skipped, values lower-cased. The last one is the scope path.
pub fn derive_scopes(subject: &Subject) -> Vec<String> {
    let mut scopes = Vec::with_capacity(6);
    let mut path = String::new();
    for (level, value) in subject.levels() {
        let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(level);
        path.push(':');
        path.push_str(&value.to_lowercase());
        scopes.push(path.clone());
    }
    scopes
}

/// The last `level:value` segment of a scope path.
pub fn leaf_segment(scope: &str) -> &str {
    scope.rsplit('/').next().unwrap_or(scope)
}

/// True when `scope` contains the exact segment `segment` (e.g. `agent:bot`).
pub fn has_segment(scope: &str, segment: &str) -> bool {
    scope.split('/').any(|s| s == segment)
}

/// Whether `scope` is the scope `prefix` names or lies under it (a `scope_prefix` filter):
/// `tenant:acme/workspace:w1` covers itself and `tenant:acme/workspace:w1/app:a`, not
/// `tenant:acme/workspace:w10`. A prefix ending in `/` covers what lies under it; an empty
/// one covers every scope.
pub fn is_within(scope: &str, prefix: &str) -> bool {
    match scope.strip_prefix(prefix) {
        Some(rest) => {
            prefix.is_empty() || prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/')
        }
        None => false,
    }
}

/// The tenant id named by a scope's first segment, if it is a tenant segment.
pub fn scope_tenant(scope: &str) -> Option<&str> {
    scope.split('/').next()?.strip_prefix("tenant:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_skipped_and_values_lowercased() {
        let s = Subject {
            tenant: Some("Acme".into()),
            agent: Some("Bot-1".into()),
            ..Default::default()
        };
        assert_eq!(
            derive_scopes(&s),
            vec![
                "tenant:acme".to_string(),
                "tenant:acme/agent:bot-1".to_string()
            ]
        );
    }

    #[test]
    fn blank_values_count_as_absent() {
        let s = Subject {
            tenant: Some("acme".into()),
            workspace: Some("  ".into()),
            app: Some("x".into()),
            ..Default::default()
        };
        assert_eq!(derive_scopes(&s), vec!["tenant:acme", "tenant:acme/app:x"]);
        assert!(!Subject::default().has_standard_level());
    }

    #[test]
    fn segments() {
        assert_eq!(leaf_segment("tenant:a/agent:b"), "agent:b");
        assert!(has_segment("tenant:a/agent:b", "agent:b"));
        assert!(!has_segment("tenant:a/agent:bb", "agent:b"));
        assert_eq!(scope_tenant("tenant:a/agent:b"), Some("a"));
        assert_eq!(scope_tenant("agent:b"), None);
    }

    #[test]
    fn a_prefix_covers_its_scope_and_what_lies_under_it() {
        let w1 = "tenant:a/workspace:w1";
        assert!(is_within(w1, w1));
        assert!(is_within("tenant:a/workspace:w1/app:x", w1));
        assert!(!is_within("tenant:a/workspace:w10", w1));
        assert!(!is_within("tenant:a", w1));
        assert!(is_within("tenant:a/workspace:w10", "tenant:a/"));
        assert!(!is_within("tenant:a", "tenant:a/"));
        assert!(!is_within("tenant:ab", "tenant:a"));
        assert!(is_within("tenant:a", ""));
    }
}
