//! The Cycles wire format. This is the only crate that knows JSON field names: request
//! types parse and validate exactly what the upstream schemas allow (unknown fields are
//! rejected), and response types carry exactly the fields the schemas allow, never `null`.
//! Handlers convert explicitly between these and the domain types of `ledger`.

pub mod api_key;
pub mod audit;
pub mod auth;
pub mod budget;
pub mod bulk;
mod common;
mod cursor;
mod error;
mod extensions;
mod fingerprint;
pub mod listing;
pub mod overview;
pub mod policy;
mod query;
pub mod runtime;
pub mod schema;
pub mod tenant;
mod validate;
pub mod webhook;
mod wire;

pub use common::*;
pub use cursor::{decode_budget_cursor, encode_budget_cursor, NextPage};
pub use error::{ApiError, ErrorBody, ErrorCode, Plane};
pub use fingerprint::fingerprint;
pub use ledger::{format_rfc3339, parse_rfc3339};
pub use query::{parse_query, ClampedLimit, PageSize, Search, Verbatim, WindowBound};
pub use validate::{parse_body, Validate};
pub(crate) use wire::parse_wire;
pub use wire::WireName;

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Page size bounds of list endpoints.
pub const DEFAULT_PAGE_SIZE: usize = 50;
pub const MAX_PAGE_SIZE: usize = 200;
/// Largest page of a governance list; larger `limit`s are clamped to it ([`ClampedLimit`]).
pub const MAX_ADMIN_PAGE_SIZE: usize = 100;
