//! `flashgen build-wheel`: the AOT build, packaged with the loader, the sources and this binary.
//!
//! The wheel's `.so` files come from the same `Builder::build` as `flashgen build` and the
//! runtime JIT, so a precompiled instance and a JIT-compiled one are the same bytes. The sources
//! and `variants.json` ship as the bytes this run read, checked against what it compiled.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indexmap::IndexMap;
use sha2::{Digest, Sha256};

use crate::arch::{self, Arch};
use crate::build::{BuildReport, Builder};
use crate::cli::WheelArgs;
use crate::cuda_packages;
use crate::error::UsageError;
use crate::fsutil::{human_bytes, sha256_bytes};
use crate::host_once::HostObjects;
use crate::matrix::Matrix;
use crate::records::{
    BuiltRow, KernelPackage, Layout, Manifest, ALL_KERNELS_EXTRA, LAYOUT, REQUIRES_PYTHON,
};
use crate::ui::Ui;
use crate::wheel::{self, WheelBuilder, WheelMetadata, WheelTag};

/// The Python package; the loader reads `_aot/`, `_data/`, `_src/` and `_bin/` inside it
/// ([`LAYOUT`], which `describe` exports for it).
const PACKAGE: &str = LAYOUT.package;

pub fn run(matrix: &Matrix, args: &WheelArgs) -> Result<()> {
    let ui = Ui::new(args.compile.quiet);
    let c = &args.compile;
    let mut sources = Vec::new();
    for dir in ["csrc", "include"] {
        collect_tree(
            &matrix.root.join(dir),
            &format!("{PACKAGE}/{}/{dir}", LAYOUT.sources),
            &mut sources,
        )?;
    }
    // The glibc target: the instances are built for it, the JIT builds for it (the manifest
    // says so), and the wheel's jit extra brings the zig that does it.
    let target = crate::manylinux::Glibc::resolve(c.manylinux.as_deref())?;
    let binary = match &args.binary {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("cannot locate the running flashgen binary")?,
    };
    if args.release {
        return release(matrix, args, sources, &binary, target, &ui);
    }
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
        build_aot(matrix, args, None, &sources, &ui)?
    };
    let kernels: Vec<PathBuf> = aot
        .iter()
        .flat_map(|(_, r)| r.built.iter().map(|b| b.path.clone()))
        .collect();
    let manifest = match &aot {
        Some((builder, report)) => builder.manifest(&report.built),
        // The same manifest with nothing in it: the loader finds no precompiled kernel (and no
        // arch it runs on) and JIT-compiles; doctor reports the empty set.
        None => empty_manifest(target),
    };
    let toolchain = aot.as_ref().map(|(b, _)| &b.toolchain);
    let mut w = core_wheel(
        matrix,
        &binary,
        &kernels,
        target,
        requirements(toolchain, target, &[]),
        vec![cuda_packages::JIT_EXTRA.to_string()],
        sources,
        &ui,
    )?;
    if let Some((_, report)) = &aot {
        add_kernels(&mut w, PACKAGE, report)?;
    }
    add_manifest(&mut w, PACKAGE, &manifest)?;
    let written = finish_wheel(w, matrix, args, aot.as_ref().map(|(_, r)| r), &ui)?;
    println!("{}", written.path.display());
    Ok(())
}

/// `--release`: one kernel wheel per release architecture (`flashgen-kernels-sm80`, ... each
/// holding every selected instance built for that architecture alone, and its manifest), then
/// the core wheel (loader, binary, sources; no kernels) whose manifest names them and whose
/// extras install them (`pip install 'flashgen[sm90a]'`, `flashgen[all]`). A user downloads
/// the code of the GPUs they run, and each wheel stays within the budget.
fn release(
    matrix: &Matrix,
    args: &WheelArgs,
    sources: Vec<Snapshot>,
    binary: &Path,
    target: Option<crate::manylinux::Glibc>,
    ui: &Ui,
) -> Result<()> {
    let c = &args.compile;
    let (list, from) = match &c.arch {
        Some(a) => (a.clone(), "--arch"),
        // Exactly the declared list: an inherited FLASHGEN_CUDA_ARCH_LIST does not narrow a release.
        None => (
            matrix.release.archs.join(" "),
            "variants.json release.archs",
        ),
    };
    let archs = arch::parse_list(&list, from)?;
    note_left_out(matrix, &args.compile.filter, ui)?;
    // Each architecture builds the same file names: a folder of its own for each.
    let release_root = args
        .build_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("build/release"));
    let mut packages = Vec::new();
    let mut toolchain = None;
    let mut paths = Vec::new();
    // Each instance's host code, compiled by its first architecture and reused by the others
    // (src/host_once.rs); removed when the release ends.
    let host_objects = std::sync::Arc::new(HostObjects::default());
    for (i, a) in archs.iter().enumerate() {
        let extra = kernel_extra(a);
        let Some((builder, report)) = build_aot(
            matrix,
            args,
            Some(ReleaseArch {
                arch: a,
                dir: &release_root.join(&extra),
                host_objects: &host_objects,
                later: &archs[i + 1..],
            }),
            &sources,
            ui,
        )?
        else {
            ui.note(format!(
                "no selected instance is built for {a}: no kernel wheel for it"
            ));
            continue;
        };
        let distribution = format!("{PACKAGE}-kernels-{extra}");
        let package = format!("{PACKAGE}_kernels_{extra}");
        let kernels: Vec<PathBuf> = report.built.iter().map(|b| b.path.clone()).collect();
        let platform = platform(&kernels, target, ui)?;
        let meta = WheelMetadata {
            name: distribution.clone(),
            version: env!("CARGO_PKG_VERSION").into(),
            summary: format!(
                "flashgen's precompiled kernels for {a} ({})",
                a.targets().join(", ")
            ),
            requires_python: REQUIRES_PYTHON.into(),
            license: env!("CARGO_PKG_LICENSE").into(),
            readme: None,
            requires_dist: vec![format!("{PACKAGE}=={}", env!("CARGO_PKG_VERSION"))],
            provides_extra: Vec::new(),
        };
        let mut w = WheelBuilder::new(meta, WheelTag::new("py3", "none", &platform));
        w.add_bytes(
            &format!("{package}/__init__.py"),
            format!(
                "\"\"\"flashgen's precompiled kernels for {a}: data the flashgen loader finds \
                 beside it (nothing to import).\"\"\"\n"
            )
            .into_bytes(),
            false,
        )?;
        add_kernels(&mut w, &package, &report)?;
        let manifest = builder.manifest(&report.built);
        add_manifest(&mut w, &package, &manifest)?;
        let written = finish_wheel(w, matrix, args, Some(&report), ui)?;
        paths.push(written.path);
        packages.push(KernelPackage {
            extra,
            distribution,
            package,
            runs_on: manifest.runs_on,
        });
        toolchain = Some(builder.toolchain.clone());
    }
    if packages.is_empty() {
        bail!("the release selects no instance built for any of {list} ({from})");
    }
    let mut manifest = empty_manifest(target);
    manifest.toolchain = toolchain.as_ref().map(crate::records::ToolchainRow::of);
    let extras = std::iter::once(cuda_packages::JIT_EXTRA.to_string())
        .chain(packages.iter().map(|p| p.extra.clone()))
        .chain(std::iter::once(ALL_KERNELS_EXTRA.to_string()))
        .collect();
    let requires = requirements(toolchain.as_ref(), target, &packages);
    manifest.kernel_packages = packages;
    let mut w = core_wheel(matrix, binary, &[], target, requires, extras, sources, ui)?;
    add_manifest(&mut w, PACKAGE, &manifest)?;
    let written = finish_wheel(w, matrix, args, None, ui)?;
    for p in paths.iter().chain(std::iter::once(&written.path)) {
        println!("{}", p.display());
    }
    Ok(())
}

/// Says what the release leaves out of the selection (`modules.<m>.release.exclude`): how many
/// instances of which module, and why.
fn note_left_out(matrix: &Matrix, filter: &crate::filter::FilterArgs, ui: &Ui) -> Result<()> {
    let mut left_out: IndexMap<(&str, &str), usize> = IndexMap::new();
    for inst in filter.select(matrix)? {
        if let Some(reason) = matrix.outside_release(inst) {
            *left_out
                .entry((matrix.module(inst).name.as_str(), reason))
                .or_default() += 1;
        }
    }
    for ((module, reason), n) in left_out {
        ui.note(format!(
            "the release leaves out {n} instance{} of {module}: {reason}",
            if n == 1 { "" } else { "s" }
        ));
    }
    Ok(())
}

/// The name of an architecture's kernel wheel and extra: its first target without the
/// underscore (`8.0+PTX` -> `sm80`, `9.0a` -> `sm90a`).
fn kernel_extra(a: &Arch) -> String {
    a.targets()[0].replace('_', "")
}

/// The manifest of a wheel that holds no kernel.
fn empty_manifest(target: Option<crate::manylinux::Glibc>) -> Manifest {
    Manifest {
        flashgen_version: env!("CARGO_PKG_VERSION").into(),
        toolchain: None,
        manylinux: target.map(|g| g.spelling()),
        archs: Vec::new(),
        runs_on: Vec::new(),
        instances: Vec::new(),
        module_rows: None,
        kernel_packages: Vec::new(),
    }
}

/// The platform tag `files` (and the binary, for the core wheel) need, checked against the
/// glibc `target`.
fn platform(files: &[PathBuf], target: Option<crate::manylinux::Glibc>, ui: &Ui) -> Result<String> {
    let platform = wheel::platform_tag(files, std::env::consts::ARCH)?;
    for note in &platform.notes {
        ui.status(format!("platform: {note}"));
    }
    if let Some(target) = target {
        check_manylinux_target(target, &platform)?;
    }
    Ok(platform.tag)
}

/// The `flashgen` wheel without its `_aot/`: the loader, the sources, the matrix, the binary and
/// the console script; tagged for what `kernels` and the binary need.
#[allow(clippy::too_many_arguments)]
fn core_wheel(
    matrix: &Matrix,
    binary: &Path,
    kernels: &[PathBuf],
    target: Option<crate::manylinux::Glibc>,
    requires_dist: Vec<String>,
    provides_extra: Vec<String>,
    sources: Vec<Snapshot>,
    ui: &Ui,
) -> Result<WheelBuilder> {
    let mut elf_files = kernels.to_vec();
    elf_files.push(binary.to_path_buf());
    let platform = platform(&elf_files, target, ui)?;
    let readme = std::fs::read_to_string(matrix.root.join("README.md")).ok();
    let meta = WheelMetadata {
        name: PACKAGE.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        summary: env!("CARGO_PKG_DESCRIPTION").into(),
        requires_python: REQUIRES_PYTHON.into(),
        license: env!("CARGO_PKG_LICENSE").into(),
        readme: readme.map(|r| ("text/markdown".to_string(), r)),
        requires_dist,
        provides_extra,
    };
    // The .so files are loaded through ctypes, never as Python extensions: any CPython 3.
    let mut w = WheelBuilder::new(meta, WheelTag::new("py3", "none", &platform));
    let mut python = Vec::new();
    collect_tree(
        &matrix.root.join("python").join(PACKAGE),
        PACKAGE,
        &mut python,
    )?;
    for f in python.into_iter().chain(sources) {
        w.add_bytes(&f.archive, f.bytes, f.executable)?;
    }
    // The matrix without its instances, and each module's instances in a file of their own: the
    // loader parses only the modules a process calls (a release lists 1,200 instances).
    let mut describe = super::describe::describe(matrix);
    let instances = describe.instances.take().unwrap_or_default();
    w.add_bytes(
        &format!("{PACKAGE}/{}", LAYOUT.matrix),
        serde_json::to_vec_pretty(&describe)?,
        false,
    )?;
    for module in describe.modules.keys() {
        let rows: Vec<_> = instances.iter().filter(|i| &i.module == module).collect();
        w.add_bytes(
            &format!("{PACKAGE}/{}", Layout::of_module(LAYOUT.instances, module)),
            serde_json::to_vec(&rows)?,
            false,
        )?;
    }
    w.add_bytes(
        &format!("{PACKAGE}/{}", LAYOUT.variants),
        matrix.config_text.clone().into_bytes(),
        false,
    )?;
    // The binary ships once; the `flashgen` command is a console script that execs it.
    w.add_bytes(
        &format!("{PACKAGE}/{}", LAYOUT.binary),
        std::fs::read(binary)?,
        true,
    )?;
    w.add_bytes(
        &format!("{}/entry_points.txt", w.dist_info_dir()?),
        format!("[console_scripts]\nflashgen = {PACKAGE}.__main__:main\n").into_bytes(),
        false,
    )?;
    Ok(w)
}

/// Writes `w` into `--out`, measures it against the budget (an over-budget wheel is removed and
/// the build fails, saying what takes the room), and reports it.
fn finish_wheel(
    w: WheelBuilder,
    matrix: &Matrix,
    args: &WheelArgs,
    report: Option<&BuildReport>,
    ui: &Ui,
) -> Result<wheel::WrittenWheel> {
    let out = std::path::absolute(&args.out)?;
    let written = w.write(&out, wheel::source_date_epoch_from_env()?)?;
    let budget = args
        .max_wheel_mib
        .map_or(matrix.release.max_wheel_bytes, |mib| mib << 20);
    if written.size > budget {
        let modules: Vec<(String, &str)> = report
            .iter()
            .flat_map(|r| &r.built)
            .map(|b| {
                (
                    format!("{}.so", b.inst.uri),
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
        "wrote {} ({}, sha256 {}, {} precompiled instances)",
        written.path.display(),
        human_bytes(written.size),
        written.sha256,
        report.map_or(0, |r| r.built.len()),
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
    Ok(written)
}

/// Why a wheel over `budget` bytes is refused: its size, and what takes the room (the binary,
/// the sources, the kernels of each module), largest first. `modules`: each kernel's file name
/// (`<uri>.so`) and its module.
fn over_budget(
    written: &wheel::WrittenWheel,
    modules: &[(String, &str)],
    budget: u64,
    from_cli: bool,
) -> String {
    let mut groups: Vec<(String, u64, usize)> = Vec::new();
    for e in &written.entries {
        let group = match modules
            .iter()
            .find(|(p, _)| e.path.ends_with(&format!("/{}/{p}", LAYOUT.aot)))
        {
            Some((_, module)) => format!("kernels of {module}"),
            None if e.path == format!("{PACKAGE}/{}", LAYOUT.binary) => {
                "the flashgen binary".into()
            }
            None if e
                .path
                .starts_with(&format!("{PACKAGE}/{}/", LAYOUT.sources)) =>
            {
                "kernel sources".into()
            }
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

/// What the wheel requires: the shared CUDA runtime its instances (and its JIT's) link; as the
/// `jit` extra, the toolchain that built them (`toolchain`; the pinned release for a JIT-only
/// wheel) with zig for a glibc `target`; and a release's kernel wheels as extras.
fn requirements(
    toolchain: Option<&crate::toolchain::Toolchain>,
    target: Option<crate::manylinux::Glibc>,
    kernels: &[KernelPackage],
) -> Vec<String> {
    let (major, version) = match toolchain {
        Some(tc) => (crate::toolchain::cuda_major(tc), tc.nvcc_version.as_str()),
        None => (crate::toolchain::DEFAULT_CUDA_MAJOR, ""),
    };
    let zig = target.map(|_| crate::manylinux::ZIG_REQUIREMENT);
    std::iter::once(cuda_packages::runtime_requirement(major))
        .chain(cuda_packages::jit_requirements(version, zig))
        .chain(kernels.iter().flat_map(|k| {
            // Each kernel wheel by its own extra, and all of them by `all`.
            [k.extra.as_str(), ALL_KERNELS_EXTRA].map(|extra| {
                format!(
                    "{}=={}; extra == \"{extra}\"",
                    k.distribution,
                    env!("CARGO_PKG_VERSION")
                )
            })
        }))
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

/// One architecture of a release: its build folder, the host objects the release's builders
/// share, and the architectures built after it.
struct ReleaseArch<'a> {
    arch: &'a Arch,
    dir: &'a Path,
    host_objects: &'a std::sync::Arc<HostObjects>,
    later: &'a [Arch],
}

/// The AOT build: the precompiled subset (or the filtered set) made present in the cache and
/// copied to `--build-dir`, checked against the sources the wheel ships. `release`: one
/// architecture of a release: the whole matrix (filters narrow it) built for that architecture
/// alone into its folder, None when it builds none of the selection.
fn build_aot<'m>(
    matrix: &'m Matrix,
    args: &WheelArgs,
    release: Option<ReleaseArch>,
    sources: &[Snapshot],
    ui: &Ui,
) -> Result<Option<(Builder<'m>, BuildReport<'m>)>> {
    let c = &args.compile;
    // No filter at all means the precompiled subset variants.json declares.
    let mut filter = c.filter.clone();
    if release.is_none() && filter.module.is_none() && filter.wheres.is_empty() {
        filter.aot = true;
    }
    let (archs, build_dir) = match &release {
        Some(r) => (Some(r.arch.to_string()), r.dir.to_path_buf()),
        None => (
            c.arch.clone(),
            args.build_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("build/wheel")),
        ),
    };
    super::check_out_dir(matrix, &build_dir, "--build-dir")?;
    crate::build::check_out_claimable(&build_dir, "--build-dir")?;
    let mut selected = filter.select(matrix)?;
    if release.is_some() {
        // The release set: the matrix less each module's `release.exclude`.
        selected.retain(|i| matrix.outside_release(i).is_none());
    }
    let mut builder = super::builder(
        matrix,
        archs.as_deref(),
        !c.no_compress,
        c.launcher.as_deref(),
        c.manylinux.as_deref(),
    )?;
    if let Some(r) = &release {
        builder.share_host_objects(r.host_objects.clone(), r.later.to_vec());
    }
    let selected = if release.is_some() {
        match builder.buildable(&selected) {
            (kept, _) if kept.is_empty() => return Ok(None),
            (kept, _) => kept,
        }
    } else {
        super::buildable(&builder, &selected, ui)?
    };
    let mut opts = super::build::options(c, build_dir.clone(), ui)?;
    // The wheel ships what the cache verified in this run, never what a stamp vouches for.
    opts.use_stamp = false;
    let report = builder.build(&selected, &opts, ui)?;
    super::build::finish(&report, ui, &build_dir)?;
    check_sources_unchanged(&builder.hashed_inputs(), sources)?;
    Ok(Some((builder, report)))
}

/// The built `.so` files, under `<package>/_aot/`. Each file is read once; those bytes are
/// hashed, checked against the sha256 the cache record gave this run, and packed.
fn add_kernels(w: &mut WheelBuilder, package: &str, report: &BuildReport) -> Result<()> {
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
        w.add_bytes(
            &format!("{package}/{}/{}.so", LAYOUT.aot, b.inst.uri),
            bytes,
            true,
        )?;
    }
    Ok(())
}

/// `<package>/_aot/manifest.json` and its rows, one file per module
/// ([`Layout::manifest_rows`]: a process reads only the modules it calls), serialized from the
/// in-memory result, never read back.
fn add_manifest(w: &mut WheelBuilder, package: &str, manifest: &Manifest) -> Result<()> {
    let mut by_module: IndexMap<&str, Vec<&BuiltRow>> = IndexMap::new();
    for row in &manifest.instances {
        by_module.entry(&row.instance.module).or_default().push(row);
    }
    for (module, rows) in &by_module {
        w.add_bytes(
            &format!(
                "{package}/{}",
                Layout::of_module(LAYOUT.manifest_rows, module)
            ),
            serde_json::to_vec(rows)?,
            false,
        )?;
    }
    let header = Manifest {
        instances: Vec::new(),
        module_rows: Some(
            by_module
                .iter()
                .map(|(m, r)| (m.to_string(), r.len()))
                .collect(),
        ),
        ..manifest.clone()
    };
    w.add_bytes(
        &format!("{package}/{}", LAYOUT.manifest),
        serde_json::to_string_pretty(&header)?.into_bytes(),
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
    let rules = crate::records::tree_rules();
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if rules.skips(&name) {
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
