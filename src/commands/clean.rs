//! `flashgen clean`: remove build output (and, with `--cache`, the cache), and say how much
//! that freed.
//!
//! Only what flashgen made goes: in an output folder that carries `.flashgen-build`, the files
//! of the instances its marker lists, `manifest.json`, the stamp and flashgen's temp files; in a
//! cache that carries flashgen's `CACHEDIR.TAG`, the objects, records, locks, build temp folders
//! and toolchain files it names that way. Each must be owned by this user; nothing is followed
//! through a symlink, and a path is taken as written only after its `.` components and trailing
//! slash are dropped (`link/` is the link, not its target). A folder is removed once nothing
//! else is left; anything else is kept and listed, so a mistyped `--out` or
//! `FLASHGEN_CACHE_DIR=.` never deletes a source tree.

use std::path::PathBuf;

use anyhow::Result;

use crate::build::{is_build_dir, remove_own_outputs, BUILD_MARKER};
use crate::cache::{self, Cache};
use crate::cli::CleanArgs;
use crate::fsutil::{human_bytes, lexical_absolute, Sweep};

enum Target {
    Build,
    Cache,
}

pub fn run(args: &CleanArgs) -> Result<()> {
    let mut targets: Vec<(PathBuf, Target, Option<String>)> = Vec::new();
    for d in &args.out {
        let d = lexical_absolute(d)?;
        let why = (!is_build_dir(&d))
            .then(|| format!("it is not a flashgen build folder (no {BUILD_MARKER} marker)"));
        targets.push((d, Target::Build, why));
    }
    if args.cache {
        let dir = lexical_absolute(&Cache::default_dir()?)?;
        let real_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        let why = (!real_dir || !Cache::is_marked(&dir)).then(|| {
            format!(
                "it is not a flashgen cache (no {} written by flashgen)",
                cache::MARKER
            )
        });
        targets.push((dir, Target::Cache, why));
    }
    let mut total = 0;
    for (dir, target, why) in targets {
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
        let mut sweep = Sweep {
            dry_run: args.dry_run,
            ..Sweep::default()
        };
        let gone = match target {
            Target::Build => remove_own_outputs(&dir, &mut sweep)?,
            Target::Cache => cache::remove_own(&dir, &mut sweep)?,
        };
        total += sweep.freed;
        let verb = if args.dry_run {
            "would remove"
        } else {
            "removed"
        };
        if gone {
            eprintln!("{verb} {} ({})", dir.display(), human_bytes(sweep.freed));
        } else {
            let mut kept: Vec<String> =
                sweep.kept.iter().map(|p| p.display().to_string()).collect();
            kept.sort();
            let more = kept.len().saturating_sub(5);
            kept.truncate(5);
            eprintln!(
                "{verb} flashgen's files from {} ({}); kept the folder and what flashgen did not make there: {}{}",
                dir.display(),
                human_bytes(sweep.freed),
                kept.join(", "),
                if more > 0 { format!(" and {more} more") } else { String::new() }
            );
        }
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
