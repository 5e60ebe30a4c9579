//! Where wheel entries go: the `ArchiveWriter` trait, and its zip implementation that streams
//! each entry through a hashing adapter, with fixed modes, times and compression so the same
//! inputs give the same bytes, and writes RECORD last.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::Path;

use anyhow::{Context, Result};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::wheel::hashing::HashingWriter;
use crate::wheel::record::Record;

/// Mode of ordinary entries.
pub const MODE_FILE: u32 = 0o644;
/// Mode of executables and scripts.
pub const MODE_EXECUTABLE: u32 = 0o755;

/// Deflate level 6 (zlib's default): near the best ratio for `.so` files at a fraction of the
/// time of 9; fixed, because the level changes the bytes.
const DEFLATE_LEVEL: i64 = 6;

/// 1980-01-01T00:00:00Z, the earliest time a zip entry can hold; the time used when no
/// `SOURCE_DATE_EPOCH` is given, so a wheel never carries the time it was built.
pub const ZIP_EPOCH: u64 = 315_532_800;

/// A sink for wheel entries. Entries are written in the order they are added.
pub trait ArchiveWriter {
    /// Adds `bytes` as the file `path` with the Unix permission bits `mode`.
    fn add_bytes(&mut self, path: &str, bytes: &[u8], mode: u32) -> Result<()>;
    /// Adds the file at `src` as `path`, streamed from disk.
    fn add_file(&mut self, path: &str, src: &Path, mode: u32) -> Result<()>;
}

/// A zip archive that hashes every entry as it is written and can then close itself with a
/// RECORD covering all of them.
pub struct ZipArchiveWriter<W: Write + Seek> {
    zip: ZipWriter<W>,
    record: Record,
    mtime: DateTime,
}

impl<W: Write + Seek> ZipArchiveWriter<W> {
    /// `source_date_epoch` (seconds since 1970, UTC) stamps every entry; `None` stamps
    /// [`ZIP_EPOCH`].
    pub fn new(inner: W, source_date_epoch: Option<u64>) -> Self {
        ZipArchiveWriter {
            zip: ZipWriter::new(inner),
            record: Record::default(),
            mtime: zip_datetime(source_date_epoch.unwrap_or(ZIP_EPOCH)),
        }
    }

    fn options(&self, mode: u32, size: u64) -> SimpleFileOptions {
        SimpleFileOptions::default()
            .compression_method(CompressionMethod::Deflated)
            .compression_level(Some(DEFLATE_LEVEL))
            .last_modified_time(self.mtime)
            .unix_permissions(mode)
            // Zip64 only where needed (leaving a margin for deflate's worst-case growth), so
            // ordinary wheels stay readable by the simplest unzip.
            .large_file(size >= 0xF000_0000)
    }

    fn add_reader(
        &mut self,
        path: &str,
        reader: &mut dyn Read,
        mode: u32,
        size: u64,
    ) -> Result<()> {
        self.zip
            .start_file(path, self.options(mode, size))
            .with_context(|| format!("starting wheel entry `{path}`"))?;
        let mut sink = HashingWriter::new(&mut self.zip);
        io::copy(reader, &mut sink).with_context(|| format!("writing wheel entry `{path}`"))?;
        let (_, digest) = sink.finish();
        self.record.push(path, digest);
        Ok(())
    }

    /// Writes `record_path` (RECORD) as the last entry and the zip's central directory, and
    /// gives back the underlying writer.
    pub fn finish(mut self, record_path: &str) -> Result<W> {
        let record = self.record.render(record_path);
        self.zip
            .start_file(record_path, self.options(MODE_FILE, record.len() as u64))
            .with_context(|| format!("starting wheel entry `{record_path}`"))?;
        self.zip
            .write_all(record.as_bytes())
            .with_context(|| format!("writing wheel entry `{record_path}`"))?;
        self.zip
            .finish()
            .context("writing the zip central directory")
    }
}

impl<W: Write + Seek> ArchiveWriter for ZipArchiveWriter<W> {
    fn add_bytes(&mut self, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
        self.add_reader(path, &mut &bytes[..], mode, bytes.len() as u64)
    }

    fn add_file(&mut self, path: &str, src: &Path, mode: u32) -> Result<()> {
        let mut file =
            File::open(src).with_context(|| format!("opening {} for the wheel", src.display()))?;
        let size = file
            .metadata()
            .with_context(|| format!("reading the size of {}", src.display()))?
            .len();
        self.add_reader(path, &mut file, mode, size)
            .with_context(|| format!("adding {} to the wheel", src.display()))
    }
}

/// Seconds since 1970 (UTC) as a zip date-time, clamped to what zip can hold (1980 to 2107).
/// Zip times carry no zone; UTC makes the bytes the same wherever the wheel is built.
pub fn zip_datetime(epoch_secs: u64) -> DateTime {
    // 2107-12-31T23:59:58Z, the last time a DOS date-time can hold.
    const ZIP_END: u64 = 4_354_819_198;
    let t = epoch_secs.clamp(ZIP_EPOCH, ZIP_END);
    let (days, secs) = (t / 86_400, t % 86_400);
    let (y, m, d) = civil_from_days(days);
    let (h, min, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    // In range by the clamp above, so the conversion cannot fail.
    DateTime::from_date_and_time(y as u16, m as u8, d as u8, h as u8, min as u8, s as u8)
        .expect("clamped to the zip date range")
}

/// Days since 1970-01-01 to a (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Counted in 400-year eras starting on 0000-03-01, where leap days fall at the era's end.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ymdhms(dt: DateTime) -> (u16, u8, u8, u8, u8, u8) {
        (
            dt.year(),
            dt.month(),
            dt.day(),
            dt.hour(),
            dt.minute(),
            dt.second(),
        )
    }

    #[test]
    fn epoch_seconds_become_utc_zip_times() {
        assert_eq!(ymdhms(zip_datetime(ZIP_EPOCH)), (1980, 1, 1, 0, 0, 0));
        assert_eq!(ymdhms(zip_datetime(0)), (1980, 1, 1, 0, 0, 0));
        // 2024-02-29T12:34:56Z: a leap day; zip keeps even seconds only.
        assert_eq!(
            ymdhms(zip_datetime(1_709_210_096)),
            (2024, 2, 29, 12, 34, 56)
        );
        assert_eq!(
            ymdhms(zip_datetime(1_700_000_001)),
            (2023, 11, 14, 22, 13, 20)
        );
        assert_eq!(ymdhms(zip_datetime(u64::MAX)), (2107, 12, 31, 23, 59, 58));
    }
}
