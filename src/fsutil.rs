//! File writes that never leave a half-written file: write a temp file beside, then rename.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};

/// Writes `bytes` to `path` atomically; returns false (and leaves the file and its mtime alone)
/// when the content is already there.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    write_atomic(path, bytes)?;
    Ok(true)
}

/// The prefix of [`write_atomic`]'s temp files (the `tempfile` crate adds 6 random characters).
const ATOMIC_TEMP_PREFIX: &str = ".tmp-";

/// Whether `name` is one of [`write_atomic`]'s temp files (as another process may be writing).
pub fn is_atomic_temp(name: &str) -> bool {
    name.len() == ATOMIC_TEMP_PREFIX.len() + 6
        && name.starts_with(ATOMIC_TEMP_PREFIX)
        && name[ATOMIC_TEMP_PREFIX.len()..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric())
}

/// Temp file, then rename: a killed process leaves the old file or the new one, never half of
/// one. No fsync: these files (headers, records, manifests) are cheap to regenerate, and syncing
/// each of 10,000 small files dominated a cold build.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(ATOMIC_TEMP_PREFIX)
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temp file in {}", dir.display()))?;
    tmp.write_all(bytes)?;
    // tempfile creates 0600; these files are meant to be read by others (like any build output).
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Places a copy of `src` at `dst` atomically (a temp file beside `dst`, then rename). A copy,
/// never a hard link: editing or truncating an output must not reach the cache object it came
/// from. `std::fs::copy` may still share blocks (a reflink) where the file system supports it.
pub fn place_file(src: &Path, dst: &Path) -> Result<()> {
    let dir = dst.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(ATOMIC_TEMP_PREFIX)
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temp file in {}", dir.display()))?
        .into_temp_path();
    std::fs::copy(src, &tmp)
        .with_context(|| format!("cannot copy {} to {}", src.display(), dst.display()))?;
    tmp.persist(dst)
        .with_context(|| format!("cannot write {}", dst.display()))?;
    Ok(())
}

/// Total size of the files under `path`.
pub fn tree_size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|rd| rd.flatten().map(|e| tree_size(&e.path())).sum())
        .unwrap_or(0)
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A file's mtime in nanoseconds since the epoch (what records and stamps compare).
pub fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(sha256_reader(&mut f)?)
}

pub fn sha256_reader(r: &mut impl std::io::Read) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    std::io::copy(r, &mut h)?;
    Ok(format!("{:x}", h.finalize()))
}

pub fn sha256_bytes(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(bytes))
}
