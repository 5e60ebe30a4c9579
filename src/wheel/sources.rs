//! Reading a file of the project tree that a wheel packs (`csrc/`, `include/`, the Python
//! package): the packed bytes are those of a regular file inside the folder being packed, never
//! of a file a symlink leads to outside it (`include/x.cuh -> ~/.ssh/id_ed25519` would publish
//! the secret), and never of a FIFO or device (reading one would hang or pack a device).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, Result};

use crate::error::UsageError;

/// The bytes of `path`, a file found under `top` (the folder being packed), and whether any of
/// its execute bits is set. A symlink is followed only when what it resolves to lies inside `top`;
/// anything but a regular file is refused (exit 2, naming the path).
pub fn read_tree_file(path: &Path, top: &Path) -> Result<(Vec<u8>, bool)> {
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut target = path.to_path_buf();
    if meta.file_type().is_symlink() {
        let link = std::fs::read_link(path).unwrap_or_default();
        let resolved = std::fs::canonicalize(path).map_err(|e| {
            UsageError::new(format!(
                "{} is a symlink to {}, which cannot be resolved ({e}); the wheel packs only \
                 files inside {}",
                path.display(),
                link.display(),
                top.display()
            ))
            .with_hint("replace the link by the file itself, or remove it")
        })?;
        let top_resolved = std::fs::canonicalize(top)
            .with_context(|| format!("cannot resolve {}", top.display()))?;
        if !resolved.starts_with(&top_resolved) {
            return Err(UsageError::new(format!(
                "{} is a symlink to {}, outside {}: the wheel packs no file from outside the tree",
                path.display(),
                resolved.display(),
                top.display()
            ))
            .with_hint(
                "replace the link by a copy of the file (if it is meant to ship), or remove it",
            )
            .into());
        }
        target = resolved;
    }
    // No symlink is followed from here on, and opening a FIFO does not wait for a writer.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&target)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(UsageError::new(format!(
            "{} is not a regular file (mode {:o}); the wheel packs regular files only",
            path.display(),
            meta.mode()
        ))
        .with_hint("remove it from the tree")
        .into());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok((bytes, meta.mode() & 0o111 != 0))
}
