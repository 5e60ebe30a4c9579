//! The CLI verbs, each a short file over the library.

mod build;
mod build_wheel;
mod choice;
mod clean;
mod describe;
mod doctor;
mod generate;
mod jit;
mod list_variants;
mod warm;

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::arch::{self, Arch};
use crate::build::Builder;
use crate::cache::Cache;
use crate::cli::{Cli, Command};
use crate::compile::Launcher;
use crate::error::NoMatch;
use crate::instance::Instance;
use crate::manylinux::Glibc;
use crate::matrix::Matrix;
use crate::toolchain::Toolchain;
use crate::ui::Ui;

pub fn run(cli: Cli) -> Result<()> {
    let config = ConfigSource::resolve(cli.config.as_deref());
    let load = || Matrix::load(&config.path, &cli.variants_files);
    let Some(command) = &cli.command else {
        // A bare `flashgen` is a request for orientation, not a mistake: the help, exit 0.
        use clap::CommandFactory;
        Cli::command().print_help()?;
        return Ok(());
    };
    match command {
        Command::ListVariants(a) => list_variants::run(&load()?, a),
        Command::Describe(_) => describe::run(&load()?),
        Command::Generate(a) => generate::run(&load()?, a),
        Command::Build(a) => build::run(&load()?, a),
        Command::BuildWheel(a) => build_wheel::run(&load()?, a),
        Command::Clean(a) => clean::run(a),
        Command::Jit(a) => jit::run(&load()?, a),
        Command::Warm(a) => warm::run(&load()?, a),
        Command::Doctor(a) => doctor::run(&config, &cli.variants_files, a),
    }
}

/// Which `variants.json` a command reads, and why.
pub(crate) struct ConfigSource {
    pub path: PathBuf,
    pub origin: &'static str,
}

impl ConfigSource {
    /// `--config`, else `./variants.json`, else the matrix bundled with the installed wheel this
    /// binary ships in (`<package>/_bin/flashgen` beside `<package>/_src/variants.json`), so the
    /// `flashgen` command works anywhere after `pip install`.
    pub fn resolve(cli: Option<&Path>) -> ConfigSource {
        const LOCAL: &str = "variants.json";
        if let Some(p) = cli {
            return ConfigSource {
                path: p.to_path_buf(),
                origin: "--config",
            };
        }
        if !Path::new(LOCAL).exists() {
            let bundled = std::env::current_exe().ok().and_then(|exe| {
                let layout = crate::records::LAYOUT;
                let p = layout.package_of_binary(&exe)?.join(layout.variants);
                p.is_file().then_some(p)
            });
            if let Some(path) = bundled {
                return ConfigSource {
                    path,
                    origin: "bundled with the installed wheel",
                };
            }
        }
        ConfigSource {
            path: PathBuf::from(LOCAL),
            origin: "./variants.json",
        }
    }
}

/// A builder over the matrix with the discovered toolchain (for `manylinux`'s glibc target,
/// else `FLASHGEN_MANYLINUX`), the shared cache, the resolved architectures and the compile
/// launcher (`--launcher`, else `FLASHGEN_NVCC_LAUNCHER`).
pub(crate) fn builder<'m>(
    matrix: &'m Matrix,
    arch: Option<&str>,
    compress: bool,
    launcher: Option<&str>,
    manylinux: Option<&str>,
) -> Result<Builder<'m>> {
    let (archs, _) = arch::resolve(arch, &matrix.archs)?;
    let launcher = Launcher::resolve(launcher)?;
    let target = Glibc::resolve(manylinux)?;
    let cache = Cache::open_default()?;
    let toolchain = Toolchain::discover(Some(&cache.dir), target)?;
    let mut builder = Builder::new(matrix, toolchain, cache, archs, compress);
    builder.launcher = launcher;
    Ok(builder)
}

/// The selected instances this build compiles. Those whose arch limit allows none of the
/// build's archs are left out with a note (a build for 8.0 never compiles an instance limited to
/// 9.0a); when that leaves nothing of a non-empty selection, a [`NoMatch`] (exit 1) says why.
pub(crate) fn buildable<'m>(
    builder: &Builder<'m>,
    selected: &[&'m Instance],
    ui: &Ui,
) -> Result<Vec<&'m Instance>> {
    let (kept, skipped) = builder.buildable(selected);
    if skipped.is_empty() {
        return Ok(kept);
    }
    let why = skipped_summary(builder.matrix, &skipped);
    if kept.is_empty() {
        return Err(NoMatch(format!(
            "none of the {} selected instances is built for {}:\n{why}\n\nhint: add their \
             architectures to --arch (or FLASHGEN_CUDA_ARCH_LIST)",
            skipped.len(),
            archs_text(&builder.archs)
        ))
        .into());
    }
    ui.note(format!(
        "skipping {} of {} instances: built for none of {}\n{why}",
        skipped.len(),
        selected.len(),
        archs_text(&builder.archs)
    ));
    Ok(kept)
}

/// One line per arch limit among `skipped`: the limit, how many, and a few URIs.
pub(crate) fn skipped_summary(matrix: &Matrix, skipped: &[&Instance]) -> String {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for inst in skipped {
        let limit = arch::spell(&matrix.arch_limit(inst).unwrap_or_default());
        match groups.iter_mut().find(|(l, _)| *l == limit) {
            Some((_, uris)) => uris.push(&inst.uri),
            None => groups.push((limit, vec![&inst.uri])),
        }
    }
    groups
        .iter()
        .map(|(limit, uris)| {
            let shown: Vec<&str> = uris.iter().take(3).copied().collect();
            let more = if uris.len() > 3 {
                format!(", ... ({} more)", uris.len() - 3)
            } else {
                String::new()
            };
            format!("  built only for {limit}: {}{more}", shown.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
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
