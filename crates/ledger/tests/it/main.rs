//! The ledger's integration tests, in one binary.

mod properties;
