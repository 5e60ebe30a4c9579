//! The CLI verbs, each a short file over the library.

mod build;
mod build_wheel;
mod clean;
mod describe;
mod doctor;
mod generate;
mod list_variants;

use std::path::Path;

use anyhow::Result;

use crate::arch::{self, Arch};
use crate::build::Builder;
use crate::cache::Cache;
use crate::cli::{Cli, Command};
use crate::matrix::Matrix;
use crate::toolchain::Toolchain;

pub fn run(cli: Cli) -> Result<()> {
    let load = || Matrix::load(&cli.config, &cli.variants_files);
    match &cli.command {
        Command::ListVariants(a) => list_variants::run(&load()?, a),
        Command::Describe(_) => describe::run(&load()?),
        Command::Generate(a) => generate::run(&load()?, a),
        Command::Build(a) => build::run(&load()?, a),
        Command::BuildWheel(a) => build_wheel::run(&load()?, a),
        Command::Clean(a) => clean::run(a),
        Command::Doctor(a) => doctor::run(&cli.config, &cli.variants_files, a),
    }
}

/// A builder over the matrix with the discovered toolchain, the shared cache and the resolved
/// architectures.
pub(crate) fn builder<'m>(
    matrix: &'m Matrix,
    arch: Option<&str>,
    compress: bool,
) -> Result<Builder<'m>> {
    let (archs, _) = arch::resolve(arch, &matrix.archs)?;
    let cache = Cache::open_default()?;
    let toolchain = Toolchain::discover(Some(&cache.dir))?;
    Ok(Builder::new(matrix, toolchain, cache, archs, compress))
}

/// Generated headers must never land in `csrc/`: a quoted include there would find one
/// instance's header for every instance.
pub(crate) fn check_out_dir(matrix: &Matrix, out: &Path, flag: &str) -> Result<()> {
    let out = std::path::absolute(out)?;
    let csrc = matrix.root.join("csrc");
    if out.starts_with(&csrc) {
        return Err(crate::error::UsageError::new(format!(
            "{flag} {}: generated files never go inside {}",
            out.display(),
            csrc.display()
        ))
        .with_hint("pick a build folder outside the source tree, e.g. build/flashgen")
        .into());
    }
    Ok(())
}

pub(crate) fn archs_text(archs: &[Arch]) -> String {
    archs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn display(p: &Path) -> String {
    p.display().to_string()
}
