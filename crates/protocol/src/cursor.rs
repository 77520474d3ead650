//! Opaque cursors: for pages ordered by `(scope, unit)`, and for sorted lists.

use ledger::{Position, SortValue, SortedPage, Unit, Window};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{parse_wire, ApiError, WireName};

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

/// A cursor of a sorted list: valid only for the order and the filters it was issued
/// under, so a client that changes either mid-walk is told to restart instead of getting
/// rows of another result set.
#[derive(Serialize, Deserialize)]
struct SortedCursor {
    /// Sort field and direction.
    s: String,
    d: bool,
    /// Hash of the filters.
    f: String,
    v: SortValue,
    i: String,
}

/// What a sorted cursor is bound to: the sort field's wire name, the direction, and the
/// filters (any `Debug` rendering that differs when they differ).
pub(crate) struct Binding<'a> {
    pub sort_by: &'a str,
    pub descending: bool,
    pub filters: String,
}

fn filter_hash(filters: &str) -> String {
    hex::encode(&Sha256::digest(filters.as_bytes())[..12])
}

pub(crate) fn encode_sorted_cursor(binding: &Binding, (value, id): Position) -> String {
    let cursor = SortedCursor {
        s: binding.sort_by.into(),
        d: binding.descending,
        f: filter_hash(&binding.filters),
        v: value,
        i: id,
    };
    hex::encode(serde_json::to_vec(&cursor).unwrap_or_default())
}

/// The position a cursor continues from, if it was issued under `binding`; `text` says
/// whether the sort field's values are text (else integers).
pub(crate) fn decode_sorted_cursor(
    raw: &str,
    binding: &Binding,
    text: bool,
) -> Result<Position, ApiError> {
    let invalid = |why: &str| {
        ApiError::invalid(format!(
            "cursor: {why}; restart pagination without a cursor"
        ))
    };
    let bytes = hex::decode(raw).map_err(|_| invalid("malformed"))?;
    let c: SortedCursor = serde_json::from_slice(&bytes).map_err(|_| invalid("malformed"))?;
    if c.s != binding.sort_by || c.d != binding.descending || c.f != filter_hash(&binding.filters) {
        return Err(invalid("issued for a different sort or filters"));
    }
    if matches!(c.v, SortValue::Text(_)) != text {
        return Err(invalid("malformed"));
    }
    Ok((c.v, c.i))
}

/// `sort_dir`: `asc` or `desc`, descending when absent (the spec's default).
pub(crate) fn descending(sort_dir: Option<&str>) -> Result<bool, ApiError> {
    match sort_dir {
        None | Some("desc") => Ok(true),
        Some("asc") => Ok(false),
        Some(_) => Err(ApiError::invalid("sort_dir: must be asc or desc")),
    }
}

/// A sorted list's order as its query asks for it: the field, the page's window and the
/// binding its cursors carry.
pub(crate) struct SortedOrder<S> {
    pub sort_by: S,
    pub window: Window,
    pub binding: Binding<'static>,
}

/// The request of a sorted list: its `sort_by` (or `default`), `sort_dir`, `cursor` and
/// `limit`, and `filters` (rendered to bind its cursors). `text` says which fields sort as
/// text.
pub(crate) struct SortedRequest<'a, S> {
    pub sort_by: Option<&'a str>,
    pub default: S,
    pub sort_dir: Option<&'a str>,
    pub cursor: Option<&'a str>,
    pub limit: usize,
    pub filters: String,
    pub text: fn(S) -> bool,
}

impl<S: WireName> SortedRequest<'_, S> {
    pub fn parse(self) -> Result<SortedOrder<S>, ApiError> {
        let sort_by = self
            .sort_by
            .map(|s| parse_wire::<S>("sort_by", s))
            .transpose()?
            .unwrap_or(self.default);
        let descending = descending(self.sort_dir)?;
        let binding = Binding {
            sort_by: sort_by.wire_name(),
            descending,
            filters: self.filters,
        };
        let after = self
            .cursor
            .map(|raw| decode_sorted_cursor(raw, &binding, (self.text)(sort_by)))
            .transpose()?;
        Ok(SortedOrder {
            sort_by,
            window: Window {
                descending,
                after,
                limit: self.limit,
            },
            binding,
        })
    }
}

/// What a list's next-page cursor is issued from, kept from the query to the response: the
/// binding of a sorted order, or nothing when the cursor is the last row's address (the
/// budget list without `sort_by`).
pub struct NextPage(pub(crate) Option<Binding<'static>>);

impl NextPage {
    /// The cursor after `position` (a history page's last row, when more follow).
    pub(crate) fn after(&self, position: Option<Position>) -> Option<String> {
        Some(encode_sorted_cursor(self.0.as_ref()?, position?))
    }

    /// The cursor of the page after `page` in a sorted order, when there is one.
    pub fn sorted<T>(&self, page: &SortedPage<T>) -> Option<String> {
        let binding = self.0.as_ref()?;
        if !page.page.has_more {
            return None;
        }
        page.last.clone().map(|p| encode_sorted_cursor(binding, p))
    }
}
