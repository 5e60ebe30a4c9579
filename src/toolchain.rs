//! Finding nvcc and the host compiler, and the version strings that key the build cache.
//!
//! Search order: `FLASHGEN_NVCC`, `CUDA_HOME`/`CUDA_PATH`, `nvcc` on PATH, then the PyPI package
//! `nvidia-cuda-nvcc` in the active Python environment (`FLASHGEN_PYTHON`, `VIRTUAL_ENV`,
//! `CONDA_PREFIX`, else the `python3` on PATH). Version strings are memoized in the cache folder
//! by the compilers' path, size and mtime, so a warm run spawns no process for them.
//!
//! Child processes never pick up code from the caller's working folder: PATH and
//! LD_LIBRARY_PATH keep only their absolute entries ([`drop_relative_search_paths`], run first
//! thing by the binary), and Python is run isolated from `/`
//! ([`python_command`](crate::python_env::python_command)).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::error::UsageError;
use crate::fsutil;
use crate::manylinux::{Glibc, ZigHost};
use crate::python_env::{anchored, pypi_nvcc, python_site_packages};

#[derive(Debug, Clone, Serialize)]
pub struct Toolchain {
    pub nvcc: PathBuf,
    /// How it was found (`FLASHGEN_NVCC`, `CUDA_HOME`, `PATH`, `python package`).
    pub found_by: String,
    /// e.g. `13.0.88` (from `release 13.0, V13.0.88`).
    pub nvcc_version: String,
    /// The whole `nvcc --version` text, which is what keys the cache.
    #[serde(skip)]
    pub nvcc_version_text: String,
    pub host_compiler: String,
    pub host_compiler_path: PathBuf,
    /// How the host compiler was found (`NVCC_CCBIN` or `PATH`).
    pub host_compiler_found_by: String,
    /// `lib64`/`lib` beside `bin/nvcc`, passed with `-L` (the PyPI nvcc needs it to link).
    pub lib_dirs: Vec<PathBuf>,
    /// The folder above nvcc's own (`<root>/bin/nvcc`), absolute; the link step reaches nvcc and
    /// `lib_dirs` through a symlink to it (`compile::TOOLCHAIN_LINK`). None for the placeholder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// `NVCC_PREPEND_FLAGS=...` / `NVCC_APPEND_FLAGS=...` lines for those that are set: nvcc
    /// adds them to every command it runs, so they change the output and key the cache.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub nvcc_env_flags: String,
    /// The glibc target of `--manylinux` / `FLASHGEN_MANYLINUX`: the host compiler is then the
    /// zig wrapper (`host_compiler_path`), passed as `-ccbin` (see `manylinux.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manylinux: Option<Glibc>,
}

/// The variables nvcc reads extra flags from.
pub const NVCC_FLAG_VARS: [&str; 2] = ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"];

/// The set ones of [`NVCC_FLAG_VARS`], one `NAME=value` line each.
fn nvcc_env_flags() -> String {
    NVCC_FLAG_VARS
        .iter()
        .filter_map(|v| {
            let val = std::env::var_os(v).filter(|x| !x.is_empty())?;
            Some(format!("{v}={}\n", val.to_string_lossy()))
        })
        .collect()
}

#[derive(Serialize, Deserialize)]
struct Versions {
    nvcc: String,
    host: String,
}

impl Toolchain {
    /// A stand-in that names `nvcc` (found on PATH when the command runs) and no library
    /// folders: what `compile_commands.json` says when no toolchain was found.
    pub fn placeholder() -> Toolchain {
        Toolchain {
            nvcc: PathBuf::from("nvcc"),
            found_by: "placeholder".into(),
            nvcc_version: "unknown".into(),
            nvcc_version_text: String::new(),
            host_compiler: String::new(),
            host_compiler_path: std::env::var_os("NVCC_CCBIN")
                .map_or_else(|| PathBuf::from("g++"), PathBuf::from),
            host_compiler_found_by: "placeholder".into(),
            lib_dirs: Vec::new(),
            root: None,
            nvcc_env_flags: nvcc_env_flags(),
            manylinux: None,
        }
    }

    /// The toolchain's root, and nvcc and `lib_dirs` relative to it: what the link step names
    /// through its symlink to the root. None when there is no root to link to.
    pub fn relative_layout(&self) -> Option<(PathBuf, PathBuf, Vec<PathBuf>)> {
        let root = self.root.as_ref()?;
        let nvcc = self.nvcc.strip_prefix(root).ok()?.to_path_buf();
        let libs = self
            .lib_dirs
            .iter()
            .map(|d| d.strip_prefix(root).map(Path::to_path_buf))
            .collect::<Result<Vec<_>, _>>()
            .ok()?;
        Some((root.clone(), nvcc, libs))
    }

    /// `cache_dir` holds the version memo; without one (an unusable cache) versions are asked.
    /// With a glibc target, the g++ found is only the source of libstdc++ (headers and static
    /// archive) and nvcc's host compiler is the zig wrapper written into the cache.
    pub fn discover(cache_dir: Option<&Path>, manylinux: Option<Glibc>) -> Result<Toolchain> {
        let (nvcc, found_by) = find_nvcc()?;
        let (host_compiler_path, host_compiler_found_by) = std::env::var_os("NVCC_CCBIN")
            .map(|p| (PathBuf::from(p), "NVCC_CCBIN"))
            .or_else(|| which::which("g++").ok().map(|p| (p, "PATH")))
            .or_else(|| which::which("c++").ok().map(|p| (p, "PATH")))
            .ok_or_else(|| {
                UsageError::new(
                    "no host C++ compiler found for nvcc (looked for NVCC_CCBIN, g++, c++)",
                )
                .with_hint("install g++ (apt-get install g++) or set NVCC_CCBIN")
            })?;
        let versions = versions(cache_dir, &nvcc, &host_compiler_path)?;
        let nvcc_version = versions
            .nvcc
            .lines()
            .find_map(|l| l.split(", V").nth(1))
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let nvcc = std::path::absolute(&nvcc).unwrap_or(nvcc);
        let root = nvcc
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let lib_dirs = ["lib64", "lib"]
            .iter()
            .map(|d| root.join(d))
            .filter(|d| d.is_dir())
            .collect();
        let mut tc = Toolchain {
            nvcc,
            found_by,
            nvcc_version,
            nvcc_version_text: versions.nvcc,
            host_compiler: versions.host.lines().next().unwrap_or("").to_string(),
            host_compiler_path,
            host_compiler_found_by: host_compiler_found_by.into(),
            lib_dirs,
            root: Some(root),
            nvcc_env_flags: nvcc_env_flags(),
            manylinux,
        };
        if let Some(target) = manylinux {
            let runtime = runtime_library(&tc).ok_or_else(|| {
                UsageError::new(format!(
                    "--manylinux: no {} beside {} (looked in {})",
                    runtime_soname(cuda_major(&tc)),
                    tc.nvcc.display(),
                    tc.lib_dirs
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .with_hint(
                    "install the CUDA runtime beside nvcc: pip install 'nvidia-cuda-runtime==13.*'",
                )
            });
            let zig =
                ZigHost::prepare(target, &tc.nvcc, &tc.host_compiler_path, runtime, cache_dir)?;
            // The identity replaces the g++ line in the key: it names g++ (for libstdc++) too.
            tc.host_compiler = zig.identity;
            tc.host_compiler_path = zig.wrapper;
            tc.host_compiler_found_by = format!(
                "{}: zig from {} ({})",
                target.tag(),
                zig.found_by,
                zig.zig.display()
            );
        }
        Ok(tc)
    }
}

fn find_nvcc() -> Result<(PathBuf, String)> {
    // Empty means unset, as for FLASHGEN_CACHE_DIR.
    if let Some(p) = std::env::var_os("FLASHGEN_NVCC").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok((p, "FLASHGEN_NVCC".into()))
        } else {
            Err(UsageError::new(format!("FLASHGEN_NVCC={} is not a file", p.display())).into())
        };
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            let p = PathBuf::from(home).join("bin/nvcc");
            if p.is_file() {
                return Ok((p, var.into()));
            }
        }
    }
    if let Ok(p) = which::which("nvcc") {
        return Ok((p, "PATH".into()));
    }
    if let Some((p, site)) = python_site_packages()
        .iter()
        .find_map(|site| pypi_nvcc(site).map(|p| (p, site.clone())))
    {
        return Ok((
            p,
            format!("python package nvidia-cuda-nvcc in {}", site.display()),
        ));
    }
    Err(UsageError::new("nvcc not found (looked at FLASHGEN_NVCC, CUDA_HOME, CUDA_PATH, PATH and the active Python environment)")
        .with_hint(
            "install the compile toolchain beside an installed flashgen with its `jit` extra:\n    pip install 'flashgen[jit]'\n(the pinned CUDA 13.0 compiler from PyPI: nvidia-cuda-nvcc, -crt, -cccl and nvidia-nvvm), or point CUDA_HOME (or FLASHGEN_NVCC) at a CUDA installation",
        )
        .into())
}

/// Removes the empty and relative entries (`.`, `bin`, ``) from this process's PATH and
/// LD_LIBRARY_PATH, so neither a lookup here (nvcc, g++, zig, python3, the launcher, nvidia-smi)
/// nor one by a child (nvcc finding its host compiler, the dynamic loader finding a child's
/// libraries) resolves to a file in whatever folder the caller stands in. Call it before any
/// thread starts.
pub fn drop_relative_search_paths() {
    for var in ["PATH", "LD_LIBRARY_PATH"] {
        let Some(value) = std::env::var_os(var) else {
            continue;
        };
        let entries: Vec<PathBuf> = std::env::split_paths(&value).collect();
        if entries.iter().all(|p| p.is_absolute()) {
            continue;
        }
        let kept: Vec<PathBuf> = entries.into_iter().filter(|p| p.is_absolute()).collect();
        if kept.is_empty() {
            std::env::remove_var(var);
        } else if let Ok(joined) = std::env::join_paths(kept) {
            std::env::set_var(var, joined);
        }
    }
}

fn versions(cache_dir: Option<&Path>, nvcc: &Path, host: &Path) -> Result<Versions> {
    fsutil::memoized(cache_dir, "", &[nvcc, host], || {
        Ok(Versions {
            nvcc: version_text(nvcc)?,
            host: version_text(host)?,
        })
    })
}

fn version_text(program: &Path) -> Result<String> {
    crate::ui::trace(&[program.display().to_string(), "--version".into()]);
    let out = Command::new(anchored(program))
        .arg("--version")
        .current_dir("/")
        .output()
        .with_context(|| format!("cannot run {} --version", program.display()))?;
    if !out.status.success() {
        anyhow::bail!(
            "`{} --version` failed ({}):\n{}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The CUDA major release whose runtime an instance links when the toolchain's version is not
/// known (`generate` without nvcc): the pinned toolchain's.
pub const DEFAULT_CUDA_MAJOR: u32 = 13;

/// The CUDA major release of `tc`'s nvcc (`13.0.88` -> 13), else [`DEFAULT_CUDA_MAJOR`].
pub fn cuda_major(tc: &Toolchain) -> u32 {
    tc.nvcc_version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(DEFAULT_CUDA_MAJOR)
}

/// The shared CUDA runtime an instance needs, by its soname (`libcudart.so.13`): what the `.so`
/// records as `NEEDED`, and what the loader makes sure is mapped before it loads an instance.
pub fn runtime_soname(cuda_major: u32) -> String {
    format!("libcudart.so.{cuda_major}")
}

/// The shared runtime file of `tc`'s toolkit (`<lib>/libcudart.so.13` beside `bin/nvcc`), which
/// `--manylinux`'s zig wrapper links by path: zig's driver takes no `-l:` form.
pub fn runtime_library(tc: &Toolchain) -> Option<PathBuf> {
    let name = runtime_soname(cuda_major(tc));
    tc.lib_dirs
        .iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
}
