//! `flashgen doctor`: what a build would use, or why it cannot run, and what the installation
//! around it holds: the precompiled set of the wheel this binary came from, torch, the GPU.
//!
//! Everything is looked up, never assumed present: a missing torch, GPU or wheel is reported as
//! absent. Only a missing toolchain fails the command (exit 1), as before, since a build needs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use super::ConfigSource;
use crate::arch::{self, Arch};
use crate::build::default_jobs;
use crate::cache::Cache;
use crate::cli::DoctorArgs;
use crate::compile::{Launcher, LAUNCHER_ENV};
use crate::matrix::Matrix;
use crate::toolchain::Toolchain;

pub fn run(config: &ConfigSource, variants_files: &[PathBuf], args: &DoctorArgs) -> Result<()> {
    // Where the cache is (the one rule, shared with the JIT) and whether it can be used.
    let cache_dir = Cache::default_dir();
    let cache = cache_dir
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|d| Cache::open(d.clone()).map(|c| c.dir));
    // FLASHGEN_MANYLINUX shows the zig host compiler a build would use.
    let toolchain = crate::manylinux::Glibc::resolve(None)
        .and_then(|target| Toolchain::discover(cache.as_ref().ok().map(PathBuf::as_path), target));
    let matrix = Matrix::load(&config.path, variants_files);
    let config_archs = matrix.as_ref().map(|m| m.archs.clone()).unwrap_or_default();
    let archs = arch::resolve(args.arch.as_deref(), &config_archs);
    let jobs = default_jobs(None, &crate::ui::Ui::new(true));
    let launcher = Launcher::resolve(None);
    let err = |e: &anyhow::Error| format!("{e:#}");
    let exe = std::env::current_exe().ok();
    let wheel = exe.as_deref().and_then(installed_wheel);
    let torch = probe_torch();
    let gpu = probe_gpu();
    if args.json {
        let v = json!({
            "flashgen_version": env!("CARGO_PKG_VERSION"),
            "binary": exe,
            "wheel": wheel,
            "torch": torch.as_ref().map_or_else(|e| json!({"error": e}), |t| json!(t)),
            "gpus": gpu.as_ref().map_or_else(|e| json!({"error": e}), |g| json!(g)),
            "toolchain": toolchain.as_ref().map_err(err).map_or_else(|e| json!({"error": e}), |t| json!(t)),
            "archs": archs.as_ref().map_err(err).map_or_else(|e| json!({"error": e}), |(a, src)| json!({
                "list": super::archs_text(a),
                "from": src,
                "targets": a.iter().flat_map(Arch::targets).collect::<Vec<_>>(),
                "runs_on": arch::runs_on_all(a),
            })),
            "launcher": launcher.as_ref().map_err(err).map_or_else(|e| json!({"error": e}), |l| if l.is_none() {
                json!(null)
            } else {
                json!({"command": l.words, "from": l.from})
            }),
            "jobs": jobs.as_ref().map_err(err).map_or_else(|e| json!({"error": e}), |j| json!(j)),
            "cache_dir": cache_dir.as_ref().map_err(err).map_or_else(|e| json!({"error": e}), |d| json!(d)),
            "cache": cache.as_ref().map_err(err).map_or_else(|e| json!({"error": e}), |_| json!("ok")),
            "config": matrix.as_ref().map_err(err).map_or_else(
                |e| json!({"error": e, "path": config.path, "origin": config.origin}),
                |m| json!({"path": m.config_path, "origin": config.origin, "instances": m.instances.len(),
                           "aot": m.instances.iter().filter(|i| i.aot).count()})),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "flashgen:      {} ({})",
            env!("CARGO_PKG_VERSION"),
            exe.as_deref().map_or_else(|| "?".into(), super::display)
        );
        match &toolchain {
            Ok(t) => {
                println!("nvcc:          {} ({})", t.nvcc.display(), t.found_by);
                println!("nvcc version:  {}", t.nvcc_version);
                println!(
                    "host compiler: {} ({}, from {})",
                    t.host_compiler,
                    t.host_compiler_path.display(),
                    t.host_compiler_found_by
                );
            }
            Err(e) => println!("nvcc:          NOT FOUND\n{e}"),
        }
        match &archs {
            Ok((a, src)) => println!("archs:         {} (from {src})", super::archs_text(a)),
            Err(e) => println!("archs:         {e}"),
        }
        match &launcher {
            Ok(l) if l.is_none() => {
                println!("launcher:      none (set {LAUNCHER_ENV} or pass --launcher)")
            }
            Ok(l) => println!("launcher:      {} (from {})", l.shell_line(), l.from),
            Err(e) => println!("launcher:      {e:#}"),
        }
        match &jobs {
            Ok(j) => println!("jobs:          {j}"),
            Err(e) => println!("jobs:          {e}"),
        }
        match (&cache_dir, &cache) {
            (Ok(d), Ok(_)) => println!("cache:         {}", super::display(d)),
            (Ok(d), Err(e)) => println!("cache:         {} (UNUSABLE: {e:#})", super::display(d)),
            (Err(e), _) => println!("cache:         {e:#}"),
        }
        match &matrix {
            Ok(m) => println!(
                "config:        {} ({}; {} instances, {} precompiled)",
                m.config_path.display(),
                config.origin,
                m.instances.len(),
                m.instances.iter().filter(|i| i.aot).count()
            ),
            Err(e) => println!("config:        {e:#}"),
        }
        match &wheel {
            Some(w) => println!(
                "wheel:         {} ({} precompiled instances{})",
                w["package"].as_str().unwrap_or("?"),
                w["precompiled"],
                match w["archs"].as_array() {
                    Some(a) if !a.is_empty() => format!(
                        " for {}",
                        a.iter()
                            .filter_map(|x| x.as_str())
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                    _ => ": JIT-only".into(),
                }
            ),
            None => println!("wheel:         none (this binary is not inside an installed wheel)"),
        }
        for k in wheel
            .iter()
            .flat_map(|w| w["kernel_wheels"].as_array().cloned().unwrap_or_default())
        {
            println!(
                "kernel wheel:  {} ({})",
                k["package"].as_str().unwrap_or("?"),
                if k["installed"].as_bool() == Some(true) {
                    "installed".to_string()
                } else {
                    format!(
                        "not installed: pip install 'flashgen[{}]'",
                        k["extra"].as_str().unwrap_or("?")
                    )
                }
            );
        }
        match &torch {
            Ok(t) => println!(
                "torch:         {} (CUDA {}, {})",
                t["version"].as_str().unwrap_or("?"),
                t["cuda"].as_str().unwrap_or("none"),
                t["python"].as_str().unwrap_or("?")
            ),
            Err(e) => println!("torch:         not found ({e})"),
        }
        match &gpu {
            Ok(gpus) => {
                for g in gpus {
                    println!(
                        "gpu:           {} (compute capability {}, driver {})",
                        g["name"].as_str().unwrap_or("?"),
                        g["compute_cap"].as_str().unwrap_or("?"),
                        g["driver"].as_str().unwrap_or("?")
                    );
                }
            }
            Err(e) => println!("gpu:           none found ({e})"),
        }
    }
    toolchain.map(|_| ())
}

/// The precompiled set of the installed wheel this binary ships in (`<package>/_bin/flashgen`
/// beside `<package>/_aot/manifest.json`), or None when it is not inside one. For a release's
/// core wheel, its kernel wheels too: each one its manifest names, installed beside it or not.
fn installed_wheel(exe: &Path) -> Option<serde_json::Value> {
    let layout = crate::records::LAYOUT;
    let package = layout.package_of_binary(exe)?;
    let read = |dir: &Path| -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(dir.join(layout.manifest)).ok()?).ok()
    };
    let manifest = read(&package)?;
    // A wheel's manifest counts its rows per module (they live in a file per module).
    let count = |m: &serde_json::Value| {
        m["instances"].as_array().map_or(0, Vec::len)
            + m["module_rows"].as_object().map_or(0, |r| {
                r.values().filter_map(|n| n.as_u64()).sum::<u64>() as usize
            })
    };
    let mut precompiled = count(&manifest);
    let mut archs: Vec<serde_json::Value> =
        manifest["archs"].as_array().cloned().unwrap_or_default();
    let mut kernels = Vec::new();
    for k in manifest["kernel_packages"].as_array().into_iter().flatten() {
        let name = k["package"].as_str().unwrap_or_default();
        // As the loader takes them: beside the package, and of its version.
        let installed = package
            .parent()
            .and_then(|site| read(&site.join(name)))
            .filter(|m| m["flashgen_version"] == manifest["flashgen_version"]);
        if let Some(m) = &installed {
            precompiled += count(m);
            archs.extend(m["archs"].as_array().cloned().unwrap_or_default());
        }
        kernels
            .push(json!({"extra": k["extra"], "package": name, "installed": installed.is_some()}));
    }
    Some(json!({
        "package": package,
        "precompiled": precompiled,
        "archs": archs,
        "kernel_wheels": kernels,
    }))
}

/// The Python flashgen serves: `FLASHGEN_PYTHON` (the console script and the loader set it to
/// their interpreter), else `python3` on PATH.
fn python() -> PathBuf {
    std::env::var_os("FLASHGEN_PYTHON")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// torch's version and CUDA version, as that Python sees them when run isolated (`-I`, so a
/// torch installed only in the user's site-packages or on PYTHONPATH is not seen). Importing torch takes seconds;
/// the probe gives up after 20 s rather than hang doctor.
fn probe_torch() -> std::result::Result<serde_json::Value, String> {
    const CODE: &str = "import json, sys, torch; print(json.dumps({'version': torch.__version__, \
        'cuda': torch.version.cuda, 'python': sys.executable}))";
    let py = python();
    let out = run_with_timeout(
        crate::python_env::python_command(&py).args(["-c", CODE]),
        Duration::from_secs(20),
    )
    .map_err(|e| format!("not importable by {} ({e})", py.display()))?;
    let last = out.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|_| format!("{}: unexpected output {last:?}", py.display()))
}

/// The GPUs nvidia-smi lists (name, compute capability, driver version).
fn probe_gpu() -> std::result::Result<Vec<serde_json::Value>, String> {
    let out = run_with_timeout(
        Command::new("nvidia-smi").args([
            "--query-gpu=name,compute_cap,driver_version",
            "--format=csv,noheader",
        ]),
        Duration::from_secs(10),
    )
    .map_err(|e| format!("nvidia-smi: {e}"))?;
    let gpus: Vec<_> = out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            json!({"name": f.first(), "compute_cap": f.get(1), "driver": f.get(2)})
        })
        .collect();
    if gpus.is_empty() {
        return Err("nvidia-smi lists no GPU".into());
    }
    Ok(gpus)
}

/// Runs `cmd` in `/` (stdin closed, stderr discarded) and returns its stdout if it exits 0 within
/// `limit`; otherwise kills it and says why.
fn run_with_timeout(cmd: &mut Command, limit: Duration) -> std::result::Result<String, String> {
    use std::io::Read;
    let mut child = cmd
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run it ({e})"))?;
    // Read on a thread so a chatty child never blocks on a full pipe while we wait.
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s", limit.as_secs()));
            }
            Err(e) => return Err(format!("cannot wait for it ({e})")),
        }
    };
    let text = reader.join().unwrap_or_default();
    if status.success() {
        Ok(text)
    } else {
        Err(format!("exited with {status}"))
    }
}
