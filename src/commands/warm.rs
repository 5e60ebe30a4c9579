//! `flashgen warm`: fills the JIT cache ahead of time for a device, so that a Docker image or a
//! cluster node never compiles on a user's first call.
//!
//! It builds what `flashgen jit` would build for each selected instance on a GPU of the given
//! compute capability, by the same code: the backend the device takes (the first in the
//! declared order that runs there), the device's archs ([`arch::resolve_for_device`], narrowed
//! by an arch limit), the same builder and cache, in parallel. Instances the device cannot run
//! are left out with a note. The loader then finds every one of them in the cache.

use anyhow::Result;

use crate::arch::{self, Arch, Capability};
use crate::build::{default_jobs, Builder, HandOut};
use crate::cache::Cache;
use crate::cli::WarmArgs;
use crate::compile::Launcher;
use crate::instance::Instance;
use crate::manylinux::Glibc;
use crate::matrix::Matrix;
use crate::toolchain::Toolchain;
use crate::ui::Ui;

/// The instances of `selected` a device of `cc` would load: per module configuration, the first
/// backend (in the declared order) that runs there; modules without a backend axis when their
/// arch limit runs there. Each with the archs its JIT builds.
fn for_device<'m>(
    matrix: &'m Matrix,
    selected: &[&'m Instance],
    requested: &[Arch],
    cc: Capability,
) -> (Vec<(&'m Instance, Vec<Arch>)>, usize) {
    let mut chosen: Vec<(&Instance, Vec<Arch>)> = Vec::new();
    let mut skipped = 0;
    for &inst in selected {
        let Some(archs) =
            arch::for_device_limited(requested, matrix.arch_limit(inst).as_deref(), cc)
        else {
            skipped += 1;
            continue;
        };
        // Another backend of the same configuration that the device runs and the module
        // prefers wins; the selection holds each configuration's backends in declared order.
        let taken_by_earlier = matrix.module(inst).backend_axis().is_some_and(|(bi, _)| {
            chosen.iter().any(|(c, _)| {
                c.module == inst.module
                    && c.choice[bi] < inst.choice[bi]
                    && c.choice
                        .iter()
                        .zip(&inst.choice)
                        .enumerate()
                        .all(|(ai, (a, b))| ai == bi || a == b)
            })
        });
        if taken_by_earlier {
            skipped += 1;
            continue;
        }
        chosen.push((inst, archs));
    }
    (chosen, skipped)
}

pub fn run(matrix: &Matrix, args: &WarmArgs) -> Result<()> {
    let ui = Ui::new(args.quiet);
    let cc = Capability::parse(&args.device_cc, "--device-cc")?;
    let (requested, _) = arch::resolve_for_device(args.arch.as_deref(), cc)?;
    let mut selected = args.filter.select(matrix)?;
    // Each configuration's backends in the order the module declares them.
    selected.sort_by_key(|i| (i.module, i.choice.clone()));
    let (chosen, skipped) = for_device(matrix, &selected, &requested, cc);
    if skipped > 0 {
        ui.note(format!(
            "leaving out {skipped} of {} selected instances: another backend of theirs is the \
             one a GPU of compute capability {cc} takes, or none of their archs runs there",
            selected.len()
        ));
    }
    let jobs = default_jobs(args.jobs, &ui)?;
    let launcher = Launcher::resolve(args.launcher.as_deref())?;
    let target = Glibc::resolve(args.manylinux.as_deref())?;
    let mut groups: Vec<(Vec<Arch>, Vec<&Instance>)> = Vec::new();
    for (inst, archs) in chosen {
        match groups.iter_mut().find(|(a, _)| *a == archs) {
            Some((_, list)) => list.push(inst),
            None => groups.push((archs, vec![inst])),
        }
    }
    let (mut ready, mut failed) = (0, 0);
    for (archs, instances) in groups {
        let cache = Cache::open_default()?;
        let toolchain = Toolchain::discover(Some(&cache.dir), target)?;
        let mut builder = Builder::new(matrix, toolchain, cache, archs.clone(), true);
        builder.launcher = launcher.clone();
        let gen = builder.cache.compile_dir("warm")?;
        let report =
            builder.ensure_cached(&instances, gen.path(), jobs, true, &HandOut::Object, &ui)?;
        for f in &report.failures {
            super::build::print_failure(f);
        }
        ready += report.ready.len();
        failed += report.failures.len();
        ui.status(format!(
            "{} instances for {} ready in {}",
            report.ready.len(),
            super::archs_text(&archs),
            builder.cache.dir.display()
        ));
    }
    if failed > 0 {
        anyhow::bail!("{failed} instances failed to build ({ready} ready)");
    }
    println!("{ready}");
    Ok(())
}
