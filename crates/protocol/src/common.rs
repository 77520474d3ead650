//! Schemas shared across endpoints: units, amounts, subjects, actions, balances.

use std::collections::BTreeMap;

use ledger::{leaf_segment, Balance as DomainBalance, OveragePolicy, Unit};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::schema::SignedAmount;
use crate::validate::{max_len, non_negative};
use crate::ApiError;

/// `UnitEnum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[schema(as = UnitEnum, description = "The unit an amount is counted in.")]
pub enum WireUnit {
    UsdMicrocents,
    Tokens,
    Credits,
    RiskPoints,
}

impl WireUnit {
    /// The wire name, e.g. `USD_MICROCENTS` (for a query string).
    pub fn as_str(self) -> &'static str {
        Unit::from(self).as_str()
    }
}

impl From<WireUnit> for Unit {
    fn from(u: WireUnit) -> Unit {
        match u {
            WireUnit::UsdMicrocents => Unit::UsdMicrocents,
            WireUnit::Tokens => Unit::Tokens,
            WireUnit::Credits => Unit::Credits,
            WireUnit::RiskPoints => Unit::RiskPoints,
        }
    }
}

impl From<Unit> for WireUnit {
    fn from(u: Unit) -> WireUnit {
        match u {
            Unit::UsdMicrocents => WireUnit::UsdMicrocents,
            Unit::Tokens => WireUnit::Tokens,
            Unit::Credits => WireUnit::Credits,
            Unit::RiskPoints => WireUnit::RiskPoints,
        }
    }
}

/// `CommitOveragePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[schema(
    as = CommitOveragePolicy,
    description = "What a commit or event does when the actual amount exceeds what is available."
)]
pub enum WirePolicy {
    Reject,
    AllowIfAvailable,
    AllowWithOverdraft,
}

impl From<WirePolicy> for OveragePolicy {
    fn from(p: WirePolicy) -> Self {
        match p {
            WirePolicy::Reject => OveragePolicy::Reject,
            WirePolicy::AllowIfAvailable => OveragePolicy::AllowIfAvailable,
            WirePolicy::AllowWithOverdraft => OveragePolicy::AllowWithOverdraft,
        }
    }
}

impl From<OveragePolicy> for WirePolicy {
    fn from(p: OveragePolicy) -> Self {
        match p {
            OveragePolicy::Reject => WirePolicy::Reject,
            OveragePolicy::AllowIfAvailable => WirePolicy::AllowIfAvailable,
            OveragePolicy::AllowWithOverdraft => WirePolicy::AllowWithOverdraft,
        }
    }
}

/// `Amount` (non-negative) on input and output; `SignedAmount` on output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A non-negative amount in a unit.")]
pub struct Amount {
    pub unit: WireUnit,
    #[schema(minimum = 0)]
    pub amount: i64,
}

impl Amount {
    pub fn new(unit: Unit, amount: i64) -> Self {
        Amount {
            unit: unit.into(),
            amount,
        }
    }

    pub fn check(&self, field: &str) -> Result<(), ApiError> {
        non_negative(format_args!("{field}.amount"), self.amount)
    }
}

/// An open JSON object (`metadata`, `metrics.custom`), kept as the client sent it.
pub type Metadata = Map<String, Value>;

/// Stores an open object as opaque text in the domain.
pub fn metadata_text(m: &Option<Metadata>) -> Option<String> {
    m.as_ref()
        .map(|m| serde_json::to_string(m).unwrap_or_else(|_| "{}".into()))
}

/// Renders stored opaque text back as the same JSON object.
pub fn metadata_raw(text: Option<&str>) -> Option<Box<RawValue>> {
    text.and_then(|t| RawValue::from_string(t.to_string()).ok())
}

/// `Subject`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(
    description = "Who is spending: at least one of tenant, workspace, app, workflow, agent, toolset is required. Each names one scope level; the budgets on every level named are checked."
)]
pub struct Subject {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[a-zA-Z0-9_.-]+$")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[a-zA-Z0-9_.-]+$")]
    pub workspace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[a-zA-Z0-9_.-]+$")]
    pub app: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[a-zA-Z0-9_.-]+$")]
    pub workflow: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[a-zA-Z0-9_.-]+$")]
    pub agent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128, pattern = "^[a-zA-Z0-9_.-]+$")]
    pub toolset: Option<String>,
    /// Free-form string dimensions (at most 16; values up to 256 characters).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<BTreeMap<String, String>>,
}

/// Subject values: the spec's CHARSET (`^[a-zA-Z0-9_.-]+$`), 1–128 characters. `:` and `/`
/// would break scope strings, so out-of-pattern values are rejected.
pub(crate) fn is_scope_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 128
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

impl Subject {
    /// The six levels with their values, in canonical order (borrowed: checking a subject
    /// copies nothing).
    fn levels(&self) -> impl Iterator<Item = (&'static str, Option<&str>)> {
        ledger::SCOPE_LEVELS.into_iter().zip([
            self.tenant.as_deref(),
            self.workspace.as_deref(),
            self.app.as_deref(),
            self.workflow.as_deref(),
            self.agent.as_deref(),
            self.toolset.as_deref(),
        ])
    }

    pub fn check(&self, field: &str) -> Result<(), ApiError> {
        if !ledger::names_a_level(self.levels().map(|(_, v)| v)) {
            return Err(ApiError::invalid(format!(
                "{field}: at least one of tenant, workspace, app, workflow, agent, toolset is required"
            )));
        }
        for (level, value) in self.levels() {
            if let Some(v) = value {
                if !is_scope_value(v) {
                    return Err(ApiError::invalid(format!(
                        "{field}.{level}: must be 1-128 characters of [a-zA-Z0-9_.-]"
                    )));
                }
            }
        }
        if let Some(dims) = &self.dimensions {
            if dims.len() > 16 {
                return Err(ApiError::invalid(format!(
                    "{field}.dimensions: at most 16 entries"
                )));
            }
            for (k, v) in dims {
                // The spec bounds values, not keys (the body's size bounds those).
                max_len(format_args!("{field}.dimensions.{k}"), v, 256)?;
            }
        }
        Ok(())
    }
}

impl From<Subject> for ledger::Subject {
    fn from(s: Subject) -> Self {
        ledger::Subject {
            tenant: s.tenant,
            workspace: s.workspace,
            app: s.app,
            workflow: s.workflow,
            agent: s.agent,
            toolset: s.toolset,
            dimensions: s.dimensions.unwrap_or_default().into_iter().collect(),
        }
    }
}

impl From<&ledger::Subject> for Subject {
    fn from(s: &ledger::Subject) -> Self {
        Subject {
            tenant: s.tenant.clone(),
            workspace: s.workspace.clone(),
            app: s.app.clone(),
            workflow: s.workflow.clone(),
            agent: s.agent.clone(),
            toolset: s.toolset.clone(),
            dimensions: (!s.dimensions.is_empty()).then(|| s.dimensions.iter().cloned().collect()),
        }
    }
}

/// `Action`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "What is being paid for.")]
pub struct Action {
    #[schema(max_length = 64)]
    pub kind: String,
    #[schema(max_length = 256)]
    pub name: String,
    /// At most 10 tags of up to 64 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 10)]
    pub tags: Option<Vec<String>>,
    /// v0.1.26 routing dimensions for policy matching: accepted (an object) and ignored, as
    /// the spec requires of a server without the extension.
    #[serde(default, skip_serializing)]
    #[schema(value_type = Option<Object>)]
    pub policy_keys: Option<Metadata>,
}

impl Action {
    pub fn check(&self, field: &str) -> Result<(), ApiError> {
        max_len(format_args!("{field}.kind"), &self.kind, 64)?;
        max_len(format_args!("{field}.name"), &self.name, 256)?;
        if let Some(tags) = &self.tags {
            if tags.len() > 10 {
                return Err(ApiError::invalid(format!("{field}.tags: at most 10 items")));
            }
            for t in tags {
                max_len(format_args!("{field}.tags[]"), t, 64)?;
            }
        }
        Ok(())
    }
}

impl From<Action> for ledger::Action {
    fn from(a: Action) -> Self {
        ledger::Action {
            kind: a.kind,
            name: a.name,
            tags: a.tags,
        }
    }
}

impl From<&ledger::Action> for Action {
    fn from(a: &ledger::Action) -> Self {
        Action {
            kind: a.kind.clone(),
            name: a.name.clone(),
            tags: a.tags.clone(),
            policy_keys: None,
        }
    }
}

/// `StandardMetrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Usage metrics reported with a commit or an event.")]
pub struct StandardMetrics {
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub tokens_input: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub tokens_output: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub latency_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128)]
    pub model_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub custom: Option<Metadata>,
}

impl StandardMetrics {
    pub fn check(&self, field: &str) -> Result<(), ApiError> {
        for (name, v) in [
            ("tokens_input", self.tokens_input),
            ("tokens_output", self.tokens_output),
            ("latency_ms", self.latency_ms),
        ] {
            if let Some(v) = v {
                non_negative(format_args!("{field}.{name}"), v)?;
            }
        }
        if let Some(m) = &self.model_version {
            max_len(format_args!("{field}.model_version"), m, 128)?;
        }
        Ok(())
    }
}

/// `Balance`: one `(scope, unit)` ledger. Every amount is emitted, so clients can check
/// `remaining = allocated − spent − reserved − debt` themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Balance<'a> {
    pub scope: &'a str,
    pub scope_path: &'a str,
    #[schema(value_type = SignedAmount)]
    pub remaining: Amount,
    pub reserved: Amount,
    pub spent: Amount,
    pub allocated: Amount,
    pub debt: Amount,
    pub overdraft_limit: Amount,
    pub is_over_limit: bool,
}

impl<'a> From<&'a DomainBalance> for Balance<'a> {
    fn from(b: &'a DomainBalance) -> Self {
        Balance {
            scope: leaf_segment(&b.scope),
            scope_path: &b.scope,
            remaining: Amount::new(b.unit, b.remaining),
            reserved: Amount::new(b.unit, b.reserved),
            spent: Amount::new(b.unit, b.spent),
            allocated: Amount::new(b.unit, b.allocated),
            debt: Amount::new(b.unit, b.debt),
            overdraft_limit: Amount::new(b.unit, b.overdraft_limit),
            is_over_limit: b.is_over_limit,
        }
    }
}

pub fn balances(list: &[DomainBalance]) -> Option<Vec<Balance<'_>>> {
    (!list.is_empty()).then(|| list.iter().map(Balance::from).collect())
}
