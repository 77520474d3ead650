//! Parsing and validation: every failure names the field. Field names are taken as
//! `Display` (a `format_args!` path is formatted only when a check fails, so a valid request
//! allocates nothing for its checks).

use std::fmt::Display;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{parse_rfc3339, ApiError};

/// Field-level checks beyond what the JSON types enforce (lengths, ranges, patterns).
pub trait Validate {
    /// Top-level fields an explicit `null` clears (a PATCH's optional fields, which the
    /// official dashboard sends as `null` when an operator empties them); every other
    /// `null` is refused.
    const CLEARABLE: &'static [&'static str] = &[];

    fn validate(&self) -> Result<(), ApiError>;
}

/// A field that may be absent (`None`), `null` (`Some(None)`: clear it) or a value; with
/// `#[serde(default, deserialize_with = "nullable")]` and its name in
/// [`Validate::CLEARABLE`].
pub fn nullable<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    serde::Deserialize::deserialize(deserializer).map(Some)
}

/// Parses a JSON body into `T` (unknown fields rejected) and validates it. Errors name the
/// offending field path, e.g. `estimate.amount: invalid type: string "x", expected i64`.
pub fn parse_body<T: DeserializeOwned + Validate>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid("Request body is required"));
    }
    // Only a body that contains `null` somewhere needs the slower tree walk that finds
    // explicit nulls; every other body is deserialized straight from its bytes.
    let value: T = if contains(body, b"null") {
        let json: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid(format!("Malformed request body: {e}")))?;
        reject_nulls(&json, "", T::CLEARABLE)?;
        serde_path_to_error::deserialize(json).map_err(field_error)?
    } else {
        // The common case, without the path tracking; only a body that fails is parsed
        // again with it, to name the offending field.
        match serde_json::from_slice(body) {
            Ok(value) => value,
            Err(_) => return Err(located_error::<T>(body)),
        }
    };
    value.validate()?;
    Ok(value)
}

/// The error of a body that does not parse as `T`, naming the field where it failed.
fn located_error<T: DeserializeOwned>(body: &[u8]) -> ApiError {
    let mut de = serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Err(e) => field_error(e),
        Ok(_) => match de.end() {
            Err(e) => ApiError::invalid(format!("Malformed request body: {e}")),
            Ok(()) => ApiError::invalid("Malformed request body"),
        },
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A deserialization error, named by the field path where it happened.
fn field_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
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
}

/// No schema field is nullable: an explicit `null` is a wrong type, not an absent field,
/// but for the body's `clearable` fields. Open objects (`metadata`, `metrics.custom`) may
/// hold anything.
fn reject_nulls(value: &Value, path: &str, clearable: &[&str]) -> Result<(), ApiError> {
    match value {
        Value::Null => Err(ApiError::invalid(format!(
            "{}: must not be null (omit the field instead)",
            if path.is_empty() { "body" } else { path }
        ))),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            let child = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match (k.as_str(), v) {
                // The open object itself must be an object; what it holds is the client's.
                ("metadata" | "custom", Value::Object(_)) => Ok(()),
                (k, Value::Null) if path.is_empty() && clearable.contains(&k) => Ok(()),
                _ => reject_nulls(v, &child, &[]),
            }
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| reject_nulls(v, &format!("{path}[{i}]"), &[])),
        _ => Ok(()),
    }
}

pub(crate) fn max_len(field: impl Display, value: &str, max: usize) -> Result<(), ApiError> {
    if value.chars().count() > max {
        return Err(ApiError::invalid(format!(
            "{field}: must be at most {max} characters"
        )));
    }
    Ok(())
}

pub(crate) fn len_between(
    field: impl Display,
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

pub(crate) fn range(field: impl Display, value: i64, min: i64, max: i64) -> Result<(), ApiError> {
    if value < min || value > max {
        return Err(ApiError::invalid(format!(
            "{field}: must be between {min} and {max}, got {value}"
        )));
    }
    Ok(())
}

pub(crate) fn non_negative(field: impl Display, value: i64) -> Result<(), ApiError> {
    if value < 0 {
        return Err(ApiError::invalid(format!(
            "{field}: must be >= 0, got {value}"
        )));
    }
    Ok(())
}

/// Idempotency keys: 1–256 characters.
pub(crate) fn idempotency_key(field: impl Display, key: &str) -> Result<(), ApiError> {
    len_between(field, key, 1, 256)
}

/// A wire enum value, parsed by `parse`; `allowed` lists the values for the error message.
pub(crate) fn parse_enum<T>(
    field: &str,
    value: &str,
    parse: impl Fn(&str) -> Option<T>,
    allowed: &str,
) -> Result<T, ApiError> {
    parse(value).ok_or_else(|| {
        ApiError::invalid(format!(
            "{field}: unknown value '{value}' (expected one of {allowed})"
        ))
    })
}

/// An optional RFC 3339 date-time field, as epoch milliseconds.
pub(crate) fn timestamp(field: &str, value: &Option<String>) -> Result<Option<i64>, ApiError> {
    value
        .as_deref()
        .map(|v| {
            parse_rfc3339(v)
                .ok_or_else(|| ApiError::invalid(format!("{field}: not an RFC 3339 date-time")))
        })
        .transpose()
}
