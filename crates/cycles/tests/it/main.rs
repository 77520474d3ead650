//! The `cycles` binary's integration tests, in one binary.

mod admin_cli;
mod crash;
mod process;
