//! The `cycles` binary's integration tests, in one binary.

mod admin_cli;
mod audit_crash;
mod crash;
mod events_crash;
mod ledger_http;
mod logs;
mod process;
mod receiver;
mod redis_faults;
mod redis_storm;
mod webhook_keys;
