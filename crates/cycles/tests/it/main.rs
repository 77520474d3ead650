//! The `cycles` binary's integration tests, in one binary.

mod crash;
