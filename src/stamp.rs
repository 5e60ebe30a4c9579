//! The no-op fast path: a stamp over everything a build reads, by file id (size, mtime, ctime).
//!
//! Content hashing keys the cache, but re-deriving 10,000 keys only to find nothing changed
//! costs more than a timestamp check (which is all ninja does). After a successful build the
//! output folder gets `.flashgen-stamp`: a hash of the config text, flags, archs, toolchain, the
//! selected URIs and the (path, inode, size, mtime, ctime) of every file under `csrc/` and
//! `include/` and of user variant headers. A later build with the same stamp, whose outputs are all present, is
//! done without generating, hashing or looking up anything. Any slow-path build removes the
//! stamp before it places a file, so a killed build never leaves a stamp over mixed outputs.
//!
//! The stamp also lists the id (device, inode, size, mtime and ctime, [`FileId`]) of every output
//! and of `manifest.json`, taken when the build wrote or hashed it, so an output edited,
//! truncated or replaced by hand sends the next build down the slow path, which puts the
//! cache's bytes back; setting the mtime back does not hide an edit, as the ctime moves anyway.
//! Each output's line also carries its cache key and sha256, so the no-op's report comes from
//! the stamp alone: one stat per output and no manifest to parse (which was a third of a
//! 10,000-instance no-op). The slow path reads the same lines ([`previous`]): an output whose id
//! and sha256 are unchanged is not read again.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::fsutil::FileId;

use sha2::{Digest, Sha256};

use crate::instance::Instance;
use crate::matrix::{HeaderPath, Matrix};

const STAMP_FILE: &str = ".flashgen-stamp";

pub fn path(out_dir: &Path) -> PathBuf {
    out_dir.join(STAMP_FILE)
}

/// The stamp of a build of `selected` with these flags and toolchain texts.
pub fn compute(
    matrix: &Matrix,
    selected: &[&Instance],
    flags: &[String],
    toolchain: &[&str],
) -> String {
    let mut h = Sha256::new();
    h.update(concat!("flashgen-stamp-v4 ", env!("CARGO_PKG_VERSION")));
    h.update(matrix.config_text.as_bytes());
    for f in flags
        .iter()
        .map(String::as_str)
        .chain(toolchain.iter().copied())
    {
        h.update(format!("\n{} {f}", f.len()));
    }
    for inst in selected {
        h.update(format!("\nuri {}", inst.uri));
    }
    let mut files = Vec::new();
    for dir in ["csrc", "include"] {
        walk(&matrix.root.join(dir), &mut files);
    }
    files.extend(matrix.variants.iter().filter_map(|v| match &v.header {
        HeaderPath::External(p) => Some(p.clone()),
        HeaderPath::Include(_) => None,
    }));
    files.sort();
    for f in files {
        let id = std::fs::metadata(&f).ok().map(|m| FileId::of(&m).word());
        h.update(format!("\nfile {} {id:?}", f.display()));
    }
    format!("{:x}", h.finalize())
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// One file the stamp vouches for: an output (with the key and sha256 of the cache entry it is
/// a copy of) or `manifest.json` (without).
pub struct Stamped {
    pub path: PathBuf,
    pub key_sha256: Option<(String, String)>,
}

/// An output as the stamp recorded it, for the no-op's report.
#[derive(Debug, PartialEq, Eq)]
pub struct Recorded {
    pub name: String,
    pub size: u64,
    pub key: String,
    pub sha256: String,
}

/// Writes the stamp for `out_dir`: the hash line, then `id key sha256 name` for each file (`-`
/// for the key and sha256 of the manifest), `id` being [`FileId::word`].
pub fn write(out_dir: &Path, stamp: &str, files: &[Stamped]) -> Result<()> {
    let mut text = format!("{stamp}\n");
    for f in files {
        let m = std::fs::symlink_metadata(&f.path)
            .with_context(|| format!("cannot stat {}", f.path.display()))?;
        let name = f.path.file_name().unwrap_or_default().to_string_lossy();
        let (key, sha) = match &f.key_sha256 {
            Some((k, s)) => (k.as_str(), s.as_str()),
            None => ("-", "-"),
        };
        text.push_str(&format!("{} {key} {sha} {name}\n", FileId::of(&m).word()));
    }
    crate::fsutil::write_atomic(&path(out_dir), text.as_bytes())
}

/// The lines of the stamp on `out_dir`, whatever its hash line: (id word, key, sha256, name).
fn lines(out_dir: &Path) -> Option<(String, Vec<[String; 4]>)> {
    let text = std::fs::read_to_string(path(out_dir)).ok()?;
    let mut lines = text.lines();
    let head = lines.next()?.to_string();
    let rows = lines
        .map(|line| {
            let mut parts = line.splitn(4, ' ').map(str::to_string);
            Some([parts.next()?, parts.next()?, parts.next()?, parts.next()?])
        })
        .collect::<Option<Vec<_>>>()?;
    Some((head, rows))
}

/// When the stamp on `out_dir` is `stamp` and every file it lists is still a regular file with
/// the recorded id: the outputs it lists (not the manifest), in the order written.
pub fn matches(out_dir: &Path, stamp: &str) -> Option<Vec<Recorded>> {
    let (head, rows) = lines(out_dir)?;
    if head != stamp {
        return None;
    }
    let mut outputs = Vec::new();
    for [id, key, sha256, name] in rows {
        let now = FileId::of_path(&out_dir.join(&name))?;
        if now.word() != id {
            return None;
        }
        if key != "-" {
            outputs.push(Recorded {
                name,
                size: now.size,
                key,
                sha256,
            });
        }
    }
    Some(outputs)
}

/// What the last stamp on `out_dir` recorded of each output, by file name: its id word and
/// sha256, whatever the stamp's hash (a changed header changes the hash, not the outputs).
pub fn previous(out_dir: &Path) -> std::collections::HashMap<String, (String, String)> {
    lines(out_dir)
        .map(|(_, rows)| {
            rows.into_iter()
                .filter(|[_, key, _, _]| key != "-")
                .map(|[id, _, sha, name]| (name, (id, sha)))
                .collect()
        })
        .unwrap_or_default()
}
