//! `flashgen build-wheel`: the AOT build, packaged with the loader, the sources and this binary.
//!
//! The wheel's `.so` files come from the same `Builder::build` as `flashgen build` and the
//! runtime JIT, so a precompiled instance and a JIT-compiled one are the same bytes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::build::BuildReport;
use crate::cli::WheelArgs;
use crate::fsutil::{human_bytes, sha256_file};
use crate::matrix::Matrix;
use crate::ui::Ui;
use crate::wheel::{self, WheelBuilder, WheelMetadata, WheelTag};

/// Where each part lives inside the installed package; the Python loader reads the same names.
const PACKAGE: &str = "flashgen";

pub fn run(matrix: &Matrix, args: &WheelArgs) -> Result<()> {
    let ui = Ui::new(args.compile.quiet);
    let c = &args.compile;
    // No filter at all means the precompiled subset variants.json declares.
    let mut filter = c.filter.clone();
    if filter.module.is_none() && filter.wheres.is_empty() {
        filter.aot = true;
    }
    let selected = filter.select(matrix)?;
    let builder = super::builder(matrix, c.arch.as_deref(), !c.no_compress)?;
    let report = builder.build(
        &selected,
        &super::build::options(c, &builder, args.build_dir.clone()),
        &ui,
    )?;
    super::build::finish(&report, &ui, &args.build_dir)?;

    let binary = match &args.binary {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("cannot locate the running flashgen binary")?,
    };
    let mut elf_files: Vec<PathBuf> = report.built.iter().map(|b| b.path.clone()).collect();
    elf_files.push(binary.clone());
    let platform = wheel::platform_tag(&elf_files, std::env::consts::ARCH)?;
    for note in &platform.notes {
        ui.status(format!("platform: {note}"));
    }

    let readme = std::fs::read_to_string(matrix.root.join("README.md")).ok();
    let meta = WheelMetadata {
        name: PACKAGE.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        summary: env!("CARGO_PKG_DESCRIPTION").into(),
        requires_python: ">=3.9".into(),
        license: env!("CARGO_PKG_LICENSE").into(),
        readme: readme.map(|r| ("text/markdown".to_string(), r)),
        requires_dist: Vec::new(),
    };
    // The .so files are loaded through ctypes, never as Python extensions: any CPython 3.
    let mut w = WheelBuilder::new(meta, WheelTag::new("py3", "none", &platform.tag));
    add_tree(&mut w, &matrix.root.join("python").join(PACKAGE), PACKAGE)?;
    add_aot(&mut w, &report, &args.build_dir)?;
    let describe = super::describe::describe_json(matrix);
    w.add_bytes(
        &format!("{PACKAGE}/_data/matrix.json"),
        serde_json::to_vec_pretty(&describe)?,
        false,
    )?;
    w.add_file(
        &format!("{PACKAGE}/_src/variants.json"),
        &matrix.config_path,
    )?;
    for dir in ["csrc", "include"] {
        add_tree(
            &mut w,
            &matrix.root.join(dir),
            &format!("{PACKAGE}/_src/{dir}"),
        )?;
    }
    w.add_bytes(
        &format!("{PACKAGE}/_bin/flashgen"),
        std::fs::read(&binary)?,
        true,
    )?;
    w.add_script("flashgen", &binary)?;

    let written = w.write(
        &std::path::absolute(&args.out)?,
        wheel::source_date_epoch_from_env()?,
    )?;
    ui.status(format!(
        "wrote {} ({}, sha256 {}, {} precompiled instances, tag {})",
        written.path.display(),
        human_bytes(written.size),
        written.sha256,
        report.built.len(),
        platform.tag
    ));
    let mut largest: Vec<_> = written.entries.iter().collect();
    largest.sort_by(|a, b| {
        b.compressed_size
            .cmp(&a.compressed_size)
            .then(a.path.cmp(&b.path))
    });
    ui.status("largest entries (compressed / uncompressed):");
    for e in largest.iter().take(6) {
        ui.status(format!(
            "  {:>10} / {:>10}  {}",
            human_bytes(e.compressed_size),
            human_bytes(e.size),
            e.path
        ));
    }
    println!("{}", written.path.display());
    Ok(())
}

/// The built `.so` files (re-hashed: only bytes matching the cache's record ship) and their
/// manifest, under `flashgen/_aot/`.
fn add_aot(w: &mut WheelBuilder, report: &BuildReport, build_dir: &Path) -> Result<()> {
    for b in &report.built {
        let sha = sha256_file(&b.path)?;
        if sha != b.entry.sha256 {
            bail!(
                "{} does not match its cache record (sha256 {sha}, recorded {}); run `flashgen clean` and build again",
                b.path.display(),
                b.entry.sha256
            );
        }
        w.add_file(&format!("{PACKAGE}/_aot/{}.so", b.inst.uri), &b.path)?;
    }
    w.add_file(
        &format!("{PACKAGE}/_aot/manifest.json"),
        &build_dir.join("manifest.json"),
    )
}

/// Every file under `dir` (sorted, caches and bytecode left out) as `prefix/<relative path>`.
fn add_tree(w: &mut WheelBuilder, dir: &Path, prefix: &str) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "__pycache__" || name.ends_with(".pyc") || name.starts_with('.') {
            continue;
        }
        let path = e.path();
        let archive = format!("{prefix}/{name}");
        if e.file_type()?.is_dir() {
            add_tree(w, &path, &archive)?;
        } else {
            w.add_file(&archive, &path)?;
        }
    }
    Ok(())
}
