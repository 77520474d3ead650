//! The runtime plane: reservations, decide, events, balances.

use crate::extensions::check_observe_mode;
use crate::WireName;
use ledger::{
    Actor, CommitResult, DecideResult, EventResult, ExtendResult, GetBalances, Idempotency,
    ReleaseResult, Reservation, ReserveResult, Unit,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::common::{balances, metadata_text, Metadata};
use crate::listing::{Include, ReservationSummary};
use crate::query::{level_filters, PageSize};
use crate::schema::{AppliedStatus, CommittedStatus, DecisionEnum, ExtendedStatus, ReleasedStatus};
use crate::validate::{idempotency_key, len_between, max_len, non_negative, range};
use crate::{
    decode_budget_cursor, fingerprint, Action, Amount, ApiError, Balance, StandardMetrics, Subject,
    Validate, WirePolicy, WireUnit, MAX_ADMIN_PAGE_SIZE,
};

pub const DEFAULT_GRACE_MS: i64 = 5_000;

/// The `X-Idempotency-Key` request header of the idempotent runtime writes.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyHeader<'a> {
    /// Optional; when present it must equal the body's `idempotency_key` (else 400).
    #[param(rename = "X-Idempotency-Key", value_type = Option<String>, min_length = 1, max_length = 256)]
    pub key: Option<&'a str>,
}

impl IdempotencyHeader<'_> {
    /// The header's name, in the lower case `HeaderMap` lookups use.
    pub const NAME: &'static str = "x-idempotency-key";

    /// Checks the header, when present, against the body's key.
    pub fn check(&self, body_key: &str) -> Result<(), ApiError> {
        match self.key {
            Some(h) if h != body_key => Err(ApiError::invalid(
                "X-Idempotency-Key header does not match the body's idempotency_key",
            )),
            _ => Ok(()),
        }
    }
}

/// The reservation an operation's path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ReservationPath {
    /// The reservation's id (1–128 characters).
    #[param(min_length = 1, max_length = 128)]
    pub reservation_id: String,
}

impl ReservationPath {
    /// The id, once checked.
    pub fn into_id(self) -> Result<String, ApiError> {
        len_between("reservation_id", &self.reservation_id, 1, 128)?;
        Ok(self.reservation_id)
    }
}

/// The query of `GET /v1/balances`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BalanceParams {
    /// Must be the key's tenant (else 403). At least one of tenant, workspace, app,
    /// workflow, agent, toolset is required.
    pub tenant: Option<String>,
    /// Only budgets whose scope has this workspace segment (case-insensitive).
    pub workspace: Option<String>,
    /// Only budgets whose scope has this app segment (case-insensitive).
    pub app: Option<String>,
    /// Only budgets whose scope has this workflow segment (case-insensitive).
    pub workflow: Option<String>,
    /// Only budgets whose scope has this agent segment (case-insensitive).
    pub agent: Option<String>,
    /// Only budgets whose scope has this toolset segment (case-insensitive).
    pub toolset: Option<String>,
    /// Validated (`true` or `false`) but without effect: budgets below the named scope
    /// are always included.
    pub include_children: Option<bool>,
    /// The admin spec's form of this operation: `tenant_id` (must be the key's tenant),
    /// `scope_prefix` and `unit` select whole ledgers (`BudgetLedger` rows) instead of the
    /// runtime's balances. The two forms' parameters do not mix.
    pub tenant_id: Option<String>,
    /// Admin form: only scopes starting with this prefix (case-insensitive).
    pub scope_prefix: Option<String>,
    /// Admin form: only budgets in this unit.
    #[param(inline)]
    pub unit: Option<WireUnit>,
    /// From the previous page's `next_cursor`.
    pub cursor: Option<String>,
    /// Page size, 1–200 (the ledger form: 1–100, as the admin spec); defaults to 50.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 200)]
    pub limit: Option<PageSize>,
}

/// Which form of `GET /v1/balances` a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BalanceForm {
    /// The runtime spec's: `Balance` rows for subject levels.
    Runtime,
    /// The admin spec's: `BudgetLedger` rows by scope prefix and unit.
    Ledgers,
}

impl BalanceParams {
    /// The balances these parameters ask `actor`'s view for, and in which form. The runtime
    /// form must name at least one subject level; the admin form needs nothing.
    pub fn into_query(self, actor: Actor) -> Result<(GetBalances, BalanceForm), ApiError> {
        let filters = level_filters([
            &self.workspace,
            &self.app,
            &self.workflow,
            &self.agent,
            &self.toolset,
        ]);
        let runtime = self.tenant.is_some() || !filters.is_empty();
        let ledgers =
            self.tenant_id.is_some() || self.scope_prefix.is_some() || self.unit.is_some();
        let form = match (runtime, ledgers) {
            (true, true) => {
                return Err(ApiError::invalid(
                    "tenant_id, scope_prefix and unit (the ledger form) do not combine with tenant, workspace, app, workflow, agent, toolset",
                ))
            }
            (false, false) => {
                return Err(ApiError::invalid(
                    "At least one of tenant, workspace, app, workflow, agent, toolset is required (or tenant_id, scope_prefix, unit for whole ledgers)",
                ))
            }
            (true, false) => BalanceForm::Runtime,
            (false, true) => BalanceForm::Ledgers,
        };
        let limit = self.limit.unwrap_or_default().0;
        if form == BalanceForm::Ledgers && limit > MAX_ADMIN_PAGE_SIZE {
            return Err(ApiError::invalid(format!(
                "limit: must be an integer between 1 and {MAX_ADMIN_PAGE_SIZE} with tenant_id, scope_prefix or unit"
            )));
        }
        let query = GetBalances {
            actor,
            tenant: self.tenant.or(self.tenant_id),
            filters,
            scope_prefix: self.scope_prefix.map(|p| p.to_lowercase()),
            unit: self.unit.map(Unit::from),
            limit,
            after: self
                .cursor
                .as_deref()
                .map(decode_budget_cursor)
                .transpose()?,
        };
        Ok((query, form))
    }
}

fn idem<T: Serialize>(request: &T, key: &str) -> Idempotency {
    Idempotency {
        key: key.into(),
        fingerprint: fingerprint(request),
    }
}

/// `ReservationCreateRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Reserve `estimate` on every budget the subject names.")]
pub struct ReservationCreateRequest {
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: String,
    pub subject: Subject,
    pub action: Action,
    pub estimate: Amount,
    /// Defaults to the tenant's `default_reservation_ttl_ms` (60000 unless configured),
    /// capped at its `max_reservation_ttl_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1_000, maximum = 86_400_000)]
    pub ttl_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 60_000, default = 5_000)]
    pub grace_period_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overage_policy: Option<WirePolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
    /// v0.1.26: ENFORCE or DISABLED (the same) are accepted; OBSERVE is not supported.
    #[serde(default, skip_serializing)]
    #[schema(pattern = "^(ENFORCE|DISABLED)$")]
    pub observe_mode: Option<String>,
}

impl Validate for ReservationCreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        idempotency_key("idempotency_key", &self.idempotency_key)?;
        check_observe_mode("observe_mode", &self.observe_mode)?;
        self.subject.check("subject")?;
        self.action.check("action")?;
        self.estimate.check("estimate")?;
        if let Some(ttl) = self.ttl_ms {
            range("ttl_ms", ttl, 1_000, 86_400_000)?;
        }
        if let Some(g) = self.grace_period_ms {
            range("grace_period_ms", g, 0, 60_000)?;
        }
        Ok(())
    }
}

impl ReservationCreateRequest {
    pub fn into_command(self, actor: Actor, reservation_id: String) -> ledger::Reserve {
        ledger::Reserve {
            actor,
            idem: idem(&self, &self.idempotency_key),
            reservation_id,
            unit: self.estimate.unit.into(),
            estimate: self.estimate.amount,
            ttl_ms: self.ttl_ms,
            grace_period_ms: self.grace_period_ms.unwrap_or(DEFAULT_GRACE_MS),
            overage_policy: self.overage_policy.map(Into::into),
            dry_run: self.dry_run.unwrap_or(false),
            metadata: metadata_text(&self.metadata),
            subject: self.subject.into(),
            action: self.action.into(),
        }
    }
}

/// `ReservationCreateResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(
    description = "A reservation, or with `dry_run` an evaluation: DENY carries `reason_code` and holds nothing."
)]
pub struct ReservationCreateResponse<'a> {
    #[schema(value_type = DecisionEnum)]
    pub decision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<&'a str>,
    pub affected_scopes: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ttl_ms: Option<i64>,
    pub scope_path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caps: Option<crate::policy::Caps>,
}

impl<'a> ReservationCreateResponse<'a> {
    pub fn new(r: &'a ReserveResult, remaining_ttl_ms: Option<i64>) -> Self {
        ReservationCreateResponse {
            decision: r.decision.wire_name(),
            reservation_id: r.reservation_id.as_deref(),
            affected_scopes: &r.affected_scopes,
            expires_at_ms: r.expires_at_ms,
            remaining_ttl_ms,
            scope_path: &r.scope_path,
            reserved: r.reserved.map(|(u, a)| Amount::new(u, a)),
            balances: balances(&r.balances),
            reason_code: r.reason_code.as_deref(),
            caps: r.caps.as_deref().cloned().map(Into::into),
        }
    }
}

/// `CommitRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Charge the actual amount of a reservation.")]
pub struct CommitRequest {
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: String,
    pub actual: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<StandardMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for CommitRequest {
    fn validate(&self) -> Result<(), ApiError> {
        idempotency_key("idempotency_key", &self.idempotency_key)?;
        self.actual.check("actual")?;
        if let Some(m) = &self.metrics {
            m.check("metrics")?;
        }
        Ok(())
    }
}

impl CommitRequest {
    pub fn into_command(self, actor: Actor, reservation_id: String) -> ledger::Commit {
        ledger::Commit {
            actor,
            idem: idem(&self, &self.idempotency_key),
            reservation_id,
            unit: self.actual.unit.into(),
            actual: self.actual.amount,
            metadata: metadata_text(&self.metadata),
        }
    }
}

/// `CommitResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "What was charged and what flowed back.")]
pub struct CommitResponse<'a> {
    #[schema(value_type = CommittedStatus, inline)]
    pub status: &'static str,
    pub charged: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance<'a>>>,
}

impl<'a> From<&'a CommitResult> for CommitResponse<'a> {
    fn from(r: &'a CommitResult) -> Self {
        CommitResponse {
            status: "COMMITTED",
            charged: Amount::new(r.unit, r.charged),
            released: r.released.map(|a| Amount::new(r.unit, a)),
            balances: balances(&r.balances),
        }
    }
}

/// `ReleaseRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Release a reservation's whole hold.")]
pub struct ReleaseRequest {
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 256)]
    pub reason: Option<String>,
}

impl Validate for ReleaseRequest {
    fn validate(&self) -> Result<(), ApiError> {
        idempotency_key("idempotency_key", &self.idempotency_key)?;
        if let Some(r) = &self.reason {
            max_len("reason", r, 256)?;
        }
        Ok(())
    }
}

impl ReleaseRequest {
    pub fn into_command(self, actor: Actor, reservation_id: String) -> ledger::Release {
        ledger::Release {
            actor,
            idem: idem(&self, &self.idempotency_key),
            reservation_id,
            reason: self.reason,
        }
    }
}

/// `ReleaseResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "What flowed back.")]
pub struct ReleaseResponse<'a> {
    #[schema(value_type = ReleasedStatus, inline)]
    pub status: &'static str,
    pub released: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance<'a>>>,
}

impl<'a> From<&'a ReleaseResult> for ReleaseResponse<'a> {
    fn from(r: &'a ReleaseResult) -> Self {
        ReleaseResponse {
            status: "RELEASED",
            released: Amount::new(r.unit, r.released),
            balances: balances(&r.balances),
        }
    }
}

/// `ReservationExtendRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Move a reservation's expiry later by `extend_by_ms`.")]
pub struct ReservationExtendRequest {
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: String,
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub extend_by_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for ReservationExtendRequest {
    fn validate(&self) -> Result<(), ApiError> {
        idempotency_key("idempotency_key", &self.idempotency_key)?;
        range("extend_by_ms", self.extend_by_ms, 1, 86_400_000)
    }
}

impl ReservationExtendRequest {
    pub fn into_command(self, actor: Actor, reservation_id: String) -> ledger::Extend {
        ledger::Extend {
            actor,
            idem: idem(&self, &self.idempotency_key),
            reservation_id,
            extend_by_ms: self.extend_by_ms,
        }
    }
}

/// `ReservationExtendResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "The reservation's new expiry.")]
pub struct ReservationExtendResponse<'a> {
    #[schema(value_type = ExtendedStatus, inline)]
    pub status: &'static str,
    pub expires_at_ms: i64,
    pub remaining_ttl_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance<'a>>>,
}

impl<'a> ReservationExtendResponse<'a> {
    pub fn new(r: &'a ExtendResult, remaining_ttl_ms: i64) -> Self {
        ReservationExtendResponse {
            status: "ACTIVE",
            expires_at_ms: r.expires_at_ms,
            remaining_ttl_ms,
            balances: balances(&r.balances),
        }
    }
}

/// `DecisionRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Ask whether a spend would be admitted, holding nothing.")]
pub struct DecisionRequest {
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: String,
    pub subject: Subject,
    pub action: Action,
    pub estimate: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for DecisionRequest {
    fn validate(&self) -> Result<(), ApiError> {
        idempotency_key("idempotency_key", &self.idempotency_key)?;
        self.subject.check("subject")?;
        self.action.check("action")?;
        self.estimate.check("estimate")
    }
}

impl DecisionRequest {
    pub fn into_command(self, actor: Actor) -> ledger::Decide {
        ledger::Decide {
            actor,
            idem: idem(&self, &self.idempotency_key),
            unit: self.estimate.unit.into(),
            estimate: self.estimate.amount,
            subject: self.subject.into(),
        }
    }
}

/// `DecisionResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "The decision; DENY carries `reason_code`.")]
pub struct DecisionResponse<'a> {
    #[schema(value_type = DecisionEnum)]
    pub decision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caps: Option<crate::policy::Caps>,
    pub affected_scopes: &'a [String],
}

impl<'a> From<&'a DecideResult> for DecisionResponse<'a> {
    fn from(r: &'a DecideResult) -> Self {
        DecisionResponse {
            decision: r.decision.wire_name(),
            reason_code: r.reason_code.as_deref(),
            caps: r.caps.clone().map(Into::into),
            affected_scopes: &r.affected_scopes,
        }
    }
}

/// `EventCreateRequest`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "Spend that already happened, charged without a reservation.")]
pub struct EventCreateRequest {
    #[schema(min_length = 1, max_length = 256)]
    pub idempotency_key: String,
    pub subject: Subject,
    pub action: Action,
    pub actual: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overage_policy: Option<WirePolicy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<StandardMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub client_time_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Metadata>,
}

impl Validate for EventCreateRequest {
    fn validate(&self) -> Result<(), ApiError> {
        idempotency_key("idempotency_key", &self.idempotency_key)?;
        self.subject.check("subject")?;
        self.action.check("action")?;
        self.actual.check("actual")?;
        if let Some(m) = &self.metrics {
            m.check("metrics")?;
        }
        if let Some(t) = self.client_time_ms {
            non_negative("client_time_ms", t)?;
        }
        Ok(())
    }
}

impl EventCreateRequest {
    pub fn into_command(self, actor: Actor, event_id: String) -> ledger::RecordEvent {
        ledger::RecordEvent {
            actor,
            idem: idem(&self, &self.idempotency_key),
            event_id,
            unit: self.actual.unit.into(),
            actual: self.actual.amount,
            overage_policy: self.overage_policy.map(Into::into),
            subject: self.subject.into(),
        }
    }
}

/// `EventCreateResponse` (201).
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "The applied event.")]
pub struct EventCreateResponse<'a> {
    #[schema(value_type = AppliedStatus, inline)]
    pub status: &'static str,
    pub event_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charged: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance<'a>>>,
}

impl<'a> From<&'a EventResult> for EventCreateResponse<'a> {
    fn from(r: &'a EventResult) -> Self {
        EventCreateResponse {
            status: "APPLIED",
            event_id: &r.event_id,
            charged: r.charged.map(|c| Amount::new(r.unit, c)),
            balances: balances(&r.balances),
        }
    }
}

/// `ReservationDetail`: the same fields as a listing row, with every projection included.
#[derive(Debug, Serialize, ToSchema)]
#[serde(transparent)]
#[schema(description = "One reservation.")]
pub struct ReservationDetail(pub ReservationSummary);

impl From<&Reservation> for ReservationDetail {
    fn from(r: &Reservation) -> Self {
        ReservationDetail(ReservationSummary::new(r, Include::ALL))
    }
}

/// `BalanceResponse`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "A page of balances, in (scope, unit) order.")]
pub struct BalanceResponse<'a> {
    pub balances: Vec<Balance<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

/// `BalanceListResponse`: the admin spec's form, whole ledgers.
#[derive(Debug, Serialize, ToSchema)]
#[schema(description = "A page of whole ledgers, in (scope, unit) order.")]
pub struct BalanceListResponse {
    pub balances: Vec<crate::budget::BudgetLedger>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    pub has_more: bool,
}

/// The answer of `GET /v1/balances`, in the form its query asked for.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Balances<'a> {
    Runtime(BalanceResponse<'a>),
    Ledgers(BalanceListResponse),
}
