//! Parsing and validation: every failure names the field.

use serde::de::DeserializeOwned;

use crate::ApiError;

/// Field-level checks beyond what the JSON types enforce (lengths, ranges, patterns).
pub trait Validate {
    fn validate(&self) -> Result<(), ApiError>;
}

/// Parses a JSON body into `T` (unknown fields rejected) and validates it. Errors name the
/// offending field path, e.g. `estimate.amount: invalid type: string "x", expected i64`.
pub fn parse_body<T: DeserializeOwned + Validate>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid("Request body is required"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let what = inner.to_string();
        // serde_json appends " at line L column C": useful for syntax errors only.
        let what = match inner.classify() {
            serde_json::error::Category::Data => what
                .rsplit_once(" at line ")
                .map_or(what.clone(), |(w, _)| w.to_string()),
            _ => what,
        };
        if path == "." || inner.is_syntax() || inner.is_eof() {
            ApiError::invalid(format!("Malformed request body: {what}"))
        } else {
            ApiError::invalid(format!("{path}: {what}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::invalid(format!("Malformed request body: {e}")))?;
    value.validate()?;
    Ok(value)
}

pub(crate) fn max_len(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.chars().count() > max {
        return Err(ApiError::invalid(format!(
            "{field}: must be at most {max} characters"
        )));
    }
    Ok(())
}

pub(crate) fn len_between(
    field: &str,
    value: &str,
    min: usize,
    max: usize,
) -> Result<(), ApiError> {
    let n = value.chars().count();
    if n < min || n > max {
        return Err(ApiError::invalid(format!(
            "{field}: must be {min} to {max} characters"
        )));
    }
    Ok(())
}

pub(crate) fn range(field: &str, value: i64, min: i64, max: i64) -> Result<(), ApiError> {
    if value < min || value > max {
        return Err(ApiError::invalid(format!(
            "{field}: must be between {min} and {max}, got {value}"
        )));
    }
    Ok(())
}

pub(crate) fn non_negative(field: &str, value: i64) -> Result<(), ApiError> {
    if value < 0 {
        return Err(ApiError::invalid(format!(
            "{field}: must be >= 0, got {value}"
        )));
    }
    Ok(())
}

/// Idempotency keys: 1–256 characters.
pub(crate) fn idempotency_key(field: &str, key: &str) -> Result<(), ApiError> {
    len_between(field, key, 1, 256)
}
