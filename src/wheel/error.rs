//! The wheel writer's errors that a caller may want to match on; everything else (I/O with the
//! path at fault) travels as `anyhow` context.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum WheelError {
    #[error("`{0}` is added to the wheel twice\n\nEach archive path may be added once.")]
    DuplicateEntry(String),

    #[error("`{path}` cannot be a wheel entry: {reason}")]
    InvalidPath { path: String, reason: &'static str },

    #[error("`{0}` is written by the wheel writer itself and cannot be added")]
    ReservedPath(String),

    #[error("`{0}` is not a valid project name\n\nUse ASCII letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit.")]
    InvalidName(String),

    #[error("`{0}` is not a version flashgen can put in a wheel file name\n\nUse a PEP 440 normalized version such as `0.1.0` or `0.1.0.dev1+cu13`.")]
    InvalidVersion(String),

    #[error("`{0}` is not a valid wheel tag component")]
    InvalidTag(String),

    #[error("metadata field `{field}` must be a single line, got {value:?}")]
    MultiLineField { field: &'static str, value: String },

    #[error("{} is not an ELF file: {reason}\n\nOnly ELF shared objects and executables decide the platform tag.", path.display())]
    NotElf { path: PathBuf, reason: String },

    #[error("{} is built for {found}, not {wanted}", path.display())]
    WrongArch {
        path: PathBuf,
        found: String,
        wanted: String,
    },

    #[error("no manylinux policy is known for architecture `{0}`\n\nflashgen tags wheels for x86_64 and aarch64.")]
    UnsupportedArch(String),

    #[error("{} needs {version}, which no manylinux policy flashgen knows allows\n\n{hint}", path.display())]
    UnsupportedSymbolVersion {
        path: PathBuf,
        version: String,
        hint: &'static str,
    },
}
