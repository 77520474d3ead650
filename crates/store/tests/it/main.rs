//! The store's integration tests, in one binary.

mod compat;
mod recovery;
