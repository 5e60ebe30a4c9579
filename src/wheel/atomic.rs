//! Write-then-rename: the wheel is written to a hidden temporary file beside its destination,
//! synced, and renamed into place, so an error or a kill never leaves a partial `.whl` there.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::NamedTempFile;

pub struct AtomicFile {
    tmp: NamedTempFile,
    dest: PathBuf,
}

impl AtomicFile {
    /// Creates the temporary file in `dest`'s folder (same file system, so the rename is
    /// atomic). Dropping the `AtomicFile` without [`commit`](Self::commit) deletes it.
    pub fn create(dest: &Path) -> Result<Self> {
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(dir)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        Ok(AtomicFile {
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    pub fn file(&mut self) -> &mut File {
        self.tmp.as_file_mut()
    }

    /// Syncs the data, gives the file ordinary read permissions (temporary files are created
    /// 0600), renames it over `dest` and syncs the folder so the rename itself is durable.
    pub fn commit(self) -> Result<PathBuf> {
        let AtomicFile { tmp, dest } = self;
        tmp.as_file()
            .sync_all()
            .with_context(|| format!("syncing {}", tmp.path().display()))?;
        set_readable(tmp.path())?;
        tmp.persist(&dest)
            .map_err(|e| e.error)
            .with_context(|| format!("renaming the finished wheel to {}", dest.display()))?;
        if let Some(dir) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Not every file system can sync a folder; the wheel is already complete then.
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(dest)
    }
}

#[cfg(unix)]
fn set_readable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
        .with_context(|| format!("setting the permissions of {}", path.display()))
}

#[cfg(not(unix))]
fn set_readable(_path: &Path) -> Result<()> {
    Ok(())
}
