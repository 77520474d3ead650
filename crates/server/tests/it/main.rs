//! The server's integration tests, in one binary: each module is one behaviour area, driven
//! over real HTTP through the harness in [`common`].
//!
//! One binary links the server, reqwest and the SDK once instead of once per area.

// First, so that `engine_tests!` is in scope in every module below.
#[macro_use]
mod common;

mod admin;
mod archive;
mod audit;
mod concurrency;
mod dashboard;
mod detector;
mod errors;
mod expiry;
mod governance;
mod idempotency;
mod lifecycle;
mod limits;
mod listing;
mod openapi;
mod overage;
mod policies;
mod sdk_rust;
mod storage_faults;
mod tenancy;
mod tenant_status;
mod webhooks;
