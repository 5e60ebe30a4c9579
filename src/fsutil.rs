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
    // tempfile creates 0600; these files are meant to be read by others (like any build output).
    write_via_temp(path, bytes, 0o644)
}

/// Writes `bytes` (a cache object's, just hashed) to `dst` atomically, mode 0755 (a temp file
/// beside `dst`, then rename). A copy, never a hard link: editing or truncating an output must
/// not reach the cache object it came from.
pub fn place_bytes(bytes: &[u8], dst: &Path) -> Result<()> {
    write_via_temp(dst, bytes, 0o755)
}

/// `bytes` into a temp file beside `path` (its folder created), given `mode`, renamed onto `path`.
fn write_via_temp(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(ATOMIC_TEMP_PREFIX)
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temp file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A toolchain probe's answer, memoized in `<cache_dir>/toolchain/<id>.json` where the id hashes
/// `tag` and the path (resolved), size and mtime of each of `programs`: a warm run spawns no
/// process, and replacing a program changes the id. `probe` runs without a memo (or without a
/// cache folder); its answer is written back, and a memo that cannot be written only costs a
/// probe next time.
pub fn memoized<T: serde::Serialize + serde::de::DeserializeOwned>(
    cache_dir: Option<&Path>,
    tag: &str,
    programs: &[&Path],
    probe: impl FnOnce() -> Result<T>,
) -> Result<T> {
    use sha2::{Digest, Sha256};
    let mut id = Sha256::new();
    id.update(tag);
    for p in programs {
        let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let meta = std::fs::metadata(&p).with_context(|| format!("cannot stat {}", p.display()))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        id.update(format!("{}|{}|{:?}\n", p.display(), meta.len(), mtime));
    }
    let memo = cache_dir.map(|d| {
        d.join("toolchain")
            .join(format!("{:x}.json", id.finalize()))
    });
    if let Some(text) = memo.as_ref().and_then(|m| std::fs::read_to_string(m).ok()) {
        if let Ok(v) = serde_json::from_str::<T>(&text) {
            return Ok(v);
        }
    }
    let v = probe()?;
    if let Some(memo) = memo {
        let _ = write_atomic(&memo, serde_json::to_string(&v)?.as_bytes());
    }
    Ok(v)
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

/// `path` made absolute with its `.` components, repeated slashes and trailing slash dropped,
/// without following any symlink: what every symlink check must look at. `link/` and `link/.`
/// name the link's target to the OS (a trailing slash resolves it), so a check on them would
/// see a folder where there is a link.
pub fn lexical_absolute(path: &Path) -> std::io::Result<std::path::PathBuf> {
    Ok(std::path::absolute(path)?.components().collect())
}

/// What a file's verification is tied to: device, inode, size, mtime and ctime (ns). A writer
/// can set the mtime back (`touch -d`, `os.utime`), but not the ctime, which the kernel sets to
/// now on every change to the file's bytes or metadata; equal ids mean the bytes hashed then are
/// the bytes there now (to the file system's timestamp granularity).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileId {
    pub fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: mtime_ns(meta),
            ctime_ns: meta
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.ctime_nsec()),
        }
    }

    /// The id of the file at `path` itself (a symlink is not followed).
    pub fn of_path(path: &Path) -> Option<FileId> {
        std::fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| FileId::of(&m))
    }

    /// One word, `dev:ino:size:mtime:ctime`, for line-based records (the stamp).
    pub fn word(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns
        )
    }
}

/// Whether `meta` is something this process's user owns.
pub fn owned_by_us(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    meta.uid() == unsafe { libc::geteuid() }
}

/// What a folder's entry is to [`Sweep::clear`], by name: not ours, a file of ours, a folder of
/// ours to remove whole (a temp folder flashgen made), or a folder of ours to clear by its rule.
pub enum Own<'a> {
    No,
    File,
    Tree,
    Dir(&'a dyn Fn(&str) -> Own<'a>),
}

/// Removes only what flashgen made (`flashgen clean`): each entry a rule names as ours and this
/// user owns, never through a symlink; anything else is kept and listed. With `dry_run` nothing
/// is removed, and the same answers are given.
#[derive(Default)]
pub struct Sweep {
    pub dry_run: bool,
    /// Bytes removed (or that would be).
    pub freed: u64,
    /// Entries kept because they are not flashgen's.
    pub kept: Vec<std::path::PathBuf>,
}

impl Sweep {
    /// Clears `dir` by `rule`, then removes `marker` (a file in `dir`) and `dir` itself when
    /// nothing else is left. True when `dir` is gone (or would be).
    pub fn clear<'a>(
        &mut self,
        dir: &Path,
        rule: &dyn Fn(&str) -> Own<'a>,
        marker: Option<&str>,
    ) -> Result<bool> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
        };
        let mut left = false;
        for e in rd {
            let e = e.with_context(|| format!("cannot read {}", dir.display()))?;
            let path = e.path();
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                self.kept.push(path);
                left = true;
                continue;
            };
            if marker == Some(name.as_str()) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path)
                .with_context(|| format!("cannot stat {}", path.display()))?;
            let owned = owned_by_us(&meta);
            let gone = match rule(&name) {
                Own::File if owned && meta.is_file() => self.remove(&path, meta.len(), false)?,
                Own::Tree if owned && meta.is_dir() => {
                    self.remove(&path, tree_size(&path), true)?
                }
                // What it keeps is listed inside.
                Own::Dir(sub) if owned && meta.is_dir() => self.clear(&path, sub, None)?,
                _ => {
                    self.kept.push(path);
                    false
                }
            };
            left |= !gone;
        }
        if left {
            return Ok(false);
        }
        if let Some(m) = marker {
            let path = dir.join(m);
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                if !(meta.is_file() && owned_by_us(&meta)) {
                    self.kept.push(path);
                    return Ok(false);
                }
                self.remove(&path, meta.len(), false)?;
            }
        }
        if !self.dry_run {
            std::fs::remove_dir(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
        }
        Ok(true)
    }

    fn remove(&mut self, path: &Path, size: u64, tree: bool) -> Result<bool> {
        if !self.dry_run {
            let r = if tree {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            };
            r.with_context(|| format!("cannot remove {}", path.display()))?;
        }
        self.freed += size;
        Ok(true)
    }
}
