//! The content-addressed build cache shared by `build`, `build-wheel` and the runtime JIT.
//!
//! `<cache>/objects/<key[..2]>/<key>.so` beside `<key>.json` (the instance's URI and key, the
//! object's sha256, size, and the id of the file when its bytes last hashed to that sha256). An
//! entry is published by renaming a finished file into place, so a killed build leaves at most a
//! stray folder under `<cache>/tmp`, never a `.so` that a later run trusts.
//!
//! Nothing in the cache is trusted because it is there: [`Cache::open`] refuses a root that
//! someone else could write to, or that flashgen did not create (no marker, not empty);
//! [`Cache::lookup`] finds an object only when it is a regular file we own that no one else can
//! write, whose record names the same instance and whose bytes match the record; and whoever hands
//! an object out ([`Cache::read_verified`]) hashes the bytes it hands out.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::error::UsageError;
use crate::fsutil::{self, FileId};

/// The marker that makes a folder a flashgen cache (<https://bford.info/cachedir/>): backup
/// tools skip it, and `flashgen clean --cache` removes only a folder that carries it.
pub const MARKER: &str = "CACHEDIR.TAG";
const MARKER_SIGNATURE: &str = "Signature: 8a477f597d28d172789f06886806bc55";
const MARKER_TEXT: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by flashgen (CUDA kernel build cache).\n\
# For information about cache directory tags, see https://bford.info/cachedir/\n";

/// The prefix of the private folders [`Cache::compile_dir`] makes under `<cache>/tmp`.
const TEMP_PREFIX: &str = "nvcc-";

pub struct Cache {
    pub dir: PathBuf,
}

/// A verified cache object: its record, and where the object is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub uri: String,
    /// The cache key (the instance's fingerprint) the object was stored under; a record under
    /// another key (copied, or written by an older flashgen) is not this instance's.
    #[serde(default)]
    pub key: String,
    pub sha256: String,
    pub size: u64,
    /// The object's device, inode, size, mtime and ctime when its bytes last hashed to `sha256`:
    /// while the object still has this id, a lookup trusts it without re-hashing (the ctime
    /// cannot be set back, so an edit always changes the id).
    #[serde(default)]
    pub verified: Option<FileId>,
    /// The absolute path of the object.
    #[serde(skip)]
    pub path: PathBuf,
    /// Its bytes were hashed against `sha256` in this process (a lookup's re-hash, an insert),
    /// rather than trusted by their id: the record's sha256 is then known to be the bytes'.
    #[serde(skip)]
    pub hashed_now: bool,
}

/// What [`Cache::lookup`] found for a key.
#[derive(Debug)]
pub enum Lookup {
    Hit(Entry),
    Miss,
    /// A record exists but its object fails a check; the text says which. The caller discards
    /// it (under the key's lock) and builds again.
    Corrupt(String),
}

impl Lookup {
    pub fn hit(self) -> Option<Entry> {
        match self {
            Lookup::Hit(e) => Some(e),
            _ => None,
        }
    }
}

impl Cache {
    /// The one rule for the cache root: `FLASHGEN_CACHE_DIR` (empty means unset; a leading `~`
    /// is the home folder; relative paths are made absolute), else `$XDG_CACHE_HOME/flashgen`
    /// when that is absolute, else `$HOME/.cache/flashgen`, else the passwd home's.
    pub fn default_dir() -> Result<PathBuf> {
        let set = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let home = || set("HOME").map(PathBuf::from).or_else(std::env::home_dir);
        if let Some(d) = set("FLASHGEN_CACHE_DIR") {
            let d = PathBuf::from(d);
            let d = match d.strip_prefix("~") {
                Ok(rest) if rest.as_os_str().is_empty() => home().ok_or_else(|| {
                    UsageError::new("FLASHGEN_CACHE_DIR=~: no home folder to expand `~` to")
                })?,
                Ok(rest) => home()
                    .ok_or_else(|| {
                        UsageError::new(format!(
                            "FLASHGEN_CACHE_DIR={}: no home folder to expand `~` to",
                            d.display()
                        ))
                    })?
                    .join(rest),
                Err(_) => d,
            };
            return Ok(std::path::absolute(&d)?);
        }
        if let Some(x) = set("XDG_CACHE_HOME").map(PathBuf::from) {
            if x.is_absolute() {
                return Ok(x.join("flashgen"));
            }
        }
        match home() {
            Some(h) => Ok(std::path::absolute(h)?.join(".cache").join("flashgen")),
            None => Err(UsageError::new(
                "cannot place the build cache: FLASHGEN_CACHE_DIR, XDG_CACHE_HOME and HOME are unset and the user has no home folder",
            )
            .with_hint("set FLASHGEN_CACHE_DIR to a private folder")
            .into()),
        }
    }

    /// [`Cache::open`] on [`Cache::default_dir`].
    pub fn open_default() -> Result<Cache> {
        Cache::open(Cache::default_dir()?)
    }

    /// Opens (creating it, mode 0700, if missing) and verifies the cache at `dir`: a real folder
    /// owned by this user that no one else can write, marked as a flashgen cache. An unmarked
    /// folder is claimed (marked) only when it is empty: anything else may be someone's files.
    pub fn open(dir: PathBuf) -> Result<Cache> {
        // `link/` or `link/.` would make the OS resolve the link before the symlink check.
        let dir = fsutil::lexical_absolute(&dir)?;
        if std::fs::symlink_metadata(&dir).is_err() {
            match std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
            {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(e).with_context(|| {
                        format!("cannot create the cache folder {}", dir.display())
                    })
                }
                _ => {}
            }
        }
        check_private_dir(&dir)?;
        claim(&dir)?;
        let cache = Cache { dir };
        for sub in ["objects", "tmp", "locks"] {
            cache.subdir(sub)?;
        }
        Ok(cache)
    }

    /// Whether `dir` carries the marker flashgen writes at a cache's root.
    pub fn is_marked(dir: &Path) -> bool {
        let marker = dir.join(MARKER);
        std::fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file())
            && std::fs::read_to_string(&marker)
                .is_ok_and(|t| t.starts_with(MARKER_SIGNATURE) && t.contains("flashgen"))
    }

    /// `<cache>/<name>`, created with mode 0700 if missing.
    pub fn subdir(&self, name: &str) -> Result<PathBuf> {
        let d = self.dir.join(name);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&d)
            .with_context(|| format!("cannot create {}", d.display()))?;
        Ok(d)
    }

    fn object(&self, key: &str) -> PathBuf {
        self.dir
            .join("objects")
            .join(&key[..2])
            .join(format!("{key}.so"))
    }

    /// The entry for `key`, the key of instance `uri`, checked: record and object are regular
    /// files (never followed through a symlink), owned by us and not writable by group or others,
    /// the record names this key and URI, and the object's bytes hash to the record's sha256 (not
    /// re-hashed while the object keeps the id it had when they last did; a new id is recorded
    /// after a successful re-hash). Whoever hands the object out still hashes what it hands out
    /// ([`Cache::read_verified`]): the record itself may have been edited.
    pub fn lookup(&self, key: &str, uri: &str) -> Lookup {
        let so = self.object(key);
        let record = so.with_extension("json");
        let mut entry: Entry = match open_private(&record) {
            Ok(Some((mut f, _))) => {
                let mut text = String::new();
                match f
                    .read_to_string(&mut text)
                    .map(|_| serde_json::from_str(&text))
                {
                    Ok(Ok(e)) => e,
                    _ => return Lookup::Corrupt(format!("unreadable record {}", record.display())),
                }
            }
            Ok(None) => return Lookup::Miss,
            Err(why) => return Lookup::Corrupt(why),
        };
        if entry.key.is_empty() {
            return Lookup::Corrupt(format!(
                "{} names no key: written by an older flashgen, whose records did not say which instance they are",
                record.display()
            ));
        }
        if entry.key != key || entry.uri != uri {
            return Lookup::Corrupt(format!(
                "{} is the record of {} (key {}), not of {uri} (key {key})",
                record.display(),
                entry.uri,
                entry.key,
            ));
        }
        let (mut f, meta) = match open_private(&so) {
            Ok(Some(x)) => x,
            Ok(None) => return Lookup::Corrupt(format!("{} is missing", so.display())),
            Err(why) => return Lookup::Corrupt(why),
        };
        entry.path = so;
        // The id is taken before the bytes are read: a change during the read gives the file a
        // new id, so the next lookup hashes it again.
        let id = FileId::of(&meta);
        if entry.size == id.size && entry.verified == Some(id) {
            return Lookup::Hit(entry);
        }
        let sha = match fsutil::sha256_reader(&mut f) {
            Ok(s) => s,
            Err(e) => return Lookup::Corrupt(format!("cannot read {}: {e}", entry.path.display())),
        };
        if sha != entry.sha256 {
            return Lookup::Corrupt(format!(
                "{} has sha256 {sha}, its record says {}",
                entry.path.display(),
                entry.sha256
            ));
        }
        // Same bytes, new id (a copy, touch or chmod): record it so the next lookup is cheap again.
        entry.size = id.size;
        entry.verified = Some(id);
        entry.hashed_now = true;
        if let Ok(text) = serde_json::to_string_pretty(&entry) {
            let _ = fsutil::write_atomic(&record, text.as_bytes());
        }
        Lookup::Hit(entry)
    }

    /// The bytes of the object `entry` (from [`Cache::lookup`] or [`Cache::insert`]) when they
    /// hash to its sha256: what a build copies out and the JIT answers for. `Err` says why not;
    /// the caller discards the object (under its lock) and builds it again.
    pub fn read_verified(&self, entry: &Entry) -> Result<Vec<u8>, String> {
        let mut f = match open_private(&entry.path) {
            Ok(Some((f, _))) => f,
            Ok(None) => return Err(format!("{} is missing", entry.path.display())),
            Err(why) => return Err(why),
        };
        let mut bytes = Vec::with_capacity(entry.size as usize);
        f.read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read {}: {e}", entry.path.display()))?;
        let sha = fsutil::sha256_bytes(&bytes);
        if sha != entry.sha256 {
            return Err(format!(
                "{} has sha256 {sha}, its record says {}",
                entry.path.display(),
                entry.sha256
            ));
        }
        Ok(bytes)
    }

    /// Removes `key`'s record and object (after [`Lookup::Corrupt`]; call with the key locked).
    pub fn discard(&self, key: &str) -> Result<()> {
        let so = self.object(key);
        for p in [so.with_extension("json"), so] {
            match std::fs::remove_file(&p) {
                Err(e) if !is_absent(&e) => {
                    return Err(e).with_context(|| format!("cannot remove {}", p.display()))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Takes the exclusive lock on `key` (`<cache>/locks/<key>.lock`), waiting for another
    /// build that holds it; released when the returned file is dropped. Held around look-again,
    /// compile and insert, so that concurrent builds of one instance compile it once.
    pub fn lock(&self, key: &str) -> Result<File> {
        let path = self.dir.join("locks").join(format!("{key}.lock"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("cannot open the lock {}", path.display()))?;
        f.lock()
            .with_context(|| format!("cannot lock {}", path.display()))?;
        Ok(f)
    }

    /// Removes what killed builds left under `<cache>/tmp` more than a day ago (younger ones may
    /// belong to a build running now): only flashgen's own temp entries (`nvcc-*` folders,
    /// `.tmp-*` files) that this user owns. Anything else there is left alone.
    pub fn sweep_stale_temps(&self) {
        let Ok(rd) = std::fs::read_dir(self.dir.join("tmp")) else {
            return;
        };
        let day = std::time::Duration::from_secs(24 * 3600);
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            // Not followed through a symlink: `DirEntry::metadata` is lstat's answer.
            let Ok(meta) = e.metadata() else { continue };
            let ours = fsutil::owned_by_us(&meta)
                && ((meta.is_dir() && name.starts_with(TEMP_PREFIX))
                    || (meta.is_file() && fsutil::is_atomic_temp(&name)));
            let old = meta
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > day);
            if ours && old {
                let _ = if meta.is_dir() {
                    std::fs::remove_dir_all(e.path())
                } else {
                    std::fs::remove_file(e.path())
                };
            }
        }
    }

    /// A fresh private folder `<cache>/tmp/nvcc-<name>.*/` (nvcc's files, the JIT's generated
    /// header), removed when dropped.
    pub fn compile_dir(&self, name: &str) -> Result<tempfile::TempDir> {
        let tmp = self.subdir("tmp")?;
        tempfile::Builder::new()
            .prefix(&format!("{TEMP_PREFIX}{name}."))
            .tempdir_in(&tmp)
            .with_context(|| format!("cannot create a folder in {}", tmp.display()))
    }

    /// Publishes a finished `.so` whose bytes are `bytes` (already read and checked by the
    /// caller): the old record goes first, then the object and a new record each arrive by
    /// rename, so a reader never sees a record over the wrong object. Errors name the path and
    /// the OS error.
    pub fn insert(&self, key: &str, uri: &str, built: &Path, bytes: &[u8]) -> Result<Entry> {
        use sha2::{Digest, Sha256};
        use std::os::unix::fs::PermissionsExt;
        let so = self.object(key);
        let record = so.with_extension("json");
        let dir = so.parent().unwrap();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(built, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot chmod {}", built.display()))?;
        let meta = std::fs::symlink_metadata(built)
            .with_context(|| format!("cannot stat {}", built.display()))?;
        if meta.len() != bytes.len() as u64 {
            anyhow::bail!("{} changed while it was being stored", built.display());
        }
        match std::fs::remove_file(&record) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", record.display()))
            }
            _ => {}
        }
        std::fs::rename(built, &so)
            .with_context(|| format!("cannot move {} to {}", built.display(), so.display()))?;
        // The id after the rename (which may set the ctime): the bytes hashed above are these.
        let meta = std::fs::symlink_metadata(&so)
            .with_context(|| format!("cannot stat {}", so.display()))?;
        let entry = Entry {
            uri: uri.to_string(),
            key: key.to_string(),
            sha256: format!("{:x}", Sha256::digest(bytes)),
            size: meta.len(),
            verified: Some(FileId::of(&meta)),
            path: so,
            hashed_now: true,
        };
        fsutil::write_atomic(&record, serde_json::to_string_pretty(&entry)?.as_bytes())?;
        Ok(entry)
    }
}

/// Marks `dir` as a flashgen cache when it is empty; keeps it when it carries the marker; refuses
/// anything else (exit 2): a folder flashgen did not create may hold someone's files, which
/// `clean --cache` and the temp sweep must never meet. A folder holding only a marker's temp file
/// is a concurrent flashgen creating this cache: its marker is waited for (up to a second).
fn claim(dir: &Path) -> Result<()> {
    for attempt in 0..50 {
        if Cache::is_marked(dir) {
            return Ok(());
        }
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the cache folder {}", dir.display()))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if names.is_empty() {
            return fsutil::write_atomic(&dir.join(MARKER), MARKER_TEXT.as_bytes());
        }
        // A concurrent flashgen may have marked the folder, and filled it, between the check above
        // and the listing: it writes the marker before anything else, so one is there now.
        if Cache::is_marked(dir) {
            return Ok(());
        }
        if attempt < 49 && names.iter().all(|n| fsutil::is_atomic_temp(n)) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        }
        names.sort();
        let more = names.len().saturating_sub(5);
        names.truncate(5);
        return Err(UsageError::new(format!(
            "{} is not a flashgen cache: it has no {MARKER} written by flashgen, and it is not empty ({}{}); flashgen keeps its cache only in a folder it created, so that cleaning it never deletes anyone's files",
            dir.display(),
            names.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ))
        .with_hint(format!(
            "set FLASHGEN_CACHE_DIR to a new or empty private folder (flashgen creates it), or move the files out of {}",
            dir.display()
        ))
        .into());
    }
    unreachable!("the last attempt returns")
}

/// What `flashgen clean --cache` removes from the cache at `dir` (marked, see [`Cache::is_marked`]):
/// objects and records (`objects/<2 hex>/<64 hex>.so|.json`), locks, the temp folders of builds,
/// the toolchain memos, wrappers and objects, and `.tmp-*` files, each only when this user owns
/// it; the marker and the folders last, once nothing else is left. Anything else is kept.
pub fn remove_own(dir: &Path, sweep: &mut fsutil::Sweep) -> Result<bool> {
    use fsutil::Own;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let temp = |n: &str| fsutil::is_atomic_temp(n);
    let object = |n: &str| {
        let ours = temp(n)
            || n.strip_suffix(".so")
                .or_else(|| n.strip_suffix(".json"))
                .is_some_and(|k| hex(k, 64));
        if ours {
            Own::File
        } else {
            Own::No
        }
    };
    let shard = |n: &str| {
        if hex(n, 2) {
            Own::Dir(&object)
        } else {
            Own::No
        }
    };
    let lock = |n: &str| {
        if temp(n) || n.strip_suffix(".lock").is_some_and(|k| hex(k, 64)) {
            Own::File
        } else {
            Own::No
        }
    };
    let tmp = |n: &str| {
        if n.starts_with(TEMP_PREFIX) {
            Own::Tree
        } else if temp(n) {
            Own::File
        } else {
            Own::No
        }
    };
    let toolchain = |n: &str| {
        // `<sha256>.json` (probe memos), `zig-cxx-<16 hex>` (the wrapper) and
        // `zig-dso-fini-<16 hex>.{o,cpp,json}` with its `.<pid>.tmp.o` (src/manylinux.rs).
        let fini = n.strip_prefix("zig-dso-fini-").is_some_and(|rest| {
            let (h, ext) = rest.split_at(rest.len().min(16));
            hex(h, 16)
                && ([".o", ".cpp", ".json"].contains(&ext)
                    || ext
                        .strip_prefix('.')
                        .and_then(|e| e.strip_suffix(".tmp.o"))
                        .is_some_and(|pid| {
                            !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
                        }))
        });
        let ours = temp(n)
            || n.strip_suffix(".json").is_some_and(|h| hex(h, 64))
            || n.strip_prefix("zig-cxx-").is_some_and(|h| hex(h, 16))
            || fini;
        if ours {
            Own::File
        } else {
            Own::No
        }
    };
    let root = |n: &str| match n {
        "objects" => Own::Dir(&shard),
        "locks" => Own::Dir(&lock),
        "tmp" => Own::Dir(&tmp),
        "toolchain" => Own::Dir(&toolchain),
        n if temp(n) => Own::File,
        _ => Own::No,
    };
    sweep.clear(dir, &root, Some(MARKER))
}

/// The refusal for a root that is not a private folder of ours, with the fix.
fn check_private_dir(dir: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("cannot stat the cache folder {}", dir.display()))?;
    let euid = unsafe { libc::geteuid() };
    let problem = if meta.file_type().is_symlink() {
        Some("is a symbolic link".to_string())
    } else if !meta.is_dir() {
        Some("is not a folder".to_string())
    } else if meta.uid() != euid {
        Some(format!(
            "is owned by uid {} (this process runs as uid {euid})",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by group or others (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(UsageError::new(format!(
            "refusing the cache folder {}: it {p}; anyone who can write there could replace the kernels flashgen loads",
            dir.display()
        ))
        .with_hint(format!(
            "chmod 700 {} (if it is yours), or set FLASHGEN_CACHE_DIR to a private folder",
            dir.display()
        ))
        .into()),
    }
}

/// Opens `path` without following a symlink and checks it is a regular file we own that group
/// and others cannot write. `Ok(None)` when it does not exist; `Err` says which check failed.
pub(crate) fn open_private(path: &Path) -> Result<Option<(File, std::fs::Metadata)>, String> {
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if is_absent(&e) => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let meta = f
        .metadata()
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    let euid = unsafe { libc::geteuid() };
    if !meta.is_file() {
        Err(format!("{} is not a regular file", path.display()))
    } else if meta.uid() != euid {
        Err(format!("{} is owned by uid {}", path.display(), meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Err(format!("{} is writable by group or others", path.display()))
    } else {
        Ok(Some((f, meta)))
    }
}

/// Not there: missing, or a component of the path is not a folder.
fn is_absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::fingerprint::cache_key;

    const KEY: &str = "ab0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd";

    fn cache() -> (tempfile::TempDir, Cache) {
        let root = tempfile::tempdir().unwrap();
        let cache = Cache::open(root.path().join("cache")).unwrap();
        (root, cache)
    }

    /// Stores `bytes` as `uri`'s object under `key`, as a build does: from a finished file.
    fn store(cache: &Cache, key: &str, uri: &str, bytes: &[u8]) -> Entry {
        let dir = cache.compile_dir("t").unwrap();
        let built = dir.path().join("instance.so");
        std::fs::write(&built, bytes).unwrap();
        cache.insert(key, uri, &built, bytes).unwrap()
    }

    fn corrupt(lookup: Lookup) -> String {
        match lookup {
            Lookup::Corrupt(why) => why,
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn a_key_covers_toolchain_flags_header_and_every_input() {
        let key = |tc: &[&str], flags: &[&str], header: &str, files: &[(&str, &str)]| {
            let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
            let files: BTreeMap<String, String> = files
                .iter()
                .map(|(n, s)| (n.to_string(), s.to_string()))
                .collect();
            cache_key(tc, &flags, header, &files)
        };
        const TC: [&str; 2] = ["nvcc 13.0", "g++ 13"];
        const FLAGS: [&str; 2] = ["-O2", "-arch=sm_80"];
        const HEADER: &str = "#define X 1\n";
        const FILES: [(&str, &str); 2] = [("csrc/a.cu", "11"), ("include/b.cuh", "22")];
        let base = key(&TC, &FLAGS, HEADER, &FILES);
        assert_eq!(base.len(), 64);
        assert!(base.bytes().all(|b| b.is_ascii_hexdigit()));
        let reordered = [FILES[1], FILES[0]];
        assert_eq!(
            base,
            key(&TC, &FLAGS, HEADER, &reordered),
            "inputs are keyed by name, not by insertion order"
        );
        let variations = [
            key(&["nvcc 13.1", "g++ 13"], &FLAGS, HEADER, &FILES),
            // The texts are length-prefixed: moving a boundary is another key.
            key(&["nvcc 13.0g", "++ 13"], &FLAGS, HEADER, &FILES),
            key(&TC, &["-O2", "-arch=sm_90a"], HEADER, &FILES),
            key(&TC, &FLAGS, "#define X 2\n", &FILES),
            key(&TC, &FLAGS, HEADER, &[FILES[0], ("include/b.cuh", "23")]),
            key(&TC, &FLAGS, HEADER, &[FILES[0], ("include/c.cuh", "22")]),
        ];
        let mut all: Vec<&String> = variations.iter().collect();
        all.push(&base);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), variations.len() + 1, "every change is a new key");
    }

    #[test]
    fn opening_marks_an_empty_folder_and_refuses_someone_elses() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("c");
        Cache::open(dir.clone()).unwrap();
        assert!(Cache::is_marked(&dir));
        Cache::open(dir).unwrap();

        let theirs = root.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(theirs.join("thesis.tex"), "x").unwrap();
        let Err(err) = Cache::open(theirs) else {
            panic!("a folder with someone's files became a cache")
        };
        assert_eq!(crate::error::exit_code(&err), 2);
        assert!(
            format!("{err:#}").contains("is not a flashgen cache"),
            "{err:#}"
        );
    }

    #[test]
    fn a_stored_object_is_found_and_handed_out_verified() {
        let (_root, cache) = cache();
        assert!(matches!(cache.lookup(KEY, "u"), Lookup::Miss));
        let stored = store(&cache, KEY, "u", b"\x7fELF object");
        assert_eq!(stored.sha256, fsutil::sha256_bytes(b"\x7fELF object"));
        let hit = cache.lookup(KEY, "u").hit().expect("a hit");
        assert_eq!(
            (hit.sha256.as_str(), hit.size),
            (stored.sha256.as_str(), 11)
        );
        assert_eq!(hit.path, cache.object(KEY));
        assert_eq!(cache.read_verified(&hit).unwrap(), b"\x7fELF object");
        let mode = std::fs::metadata(&hit.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o022, 0, "no one else may write an object");
    }

    #[test]
    fn a_changed_object_is_corrupt_until_discarded() {
        let (_root, cache) = cache();
        let stored = store(&cache, KEY, "u", b"good bytes");
        // Same size, other bytes, put in place by rename: the new file id (another inode) makes
        // the lookup hash them again.
        let evil = cache.dir.join("tmp/evil");
        std::fs::write(&evil, b"evil bytes").unwrap();
        std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&evil, cache.object(KEY)).unwrap();
        let why = corrupt(cache.lookup(KEY, "u"));
        assert!(why.contains("its record says"), "{why}");
        // Whoever hands it out hashes what it hands out, whatever the lookup said before.
        let handed = cache.read_verified(&stored).unwrap_err();
        assert!(handed.contains("its record says"), "{handed}");
        cache.discard(KEY).unwrap();
        assert!(matches!(cache.lookup(KEY, "u"), Lookup::Miss));
    }

    #[test]
    fn a_record_of_another_instance_or_writable_by_others_is_corrupt() {
        let (_root, cache) = cache();
        store(&cache, KEY, "u", b"bytes");
        let why = corrupt(cache.lookup(KEY, "other_uri"));
        assert!(why.contains("not of other_uri"), "{why}");

        std::fs::set_permissions(cache.object(KEY), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        let why = corrupt(cache.lookup(KEY, "u"));
        assert!(why.contains("writable by group or others"), "{why}");

        std::fs::remove_file(cache.object(KEY)).unwrap();
        let why = corrupt(cache.lookup(KEY, "u"));
        assert!(why.contains("is missing"), "{why}");
    }
}
