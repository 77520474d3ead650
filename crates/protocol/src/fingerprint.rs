//! Request fingerprints for idempotency: SHA-256 of the request's RFC 8785 (JCS) canonical
//! JSON, with one deliberate difference: integers are written exactly. JCS writes every
//! number as an IEEE double, so two amounts that differ only beyond 2^53 would share a
//! fingerprint, and a changed retry would be replayed instead of refused. Below 2^53 (and for
//! every non-integer number) the bytes are JCS's, so fingerprints stay stable.

use std::io::{self, Write};

use serde::Serialize;
use serde_json::{Number, Value};
use sha2::{Digest, Sha256};

/// Fingerprints a parsed request. Key order and whitespace in the client's JSON do not
/// matter; the values do.
pub fn fingerprint<T: Serialize>(request: &T) -> [u8; 32] {
    let mut hasher = HashWriter(Sha256::new());
    // A parsed request always converts and writes: every field came from JSON, and the hasher
    // never fails.
    if let Ok(value) = serde_json::to_value(request) {
        let _ = write_canonical(&value, &mut hasher);
    }
    hasher.0.finalize().into()
}

/// Writes `value` canonically: no whitespace, object members sorted by the UTF-16 code units
/// of their names, strings escaped as JSON.stringify does (serde_json's escaping is the same),
/// numbers as described in the module documentation.
fn write_canonical(value: &Value, out: &mut impl Write) -> io::Result<()> {
    match value {
        Value::Null => out.write_all(b"null"),
        Value::Bool(b) => out.write_all(if *b { b"true" } else { b"false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => serde_json::to_writer(&mut *out, s).map_err(io::Error::other),
        Value::Array(items) => {
            out.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                write_canonical(item, out)?;
            }
            out.write_all(b"]")
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.write_all(b"{")?;
            for (i, (name, member)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                serde_json::to_writer(&mut *out, name).map_err(io::Error::other)?;
                out.write_all(b":")?;
                write_canonical(member, out)?;
            }
            out.write_all(b"}")
        }
    }
}

fn write_number(n: &Number, out: &mut impl Write) -> io::Result<()> {
    if let Some(i) = n.as_i64() {
        write!(out, "{i}")
    } else if let Some(u) = n.as_u64() {
        write!(out, "{u}")
    } else {
        let f = n.as_f64().unwrap_or(0.0);
        out.write_all(ryu_js::Buffer::new().format_finite(f).as_bytes())
    }
}

/// Feeds written bytes straight into the hash (no intermediate buffer).
struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn canonical(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        write_canonical(value, &mut out).expect("writes to a Vec");
        out
    }

    /// JSON values whose integers fit a double exactly, with awkward strings and names.
    fn json() -> impl Strategy<Value = Value> {
        let text = "[a-zA-Z0-9 \"\\\\/\\x00-\\x1f\\x7f\u{e9}\u{2028}\u{ffff}\u{1f600}]{0,8}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-(1i64 << 53)..(1i64 << 53)).prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            text.prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(text, inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Byte for byte what the RFC 8785 implementation writes, wherever JCS is exact.
        #[test]
        fn canonical_form_is_jcs(value in json()) {
            let jcs = serde_json_canonicalizer::to_vec(&value).expect("JCS");
            prop_assert_eq!(canonical(&value), jcs);
        }
    }

    #[test]
    fn integers_beyond_two_to_the_53_stay_distinct() {
        let a = serde_json::json!({"amount": 9_007_199_254_740_993_i64});
        let b = serde_json::json!({"amount": 9_007_199_254_740_992_i64});
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(canonical(&a), br#"{"amount":9007199254740993}"#);
    }

    #[test]
    fn member_order_and_whitespace_do_not_matter() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": [true, null]}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{"a":[true,null],"b":1}"#).expect("json");
        assert_eq!(fingerprint(&a), fingerprint(&b));
    }
}
