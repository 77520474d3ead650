//! The data directory is private: it holds every tenant's ledgers, the key digests and the
//! audit log, so the directory is created owner-only and so is every file in it.

#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use store::embedded::{Durability, EmbeddedConfig, EmbeddedStore};
use store::{Load, ManualClock, Store};
use tempfile::TempDir;

use crate::history::create;

#[tokio::test]
async fn the_data_directory_and_its_files_are_owner_only() {
    let parent = TempDir::new().unwrap();
    let dir = parent.path().join("data");
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let (store, _) =
        EmbeddedStore::open(EmbeddedConfig::new(&dir, Durability::Strict, clock)).unwrap();
    let created = store
        .execute(create("acme", "Acme"), Load::Busy)
        .await
        .unwrap();
    assert!(created.result.is_ok());
    // A graceful stop writes the final snapshot too.
    store.shutdown().await;
    drop(store);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "the data directory");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(mode(&path) & 0o077, 0, "{name} is readable by others");
        names.push(name);
    }
    names.sort();
    for kind in ["LOCK", "history.sqlite", "journal-", "snapshot-"] {
        assert!(
            names.iter().any(|n| n.starts_with(kind)),
            "no {kind} in {names:?}"
        );
    }
}
