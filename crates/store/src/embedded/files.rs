//! File naming and durable-file helpers shared by the journal and snapshots.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// The on-disk format version written in every file header.
pub const FORMAT_VERSION: u32 = 1;

/// Creates `dir` and any missing parent owner-only (`0700`): a data directory holds every
/// tenant's ledgers, the key digests and the audit log. One that exists is left as it is.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Open options for the data directory's files: created owner read/write only (`0600`).
pub fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

/// Takes `dir`'s `LOCK` file (created owner-only) for as long as the returned file stays
/// open, so that two processes never share a directory: the second is refused here instead
/// of writing (or, for the Redis engine's history cache, deleting) the first one's files.
pub fn lock_dir(dir: &Path) -> io::Result<File> {
    let lock = private_file()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "data directory {} is in use by another process (each needs its own)",
                dir.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

pub fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("journal-{first_seq:020}.log"))
}

pub fn snapshot_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("snapshot-{seq:020}.bin"))
}

/// Files named `{prefix}{seq:020}{suffix}` in `dir`, sorted by sequence number.
pub fn list_numbered(dir: &Path, prefix: &str, suffix: &str) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(num) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(suffix))
        else {
            continue;
        };
        if let Ok(seq) = num.parse::<u64>() {
            out.push((seq, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

pub fn list_segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    list_numbered(dir, "journal-", ".log")
}

pub fn list_snapshots(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    list_numbered(dir, "snapshot-", ".bin")
}

/// Takes group and other permissions away from `dir` and the files in it (`0700`, `0600`),
/// as they are created: a directory restored from a copy, or made by hand, may have been
/// left readable by others. Answers how many entries it changed.
#[cfg(unix)]
pub fn make_private(dir: &Path) -> io::Result<usize> {
    use std::os::unix::fs::PermissionsExt;
    let mut changed = 0;
    let mut restrict = |path: &Path, mode: u32| -> io::Result<()> {
        let permissions = fs::symlink_metadata(path)?.permissions();
        if permissions.mode() & 0o077 != 0 {
            fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
            changed += 1;
        }
        Ok(())
    };
    restrict(dir, 0o700)?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            restrict(&entry.path(), 0o600)?;
        }
    }
    Ok(changed)
}

/// Elsewhere, permissions are left as they are.
#[cfg(not(unix))]
pub fn make_private(_dir: &Path) -> io::Result<usize> {
    Ok(0)
}

/// Makes a directory entry change (create, rename, delete) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_directory_is_refused_until_its_lock_is_closed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let first = lock_dir(dir.path()).expect("the first lock");
        let refused = lock_dir(dir.path()).expect_err("a second lock of the same directory");
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock);
        assert!(refused.to_string().contains("is in use by another process"));
        drop(first);
        lock_dir(dir.path()).expect("the lock, once the first is closed");
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_left_readable_by_others_is_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let set = |path: &Path, mode: u32| {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap()
        };
        let (open, private) = (
            dir.path().join("history.sqlite"),
            dir.path().join("admin.key"),
        );
        fs::write(&open, b"x").unwrap();
        fs::write(&private, b"x").unwrap();
        set(dir.path(), 0o755);
        set(&open, 0o644);
        set(&private, 0o600);
        assert_eq!(make_private(dir.path()).unwrap(), 2);
        assert_eq!(
            (mode(dir.path()), mode(&open), mode(&private)),
            (0o700, 0o600, 0o600)
        );
        assert_eq!(
            make_private(dir.path()).unwrap(),
            0,
            "nothing left to change"
        );
    }
}
