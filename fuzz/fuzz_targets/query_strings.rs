//! Every query string the server parses, through to the operation it becomes (cursors
//! decoded, filters checked): the first byte picks the operation, the rest is the raw query.
//! Each step must answer a value or an `ApiError`, never panic.

#![no_main]

use ledger::Actor;
use libfuzzer_sys::fuzz_target;
use protocol::parse_query;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, raw)) = data.split_first() else {
        return;
    };
    let Ok(raw) = std::str::from_utf8(raw) else {
        return;
    };
    let raw = Some(raw);
    let actor = || Actor::ApiKey([7; 32]);
    use protocol::{api_key, audit, budget, listing, policy, runtime, tenant, webhook};
    match pick % 15 {
        0 => {
            if let Ok(p) = parse_query::<runtime::BalanceParams>(raw) {
                let _ = p.into_query(actor());
            }
        }
        1 => {
            if let Ok(p) = parse_query::<api_key::RevokeParams>(raw) {
                let _ = p.into_reason();
            }
        }
        2 => {
            if let Ok(p) = parse_query::<api_key::ApiKeyListParams>(raw) {
                let _ = p.into_list(Actor::Admin);
            }
        }
        3 => {
            if let Ok(p) = parse_query::<audit::AuditListParams>(raw) {
                let _ = p.into_query();
            }
        }
        4 => {
            if let Ok(p) = parse_query::<tenant::TenantListParams>(raw) {
                let _ = p.into_list(Actor::Admin);
            }
        }
        5 => {
            if let Ok(p) = parse_query::<budget::BudgetListParams>(raw) {
                let _ = p.into_list(actor());
            }
        }
        6 => {
            let _ = parse_query::<budget::FundParams>(raw);
        }
        7 => {
            if let Ok(p) = parse_query::<webhook::EventListParams>(raw) {
                let _ = p.into_query(Some("acme".into()));
            }
        }
        8 => {
            let _ = parse_query::<webhook::TenantEventListParams>(raw);
        }
        9 => {
            let _ = parse_query::<webhook::WebhookListParams>(raw);
        }
        10 => {
            let _ = parse_query::<webhook::TenantWebhookListParams>(raw);
        }
        11 => {
            let _ = parse_query::<webhook::WebhookOwnerParams>(raw);
        }
        12 => {
            if let Ok(p) = parse_query::<webhook::DeliveryListParams>(raw) {
                let _ = p.into_query("whsub_1".into());
            }
        }
        13 => {
            if let Ok(p) = parse_query::<listing::ReservationListParams>(raw) {
                let _ = p.into_query(actor());
            }
        }
        _ => {
            if let Ok(p) = parse_query::<policy::PolicyListParams>(raw) {
                let _ = p.into_query();
            }
        }
    }
});
