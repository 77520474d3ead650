//! Storage faults injected into the journal's file operations, so that tests can drive the
//! engine through a failing disk (a write or `fdatasync` answering EIO, a full disk, a
//! read-only remount) and back, on the very code path a real fault takes. Nothing is
//! injected unless a test arms it: in a server the check is one relaxed atomic load before a
//! `write` or an `fdatasync`, beside the system call it guards.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};

/// A fault the journal's file operations answer with, until it is cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFault {
    /// Every `write` fails with EIO.
    WriteError,
    /// Writes succeed (into the page cache) and every `fdatasync` fails with EIO: the
    /// case where a retried `fsync` can report success for data that never reached the disk.
    SyncError,
    /// The disk is full: every `write` that needs space fails with ENOSPC.
    NoSpace,
    /// The file system was remounted read-only: every write, resize and sync fails with
    /// EROFS.
    ReadOnly,
}

/// Linux's error numbers (the same on the BSDs and macOS).
const EIO: i32 = 5;
const ENOSPC: i32 = 28;
const EROFS: i32 = 30;

/// The file operations a fault can refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiskOp {
    Write,
    Sync,
    Resize,
}

/// The fault armed for a store's journal, if any (shared with the test that arms it).
#[derive(Debug, Default)]
pub struct DiskFaults(AtomicU8);

impl DiskFaults {
    /// Arms `fault` for every later file operation, or clears it (`None`).
    pub fn inject(&self, fault: Option<DiskFault>) {
        let code = match fault {
            None => 0,
            Some(DiskFault::WriteError) => 1,
            Some(DiskFault::SyncError) => 2,
            Some(DiskFault::NoSpace) => 3,
            Some(DiskFault::ReadOnly) => 4,
        };
        self.0.store(code, Ordering::Relaxed);
    }

    /// The error `op` fails with under the armed fault, if it fails.
    pub(crate) fn check(&self, op: DiskOp) -> io::Result<()> {
        let errno = match (self.0.load(Ordering::Relaxed), op) {
            (0, _) => return Ok(()),
            (1, DiskOp::Write) | (2, DiskOp::Sync) => EIO,
            (3, DiskOp::Write) => ENOSPC,
            (4, _) => EROFS,
            _ => return Ok(()),
        };
        Err(io::Error::from_raw_os_error(errno))
    }
}
