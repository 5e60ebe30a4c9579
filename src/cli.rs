//! Command-line arguments. The doc comments here are the `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::filter::FilterArgs;

/// flashgen: one source of truth for CUDA kernel variants. Expands variants.json into kernel
/// instances, writes their generated headers, builds them with nvcc in parallel through a
/// content-addressed cache, and packages the precompiled subset as a wheel.
#[derive(Debug, Parser)]
#[command(name = "flashgen", version, max_term_width = 100)]
pub struct Cli {
    /// The variant matrix to read [default: ./variants.json, else the one bundled with the
    /// installed wheel this binary came from].
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Extra user-written variants for this run (JSON: {"variants": {name: {header, struct,
    /// params}}}), appended to every variant axis; never precompiled. Repeatable.
    #[arg(long = "variants-file", global = true, value_name = "PATH")]
    pub variants_files: Vec<PathBuf>,
    /// Print each nvcc command line on stderr as it starts (and the toolchain probes).
    #[arg(long, short = 'v', global = true)]
    pub verbose: bool,
    /// Without a subcommand, flashgen prints this help and exits 0.
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the instances of the matrix (module, URI, parameters, precompiled, cached).
    ListVariants(ListArgs),
    /// Print the matrix as the Python loader reads it (modules, axes, variants, instances).
    Describe(DescribeArgs),
    /// Write each selected instance's generated header (or, with --dispatch, one dispatching
    /// header per module), compile_commands.json and, with --ninja, build.ninja.
    Generate(GenerateArgs),
    /// Compile the selected instances into .so files, in parallel, through the cache.
    Build(BuildArgs),
    /// Build the precompiled subset (or the filtered set) and package it as a wheel.
    BuildWheel(WheelArgs),
    /// Remove build output folders (and, with --cache, the shared cache), reporting what was freed.
    Clean(CleanArgs),
    /// Show the toolchain, architectures, job count and cache that a build would use.
    Doctor(DoctorArgs),
    /// The runtime JIT's one call (the Python loader runs it): find the selected instance,
    /// built for a device, in the cache (verified) or compile it into the cache, and print the
    /// object's path and sha256 as JSON. Nothing is written outside the cache.
    Jit(JitArgs),
    /// Fill the JIT cache ahead of time for a GPU: build every selected instance as the
    /// loader's JIT would on a device of that compute capability (for a Docker image or a
    /// cluster node); prints how many are ready.
    Warm(WarmArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Architectures for the "cached" column (as for build).
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// JSON, the only format (accepted for symmetry with the other commands).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Folder that receives <uri>/flashgen_instance.cuh (or <module>/ with --dispatch).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// One header per module whose DISPATCH_<axis> macros switch over the selected values.
    #[arg(long)]
    pub dispatch: bool,
    /// Architectures for compile_commands.json (as for build).
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
    /// Also write build.ninja: a compile edge ($launcher nvcc -c) and a link edge per instance,
    /// the same commands flashgen runs (`ninja -C DIR` builds DIR/<uri>.so).
    #[arg(long)]
    pub ninja: bool,
    /// The launcher build.ninja puts in front of each compile [default: FLASHGEN_NVCC_LAUNCHER].
    #[arg(long, value_name = "CMD")]
    pub launcher: Option<String>,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// Options shared by build and build-wheel.
#[derive(Debug, Args)]
pub struct CompileArgs {
    /// Parallel nvcc jobs [default: MAX_JOBS, else min(cores, available memory / 2 GiB)].
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<usize>,
    /// GPU architectures, e.g. "8.0 9.0a" or "80;90a+PTX" [default: FLASHGEN_CUDA_ARCH_LIST,
    /// else TORCH_CUDA_ARCH_LIST, else variants.json].
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
    /// Keep compiling after a failure and list all failures at the end.
    #[arg(long)]
    pub keep_going: bool,
    /// Leave fatbins uncompressed (default: -Xfatbin=-compress-all --compress-mode=size).
    #[arg(long)]
    pub no_compress: bool,
    /// A command to run each nvcc compile step through, split like a shell line (e.g.
    /// "sccache"); not part of the cache key [default: FLASHGEN_NVCC_LAUNCHER].
    #[arg(long, value_name = "CMD")]
    pub launcher: Option<String>,
    /// Build every instance for this glibc, e.g. "2_17": nvcc's host compiler becomes zig c++
    /// (the PyPI ziglang==0.13.0) targeting it, so the .so files need nothing newer from glibc
    /// and no libstdc++; part of the cache key [default: FLASHGEN_MANYLINUX, else g++].
    #[arg(long, value_name = "2_N")]
    pub manylinux: Option<String>,
    /// Print only errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Folder that receives the .so files and manifest.json.
    #[arg(long, value_name = "DIR", default_value = "build/flashgen")]
    pub out: PathBuf,
    /// Print a machine-readable summary on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub compile: CompileArgs,
}

#[derive(Debug, Args)]
pub struct WheelArgs {
    /// Folder that receives the wheel.
    #[arg(long, value_name = "DIR", default_value = "dist")]
    pub out: PathBuf,
    /// Where the precompiled .so files are built before packaging [default: build/wheel; a
    /// release: one folder per architecture under build/release].
    #[arg(long, value_name = "DIR")]
    pub build_dir: Option<PathBuf>,
    /// The flashgen binary to ship [default: this one].
    #[arg(long, value_name = "PATH")]
    pub binary: Option<PathBuf>,
    /// Ship no precompiled instance (needs no nvcc): the loader JIT-compiles every kernel on
    /// first use. Takes no filters.
    #[arg(long, alias = "jit-only")]
    pub no_aot: bool,
    /// Precompile the release: every instance of the matrix (filters narrow it) for
    /// variants.json's `release.archs` (--arch overrides).
    #[arg(long, conflicts_with = "no_aot")]
    pub release: bool,
    /// Refuse (and remove) a wheel heavier than this many MiB [default: variants.json
    /// `release.max_wheel_mib`, else 100, PyPI's limit].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub max_wheel_mib: Option<u64>,
    #[command(flatten)]
    pub compile: CompileArgs,
}

#[derive(Debug, Args)]
pub struct CleanArgs {
    /// Build output folders to remove; only folders a build marked (.flashgen-build) are removed.
    #[arg(long, value_name = "DIR", default_values = ["build/flashgen", "build/wheel"])]
    pub out: Vec<PathBuf>,
    /// Also remove the shared cache (FLASHGEN_CACHE_DIR), if it carries flashgen's CACHEDIR.TAG.
    #[arg(long)]
    pub cache: bool,
    /// Print what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct JitArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Only look: answer `"source": "missing"` instead of compiling (FLASHGEN_DISABLE_JIT).
    #[arg(long)]
    pub no_compile: bool,
    /// Must select exactly one instance.
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// What `jit` and `warm` build for: a device, and how its instances are compiled.
#[derive(Debug, Args)]
pub struct DeviceArgs {
    /// The device's compute capability (MAJOR.MINOR, as the driver reports it); the JIT builds
    /// for it (9.0 -> 9.0a) unless --arch or FLASHGEN_CUDA_ARCH_LIST names archs that run on it.
    #[arg(long, value_name = "MAJOR.MINOR")]
    pub device_cc: String,
    /// Architectures to build for instead of the device's own (they must run on the device).
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
    /// A command to run the nvcc compile step through (as for build) [default:
    /// FLASHGEN_NVCC_LAUNCHER, which the Python loader passes through].
    #[arg(long, value_name = "CMD")]
    pub launcher: Option<String>,
    /// Build every instance for this glibc, e.g. "2_17": nvcc's host compiler becomes zig c++
    /// (the PyPI ziglang==0.13.0) targeting it, so the .so files need nothing newer from glibc
    /// and no libstdc++; part of the cache key [default: FLASHGEN_MANYLINUX, else g++].
    #[arg(long, value_name = "2_N")]
    pub manylinux: Option<String>,
}

#[derive(Debug, Args)]
pub struct WarmArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Parallel nvcc jobs [default: MAX_JOBS, else min(cores, available memory / 2 GiB)].
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<usize>,
    /// Print only errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// The instances to warm (default: the whole matrix).
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Architectures to report (as for build).
    #[arg(long, value_name = "LIST")]
    pub arch: Option<String>,
}
