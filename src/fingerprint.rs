//! Content fingerprints: what a translation unit includes, hashed once per file per run.
//!
//! An instance's cache key is a sha256 over its generated header, every source and header its
//! translation unit reaches through `#include` inside the project's folders (system and CUDA
//! headers are covered by the nvcc version), the toolchain's version texts, every flag and the
//! arch list. Files are named by their place in the tree, never by absolute path, so the key does
//! not depend on where the tree, the output or the cache lives.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::codegen::HEADER_NAME;

/// Bumped whenever the meaning of a key changes, or the bytes its inputs build: v2 when the link
/// started to run nvcc through the relative `.cuda` symlink (a v1 object records the toolchain's
/// absolute path, which no v2 build gives).
const KEY_FORMAT: &str = "flashgen-cache-key-v2";

struct FileInfo {
    sha: String,
    /// `(name, quoted)` for each `#include` line.
    includes: Vec<(String, bool)>,
}

/// Hashes and scans files, each once, from any number of threads.
pub struct SourceHasher {
    root: PathBuf,
    /// Folders searched for `#include <...>`, in order, after the generated header's folder.
    include_dirs: Vec<PathBuf>,
    files: Mutex<HashMap<PathBuf, Arc<FileInfo>>>,
    closures: Mutex<HashMap<PathBuf, Arc<Closure>>>,
    resolved: Mutex<HashMap<(String, bool), Option<PathBuf>>>,
}

impl SourceHasher {
    pub fn new(root: &Path, include_dirs: Vec<PathBuf>) -> Self {
        Self {
            root: root.to_path_buf(),
            include_dirs,
            files: Mutex::default(),
            closures: Mutex::default(),
            resolved: Mutex::default(),
        }
    }

    fn info(&self, path: &Path) -> Result<Arc<FileInfo>> {
        if let Some(i) = self.files.lock().unwrap().get(path) {
            return Ok(i.clone());
        }
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let info = Arc::new(FileInfo {
            sha: format!("{:x}", Sha256::digest(&bytes)),
            includes: scan_includes(&String::from_utf8_lossy(&bytes)),
        });
        self.files
            .lock()
            .unwrap()
            .insert(path.to_path_buf(), info.clone());
        Ok(info)
    }

    fn resolve(&self, name: &str, quoted: bool, from: Option<&Path>) -> Option<PathBuf> {
        let local = from
            .filter(|_| quoted)
            .and_then(Path::parent)
            .map(|d| d.join(name));
        local
            .into_iter()
            .chain(self.include_dirs.iter().map(|d| d.join(name)))
            .find(|p| p.is_file())
    }

    /// Name of a file for the key: relative to the tree when inside it, else its file name.
    fn logical(&self, path: &Path) -> String {
        path.strip_prefix(&self.root).map_or_else(
            |_| {
                format!(
                    "external/{}",
                    path.file_name().unwrap_or_default().to_string_lossy()
                )
            },
            |p| p.to_string_lossy().into_owned(),
        )
    }

    /// Every file hashed so far, with its sha256.
    pub fn hashed(&self) -> Vec<(PathBuf, String)> {
        let files = self.files.lock().unwrap();
        files
            .iter()
            .map(|(p, i)| (p.clone(), i.sha.clone()))
            .collect()
    }

    /// Every project file `source` reaches, with its sha256; the generated header is walked from
    /// its text, since each instance has its own.
    pub fn inputs(&self, source: &Path, generated: &str) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for c in self.closures_of(source, generated)? {
            out.extend(c.files.iter().cloned());
        }
        Ok(out)
    }

    /// The first file of `inputs(source, generated)` whose bytes on disk are no longer the ones
    /// hashed for the key: nvcc may have compiled that newer text, which the key does not name.
    /// Called once a compile has finished, before its object is stored.
    pub fn changed_since_hashed(&self, source: &Path, generated: &str) -> Result<Option<PathBuf>> {
        for c in self.closures_of(source, generated)? {
            for path in &c.paths {
                let recorded = self.info(path)?.sha.clone();
                let now = match std::fs::read(path) {
                    Ok(bytes) => format!("{:x}", Sha256::digest(&bytes)),
                    Err(_) => return Ok(Some(path.clone())),
                };
                if now != recorded {
                    return Ok(Some(path.clone()));
                }
            }
        }
        Ok(None)
    }

    /// The closure of `source` and, where it includes the generated header, those of the headers
    /// that header names.
    fn closures_of(&self, source: &Path, generated: &str) -> Result<Vec<Arc<Closure>>> {
        let c = self.closure(source)?;
        let mut out = vec![c.clone()];
        if c.includes_generated {
            for (name, quoted) in scan_includes(generated) {
                if let Some(p) = self.resolve_angle(&name, quoted) {
                    out.push(self.closure(&p)?);
                }
            }
        }
        Ok(out)
    }

    /// The files reachable from `start` (itself included), computed once per file per run.
    fn closure(&self, start: &Path) -> Result<Arc<Closure>> {
        if let Some(c) = self.closures.lock().unwrap().get(start) {
            return Ok(c.clone());
        }
        let mut files = Vec::new();
        let mut paths = Vec::new();
        let mut includes_generated = false;
        let mut seen = HashSet::new();
        let mut stack = vec![start.to_path_buf()];
        while let Some(path) = stack.pop() {
            if !seen.insert(path.clone()) {
                continue;
            }
            let info = self.info(&path)?;
            files.push((self.logical(&path), info.sha.clone()));
            paths.push(path.clone());
            for (name, quoted) in &info.includes {
                if name == HEADER_NAME {
                    includes_generated = true;
                } else if let Some(p) = self.resolve(name, *quoted, Some(&path)) {
                    stack.push(p);
                }
            }
        }
        let c = Arc::new(Closure {
            files,
            paths,
            includes_generated,
        });
        self.closures
            .lock()
            .unwrap()
            .insert(start.to_path_buf(), c.clone());
        Ok(c)
    }

    /// `resolve` for includes of the generated header (no including folder), memoized: every
    /// instance's header names the same few variant headers.
    fn resolve_angle(&self, name: &str, quoted: bool) -> Option<PathBuf> {
        let key = (name.to_string(), quoted);
        if let Some(hit) = self.resolved.lock().unwrap().get(&key) {
            return hit.clone();
        }
        let found = self.resolve(name, quoted, None);
        self.resolved.lock().unwrap().insert(key, found.clone());
        found
    }
}

/// What one file reaches through `#include`.
struct Closure {
    /// `(logical name, sha256)` of each file, the start included.
    files: Vec<(String, String)>,
    /// Where each of `files` was read.
    paths: Vec<PathBuf>,
    /// Whether the walk met `<flashgen_instance.cuh>`, whose includes differ per instance.
    includes_generated: bool,
}

/// `#include <x>` / `#include "x"` lines. Conditional includes count too: a key that is
/// sometimes too wide only costs a rebuild, never a stale binary.
fn scan_includes(text: &str) -> Vec<(String, bool)> {
    text.lines()
        .filter_map(|line| {
            let rest = line
                .trim_start()
                .strip_prefix('#')?
                .trim_start()
                .strip_prefix("include")?
                .trim_start();
            let (close, quoted) = match rest.chars().next()? {
                '"' => ('"', true),
                '<' => ('>', false),
                _ => return None,
            };
            let name = &rest[1..];
            Some((name[..name.find(close)?].to_string(), quoted))
        })
        .collect()
}

/// The cache key of one instance.
pub fn cache_key(
    toolchain_texts: &[&str],
    flags: &[String],
    generated: &str,
    inputs: &BTreeMap<String, String>,
) -> String {
    let mut h = Sha256::new();
    h.update(KEY_FORMAT);
    for t in toolchain_texts {
        h.update(format!("\ntoolchain {}", t.len()));
        h.update(t);
    }
    for f in flags {
        h.update(format!("\nflag {f}"));
    }
    h.update(format!("\ngenerated {:x}", Sha256::digest(generated)));
    for (name, sha) in inputs {
        h.update(format!("\nfile {name} {sha}"));
    }
    format!("{:x}", h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_both_include_forms() {
        let t = "#include <a/b.cuh>\n  #  include \"c.h\"\n// #include <no>\n#define X\n";
        assert_eq!(
            scan_includes(t),
            vec![("a/b.cuh".to_string(), false), ("c.h".to_string(), true)]
        );
    }
}
