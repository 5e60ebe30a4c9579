//! The content-addressed build cache shared by `build`, `build-wheel` and the runtime JIT.
//!
//! `<cache>/objects/<key[..2]>/<key>.so` beside `<key>.json` (its sha256 and size). An entry is
//! published by renaming a finished file into place, so a killed build leaves at most a stray
//! temp file under `<cache>/tmp`, never a `.so` that a later run trusts.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::fsutil;

pub struct Cache {
    pub dir: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub uri: String,
    pub sha256: String,
    pub size: u64,
    #[serde(skip)]
    pub path: PathBuf,
}

impl Cache {
    /// `FLASHGEN_CACHE_DIR`, else `~/.cache/flashgen` (`$XDG_CACHE_HOME/flashgen` if set).
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("FLASHGEN_CACHE_DIR") {
            return PathBuf::from(d);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("flashgen")
    }

    pub fn open(dir: PathBuf) -> Cache {
        Cache { dir }
    }

    fn object(&self, key: &str) -> PathBuf {
        self.dir
            .join("objects")
            .join(&key[..2])
            .join(format!("{key}.so"))
    }

    /// The entry for `key`, if one is complete: its record exists and the `.so` has the
    /// recorded size (the loader and `build-wheel` re-check the sha256 before trusting bytes).
    pub fn lookup(&self, key: &str) -> Option<Entry> {
        let so = self.object(key);
        let text = std::fs::read_to_string(so.with_extension("json")).ok()?;
        let mut entry: Entry = serde_json::from_str(&text).ok()?;
        let size = std::fs::metadata(&so).ok()?.len();
        (size == entry.size).then(|| {
            entry.path = so;
            entry
        })
    }

    /// Removes temp files that a killed build left under `<cache>/tmp` more than a day ago
    /// (younger ones may belong to a build running now).
    pub fn sweep_stale_temps(&self) {
        let Ok(rd) = std::fs::read_dir(self.dir.join("tmp")) else {
            return;
        };
        let day = std::time::Duration::from_secs(24 * 3600);
        for e in rd.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > day);
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// A fresh path under `<cache>/tmp` for nvcc to write to.
    pub fn temp_output(&self, uri: &str) -> Result<tempfile::TempPath> {
        let tmp = self.dir.join("tmp");
        std::fs::create_dir_all(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        let file = tempfile::Builder::new()
            .prefix(&format!("{uri}."))
            .suffix(".so")
            .tempfile_in(&tmp)?;
        Ok(file.into_temp_path())
    }

    /// Publishes a finished `.so`: the object first, then its record, each by rename.
    pub fn insert(&self, key: &str, uri: &str, built: tempfile::TempPath) -> Result<Entry> {
        let so = self.object(key);
        std::fs::create_dir_all(so.parent().unwrap())?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&built, std::fs::Permissions::from_mode(0o755))?;
        let sha256 = fsutil::sha256_file(&built)?;
        let size = std::fs::metadata(&built)?.len();
        built
            .persist(&so)
            .with_context(|| format!("cannot move the build into {}", so.display()))?;
        let entry = Entry {
            uri: uri.to_string(),
            sha256,
            size,
            path: so.clone(),
        };
        fsutil::write_atomic(
            &so.with_extension("json"),
            serde_json::to_string_pretty(&entry)?.as_bytes(),
        )?;
        Ok(entry)
    }

    pub fn exists(dir: &Path) -> bool {
        dir.join("objects").is_dir()
    }
}
