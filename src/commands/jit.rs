//! `flashgen jit`: the runtime JIT's one call. The Python loader holds no build policy: it asks
//! this verb for an instance built for its device and gets back the verified cache object's path
//! and sha256, which it checks again on the bytes it loads.
//!
//! Everything a JIT build depends on is decided here, by the same code as `flashgen build`: the
//! archs for the device ([`arch::resolve_for_device`]), the cache root and its trust checks, the
//! toolchain, the content key, the per-object lock (concurrent loaders compile an instance
//! once). The object is never copied out of the cache, so the JIT stores each `.so` once.

use anyhow::Result;

use crate::arch::{self, Capability};
use crate::build::Builder;
use crate::cache::Cache;
use crate::cli::JitArgs;
use crate::compile::Launcher;
use crate::error::UsageError;
use crate::manylinux::Glibc;
use crate::matrix::Matrix;
use crate::records::{JitAnswer, JitSource};
use crate::toolchain::Toolchain;
use crate::ui::Ui;

pub fn run(matrix: &Matrix, args: &JitArgs) -> Result<()> {
    let cc = Capability::parse(&args.device_cc, "--device-cc")?;
    let (archs, _) = arch::resolve_for_device(args.arch.as_deref(), cc)?;
    let selected = args.filter.select(matrix)?;
    let [inst] = selected.as_slice() else {
        return Err(UsageError::new(format!(
            "flashgen jit needs --module and --where terms that select exactly one instance; {} match",
            selected.len()
        ))
        .with_hint("give every axis of the module: --where AXIS=VALUE for each")
        .into());
    };
    let launcher = Launcher::resolve(args.launcher.as_deref())?;
    let target = Glibc::resolve(args.manylinux.as_deref())?;
    let cache = Cache::open_default()?;
    let toolchain = Toolchain::discover(Some(&cache.dir), target)?;
    let mut builder = Builder::new(matrix, toolchain, cache, archs.clone(), true);
    builder.launcher = launcher;
    let mut answer = JitAnswer {
        instance: matrix.instance_row(inst),
        source: JitSource::Missing,
        arch: super::archs_text(&archs),
        archs: archs.iter().flat_map(arch::Arch::targets).collect(),
        cache_dir: builder.cache.dir.clone(),
        fingerprint: None,
        path: None,
        sha256: None,
        size: None,
    };
    let found = if args.no_compile {
        let prepared = builder.prepare(&[*inst], None)?;
        let key = prepared[0].key.clone();
        builder
            .cache
            .lookup(&key)
            .hit()
            .map(|e| (key, e, JitSource::Cache))
    } else {
        let gen = builder.cache.compile_dir(&inst.uri)?;
        let report = builder.ensure_cached(&[*inst], gen.path(), 1, false, &Ui::new(true))?;
        if let Some(f) = report.failures.first() {
            super::build::print_failure(f);
            anyhow::bail!("the JIT could not build {}", inst.uri);
        }
        report.ready.into_iter().next().map(|r| {
            let source = if r.cached {
                JitSource::Cache
            } else {
                JitSource::Compiled
            };
            (r.prepared.key, r.entry, source)
        })
    };
    if let Some((key, entry, source)) = found {
        answer.source = source;
        answer.fingerprint = Some(key);
        answer.sha256 = Some(entry.sha256);
        answer.size = Some(entry.size);
        answer.path = Some(entry.path);
    }
    println!("{}", serde_json::to_string_pretty(&answer)?);
    Ok(())
}
