//! The store's integration tests, in one binary.

mod compat;
mod faults;
mod history;
mod privacy;
mod recovery;
mod redis_differential;
