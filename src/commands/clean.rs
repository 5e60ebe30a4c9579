//! `flashgen clean`: remove build output and the cache, and say how much that freed.

use anyhow::{Context, Result};

use crate::cache::Cache;
use crate::cli::CleanArgs;
use crate::fsutil::{human_bytes, tree_size};

pub fn run(args: &CleanArgs) -> Result<()> {
    let mut targets = args.out.clone();
    if !args.keep_cache {
        targets.push(Cache::default_dir());
    }
    let mut total = 0;
    for dir in targets {
        if !dir.exists() {
            continue;
        }
        let size = tree_size(&dir);
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
        eprintln!("removed {} ({})", dir.display(), human_bytes(size));
        total += size;
    }
    eprintln!("freed {}", human_bytes(total));
    Ok(())
}
