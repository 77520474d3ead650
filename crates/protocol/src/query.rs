//! Query strings, parsed strictly into typed parameter structs. Each struct derives
//! `Deserialize` and `utoipa::IntoParams`, so one type is both the parser and the
//! documentation of an operation's query.
//!
//! Parameters a struct does not declare are ignored (the spec's additive-parameter rule).
//! A declared scalar parameter given twice (`?limit=1&limit=2`) or given empty (`?to=`) is
//! 400 INVALID_REQUEST naming it: picking one of two values, or reading an empty one as
//! absent, would answer a question the client did not ask (except where the spec says an
//! empty one is absent: [`Search`], [`WindowBound`]). Values are trimmed. A list
//! parameter (a `Vec` field) takes a comma-separated list, the parameter repeated, or both;
//! its empty items are skipped, and it takes at most [`MAX_LIST_ITEMS`] items, empty ones
//! counted (a list's length is what was sent, not what was kept).

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{SeqDeserializer, StrDeserializer};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::forward_to_deserialize_any;

use crate::{ApiError, DEFAULT_PAGE_SIZE, MAX_ADMIN_PAGE_SIZE, MAX_PAGE_SIZE};

/// The most items a list parameter takes.
pub(crate) const MAX_LIST_ITEMS: usize = 25;

/// A query parameter's name and every value it was given, in order of appearance.
type Param<'a> = (Cow<'a, str>, Vec<Cow<'a, str>>);

/// Parses a raw query string (`None`: there was none) into `T`.
pub fn parse_query<T: DeserializeOwned>(raw: Option<&str>) -> Result<T, ApiError> {
    let mut params: Vec<Param> = Vec::new();
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match params.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => params.push((name, vec![value])),
        }
    }
    T::deserialize(Params {
        params: params.iter(),
        current: None,
    })
    .map_err(|e| ApiError::invalid(e.0))
}

/// A list's page size, the `limit` parameter: 1 to [`MAX_PAGE_SIZE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSize(pub usize);

impl Default for PageSize {
    fn default() -> Self {
        PageSize(DEFAULT_PAGE_SIZE)
    }
}

impl<'de> de::Deserialize<'de> for PageSize {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;

        impl Visitor<'_> for Text {
            type Value = PageSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an integer between 1 and {MAX_PAGE_SIZE}")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<PageSize, E> {
                match text.parse() {
                    Ok(n) if (1..=MAX_PAGE_SIZE).contains(&n) => Ok(PageSize(n)),
                    _ => Err(E::custom(format_args!(
                        "must be an integer between 1 and {MAX_PAGE_SIZE}"
                    ))),
                }
            }
        }

        deserializer.deserialize_str(Text)
    }
}

/// The `limit` of a governance list (tenants, API keys, budgets): an integer of at least 1.
/// The spec sets these lists no maximum (or one clients exceed: the dashboard asks for up to
/// 2 000 rows), so larger values are clamped to [`MAX_ADMIN_PAGE_SIZE`], as the reference
/// does, rather than refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClampedLimit(pub usize);

impl Default for ClampedLimit {
    fn default() -> Self {
        ClampedLimit(DEFAULT_PAGE_SIZE)
    }
}

impl<'de> de::Deserialize<'de> for ClampedLimit {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;

        impl Visitor<'_> for Text {
            type Value = ClampedLimit;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive integer")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<ClampedLimit, E> {
                // Any positive int64, as documented (larger ones are clamped, not refused).
                match text.parse::<i64>() {
                    Ok(n) if n >= 1 => Ok(ClampedLimit(
                        usize::try_from(n)
                            .map_or(MAX_ADMIN_PAGE_SIZE, |n| n.min(MAX_ADMIN_PAGE_SIZE)),
                    )),
                    _ => Err(E::custom("must be a positive integer")),
                }
            }
        }

        deserializer.deserialize_str(Text)
    }
}

/// The `search` parameter: a free-text, case-insensitive substring, at most 128 characters.
/// Unlike other scalars an empty value is allowed and means "no search" (the spec says so).
/// Held trimmed and lower-cased; `None` when empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search(pub Option<String>);

/// The name [`Values`] recognises to let an empty `search` through.
const SEARCH: &str = "Search";

impl<'de> de::Deserialize<'de> for Search {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let term = |text: &str| {
            // As sent: the bound is on what the client sent, not on what trimming kept.
            if text.chars().count() > 128 {
                return Err("must be at most 128 characters");
            }
            let term = text.trim();
            Ok(Search((!term.is_empty()).then(|| term.to_lowercase())))
        };
        deserialize_text(
            deserializer,
            SEARCH,
            "a search term of at most 128 characters",
            term,
        )
    }
}

/// A bound of a time window (`from`, `to`, `expires_from` … of `GET /v1/reservations`):
/// unlike other scalars, a blank value means the bound is unset (the spec's normative rule:
/// clients render unset variables as `?from=`). Held trimmed; parsed by the listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowBound(pub Option<String>);

/// The name [`Values`] recognises to let a blank window bound through.
const WINDOW_BOUND: &str = "WindowBound";

impl<'de> de::Deserialize<'de> for WindowBound {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bound = |text: &str| {
            let text = text.trim();
            Ok(WindowBound((!text.is_empty()).then(|| text.to_string())))
        };
        deserialize_text(
            deserializer,
            WINDOW_BOUND,
            "an RFC 3339 date-time, or nothing",
            bound,
        )
    }
}

/// A scalar taken exactly as sent, not trimmed: an idempotency key is opaque, and a trimmed
/// one would name another key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verbatim(pub String);

/// The name [`Values`] recognises to hand a value over untrimmed.
const VERBATIM: &str = "Verbatim";

impl<'de> de::Deserialize<'de> for Verbatim {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserialize_text(deserializer, VERBATIM, "a value", |text| {
            Ok(Verbatim(text.to_string()))
        })
    }
}

/// Deserializes a parameter's newtype from its text: asks for the newtype `name` (which
/// [`Values`] may recognise, to hand the text over its own way) and makes the value with
/// `make`, whose error names what is wrong.
pub(crate) fn deserialize_text<'de, D, T>(
    deserializer: D,
    name: &'static str,
    expecting: &'static str,
    make: fn(&str) -> Result<T, &'static str>,
) -> Result<T, D::Error>
where
    D: de::Deserializer<'de>,
{
    struct Text<T> {
        expecting: &'static str,
        make: fn(&str) -> Result<T, &'static str>,
    }

    impl<'de, T> Visitor<'de> for Text<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expecting)
        }

        fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
            d.deserialize_str(self)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
            (self.make)(text).map_err(E::custom)
        }
    }

    deserializer.deserialize_newtype_struct(name, Text { expecting, make })
}

/// The name [`Values`] recognises for a parameter of open-ended tokens (`include`): its
/// values are handed over comma-joined, without the list's bound, since the spec makes any
/// number of unknown or empty tokens harmless.
pub(crate) const TOKENS: &str = "Tokens";

/// The subject-level filters of a query (`workspace` … `toolset`, in that order), each
/// lower-cased with its level's name.
pub(crate) fn level_filters(values: [&Option<String>; 5]) -> Vec<(&'static str, String)> {
    ledger::SCOPE_LEVELS[1..]
        .iter()
        .zip(values)
        .filter_map(|(level, value)| value.as_ref().map(|v| (*level, v.to_lowercase())))
        .collect()
}

/// A parameter-level failure; the message names the parameter.
#[derive(Debug)]
struct QueryError(String);

impl QueryError {
    fn new(message: &str) -> Self {
        QueryError(message.to_string())
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QueryError {}

impl de::Error for QueryError {
    fn custom<T: fmt::Display>(message: T) -> Self {
        QueryError(message.to_string())
    }

    fn missing_field(field: &'static str) -> Self {
        QueryError(format!("{field}: query parameter is required"))
    }
}

/// The whole query, as a map from parameter names to their values.
struct Params<'a, I> {
    params: I,
    /// The parameter whose name was just read: its value comes next.
    current: Option<&'a Param<'a>>,
}

impl<'de, 'a, I: Iterator<Item = &'a Param<'a>>> de::Deserializer<'de> for Params<'a, I> {
    type Error = QueryError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_map(self)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, 'a, I: Iterator<Item = &'a Param<'a>>> MapAccess<'de> for Params<'a, I> {
    type Error = QueryError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, QueryError> {
        let Some(param) = self.params.next() else {
            return Ok(None);
        };
        self.current = Some(param);
        let name: StrDeserializer<QueryError> = param.0.as_ref().into_deserializer();
        seed.deserialize(name).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, QueryError> {
        let Some((name, values)) = self.current.take() else {
            return Err(QueryError::new("a parameter value without its name"));
        };
        seed.deserialize(Values(values))
            .map_err(|e| QueryError(format!("{name}: {e}")))
    }
}

/// The values one parameter was given.
struct Values<'a>(&'a [Cow<'a, str>]);

impl<'a> Values<'a> {
    /// The value of a scalar parameter: exactly one, not blank.
    fn one(&self) -> Result<&'a str, QueryError> {
        match self.0 {
            [value] if value.trim().is_empty() => Err(QueryError::new("must not be empty")),
            [value] => Ok(value.trim()),
            _ => Err(QueryError::new("must be given at most once")),
        }
    }
}

impl<'de, 'a> de::Deserializer<'de> for Values<'a> {
    type Error = QueryError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_str(self.one()?)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        match self.one()? {
            "true" => visitor.visit_bool(true),
            "false" => visitor.visit_bool(false),
            _ => Err(QueryError::new("must be true or false")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, QueryError> {
        match (name, self.0) {
            // `search` and a window's bounds may be empty (no search, no bound), but not
            // repeated.
            (SEARCH | WINDOW_BOUND, [value]) => visitor.visit_str(value),
            // Open-ended tokens: every value, comma-joined, however many.
            (TOKENS, values) => visitor.visit_str(&values.join(",")),
            (VERBATIM, [value]) if value.is_empty() => Err(QueryError::new("must not be empty")),
            (VERBATIM, [value]) => visitor.visit_str(value),
            (VERBATIM, _) => Err(QueryError::new("must be given at most once")),
            _ => visitor.visit_newtype_struct(self),
        }
    }

    /// A list: every comma-separated item of every value, trimmed, empty items skipped; at
    /// most [`MAX_LIST_ITEMS`] items sent.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        let sent: usize = self.0.iter().map(|value| value.split(',').count()).sum();
        if sent > MAX_LIST_ITEMS {
            return Err(QueryError(format!("at most {MAX_LIST_ITEMS} items")));
        }
        let items = self
            .0
            .iter()
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .filter(|item| !item.is_empty());
        let mut seq = SeqDeserializer::new(items);
        let list = visitor.visit_seq(&mut seq)?;
        seq.end()?;
        Ok(list)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, QueryError> {
        let value: StrDeserializer<QueryError> = self.one()?.into_deserializer();
        value.deserialize_enum(name, variants, visitor)
    }

    /// A parameter the struct does not declare: whatever it holds, it is ignored.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct tuple tuple_struct map struct identifier
    }
}

/// `from` / `to` of a history query: RFC 3339 bounds (inclusive), `from` not after `to`.
pub(crate) fn time_window(
    from: &Option<String>,
    to: &Option<String>,
) -> Result<(Option<i64>, Option<i64>), ApiError> {
    let time = |name: &str, value: &Option<String>| {
        value
            .as_deref()
            .map(|v| {
                crate::parse_rfc3339(v).ok_or_else(|| {
                    ApiError::invalid(format!("{name}: must be an RFC 3339 date-time"))
                })
            })
            .transpose()
    };
    let (from_ms, to_ms) = (time("from", from)?, time("to", to)?);
    if let (Some(f), Some(t)) = (from_ms, to_ms) {
        if f > t {
            return Err(ApiError::invalid("from: must not be after to"));
        }
    }
    Ok((from_ms, to_ms))
}

/// A `trace_id` filter: 32 lowercase hex characters.
pub(crate) fn check_trace_id(trace: &Option<String>) -> Result<(), ApiError> {
    if let Some(t) = trace {
        let hex = t.len() == 32 && t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex {
            return Err(ApiError::invalid(
                "trace_id: must be 32 lowercase hex characters",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;
    use crate::WireUnit;

    #[derive(Debug, Default, PartialEq, Deserialize)]
    #[serde(default)]
    struct Probe {
        name: Option<String>,
        limit: Option<PageSize>,
        flag: Option<bool>,
        unit: Option<WireUnit>,
        items: Vec<String>,
        search: Search,
        key: Option<Verbatim>,
    }

    fn probe(raw: &str) -> Result<Probe, String> {
        parse_query(Some(raw)).map_err(|e| e.message)
    }

    #[test]
    fn declared_parameters_are_typed_and_others_ignored() {
        let p = probe("name=%20a%20b&limit=5&flag=true&unit=TOKENS&color=x&color=").unwrap();
        assert_eq!(p.name.as_deref(), Some("a b"));
        assert_eq!(p.limit, Some(PageSize(5)));
        assert_eq!(p.flag, Some(true));
        assert_eq!(p.unit, Some(WireUnit::Tokens));
        assert_eq!(parse_query::<Probe>(None).unwrap(), Probe::default());
    }

    #[test]
    fn a_repeated_or_empty_scalar_is_refused_by_name() {
        for (raw, message) in [
            ("limit=1&limit=2", "limit: must be given at most once"),
            ("name=a&name=a", "name: must be given at most once"),
            ("name=", "name: must not be empty"),
            ("limit=%20", "limit: must not be empty"),
            ("flag=&name=a", "flag: must not be empty"),
            ("unit=", "unit: must not be empty"),
            ("limit=x", "limit: must be an integer between 1 and 200"),
            ("limit=0", "limit: must be an integer between 1 and 200"),
            ("limit=201", "limit: must be an integer between 1 and 200"),
            ("flag=yes", "flag: must be true or false"),
        ] {
            assert_eq!(probe(raw).unwrap_err(), message, "{raw}");
        }
        assert!(probe("unit=GOLD")
            .unwrap_err()
            .starts_with("unit: unknown variant"));
    }

    #[test]
    fn a_list_takes_commas_and_repeats_and_skips_empty_items() {
        let p = probe("items=a,%20b,,&items=c&items=").unwrap();
        assert_eq!(p.items, ["a", "b", "c"]);
        assert!(probe("items=").unwrap().items.is_empty());
    }

    #[test]
    fn a_list_takes_at_most_25_items_sent_empty_ones_too() {
        let items = |n: usize, item: &str| vec![item; n].join(",");
        assert_eq!(
            probe(&format!("items={}", items(25, "a")))
                .unwrap()
                .items
                .len(),
            25
        );
        for query in [
            format!("items={}", items(26, "a")),
            format!("items={}", items(26, "")),
            format!("items={}&items={}", items(13, "a"), items(13, "")),
        ] {
            let e = probe(&query).unwrap_err();
            assert_eq!(e, "items: at most 25 items", "{query}");
        }
    }

    #[test]
    fn a_verbatim_value_is_not_trimmed_and_a_bound_counts_what_was_sent() {
        let p = probe("key=%20k%20&search=%20Ab%20").unwrap();
        assert_eq!(p.key, Some(Verbatim(" k ".into())));
        assert_eq!(p.search, Search(Some("ab".into())));
        for (raw, message) in [
            ("key=", "key: must not be empty"),
            ("key=a&key=b", "key: must be given at most once"),
        ] {
            assert_eq!(probe(raw).unwrap_err(), message, "{raw}");
        }
        let padded = format!("search=a{}", "%20".repeat(128));
        assert_eq!(
            probe(&padded).unwrap_err(),
            "search: must be at most 128 characters"
        );
    }

    #[test]
    fn a_missing_required_parameter_is_named() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Required {
            scope: String,
        }
        let e = parse_query::<Required>(Some("other=1")).unwrap_err();
        assert_eq!(e.message, "scope: query parameter is required");
    }
}
