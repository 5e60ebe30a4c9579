//! The content-addressed build cache shared by `build`, `build-wheel` and the runtime JIT.
//!
//! `<cache>/objects/<key[..2]>/<key>.so` beside `<key>.json` (its sha256, size and mtime). An
//! entry is published by renaming a finished file into place, so a killed build leaves at most a
//! stray folder under `<cache>/tmp`, never a `.so` that a later run trusts.
//!
//! Nothing in the cache is trusted because it is there: [`Cache::open`] refuses a root that
//! someone else could write to, and [`Cache::lookup`] hands out an object only when it is a
//! regular file we own that no one else can write and whose bytes match its record.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::error::UsageError;
use crate::fsutil::{self, mtime_ns};

/// The marker that makes a folder a flashgen cache (<https://bford.info/cachedir/>): backup
/// tools skip it, and `flashgen clean --cache` removes only a folder that carries it.
pub const MARKER: &str = "CACHEDIR.TAG";
const MARKER_SIGNATURE: &str = "Signature: 8a477f597d28d172789f06886806bc55";
const MARKER_TEXT: &str = "Signature: 8a477f597d28d172789f06886806bc55\n\
# This file is a cache directory tag created by flashgen (CUDA kernel build cache).\n\
# For information about cache directory tags, see https://bford.info/cachedir/\n";

/// Every name flashgen creates at the cache root; a folder holding anything else is not ours.
const OWN_NAMES: &[&str] = &["objects", "tmp", "locks", "toolchain", "jit", MARKER];

pub struct Cache {
    pub dir: PathBuf,
}

/// A verified cache object: its record, and where the object is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub uri: String,
    pub sha256: String,
    pub size: u64,
    /// The object's mtime (ns since the epoch) when it was recorded: with the size, what lets a
    /// lookup trust the object without re-hashing it.
    #[serde(default)]
    pub mtime_ns: i64,
    /// The absolute path of the object.
    #[serde(skip)]
    pub path: PathBuf,
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
    /// folder is adopted only when it holds nothing flashgen would not have created.
    pub fn open(dir: PathBuf) -> Result<Cache> {
        let dir = std::path::absolute(&dir)?;
        let fresh = !dir.exists() && std::fs::symlink_metadata(&dir).is_err();
        if fresh {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .with_context(|| format!("cannot create the cache folder {}", dir.display()))?;
        }
        check_private_dir(&dir)?;
        if !Cache::is_marked(&dir) {
            let foreign: Vec<String> = std::fs::read_dir(&dir)
                .with_context(|| format!("cannot read the cache folder {}", dir.display()))?
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                // A concurrent flashgen that is creating this cache may be between writing its
                // marker's temp file and renaming it: that temp file is ours too.
                .filter(|n| !OWN_NAMES.contains(&n.as_str()) && !fsutil::is_atomic_temp(n))
                .collect();
            if !foreign.is_empty() {
                let mut shown = foreign.clone();
                shown.sort();
                shown.truncate(5);
                return Err(UsageError::new(format!(
                    "{} is not a flashgen cache: it has no {MARKER} and holds other files ({})",
                    dir.display(),
                    shown.join(", ")
                ))
                .with_hint("set FLASHGEN_CACHE_DIR to an empty or new private folder")
                .into());
            }
            fsutil::write_atomic(&dir.join(MARKER), MARKER_TEXT.as_bytes())?;
        }
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

    /// The entry for `key`, verified: record and object are regular files (never followed
    /// through a symlink), owned by us and not writable by group or others, and the object has
    /// the recorded size and mtime. Only we can write in the cache, so that match is trusted;
    /// on a mismatch the object is re-hashed, and kept only if its sha256 is the recorded one.
    pub fn lookup(&self, key: &str) -> Lookup {
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
        let (mut f, meta) = match open_private(&so) {
            Ok(Some(x)) => x,
            Ok(None) => return Lookup::Corrupt(format!("{} is missing", so.display())),
            Err(why) => return Lookup::Corrupt(why),
        };
        entry.path = so;
        if meta.len() == entry.size && mtime_ns(&meta) == entry.mtime_ns {
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
        // Same bytes, new mtime (a copy or touch): record it so the next lookup is cheap again.
        entry.size = meta.len();
        entry.mtime_ns = mtime_ns(&meta);
        if let Ok(text) = serde_json::to_string_pretty(&entry) {
            let _ = fsutil::write_atomic(&record, text.as_bytes());
        }
        Lookup::Hit(entry)
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
    /// belong to a build running now).
    pub fn sweep_stale_temps(&self) {
        let Ok(rd) = std::fs::read_dir(self.dir.join("tmp")) else {
            return;
        };
        let day = std::time::Duration::from_secs(24 * 3600);
        for e in rd.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            let old = meta
                .modified()
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > day);
            if old {
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
            .prefix(&format!("nvcc-{name}."))
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
        let entry = Entry {
            uri: uri.to_string(),
            sha256: format!("{:x}", Sha256::digest(bytes)),
            size: meta.len(),
            mtime_ns: mtime_ns(&meta),
            path: so,
        };
        fsutil::write_atomic(&record, serde_json::to_string_pretty(&entry)?.as_bytes())?;
        Ok(entry)
    }
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
fn open_private(path: &Path) -> Result<Option<(File, std::fs::Metadata)>, String> {
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
