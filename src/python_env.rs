//! The Python environment flashgen looks into for pip-installed tools (the PyPI nvcc, zig):
//! its site-packages folders, and a Python process that cannot pick up code from the caller's
//! working folder. Used by [`toolchain`](crate::toolchain) (nvcc) and
//! [`manylinux`](crate::manylinux) (zig), and by `doctor`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// nvcc of the PyPI package `nvidia-cuda-nvcc` (CUDA 13 layout, then 12) in `site`.
pub(crate) fn pypi_nvcc(site: &Path) -> Option<PathBuf> {
    ["nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"]
        .iter()
        .map(|rel| site.join(rel))
        .find(|p| p.is_file())
}

/// site-packages folders of the Python environment that asked (`FLASHGEN_PYTHON`, which the
/// loader sets), else the active one (`VIRTUAL_ENV`, `CONDA_PREFIX`, the `python3` on PATH).
/// Folders are guessed from the prefix first; a Python process is started only when that misses.
pub(crate) fn python_site_packages() -> Vec<PathBuf> {
    if let Some(py) = std::env::var_os("FLASHGEN_PYTHON") {
        let py = PathBuf::from(py);
        let prefix = py.parent().and_then(Path::parent).unwrap_or(Path::new("/"));
        let mut sites = glob_site_packages(prefix);
        if !sites.iter().any(|s| pypi_nvcc(s).is_some()) {
            sites.extend(ask_python(&py));
        }
        return sites;
    }
    let prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    let mut out: Vec<PathBuf> = prefixes
        .iter()
        .flat_map(|p| glob_site_packages(p))
        .collect();
    if out.is_empty() {
        if let Ok(py) = which::which("python3") {
            out.extend(ask_python(&py));
        }
    }
    out
}

fn glob_site_packages(prefix: &Path) -> Vec<PathBuf> {
    let lib = prefix.join("lib");
    let Ok(rd) = std::fs::read_dir(&lib) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python"))
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect();
    v.sort();
    v
}

fn ask_python(python: &Path) -> Option<PathBuf> {
    let out = python_command(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `python` ready to take `-c CODE`: isolated (`-I`: neither the working folder nor any
/// `PYTHON*` variable, `PYTHONPATH` and `PYTHONSTARTUP` included, nor the user's site-packages
/// reach `sys.path`) and started in `/`. Python puts the folder it starts in first on
/// `sys.path` for `-c`, so run in the caller's folder a `sysconfig.py` or `torch.py` planted there
/// would run as the caller.
pub(crate) fn python_command(python: &Path) -> Command {
    let mut cmd = Command::new(anchored(python));
    cmd.arg("-I").current_dir("/");
    cmd
}

/// `program` as a child started in another folder must name it: a relative path with a folder
/// (`venv/bin/python`, `./cuda/bin/nvcc`) names a file of the caller's folder, so it is made
/// absolute; a bare name is left to the (absolute-only) PATH.
pub(crate) fn anchored(program: &Path) -> PathBuf {
    if program.is_relative() && program.components().count() > 1 {
        std::path::absolute(program).unwrap_or_else(|_| program.to_path_buf())
    } else {
        program.to_path_buf()
    }
}
