//! `flashgen clean`: remove build output (and, with `--cache`, the cache), and say how much
//! that freed.
//!
//! Only folders flashgen marked are removed: an output folder carries `.flashgen-build`, the
//! cache carries flashgen's `CACHEDIR.TAG`. Anything else is skipped with the reason, so a
//! mistyped `--out` or `FLASHGEN_CACHE_DIR=.` never deletes a source tree.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::build::{is_build_dir, BUILD_MARKER};
use crate::cache::{self, Cache};
use crate::cli::CleanArgs;
use crate::fsutil::{human_bytes, tree_size};

pub fn run(args: &CleanArgs) -> Result<()> {
    let mut targets: Vec<(PathBuf, Option<String>)> = args
        .out
        .iter()
        .map(|d| {
            let why = (!is_build_dir(d))
                .then(|| format!("it is not a flashgen build folder (no {BUILD_MARKER} marker)"));
            (d.clone(), why)
        })
        .collect();
    if args.cache {
        let dir = Cache::default_dir()?;
        let real_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        let why = (!real_dir || !Cache::is_marked(&dir)).then(|| {
            format!(
                "it is not a flashgen cache (no {} written by flashgen)",
                cache::MARKER
            )
        });
        targets.push((dir, why));
    }
    let mut total = 0;
    for (dir, why) in targets {
        if std::fs::symlink_metadata(&dir).is_err() {
            continue;
        }
        if let Some(why) = why {
            eprintln!(
                "skipped {}: {why}; remove it by hand if you mean to",
                dir.display()
            );
            continue;
        }
        let size = tree_size(&dir);
        total += size;
        if args.dry_run {
            eprintln!("would remove {} ({})", dir.display(), human_bytes(size));
            continue;
        }
        remove(&dir)?;
        eprintln!("removed {} ({})", dir.display(), human_bytes(size));
    }
    if args.dry_run {
        eprintln!(
            "would free {} (dry run: nothing removed)",
            human_bytes(total)
        );
    } else {
        eprintln!("freed {}", human_bytes(total));
    }
    Ok(())
}

fn remove(dir: &Path) -> Result<()> {
    std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))
}
