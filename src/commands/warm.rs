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

pub fn run(matrix: &Matrix, args: &WarmArgs) -> Result<()> {
    let ui = Ui::new(args.quiet);
    let cc = Capability::parse(&args.device.device_cc, "--device-cc")?;
    let (requested, _) = arch::resolve_for_device(args.device.arch.as_deref(), cc)?;
    let selected = args.filter.select(matrix)?;
    // Per configuration, what `flashgen jit` would build for the device (the same decider).
    let mut chosen = Vec::new();
    for choices in super::jit::configurations(matrix, &selected) {
        if let Ok(pick) = super::jit::for_device(matrix, &choices, &requested, cc) {
            chosen.push(pick);
        }
    }
    let skipped = selected.len() - chosen.len();
    if skipped > 0 {
        ui.note(format!(
            "leaving out {skipped} of {} selected instances: another backend of theirs is the \
             one a GPU of compute capability {cc} takes, or none of their archs runs there",
            selected.len()
        ));
    }
    let jobs = default_jobs(args.jobs, &ui)?;
    let launcher = Launcher::resolve(args.device.launcher.as_deref())?;
    let target = Glibc::resolve(args.device.manylinux.as_deref())?;
    let mut groups: Vec<(Vec<Arch>, Vec<&Instance>)> = Vec::new();
    for (inst, archs) in chosen {
        match groups.iter_mut().find(|(a, _)| *a == archs) {
            Some((_, list)) => list.push(inst),
            None => groups.push((archs, vec![inst])),
        }
    }
    let (mut ready, mut failed) = (0, 0);
    let toolchain = Toolchain::discover(Some(&Cache::open_default()?.dir), target)?;
    for (archs, instances) in groups {
        let cache = Cache::open_default()?;
        let mut builder = Builder::new(matrix, toolchain.clone(), cache, archs.clone(), true);
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
