//! `flashgen build-wheel`: the AOT build, packaged with the loader, the sources and this binary.
//!
//! The wheel's `.so` files come from the same `Builder::build` as `flashgen build` and the
//! runtime JIT, so a precompiled instance and a JIT-compiled one are the same bytes. The sources
//! and `variants.json` ship as the bytes this run read, checked against what it compiled.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::build::{BuildReport, Builder};
use crate::cli::WheelArgs;
use crate::cuda_packages;
use crate::error::UsageError;
use crate::fsutil::{human_bytes, sha256_bytes};
use crate::matrix::Matrix;
use crate::records::Manifest;
use crate::ui::Ui;
use crate::wheel::{self, WheelBuilder, WheelMetadata, WheelTag};

/// The Python package; the loader reads `_aot/`, `_data/`, `_src/` and `_bin/` inside it.
const PACKAGE: &str = "flashgen";

pub fn run(matrix: &Matrix, args: &WheelArgs) -> Result<()> {
    let ui = Ui::new(args.compile.quiet);
    let c = &args.compile;
    let mut sources = Vec::new();
    for dir in ["csrc", "include"] {
        collect_tree(
            &matrix.root.join(dir),
            &format!("{PACKAGE}/_src/{dir}"),
            &mut sources,
        )?;
    }
    // The glibc target: the instances are built for it, the JIT builds for it (the manifest
    // says so), and the wheel requires the zig that does it.
    let target = crate::manylinux::Glibc::resolve(c.manylinux.as_deref())?;
    let aot = if args.no_aot {
        if c.filter.module.is_some() || !c.filter.wheres.is_empty() || c.filter.aot {
            return Err(UsageError::new(
                "--no-aot builds a wheel without precompiled instances; it takes no --module, --where or --aot",
            )
            .into());
        }
        ui.status("--no-aot: a JIT-only wheel; the loader compiles every kernel on first use");
        None
    } else {
        Some(build_aot(matrix, args, &sources, &ui)?)
    };

    let binary = match &args.binary {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("cannot locate the running flashgen binary")?,
    };
    let mut elf_files: Vec<PathBuf> = aot
        .iter()
        .flat_map(|(_, r)| r.built.iter().map(|b| b.path.clone()))
        .collect();
    elf_files.push(binary.clone());
    let platform = wheel::platform_tag(&elf_files, std::env::consts::ARCH)?;
    for note in &platform.notes {
        ui.status(format!("platform: {note}"));
    }
    if let Some(target) = target {
        check_manylinux_target(target, &platform)?;
    }

    let readme = std::fs::read_to_string(matrix.root.join("README.md")).ok();
    let meta = WheelMetadata {
        name: PACKAGE.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        summary: env!("CARGO_PKG_DESCRIPTION").into(),
        requires_python: ">=3.9".into(),
        license: env!("CARGO_PKG_LICENSE").into(),
        readme: readme.map(|r| ("text/markdown".to_string(), r)),
        requires_dist: requirements(aot.as_ref().map(|(b, _)| &b.toolchain), target),
        provides_extra: vec![cuda_packages::JIT_EXTRA.to_string()],
    };
    // The .so files are loaded through ctypes, never as Python extensions: any CPython 3.
    let mut w = WheelBuilder::new(meta, WheelTag::new("py3", "none", &platform.tag));
    let mut python = Vec::new();
    collect_tree(
        &matrix.root.join("python").join(PACKAGE),
        PACKAGE,
        &mut python,
    )?;
    for f in python.into_iter().chain(sources) {
        w.add_bytes(&f.archive, f.bytes, f.executable)?;
    }
    match &aot {
        Some((builder, report)) => add_aot(&mut w, builder, report)?,
        // The same manifest with nothing in it: the loader finds no precompiled kernel (and no
        // arch it runs on) and JIT-compiles; doctor reports the empty set.
        None => w.add_bytes(
            &format!("{PACKAGE}/_aot/manifest.json"),
            serde_json::to_string_pretty(&Manifest {
                flashgen_version: env!("CARGO_PKG_VERSION").into(),
                toolchain: None,
                manylinux: target.map(|g| g.spelling()),
                archs: Vec::new(),
                runs_on: Vec::new(),
                instances: Vec::new(),
            })?
            .into_bytes(),
            false,
        )?,
    }
    let describe = super::describe::describe(matrix);
    w.add_bytes(
        &format!("{PACKAGE}/_data/matrix.json"),
        serde_json::to_vec_pretty(&describe)?,
        false,
    )?;
    w.add_bytes(
        &format!("{PACKAGE}/_src/variants.json"),
        matrix.config_text.clone().into_bytes(),
        false,
    )?;
    // The binary ships once; the `flashgen` command is a console script that execs it.
    w.add_bytes(
        &format!("{PACKAGE}/_bin/flashgen"),
        std::fs::read(&binary)?,
        true,
    )?;
    w.add_bytes(
        &format!("{}/entry_points.txt", w.dist_info_dir()?),
        format!("[console_scripts]\nflashgen = {PACKAGE}.__main__:main\n").into_bytes(),
        false,
    )?;

    let out = std::path::absolute(&args.out)?;
    let written = w.write(&out, wheel::source_date_epoch_from_env()?)?;
    let budget = args
        .max_wheel_mib
        .map_or(matrix.release.max_wheel_bytes, |mib| mib << 20);
    if written.size > budget {
        let modules: Vec<(String, &str)> = aot
            .iter()
            .flat_map(|(_, r)| &r.built)
            .map(|b| {
                (
                    format!("{PACKAGE}/_aot/{}.so", b.inst.uri),
                    matrix.module(b.inst).name.as_str(),
                )
            })
            .collect();
        let over = over_budget(&written, &modules, budget, args.max_wheel_mib.is_some());
        std::fs::remove_file(&written.path)
            .with_context(|| format!("cannot remove {}", written.path.display()))?;
        bail!("{over}");
    }
    ui.status(format!(
        "wrote {} ({}, sha256 {}, {} precompiled instances, tag {})",
        written.path.display(),
        human_bytes(written.size),
        written.sha256,
        aot.as_ref().map_or(0, |(_, r)| r.built.len()),
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

/// Why a wheel over `budget` bytes is refused: its size, and what takes the room (the binary,
/// the sources, the kernels of each module), largest first. `modules`: each kernel's archive
/// path and its module.
fn over_budget(
    written: &wheel::WrittenWheel,
    modules: &[(String, &str)],
    budget: u64,
    from_cli: bool,
) -> String {
    let mut groups: Vec<(String, u64, usize)> = Vec::new();
    for e in &written.entries {
        let group = match modules.iter().find(|(p, _)| *p == e.path) {
            Some((_, module)) => format!("kernels of {module}"),
            None if e.path.starts_with(&format!("{PACKAGE}/_bin/")) => "the flashgen binary".into(),
            None if e.path.starts_with(&format!("{PACKAGE}/_src/")) => "kernel sources".into(),
            None => "loader, matrix and metadata".into(),
        };
        match groups.iter_mut().find(|(g, _, _)| *g == group) {
            Some((_, size, n)) => {
                *size += e.compressed_size;
                *n += 1;
            }
            None => groups.push((group, e.compressed_size, 1)),
        }
    }
    groups.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let lines: Vec<String> = groups
        .iter()
        .map(|(g, size, n)| format!("  {:>10}  {g} ({n} files)", human_bytes(*size)))
        .collect();
    format!(
        "{} is {}, over the budget of {} ({}); it was removed. Compressed, by part:\n{}\n\n\
         hint: build fewer instances or architectures (variants.json release.archs, --arch, \
         filters), or raise the budget (variants.json release.max_wheel_mib, --max-wheel-mib) \
         where the index allows larger files",
        written.path.display(),
        human_bytes(written.size),
        human_bytes(budget),
        if from_cli {
            "--max-wheel-mib"
        } else {
            "variants.json release.max_wheel_mib, default PyPI's 100 MiB"
        },
        lines.join("\n")
    )
}

/// What the wheel requires: the shared CUDA runtime its instances (and its JIT's) link, and,
/// as the `jit` extra, the toolchain that built them (`toolchain`; the pinned release for a
/// JIT-only wheel) with zig for a glibc `target`.
fn requirements(
    toolchain: Option<&crate::toolchain::Toolchain>,
    target: Option<crate::manylinux::Glibc>,
) -> Vec<String> {
    let (major, version) = match toolchain {
        Some(tc) => (crate::compile::cuda_major(tc), tc.nvcc_version.as_str()),
        None => (crate::compile::DEFAULT_CUDA_MAJOR, ""),
    };
    let zig = target.map(|_| crate::manylinux::ZIG_REQUIREMENT);
    std::iter::once(cuda_packages::runtime_requirement(major))
        .chain(cuda_packages::jit_requirements(version, zig))
        .collect()
}

/// With a glibc target (`--manylinux`, `FLASHGEN_MANYLINUX`), the wheel must get that tag: the
/// instances are built for it, but the shipped binary is whatever `--binary` names, and a
/// dynamically linked one needs the build machine's glibc. Refused rather than tagged higher.
fn check_manylinux_target(
    target: crate::manylinux::Glibc,
    platform: &wheel::PlatformReport,
) -> Result<()> {
    let minor = platform
        .tag
        .strip_prefix("manylinux_2_")
        .and_then(|t| t.split('_').next())
        .and_then(|m| m.parse::<u32>().ok());
    if minor.is_some_and(|m| m <= target.minor) {
        return Ok(());
    }
    let needs: Vec<String> = platform
        .newest
        .iter()
        .map(|(v, f)| format!("{v} ({})", f.display()))
        .collect();
    Err(UsageError::new(format!(
        "--manylinux {}: the wheel's files need platform {}: {}",
        target.tag(),
        platform.tag,
        needs.join(", ")
    ))
    .with_hint(
        "ship a static binary: RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu, then --binary target/x86_64-unknown-linux-gnu/release/flashgen (ci/build-wheel.sh does this)",
    )
    .into())
}

/// The AOT build: the precompiled subset (or the filtered set) made present in the cache and
/// copied to `--build-dir`, checked against the sources the wheel ships.
fn build_aot<'m>(
    matrix: &'m Matrix,
    args: &WheelArgs,
    sources: &[Snapshot],
    ui: &Ui,
) -> Result<(Builder<'m>, BuildReport<'m>)> {
    let c = &args.compile;
    // No filter at all means the precompiled subset variants.json declares; a release is the
    // whole matrix (filters narrow it), for the release's architectures.
    let mut filter = c.filter.clone();
    if !args.release && filter.module.is_none() && filter.wheres.is_empty() {
        filter.aot = true;
    }
    let release_archs = matrix.release.archs.join(" ");
    let archs = match (&c.arch, args.release) {
        (Some(a), _) => Some(a.as_str()),
        // Exactly the declared list: an inherited FLASHGEN_CUDA_ARCH_LIST does not narrow a release.
        (None, true) => Some(release_archs.as_str()),
        (None, false) => None,
    };
    super::check_out_dir(matrix, &args.build_dir, "--build-dir")?;
    crate::build::check_out_claimable(&args.build_dir, "--build-dir")?;
    let selected = filter.select(matrix)?;
    let builder = super::builder(
        matrix,
        archs,
        !c.no_compress,
        c.launcher.as_deref(),
        c.manylinux.as_deref(),
    )?;
    let selected = super::buildable(&builder, &selected, ui)?;
    let mut opts = super::build::options(c, &builder, args.build_dir.clone(), ui)?;
    // The wheel ships what the cache verified in this run, never what a stamp vouches for.
    opts.use_stamp = false;
    let report = builder.build(&selected, &opts, ui)?;
    super::build::finish(&report, ui, &args.build_dir)?;
    check_sources_unchanged(&builder.hashed_inputs(), sources)?;
    Ok((builder, report))
}

/// The built `.so` files and their manifest, under `flashgen/_aot/`. Each file is read once;
/// those bytes are hashed, checked against the sha256 the cache record gave this run, and
/// packed. The manifest is serialized from the same in-memory result, not read back.
fn add_aot(w: &mut WheelBuilder, builder: &Builder, report: &BuildReport) -> Result<()> {
    for b in &report.built {
        let bytes =
            std::fs::read(&b.path).with_context(|| format!("cannot read {}", b.path.display()))?;
        let sha = sha256_bytes(&bytes);
        if sha != b.entry.sha256 {
            bail!(
                "{} does not match its cache record (sha256 {sha}, recorded {}); build again",
                b.path.display(),
                b.entry.sha256
            );
        }
        w.add_bytes(&format!("{PACKAGE}/_aot/{}.so", b.inst.uri), bytes, true)?;
    }
    w.add_bytes(
        &format!("{PACKAGE}/_aot/manifest.json"),
        serde_json::to_string_pretty(&builder.manifest(&report.built))?.into_bytes(),
        false,
    )
}

/// A file read into memory for the wheel.
struct Snapshot {
    path: PathBuf,
    archive: String,
    bytes: Vec<u8>,
    executable: bool,
}

/// Every file under `dir` (sorted; caches, bytecode and dot files left out) as
/// `prefix/<relative path>`.
fn collect_tree(dir: &Path, prefix: &str, out: &mut Vec<Snapshot>) -> Result<()> {
    collect_tree_in(dir, dir, prefix, out)
}

fn collect_tree_in(top: &Path, dir: &Path, prefix: &str, out: &mut Vec<Snapshot>) -> Result<()> {
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
            collect_tree_in(top, &path, &archive, out)?;
        } else {
            // No symlink out of `top`, nothing but regular files.
            let (bytes, executable) = wheel::read_tree_file(&path, top)?;
            out.push(Snapshot {
                path,
                archive,
                bytes,
                executable,
            });
        }
    }
    Ok(())
}

/// Fails when a file the build compiled differs from the copy the wheel ships: an edit landed
/// while the wheel was building.
fn check_sources_unchanged(hashed: &[(PathBuf, String)], sources: &[Snapshot]) -> Result<()> {
    for (path, sha) in hashed {
        if let Some(s) = sources.iter().find(|s| &s.path == path) {
            if format!("{:x}", Sha256::digest(&s.bytes)) != *sha {
                bail!(
                    "{} changed while the wheel was building; run build-wheel again",
                    path.display()
                );
            }
        }
    }
    Ok(())
}
