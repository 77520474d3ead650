//! Request fingerprints for idempotency: SHA-256 of the request's RFC 8785 (JCS) canonical
//! JSON, with one deliberate difference: integers are written exactly. JCS writes every
//! number as an IEEE double, so two amounts that differ only beyond 2^53 would share a
//! fingerprint, and a changed retry would be replayed instead of refused. Below 2^53 (and for
//! every non-integer number) the bytes are JCS's, so fingerprints stay stable.
//!
//! The canonical form is written straight from the request's `Serialize` implementation, in
//! the shape `serde_json` would give it (the same representation of options, enums, maps and
//! bytes), without building a `serde_json::Value` first: every request pays for a
//! fingerprint, and the intermediate tree was most of its cost. The members of each object
//! are written into a per-thread scratch buffer as they come, then emitted sorted in place.

use std::cell::Cell;
use std::cmp::Ordering;
use std::fmt::{self, Display};
use std::ops::Range;

use serde::ser::{self, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// Fingerprints a parsed request. Key order and whitespace in the client's JSON do not
/// matter; the values do.
pub fn fingerprint<T: Serialize + ?Sized>(request: &T) -> [u8; 32] {
    SCRATCH.with(|cell| {
        let mut scratch = cell.take();
        scratch.clear();
        // A parsed request always serializes: every value came from JSON. Should one not, it
        // gets the fingerprint of nothing, as consistently as any other.
        if request.serialize(&mut scratch).is_err() {
            scratch.clear();
        }
        let digest = Sha256::digest(&scratch.out).into();
        // An unusually large request does not keep its buffer for the thread's lifetime.
        if scratch.out.capacity() <= KEEP_SCRATCH_BYTES {
            cell.set(scratch);
        }
        digest
    })
}

const KEEP_SCRATCH_BYTES: usize = 64 * 1024;

thread_local! {
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// The canonical bytes being written, and the members of every object still open.
#[derive(Default)]
struct Scratch {
    out: Vec<u8>,
    members: Vec<Member>,
}

/// One object member: its name and where its canonical value sits in `Scratch::out`.
struct Member {
    name: Name,
    value: Range<usize>,
}

enum Name {
    Field(&'static str),
    Key(String),
}

impl Name {
    fn as_str(&self) -> &str {
        match self {
            Name::Field(name) => name,
            Name::Key(name) => name,
        }
    }
}

/// JCS orders members by the UTF-16 code units of their names.
fn utf16_order(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

impl Scratch {
    fn clear(&mut self) {
        self.out.clear();
        self.members.clear();
    }

    fn string(&mut self, s: &str) -> Result<(), Error> {
        write_string(&mut self.out, s)
    }

    fn integer(&mut self, n: impl itoa::Integer) {
        self.out
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }

    /// Non-finite numbers become `null`, as serde_json writes them.
    fn float(&mut self, f: f64) {
        if f.is_finite() {
            self.out
                .extend_from_slice(ryu_js::Buffer::new().format_finite(f).as_bytes());
        } else {
            self.out.extend_from_slice(b"null");
        }
    }

    /// Opens an object whose members follow.
    fn open_object(&mut self, variant: Option<&'static str>) -> Result<Object<'_>, Error> {
        if let Some(name) = variant {
            self.open_variant(name)?;
        }
        Ok(Object {
            start: self.out.len(),
            first_member: self.members.len(),
            key: None,
            close_variant: variant.is_some(),
            scratch: self,
        })
    }

    /// `{"Variant":` — the externally tagged form serde_json gives enum variants with data.
    fn open_variant(&mut self, name: &str) -> Result<(), Error> {
        self.out.push(b'{');
        self.string(name)?;
        self.out.push(b':');
        Ok(())
    }

    fn open_array(&mut self, variant: Option<&'static str>) -> Result<Array<'_>, Error> {
        if let Some(name) = variant {
            self.open_variant(name)?;
        }
        self.out.push(b'[');
        Ok(Array {
            first: true,
            close_variant: variant.is_some(),
            scratch: self,
        })
    }

    /// Serializes one member's value and records where it landed.
    fn member<T: Serialize + ?Sized>(&mut self, name: Name, value: &T) -> Result<(), Error> {
        let start = self.out.len();
        value.serialize(&mut *self)?;
        let value = start..self.out.len();
        self.members.push(Member { name, value });
        Ok(())
    }

    /// Replaces the object's unsorted member values (from `start` on) with the canonical
    /// object: names sorted, each written once, no whitespace.
    fn close_object(&mut self, start: usize, first_member: usize) -> Result<(), Error> {
        let Scratch { out, members } = self;
        let object = &mut members[first_member..];
        object.sort_unstable_by(|a, b| utf16_order(a.name.as_str(), b.name.as_str()));
        let written = out.len();
        out.push(b'{');
        for (i, member) in object.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(out, member.name.as_str())?;
            out.push(b':');
            out.extend_from_within(member.value.clone());
        }
        out.push(b'}');
        out.copy_within(written.., start);
        let len = out.len() - written;
        out.truncate(start + len);
        members.truncate(first_member);
        Ok(())
    }
}

/// A JSON string, escaped as JSON.stringify does (serde_json's escaping is the same).
fn write_string(out: &mut Vec<u8>, s: &str) -> Result<(), Error> {
    serde_json::to_writer(out, s).map_err(|e| Error(e.to_string()))
}

#[derive(Debug)]
pub struct Error(String);

impl Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// Integers are written exactly, whatever their size (see the module documentation).
macro_rules! integers_exactly {
    ($($method:ident: $t:ty),*) => {
        $(fn $method(self, v: $t) -> Result<(), Error> {
            self.integer(v);
            Ok(())
        })*
    };
}

impl<'a> Serializer for &'a mut Scratch {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Array<'a>;
    type SerializeTuple = Array<'a>;
    type SerializeTupleStruct = Array<'a>;
    type SerializeTupleVariant = Array<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    integers_exactly!(
        serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_u128: u128
    );

    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.float(f64::from(v));
        Ok(())
    }

    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.float(v);
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.string(v.encode_utf8(&mut [0; 4]))
    }

    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.string(v)
    }

    /// Bytes are an array of numbers, as in serde_json.
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        use ser::SerializeSeq;
        let mut array = self.open_array(None)?;
        for byte in v {
            array.serialize_element(byte)?;
        }
        array.end()
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.string(variant)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.open_variant(variant)?;
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Array<'a>, Error> {
        self.open_array(None)
    }

    fn serialize_tuple(self, _len: usize) -> Result<Array<'a>, Error> {
        self.open_array(None)
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Array<'a>, Error> {
        self.open_array(None)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Array<'a>, Error> {
        self.open_array(Some(variant))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Object<'a>, Error> {
        self.open_object(None)
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Object<'a>, Error> {
        self.open_object(None)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Object<'a>, Error> {
        self.open_object(Some(variant))
    }
}

/// An array (or a tuple) being written.
pub struct Array<'a> {
    scratch: &'a mut Scratch,
    first: bool,
    close_variant: bool,
}

impl Array<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !std::mem::take(&mut self.first) {
            self.scratch.out.push(b',');
        }
        value.serialize(&mut *self.scratch)
    }

    fn close(self) -> Result<(), Error> {
        self.scratch.out.push(b']');
        if self.close_variant {
            self.scratch.out.push(b'}');
        }
        Ok(())
    }
}

/// The four array-shaped traits differ only in their method's name.
macro_rules! array_shaped {
    ($($shape:ident::$method:ident),*) => {
        $(impl ser::$shape for Array<'_> {
            type Ok = ();
            type Error = Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }

            fn end(self) -> Result<(), Error> {
                self.close()
            }
        })*
    };
}

array_shaped!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// An object (a struct or a map) being written: its members collect in the scratch space and
/// are sorted when it closes.
pub struct Object<'a> {
    scratch: &'a mut Scratch,
    /// Where the object's bytes begin in `Scratch::out`.
    start: usize,
    /// Where its members begin in `Scratch::members`.
    first_member: usize,
    /// A map's key, between `serialize_key` and `serialize_value`.
    key: Option<String>,
    close_variant: bool,
}

impl Object<'_> {
    fn close(self) -> Result<(), Error> {
        self.scratch.close_object(self.start, self.first_member)?;
        if self.close_variant {
            self.scratch.out.push(b'}');
        }
        Ok(())
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(key.serialize(MapKey)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error("a map value without its key".into()))?;
        self.scratch.member(Name::Key(key), value)
    }

    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// Structs and struct variants collect their fields alike.
macro_rules! struct_shaped {
    ($($shape:ident),*) => {
        $(impl ser::$shape for Object<'_> {
            type Ok = ();
            type Error = Error;

            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                name: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.scratch.member(Name::Field(name), value)
            }

            fn end(self) -> Result<(), Error> {
                self.close()
            }
        })*
    };
}

struct_shaped!(SerializeStruct, SerializeStructVariant);

/// Map keys become member names the way serde_json turns them into strings: strings as they
/// are, numbers and booleans as their text, unit variants by name. Anything else is refused,
/// as serde_json refuses it.
struct MapKey;

fn not_a_key<T>() -> Result<T, Error> {
    Err(Error("map keys must be strings".into()))
}

macro_rules! keys_as_text {
    ($($method:ident: $t:ty),*) => {
        $(fn $method(self, v: $t) -> Result<String, Error> {
            Ok(v.to_string())
        })*
    };
}

impl Serializer for MapKey {
    type Ok = String;
    type Error = Error;
    type SerializeSeq = ser::Impossible<String, Error>;
    type SerializeTuple = ser::Impossible<String, Error>;
    type SerializeTupleStruct = ser::Impossible<String, Error>;
    type SerializeTupleVariant = ser::Impossible<String, Error>;
    type SerializeMap = ser::Impossible<String, Error>;
    type SerializeStruct = ser::Impossible<String, Error>;
    type SerializeStructVariant = ser::Impossible<String, Error>;

    keys_as_text!(
        serialize_bool: bool, serialize_i8: i8, serialize_i16: i16, serialize_i32: i32,
        serialize_i64: i64, serialize_i128: i128, serialize_u8: u8, serialize_u16: u16,
        serialize_u32: u32, serialize_u64: u64, serialize_u128: u128, serialize_char: char,
        serialize_str: &str
    );

    fn serialize_f32(self, _v: f32) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_f64(self, _v: f64) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_bytes(self, _v: &[u8]) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_none(self) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_unit(self) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<String, Error> {
        Ok(variant.to_string())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<String, Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<String, Error> {
        not_a_key()
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        not_a_key()
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        not_a_key()
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        not_a_key()
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        not_a_key()
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        not_a_key()
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        not_a_key()
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        not_a_key()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn canonical<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
        let mut scratch = Scratch::default();
        value.serialize(&mut scratch).expect("serializes");
        assert!(scratch.members.is_empty(), "every object closed");
        scratch.out
    }

    /// What the module promises: JCS of serde_json's view of the value.
    fn jcs<T: Serialize>(value: &T) -> Vec<u8> {
        let value = serde_json::to_value(value).expect("converts");
        serde_json_canonicalizer::to_vec(&value).expect("JCS")
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

    /// The shapes serde derives for Rust types, beyond what a JSON value holds.
    #[derive(serde::Serialize)]
    enum Shape {
        Unit,
        Newtype(i64),
        Tuple(u8, String),
        Struct { zeta: bool, alpha: Option<f64> },
    }

    #[derive(serde::Serialize)]
    struct Nested {
        z: Vec<Shape>,
        a: std::collections::HashMap<u32, Value>,
        m: (char, (), Option<String>),
        #[serde(with = "serde_bytes_as_seq")]
        b: Vec<u8>,
    }

    mod serde_bytes_as_seq {
        pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
    }

    proptest! {
        /// Byte for byte what the RFC 8785 implementation writes, wherever JCS is exact.
        #[test]
        fn canonical_form_is_jcs(value in json()) {
            prop_assert_eq!(canonical(&value), jcs(&value));
        }

        #[test]
        fn derived_shapes_are_written_as_serde_json_sees_them(
            n in -(1i64 << 53)..(1i64 << 53),
            f in any::<f64>().prop_filter("finite", |f| f.is_finite()),
            text in "[a-z\"\\\\\u{e9}\u{1f600}]{0,6}",
            keys in prop::collection::hash_map(any::<u32>(), json(), 0..4),
            bytes in prop::collection::vec(any::<u8>(), 0..6),
        ) {
            let nested = Nested {
                z: vec![
                    Shape::Unit,
                    Shape::Newtype(n),
                    Shape::Tuple(7, text.clone()),
                    Shape::Struct { zeta: true, alpha: Some(f) },
                    Shape::Struct { zeta: false, alpha: None },
                ],
                a: keys,
                m: ('\u{1f600}', (), Some(text)),
                b: bytes,
            };
            prop_assert_eq!(canonical(&nested), jcs(&nested));
        }
    }

    /// The requests that carry idempotency keys, parsed from full bodies, fingerprint the
    /// canonical bytes JCS gives serde_json's view of them: fingerprints recorded by earlier
    /// versions (journals, snapshots) still match.
    #[test]
    fn request_types_canonicalize_as_jcs() {
        fn check<T: Serialize + serde::de::DeserializeOwned>(body: &str) {
            let request: T = serde_json::from_str(body).expect("a valid request");
            assert_eq!(canonical(&request), jcs(&request), "{body}");
        }
        let subject = r#""subject": {"tenant": "acme", "agent": "a-1", "toolset": "t.x",
            "dimensions": {"z": "1", "cost_center": "\u00e9\"q\""}}"#;
        let action =
            r#""action": {"kind": "llm.completion", "name": "gpt-4o", "tags": ["b", "a"]}"#;
        let metadata = r#""metadata": {"nested": {"y": [1, 2.5, -0.0, 1e21, null]}, "A": true}"#;
        let metrics = r#""metrics": {"tokens_input": 10, "tokens_output": 7, "latency_ms": 3,
            "model_version": "v2", "custom": {"k": "v", "n": 9007199254740991}}"#;
        check::<crate::runtime::ReservationCreateRequest>(&format!(
            r#"{{"idempotency_key": "k1", {subject}, {action},
                "estimate": {{"unit": "TOKENS", "amount": 100}}, "ttl_ms": 60000,
                "grace_period_ms": 0, "overage_policy": "ALLOW_IF_AVAILABLE", "dry_run": false,
                {metadata}}}"#
        ));
        check::<crate::runtime::CommitRequest>(&format!(
            r#"{{"idempotency_key": "k2", "actual": {{"unit": "USD_MICROCENTS", "amount": 80}},
                {metrics}, {metadata}}}"#
        ));
        check::<crate::runtime::ReleaseRequest>(r#"{"idempotency_key": "k3", "reason": "done"}"#);
        check::<crate::runtime::ReservationExtendRequest>(&format!(
            r#"{{"idempotency_key": "k4", "extend_by_ms": 1000, {metadata}}}"#
        ));
        check::<crate::runtime::DecisionRequest>(&format!(
            r#"{{"idempotency_key": "k5", {subject}, {action},
                "estimate": {{"unit": "CREDITS", "amount": 5}}, {metadata}}}"#
        ));
        check::<crate::runtime::EventCreateRequest>(&format!(
            r#"{{"idempotency_key": "k6", {subject}, {action},
                "actual": {{"unit": "RISK_POINTS", "amount": 50}}, "overage_policy": "REJECT",
                {metrics}, "client_time_ms": 1700000000000, {metadata}}}"#
        ));
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

    #[test]
    fn fingerprints_are_the_sha256_of_the_canonical_bytes() {
        let request = serde_json::json!({"b": [1.5, "x"], "a": {"d": null, "c": -3}});
        let expected: [u8; 32] = Sha256::digest(br#"{"a":{"c":-3,"d":null},"b":[1.5,"x"]}"#).into();
        assert_eq!(fingerprint(&request), expected);
        // The thread's scratch space is reused without carrying anything over.
        assert_eq!(fingerprint(&request), expected);
    }

    /// Fingerprints are persisted (every idempotency record holds one), so they must never
    /// change: a changed function would turn every retry of an earlier request into an
    /// IDEMPOTENCY_MISMATCH. These vectors pin the canonical bytes and their SHA-256; the
    /// digests were computed from the bytes outside this code. The second vector is where
    /// the form departs from RFC 8785, which would write the amount as 9007199254740992.
    #[test]
    fn golden_vectors() {
        let vectors: [(&str, &[u8], &str); 3] = [
            (
                r#"{"b": 1, "a": "x"}"#,
                br#"{"a":"x","b":1}"#,
                "cdab067e9f3beb32d1252cfd63e492592fecbf591b0d08cadb24bb17f3864246",
            ),
            (
                r#"{"amount": 9007199254740993}"#,
                br#"{"amount":9007199254740993}"#,
                "966c9a58ed6d8395e0ffaeba3958485187f471700366321f994f83767dd33195",
            ),
            (
                r#"{"s": "\u00e9\n", "f": 1.50, "e": 1E21}"#,
                "{\"e\":1e+21,\"f\":1.5,\"s\":\"\u{e9}\\n\"}".as_bytes(),
                "29d770054f81b06953d7138abc755127182e21d14d1c52053e5191ff491a3c9e",
            ),
        ];
        for (body, bytes, digest) in vectors {
            let value: Value = serde_json::from_str(body).expect("json");
            assert_eq!(canonical(&value), bytes, "{body}");
            assert_eq!(hex::encode(fingerprint(&value)), digest, "{body}");
        }
    }

    /// A whole reserve request, as the server parses it: pins the shape its type gives the
    /// canonical form (field names, omitted options) as well as the bytes.
    #[test]
    fn golden_reserve_request() {
        let body = r#"{"idempotency_key": "k1", "subject": {"tenant": "acme", "agent": "bot"},
            "action": {"kind": "llm.completion", "name": "gpt"},
            "estimate": {"unit": "TOKENS", "amount": 100}}"#;
        let request: crate::runtime::ReservationCreateRequest =
            serde_json::from_str(body).expect("a reserve request");
        assert_eq!(
            String::from_utf8(canonical(&request)).expect("utf-8"),
            concat!(
                r#"{"action":{"kind":"llm.completion","name":"gpt"},"#,
                r#""estimate":{"amount":100,"unit":"TOKENS"},"idempotency_key":"k1","#,
                r#""subject":{"agent":"bot","tenant":"acme"}}"#
            )
        );
        assert_eq!(
            hex::encode(fingerprint(&request)),
            "970d28dc7516650ed75f082cbe6f7229435a33ec6706523977b15fd25c9531e0"
        );
    }
}
