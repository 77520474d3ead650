//! How the protocol spells the ledger's enum values. The ledger's own vocabulary is its
//! variants; the upper-case strings (and the reservation list's `sort_by` names) are the
//! wire's, so they live here, beside the types that put them in JSON and the schemas that
//! document them.
//!
//! Four ledger enums keep their spelling in `ledger`: `Unit`, `BudgetStatus`,
//! `ReservationStatus` and `Permission`. The ledger's refusal messages name their values
//! (`"Reservation already finalized with status COMMITTED"`, `"unit TOKENS is not …"`),
//! and the permission check matches the `:read` / `:write` suffixes of a permission's name.

use ledger::{
    ApiKeySort, ApiKeyStatus, AuditSort, BudgetSort, Decision, DeliveryStatus, EventSort,
    ExpiryPolicy, FundingOp, PolicyStatus, RolloverPolicy, SortBy, TenantSort, TenantStatus,
    WebhookSort, WebhookStatus,
};

use crate::ApiError;

/// An enum whose values have a fixed spelling on the wire.
pub trait WireName: Copy + Sized + 'static {
    /// Every value's spelling, in declaration order (the schemas' `enum` lists).
    const NAMES: &'static [&'static str];

    fn wire_name(self) -> &'static str;

    /// The value spelled `s`, exactly (case-sensitive, as the spec's enums are).
    fn from_wire_name(s: &str) -> Option<Self>;
}

/// `value` spelled as one of `T`'s values, else 400 naming `field` and the values it takes.
pub(crate) fn parse_wire<T: WireName>(field: &str, value: &str) -> Result<T, ApiError> {
    T::from_wire_name(value).ok_or_else(|| {
        ApiError::invalid(format!(
            "{field}: unknown value '{value}' (expected one of {})",
            T::NAMES.join(", ")
        ))
    })
}

/// Declares each value's spelling once; `wire_name` and `from_wire_name` are the two
/// directions of the same table.
macro_rules! wire_names {
    ($($ty:ident { $($variant:ident => $name:literal),+ $(,)? })*) => {$(
        impl WireName for $ty {
            const NAMES: &'static [&'static str] = &[$($name),+];

            fn wire_name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            fn from_wire_name(s: &str) -> Option<Self> {
                match s {
                    $($name => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }
    )*};
}

wire_names! {
    Decision { Allow => "ALLOW", AllowWithCaps => "ALLOW_WITH_CAPS", Deny => "DENY" }
    TenantStatus { Active => "ACTIVE", Suspended => "SUSPENDED", Closed => "CLOSED" }
    ExpiryPolicy {
        AutoRelease => "AUTO_RELEASE",
        ManualCleanup => "MANUAL_CLEANUP",
        GraceOnly => "GRACE_ONLY",
    }
    RolloverPolicy {
        None => "NONE",
        CarryForward => "CARRY_FORWARD",
        CapAtAllocated => "CAP_AT_ALLOCATED",
    }
    FundingOp {
        Credit => "CREDIT",
        Debit => "DEBIT",
        Reset => "RESET",
        ResetSpent => "RESET_SPENT",
        RepayDebt => "REPAY_DEBT",
    }
    ApiKeyStatus { Active => "ACTIVE", Revoked => "REVOKED", Expired => "EXPIRED" }
    PolicyStatus { Active => "ACTIVE", Disabled => "DISABLED" }
    SortBy {
        ReservationId => "reservation_id",
        Tenant => "tenant",
        ScopePath => "scope_path",
        Status => "status",
        Reserved => "reserved",
        CreatedAt => "created_at_ms",
        ExpiresAt => "expires_at_ms",
    }
    BudgetSort {
        TenantId => "tenant_id",
        Scope => "scope",
        Unit => "unit",
        Status => "status",
        CommitOveragePolicy => "commit_overage_policy",
        Utilization => "utilization",
        Debt => "debt",
    }
    TenantSort { TenantId => "tenant_id", Name => "name", Status => "status", CreatedAt => "created_at" }
    EventSort {
        EventType => "event_type",
        Category => "category",
        Scope => "scope",
        TenantId => "tenant_id",
        Timestamp => "timestamp",
    }
    WebhookSort {
        Url => "url",
        TenantId => "tenant_id",
        Status => "status",
        ConsecutiveFailures => "consecutive_failures",
    }
    WebhookStatus { Active => "ACTIVE", Paused => "PAUSED", Disabled => "DISABLED" }
    DeliveryStatus {
        Pending => "PENDING",
        Success => "SUCCESS",
        Failed => "FAILED",
        Retrying => "RETRYING",
    }
    AuditSort {
        Timestamp => "timestamp",
        Operation => "operation",
        ResourceType => "resource_type",
        TenantId => "tenant_id",
        KeyId => "key_id",
        Status => "status",
    }
    ApiKeySort {
        KeyId => "key_id",
        Name => "name",
        TenantId => "tenant_id",
        Status => "status",
        CreatedAt => "created_at",
        ExpiresAt => "expires_at",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each table round-trips and names every value once: a variant added to the ledger
    /// without a spelling fails to compile (`match` is exhaustive), a duplicated or
    /// mistyped spelling fails here.
    fn round_trips<T: WireName + PartialEq + std::fmt::Debug>() {
        for name in T::NAMES {
            let value = T::from_wire_name(name).unwrap_or_else(|| panic!("{name} parses"));
            assert_eq!(value.wire_name(), *name);
        }
        let mut names = T::NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), T::NAMES.len(), "spellings are distinct");
        assert_eq!(
            T::from_wire_name(&T::NAMES[0].to_lowercase())
                .filter(|_| { T::NAMES[0].chars().any(|c| c.is_ascii_uppercase()) }),
            None,
            "spellings are case-sensitive"
        );
    }

    #[test]
    fn every_table_round_trips() {
        round_trips::<Decision>();
        round_trips::<TenantStatus>();
        round_trips::<ExpiryPolicy>();
        round_trips::<RolloverPolicy>();
        round_trips::<FundingOp>();
        round_trips::<ApiKeyStatus>();
        round_trips::<PolicyStatus>();
        round_trips::<SortBy>();
        round_trips::<TenantSort>();
        round_trips::<AuditSort>();
        round_trips::<EventSort>();
        round_trips::<WebhookSort>();
        round_trips::<WebhookStatus>();
        round_trips::<DeliveryStatus>();
        round_trips::<BudgetSort>();
        round_trips::<ApiKeySort>();
    }
}
