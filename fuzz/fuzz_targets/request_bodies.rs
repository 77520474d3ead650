//! Every request body type the server parses: the first byte picks the type, the rest is
//! the body. Parsing must answer a value or an `ApiError`, never panic; a value must be one
//! its validation accepts.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::{parse_body, Validate};
use serde::de::DeserializeOwned;

fn parse<T: DeserializeOwned + Validate>(body: &[u8]) {
    if let Ok(value) = parse_body::<T>(body) {
        assert!(
            value.validate().is_ok(),
            "parse_body returned a value it refuses"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    use protocol::{api_key, auth, budget, bulk, policy, runtime, tenant, webhook};
    match pick % 24 {
        0 => parse::<runtime::ReservationCreateRequest>(body),
        1 => parse::<runtime::CommitRequest>(body),
        2 => parse::<runtime::ReleaseRequest>(body),
        3 => parse::<runtime::ReservationExtendRequest>(body),
        4 => parse::<runtime::DecisionRequest>(body),
        5 => parse::<runtime::EventCreateRequest>(body),
        6 => parse::<tenant::TenantCreateRequest>(body),
        7 => parse::<tenant::TenantUpdateRequest>(body),
        8 => parse::<api_key::ApiKeyCreateRequest>(body),
        9 => parse::<api_key::ApiKeyUpdateRequest>(body),
        10 => parse::<budget::BudgetCreateRequest>(body),
        11 => parse::<budget::BudgetUpdateRequest>(body),
        12 => parse::<budget::BudgetFundingRequest>(body),
        13 => parse::<budget::BudgetStatusTransitionRequest>(body),
        14 => parse::<policy::PolicyCreateRequest>(body),
        15 => parse::<policy::PolicyUpdateRequest>(body),
        16 => parse::<bulk::TenantBulkActionRequest>(body),
        17 => parse::<bulk::BudgetBulkActionRequest>(body),
        18 => parse::<bulk::WebhookBulkActionRequest>(body),
        19 => parse::<webhook::WebhookCreateRequest>(body),
        20 => parse::<webhook::WebhookUpdateRequest>(body),
        21 => parse::<webhook::WebhookSecurityBody>(body),
        22 => parse::<webhook::ReplayRequest>(body),
        _ => parse::<auth::ValidateRequest>(body),
    }
});
