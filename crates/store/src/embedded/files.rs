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

/// What [`make_private`] found and did.
#[derive(Debug, Default)]
pub struct Privacy {
    /// The server's own files it took group and other permissions from.
    pub tightened: usize,
    /// Whether the directory itself is open to group or others (left as it is: it may
    /// be shared, or not the server's own).
    pub open_dir: bool,
    /// A file it could not change (not its owner): left as it is.
    pub refused: Option<io::Error>,
}

/// Takes group and other permissions away from the server's own files in `dir` (its
/// journal, snapshots, history, keys and lock), as they are created: a directory restored
/// from a copy may have left them readable by others. Other files, and the directory
/// itself, are only looked at; nothing here stops a start.
#[cfg(unix)]
pub fn make_private(dir: &Path) -> Privacy {
    use std::os::unix::fs::PermissionsExt;
    let open = |mode: u32| mode & 0o077 != 0;
    let mut privacy = Privacy {
        open_dir: fs::metadata(dir).is_ok_and(|m| open(m.permissions().mode())),
        ..Privacy::default()
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return privacy;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ours = ["journal-", "snapshot-", "history.sqlite"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
            || ["admin.key", "webhook.key", "LOCK"].contains(&name.as_ref());
        let Ok(meta) = entry.metadata() else { continue };
        let mode = meta.permissions().mode();
        if !ours || !meta.is_file() || !open(mode) {
            continue;
        }
        match fs::set_permissions(entry.path(), fs::Permissions::from_mode(mode & 0o700)) {
            Ok(()) => privacy.tightened += 1,
            Err(e) => privacy.refused = Some(e),
        }
    }
    privacy
}

/// Elsewhere, permissions are left as they are.
#[cfg(not(unix))]
pub fn make_private(_dir: &Path) -> Privacy {
    Privacy::default()
}

/// Says what [`make_private`] did and found, at start.
pub fn report_privacy(dir: &Path, privacy: &Privacy) {
    if privacy.tightened > 0 {
        tracing::warn!(dir = %dir.display(), files = privacy.tightened,
            "files of the data directory were readable by others: made owner-only");
    }
    if let Some(e) = &privacy.refused {
        tracing::warn!(dir = %dir.display(), error = %e,
            "a file of the data directory is readable by others and could not be changed");
    }
    if privacy.open_dir {
        tracing::warn!(dir = %dir.display(),
            "the data directory is open to other users, and it holds every tenant's data: \
             chmod 700 it");
    }
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
    fn the_servers_files_left_readable_by_others_are_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let mode = |path: &Path| fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let set = |path: &Path, mode: u32| {
            fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap()
        };
        let path = |name: &str| dir.path().join(name);
        for (name, m) in [
            ("history.sqlite", 0o644),
            ("admin.key", 0o600),
            ("run.sh", 0o755),
        ] {
            fs::write(path(name), b"x").unwrap();
            set(&path(name), m);
        }
        set(dir.path(), 0o755);
        let privacy = make_private(dir.path());
        assert_eq!((privacy.tightened, privacy.open_dir), (1, true));
        assert!(privacy.refused.is_none());
        assert_eq!(mode(&path("history.sqlite")), 0o600);
        assert_eq!(mode(&path("admin.key")), 0o600);
        assert_eq!(mode(&path("run.sh")), 0o755, "not the server's: left alone");
        assert_eq!(mode(dir.path()), 0o755, "the directory is only reported");
        assert_eq!(
            make_private(dir.path()).tightened,
            0,
            "nothing left to change"
        );
    }
}
