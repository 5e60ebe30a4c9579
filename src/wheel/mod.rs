//! The PEP 427 wheel writer behind `flashgen build-wheel`: collects entries, writes a
//! reproducible `.whl` atomically with WHEEL, METADATA and RECORD, and picks the manylinux
//! platform tag from the glibc and libstdc++ symbol versions the bundled ELF files need.

mod atomic;
mod builder;
mod error;
mod hashing;
mod metadata;
mod names;
mod platform;
mod policy;
mod record;
mod sources;
mod writer;

#[cfg(test)]
mod tests;

pub use builder::{source_date_epoch_from_env, WheelBuilder, WrittenEntry, WrittenWheel};
pub use error::WheelError;
pub use metadata::{WheelMetadata, WheelTag};
pub use names::escape_distribution_name;
pub use platform::{platform_tag, PlatformReport};
pub use sources::read_tree_file;
pub use writer::{ArchiveWriter, ZipArchiveWriter, ZIP_EPOCH};
