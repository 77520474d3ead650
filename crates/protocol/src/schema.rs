//! OpenAPI schemas for wire values that are not Rust types of their own: the string enums
//! the response types carry as `&'static str` (their values come from the same tables that
//! spell them, `wire.rs` or the domain enums' `as_str`, so the document cannot drift from what is emitted), the string enums requests
//! carry as `String` (validated against the same domain enums), and `SignedAmount`.
//!
//! These types exist for documentation only: nothing is ever built from them.

use ledger::{
    ApiKeySort, ApiKeyStatus as DomainApiKeyStatus, AuditSort, BudgetSort,
    BudgetStatus as DomainBudgetStatus, Decision, ExpiryPolicy, FundingOp,
    Permission as DomainPermission, PolicyStatus as DomainPolicyStatus,
    ReservationStatus as DomainReservationStatus, RolloverPolicy as DomainRolloverPolicy, SortBy,
    TenantSort, TenantStatus as DomainTenantStatus,
};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use crate::{WireName, WireUnit};

fn string_enum(description: &str, values: &[&'static str]) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .enum_values(Some(values.iter().copied()))
        .into()
}

/// Declares a documentation-only string enum: `Name => "description", values`.
macro_rules! string_enum {
    ($($(#[$meta:meta])* $name:ident => $description:literal, $values:expr;)*) => {$(
        $(#[$meta])*
        #[doc = $description]
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                string_enum($description, &$values)
            }
        }

        impl ToSchema for $name {}
    )*};
}

string_enum! {
    DecisionEnum => "The admission decision.",
        *Decision::NAMES;
    ReservationStatus => "A reservation's lifecycle state.",
        DomainReservationStatus::ALL.map(DomainReservationStatus::as_str);
    Permission => "A permission an API key can hold.",
        DomainPermission::ALL.map(DomainPermission::as_str);
    TenantStatus => "A tenant's lifecycle state.",
        *DomainTenantStatus::NAMES;
    ReservationExpiryPolicy => "What happens to a tenant's reservations that are never settled.",
        *ExpiryPolicy::NAMES;
    BudgetStatus => "A budget's state.",
        [DomainBudgetStatus::Active, DomainBudgetStatus::Frozen, DomainBudgetStatus::Closed]
            .map(DomainBudgetStatus::as_str);
    RolloverPolicy => "How unused budget is treated at a period boundary (recorded and reported).",
        *DomainRolloverPolicy::NAMES;
    FundingOperation => "A funding operation.",
        *FundingOp::NAMES;
    ApiKeyStatus => "An API key's state (EXPIRED once `expires_at` has passed).",
        *DomainApiKeyStatus::NAMES;
    TenantSortBy => "The field tenants are listed by.", *TenantSort::NAMES;
    AuditSortBy => "The field audit entries are listed by.", *AuditSort::NAMES;
    BudgetSortBy => "The field budgets are sorted by.", *BudgetSort::NAMES;
    ApiKeySortBy => "The field API keys are listed by.", *ApiKeySort::NAMES;
    ReservationSortBy => "The field reservations are listed by.",
        *SortBy::NAMES;
    SortDirection => "The direction of a listing.", ["asc", "desc"];
    PolicyStatus => "A policy's state: a DISABLED policy does not apply.",
        *DomainPolicyStatus::NAMES;
    CommittedStatus => "Always COMMITTED.", ["COMMITTED"];
    ReleasedStatus => "Always RELEASED.", ["RELEASED"];
    ExtendedStatus => "Always ACTIVE: the reservation is still open.", ["ACTIVE"];
    AppliedStatus => "Always APPLIED.", ["APPLIED"];
}

/// `SignedAmount`: an amount that can be negative (`remaining` under overdraft).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SignedAmount {
    unit: WireUnit,
    amount: i64,
}
