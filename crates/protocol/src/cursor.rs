//! Opaque cursors for pages ordered by `(scope, unit)`.

use ledger::Unit;

use crate::ApiError;

pub fn encode_budget_cursor(scope: &str, unit: Unit) -> String {
    hex::encode(format!("{scope}\n{}", unit.as_str()))
}

pub fn decode_budget_cursor(cursor: &str) -> Result<(String, Unit), ApiError> {
    let invalid = || {
        ApiError::invalid(
            "cursor: not valid for this result set; restart pagination without a cursor",
        )
    };
    let bytes = hex::decode(cursor).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    let (scope, unit) = text.split_once('\n').ok_or_else(invalid)?;
    let unit = Unit::parse(unit).ok_or_else(invalid)?;
    Ok((scope.to_string(), unit))
}
