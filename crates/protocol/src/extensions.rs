//! Fields of the v0.1.26 extensions this server does not implement, and what it does with
//! each. Where the spec says a server without the extension MUST ignore a field
//! (`Action.policy_keys`, the `observe_mode` filters of tenant lists and bulk filters), it
//! is accepted and ignored. The other extension fields are accepted with the values that
//! mean what this server already does (`observe_mode` ENFORCE or its alias DISABLED, empty
//! quota and access lists); any other value is refused with 400 naming the field, since
//! ignoring it would silently do something else than asked: spend a reservation the caller
//! only wanted observed, or leave a quota unenforced that an operator believes is in force.
//! None of them is stored or part of a request's fingerprint.

use serde_json::Value;

use crate::ApiError;

/// `observe_mode`: only its enforcing values.
pub(crate) fn check_observe_mode(field: &str, value: &Option<String>) -> Result<(), ApiError> {
    match value.as_deref() {
        None | Some("ENFORCE") | Some("DISABLED") => Ok(()),
        Some("OBSERVE") => Err(ApiError::invalid(format!(
            "{field}: OBSERVE is not supported by this server (v0.1.25); use dry_run to evaluate without reserving"
        ))),
        Some(other) => Err(ApiError::invalid(format!(
            "{field}: unknown value '{other}' (expected one of DISABLED, OBSERVE, ENFORCE)"
        ))),
    }
}

/// A policy's quota and access-control lists, by field name: only empty ones.
pub(crate) fn check_unenforced_lists<const N: usize>(
    lists: [(&str, &Option<Vec<Value>>); N],
) -> Result<(), ApiError> {
    match lists
        .into_iter()
        .find(|(_, list)| list.as_ref().is_some_and(|items| !items.is_empty()))
    {
        Some((field, _)) => Err(ApiError::invalid(format!(
            "{field}: action quotas and action-kind access control are not supported by this server (v0.1.25); only an empty list is accepted"
        ))),
        None => Ok(()),
    }
}
