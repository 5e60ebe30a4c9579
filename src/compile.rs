//! One nvcc invocation: the command line for an instance, and running it.
//!
//! The command is complete and standalone: the error shown on failure, and each entry of
//! `compile_commands.json`, can be pasted into a shell to reproduce the compile alone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::arch::Arch;
use crate::toolchain::Toolchain;

/// Flags every instance gets: a self-contained shared object with only the C entry points
/// exported, and reproducible bytes (see DEVELOPERS.md).
const FIXED_FLAGS: &[&str] = &[
    "-shared",
    "-Xcompiler=-fPIC",
    "-cudart=static",
    "-Xlinker=--strip-all",
    "-Xlinker=--build-id=none",
];

pub const FATBIN_COMPRESSION: &str = "-Xfatbin=-compress-all";

/// The flags that shape the output, in order: they go into the cache key.
pub fn output_flags(user_flags: &[String], archs: &[Arch], compress: bool) -> Vec<String> {
    let mut flags: Vec<String> = FIXED_FLAGS.iter().map(|s| s.to_string()).collect();
    flags.extend(user_flags.iter().cloned());
    if compress && !flags.iter().any(|f| f == FATBIN_COMPRESSION) {
        flags.push(FATBIN_COMPRESSION.into());
    }
    flags.extend(archs.iter().flat_map(Arch::gencode));
    flags
}

#[derive(Debug, Clone)]
pub struct NvccCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl NvccCommand {
    /// `include_dirs` are searched in order; the generated header's folder comes first.
    pub fn new(
        tc: &Toolchain,
        flags: &[String],
        include_dirs: &[PathBuf],
        source: &Path,
        output: &Path,
    ) -> Self {
        let mut args: Vec<String> = Vec::new();
        if std::env::var_os("NVCC_CCBIN").is_some() {
            args.push(format!("-ccbin={}", tc.host_compiler_path.display()));
        }
        args.extend(flags.iter().cloned());
        args.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
        args.extend(tc.lib_dirs.iter().map(|d| format!("-L{}", d.display())));
        args.push(source.display().to_string());
        args.push("-o".into());
        args.push(output.display().to_string());
        NvccCommand {
            program: tc.nvcc.clone(),
            args,
        }
    }

    /// The command as one shell line.
    pub fn shell_line(&self) -> String {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn argv(&self) -> Vec<String> {
        std::iter::once(self.program.display().to_string())
            .chain(self.args.iter().cloned())
            .collect()
    }

    /// Runs nvcc; on failure returns its status text and stderr.
    pub fn run(&self) -> Result<Duration, (String, String)> {
        let start = Instant::now();
        match Command::new(&self.program).args(&self.args).output() {
            Ok(out) if out.status.success() => Ok(start.elapsed()),
            Ok(out) => {
                let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
                text.push_str(&String::from_utf8_lossy(&out.stdout));
                Err((out.status.to_string(), text))
            }
            Err(e) => Err((format!("could not start: {e}"), String::new())),
        }
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=/.,:+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
