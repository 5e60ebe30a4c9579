//! `WheelBuilder`: collects what goes into a wheel (bytes, files on disk, scripts), then writes
//! the `.whl` in one go: entries in a stable order, dist-info last, RECORD very last.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::wheel::atomic::AtomicFile;
use crate::wheel::error::WheelError;
use crate::wheel::hashing::HashingWriter;
use crate::wheel::metadata::{metadata_file, wheel_file, WheelMetadata, WheelTag};
use crate::wheel::names::{
    escape_distribution_name, escape_version, validate_archive_path, validate_project_name,
};
use crate::wheel::writer::{ArchiveWriter, ZipArchiveWriter, MODE_EXECUTABLE, MODE_FILE};

/// Collects the entries of one wheel. Nothing touches the destination until [`write`].
///
/// [`write`]: WheelBuilder::write
#[derive(Debug)]
pub struct WheelBuilder {
    meta: WheelMetadata,
    tag: WheelTag,
    entries: BTreeMap<String, Entry>,
}

#[derive(Debug)]
struct Entry {
    source: Source,
    mode: u32,
}

#[derive(Debug)]
enum Source {
    Bytes(Vec<u8>),
    File(PathBuf),
}

/// A wheel on disk, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenWheel {
    pub path: PathBuf,
    /// SHA-256 of the whole `.whl`, lower-case hex.
    pub sha256: String,
    pub size: u64,
    /// Every entry in archive order, RECORD last.
    pub entries: Vec<WrittenEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenEntry {
    pub path: String,
    pub size: u64,
    pub compressed_size: u64,
}

impl WheelBuilder {
    pub fn new(meta: WheelMetadata, tag: WheelTag) -> Self {
        WheelBuilder {
            meta,
            tag,
            entries: BTreeMap::new(),
        }
    }

    /// `{name}-{version}`, as the `.dist-info` and `.data` folders and the file name start.
    fn name_version(&self) -> Result<String, WheelError> {
        validate_project_name(&self.meta.name)?;
        Ok(format!(
            "{}-{}",
            escape_distribution_name(&self.meta.name),
            escape_version(&self.meta.version)?
        ))
    }

    /// The `.whl` file name, `{name}-{version}-{python}-{abi}-{platform}.whl`.
    pub fn file_name(&self) -> Result<String, WheelError> {
        self.tag.validate()?;
        Ok(format!("{}-{}.whl", self.name_version()?, self.tag))
    }

    pub fn dist_info_dir(&self) -> Result<String, WheelError> {
        Ok(format!("{}.dist-info", self.name_version()?))
    }

    pub fn data_dir(&self) -> Result<String, WheelError> {
        Ok(format!("{}.data", self.name_version()?))
    }

    /// Adds `bytes` as `archive_path` (mode 0755 when `executable`, else 0644).
    pub fn add_bytes(
        &mut self,
        archive_path: &str,
        bytes: Vec<u8>,
        executable: bool,
    ) -> Result<()> {
        let mode = if executable {
            MODE_EXECUTABLE
        } else {
            MODE_FILE
        };
        self.insert(archive_path, Source::Bytes(bytes), mode)
    }

    /// Adds the file at `src` as `archive_path`; it is read when the wheel is written. The
    /// entry is executable (0755) when the source file has any execute bit, else 0644.
    pub fn add_file(&mut self, archive_path: &str, src: &Path) -> Result<()> {
        let meta =
            fs::metadata(src).with_context(|| format!("adding {} to the wheel", src.display()))?;
        if !meta.is_file() {
            anyhow::bail!(
                "{} is not a regular file and cannot be added to the wheel",
                src.display()
            );
        }
        let mode = if is_executable(&meta) {
            MODE_EXECUTABLE
        } else {
            MODE_FILE
        };
        self.insert(archive_path, Source::File(src.to_path_buf()), mode)
    }

    /// Adds the file at `src` as the script `name`: `{name}-{version}.data/scripts/<name>`,
    /// which installers copy to the environment's `bin/`, mode 0755.
    pub fn add_script(&mut self, name: &str, src: &Path) -> Result<()> {
        if name.contains('/') {
            return Err(WheelError::InvalidPath {
                path: name.to_string(),
                reason: "a script name cannot contain `/`",
            }
            .into());
        }
        let path = format!("{}/scripts/{name}", self.data_dir()?);
        self.add_file(&path, src)?;
        if let Some(entry) = self.entries.get_mut(&path) {
            entry.mode = MODE_EXECUTABLE;
        }
        Ok(())
    }

    fn insert(&mut self, archive_path: &str, source: Source, mode: u32) -> Result<()> {
        validate_archive_path(archive_path)?;
        self.check_not_reserved(archive_path)?;
        if self.entries.contains_key(archive_path) {
            return Err(WheelError::DuplicateEntry(archive_path.to_string()).into());
        }
        self.entries
            .insert(archive_path.to_string(), Entry { source, mode });
        Ok(())
    }

    /// The writer owns WHEEL, METADATA and RECORD, and a wheel has one `.dist-info` and one
    /// `.data` folder: those of this distribution.
    fn check_not_reserved(&self, path: &str) -> Result<(), WheelError> {
        let dist_info = self.dist_info_dir()?;
        let data = self.data_dir()?;
        let top = path.split('/').next().unwrap_or_default();
        let generated = ["WHEEL", "METADATA", "RECORD"].map(|f| format!("{dist_info}/{f}"));
        let foreign_special_dir = (top.ends_with(".dist-info") && top != dist_info)
            || (top.ends_with(".data") && top != data);
        if generated.iter().any(|g| g == path)
            || foreign_special_dir
            || path == dist_info
            || path == data
        {
            return Err(WheelError::ReservedPath(path.to_string()));
        }
        Ok(())
    }

    /// Writes `<out_dir>/<file_name()>` (creating `out_dir`), replacing any wheel of that name.
    ///
    /// Every entry is stamped with `source_date_epoch` (or 1980-01-01 when `None`), so the same
    /// entries give a byte-identical wheel. On any error the destination is left untouched.
    pub fn write(self, out_dir: &Path, source_date_epoch: Option<u64>) -> Result<WrittenWheel> {
        let file_name = self.file_name()?;
        let dist_info = self.dist_info_dir()?;
        let data = self.data_dir()?;
        let generator = format!("flashgen {}", env!("CARGO_PKG_VERSION"));

        let mut entries: Vec<(String, Entry)> = self.entries.into_iter().collect();
        let generated = [
            ("WHEEL", wheel_file(&self.tag, &generator)),
            ("METADATA", metadata_file(&self.meta)?),
        ];
        for (name, text) in generated {
            let entry = Entry {
                source: Source::Bytes(text.into_bytes()),
                mode: MODE_FILE,
            };
            entries.push((format!("{dist_info}/{name}"), entry));
        }
        // Package files first, then `.data`, then `.dist-info` (the order the spec recommends,
        // so metadata sits at the end of the archive), each group sorted by path.
        entries.sort_by(|(a, _), (b, _)| {
            let group = |p: &str| {
                if p.starts_with(&format!("{dist_info}/")) {
                    2
                } else if p.starts_with(&format!("{data}/")) {
                    1
                } else {
                    0
                }
            };
            (group(a), a).cmp(&(group(b), b))
        });

        fs::create_dir_all(out_dir)
            .with_context(|| format!("creating the wheel folder {}", out_dir.display()))?;
        let dest = out_dir.join(&file_name);
        let mut out = AtomicFile::create(&dest)?;
        {
            let mut zip = ZipArchiveWriter::new(BufWriter::new(out.file()), source_date_epoch);
            for (path, entry) in &entries {
                match &entry.source {
                    Source::Bytes(bytes) => zip.add_bytes(path, bytes, entry.mode)?,
                    Source::File(src) => zip.add_file(path, src, entry.mode)?,
                }
            }
            let buffered = zip.finish(&format!("{dist_info}/RECORD"))?;
            buffered
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(|| format!("writing {}", dest.display()))?;
        }
        let (sha256, size, written) = inspect(out.file())
            .with_context(|| format!("reading back the wheel written for {}", dest.display()))?;
        let path = out.commit()?;
        Ok(WrittenWheel {
            path,
            sha256,
            size,
            entries: written,
        })
    }
}

/// Hashes the finished archive and lists its entries with their compressed sizes, which the
/// zip writer does not report as it goes.
fn inspect(file: &mut File) -> Result<(String, u64, Vec<WrittenEntry>)> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = HashingWriter::new(std::io::sink());
    std::io::copy(file, &mut hasher)?;
    let (_, digest) = hasher.finish();

    file.seek(SeekFrom::Start(0))?;
    let mut archive = zip::ZipArchive::new(&mut *file)?;
    let mut entries = Vec::with_capacity(archive.len());
    for i in 0..archive.len() {
        let e = archive.by_index_raw(i)?;
        entries.push(WrittenEntry {
            path: e.name().to_string(),
            size: e.size(),
            compressed_size: e.compressed_size(),
        });
    }
    Ok((digest.hex(), digest.size, entries))
}

#[cfg(unix)]
fn is_executable(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_meta: &fs::Metadata) -> bool {
    false
}

/// Reads `SOURCE_DATE_EPOCH` (seconds since 1970) for [`WheelBuilder::write`]: `None` when
/// unset or empty, an error naming the variable when it is not a number.
pub fn source_date_epoch_from_env() -> Result<Option<u64>> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v.trim().parse::<u64>().map(Some).with_context(|| {
            format!("SOURCE_DATE_EPOCH={v:?} is not a whole number of seconds since 1970")
        }),
        Err(_) => Ok(None),
    }
}
