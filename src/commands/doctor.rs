//! `flashgen doctor`: what a build would use, or why it cannot run.

use std::path::PathBuf;

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
    let toolchain = Toolchain::discover(cache.as_ref().ok().map(PathBuf::as_path));
    let matrix = Matrix::load(&config.path, variants_files);
    let config_archs = matrix.as_ref().map(|m| m.archs.clone()).unwrap_or_default();
    let archs = arch::resolve(args.arch.as_deref(), &config_archs);
    let jobs = default_jobs(None, &crate::ui::Ui::new(true));
    let launcher = Launcher::resolve(None);
    let err = |e: &anyhow::Error| format!("{e:#}");
    if args.json {
        let v = json!({
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
        match &toolchain {
            Ok(t) => {
                println!("nvcc:          {} ({})", t.nvcc.display(), t.found_by);
                println!("nvcc version:  {}", t.nvcc_version);
                println!(
                    "host compiler: {} ({})",
                    t.host_compiler,
                    t.host_compiler_path.display()
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
    }
    toolchain.map(|_| ())
}
