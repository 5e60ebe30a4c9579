//! `flashgen jit`: the runtime JIT's one call. The Python loader holds no build policy: it asks
//! this verb for an instance built for its device and gets back the verified cache object's path
//! and sha256, which it checks again on the bytes it loads.
//!
//! Everything a JIT build depends on is decided here, by the same code as `flashgen build`: the
//! archs for the device ([`arch::resolve_for_device`]), the cache root and its trust checks, the
//! toolchain, the content key, the per-object lock (concurrent loaders compile an instance
//! once). The object is never copied out of the cache, so the JIT stores each `.so` once; its
//! bytes are hashed against the record before the path is answered (`HandOut::Object`).
//!
//! An instance with an arch limit (a `backend` value's or its module's `archs`) is built only
//! for archs of that limit that run on the device; one that cannot run there is refused, naming
//! the backends the device does run. Without a `backend` term the verb takes the first backend,
//! in the order variants.json declares, that runs on the device. Both rules and their messages
//! are `choice`'s, which `describe` also writes out as the table the loader reads (so it never
//! spawns to ask).

use anyhow::Result;

use crate::arch::{self, Arch, Capability};
use crate::build::{Builder, HandOut};
use crate::cache::Cache;
use crate::cli::JitArgs;
use crate::compile::Launcher;
use crate::error::UsageError;
use crate::instance::Instance;
use crate::manylinux::Glibc;
use crate::matrix::Matrix;
use crate::records::{JitAnswer, JitSource};

use super::choice;
use crate::toolchain::Toolchain;
use crate::ui::Ui;

/// `selected` grouped by configuration: instances of one module equal in every axis but the
/// backend, each group in the order the backend axis declares (a module without one: one
/// instance a group), groups in the order of their first instance.
pub(super) fn configurations<'m>(
    matrix: &Matrix,
    selected: &[&'m Instance],
) -> Vec<Vec<&'m Instance>> {
    let mut index: std::collections::HashMap<(usize, Vec<usize>), usize> = Default::default();
    let mut groups: Vec<Vec<&Instance>> = Vec::new();
    for &inst in selected {
        let backend = matrix.module(inst).backend_axis().map(|(bi, _)| bi);
        let mut key = inst.choice.clone();
        if let Some(bi) = backend {
            key[bi] = 0;
        }
        let g = *index.entry((inst.module, key)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(inst);
    }
    for group in &mut groups {
        if let Some((bi, _)) = matrix.module(group[0]).backend_axis() {
            group.sort_by_key(|i| i.choice[bi]);
        }
    }
    groups
}

/// The instance a GPU of `cc` loads among one configuration's `choices` (one instance: that
/// one; several backends: the first that runs there), and the archs its JIT builds for it
/// (`requested`, narrowed by its arch limit); an error saying why when it runs none.
pub(super) fn for_device<'m>(
    matrix: &Matrix,
    choices: &[&'m Instance],
    requested: &[Arch],
    cc: Capability,
) -> Result<(&'m Instance, Vec<Arch>)> {
    let inst = match choices {
        [one] => *one,
        many => choose_backend(matrix, many, cc)?,
    };
    let limit = matrix.arch_limit(inst);
    let archs = arch::for_device_limited(requested, limit.as_deref(), cc)
        .ok_or_else(|| cannot_run(matrix, inst, cc))?;
    Ok((inst, archs))
}

/// The first of `choices` (in the declared order) that runs on a GPU of `cc`
/// ([`choice::running`]).
fn choose_backend<'m>(
    matrix: &Matrix,
    choices: &[&'m Instance],
    cc: Capability,
) -> Result<&'m Instance> {
    let m = matrix.module(choices[0]);
    let (bi, _) = m.backend_axis().expect("backend_choices checked the axis");
    let runs = choice::running(m, cc);
    if let Some(inst) = runs
        .iter()
        .find_map(|&vi| choices.iter().find(|i| i.choice[bi] == vi))
    {
        return Ok(inst);
    }
    let table = choice::table(m).expect("a backend axis");
    Err(UsageError::new(choice::none_runs(m, &table, cc))
        .with_hint("add a backend without an arch limit (or one for this GPU) to variants.json")
        .into())
}

/// Why `inst` cannot be built for a GPU of `cc`: its arch limit, and what the device runs.
fn cannot_run(matrix: &Matrix, inst: &Instance, cc: Capability) -> anyhow::Error {
    let m = matrix.module(inst);
    let (Some((bi, axis)), Some(table)) = (m.backend_axis(), choice::table(m)) else {
        return UsageError::new(format!(
            "module {} is built only for {} (modules.{}.archs in {}), and none of them runs on a \
             GPU of compute capability {cc}",
            m.name,
            arch::spell(&matrix.arch_limit(inst).unwrap_or_default()),
            m.name,
            matrix.config_path.display()
        ))
        .with_hint("run it on a GPU of those architectures")
        .into();
    };
    let value = axis.values[inst.choice[bi]].to_string();
    UsageError::new(choice::refused(m, &table, &value, cc))
        .with_hint(table.hint.clone())
        .into()
}

/// The glibc target of a JIT build, by the one precedence there is: `--manylinux`, else
/// `FLASHGEN_MANYLINUX` (`off`: the system's g++), else the target of the installed wheel whose
/// variants.json this is (its manifest's `manylinux`: the JIT then builds the bytes the wheel
/// would), else the system's g++. The loader passes none of them.
fn jit_target(matrix: &Matrix, cli: Option<&str>) -> Result<Option<Glibc>> {
    let env_set =
        std::env::var(crate::manylinux::MANYLINUX_ENV).is_ok_and(|v| !v.trim().is_empty());
    if cli.is_some() || env_set {
        return Glibc::resolve(cli);
    }
    let layout = crate::records::LAYOUT;
    let config = &matrix.config_path;
    if !config.ends_with(layout.variants) {
        return Ok(None);
    }
    let depth = std::path::Path::new(layout.variants).components().count();
    let Some(package) = config.ancestors().nth(depth) else {
        return Ok(None);
    };
    let manifest = package.join(layout.manifest);
    let Ok(bytes) = std::fs::read(&manifest) else {
        return Ok(None);
    };
    let shipped: crate::records::Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", manifest.display()))?;
    shipped
        .manylinux
        .map(|t| Glibc::parse(&t, &format!("{} manylinux", manifest.display())))
        .transpose()
}

/// The variable by which the loader names itself (its pid) to the `jit` it starts.
pub const PARENT_PID_ENV: &str = "FLASHGEN_PARENT_PID";

/// Ends this process (and with it, through the build's guard, every compile it started) when
/// the loader that asked dies: `PR_SET_PDEATHSIG` set here, by the child itself, so the loader
/// can start it without a hook that runs between fork and exec (which would make Python copy
/// its whole address space instead of using vfork, and is not safe in a threaded program).
/// Exits at once when the loader is already gone.
fn die_with_parent() {
    let Some(parent) = std::env::var(PARENT_PID_ENV)
        .ok()
        .and_then(|p| p.parse::<libc::pid_t>().ok())
    else {
        return;
    };
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid take no pointers and only affect this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            std::process::exit(1);
        }
    }
}

pub fn run(matrix: &Matrix, args: &JitArgs) -> Result<()> {
    die_with_parent();
    let cc = Capability::parse(&args.device.device_cc, "--device-cc")?;
    let (requested, _) = arch::resolve_for_device(args.device.arch.as_deref(), cc)?;
    let selected = args.filter.select(matrix)?;
    let (inst, archs) = match configurations(matrix, &selected).as_slice() {
        [choices] => for_device(matrix, choices, &requested, cc)?,
        _ => {
            return Err(UsageError::new(format!(
                "flashgen jit needs --module and --where terms that select exactly one instance; {} match",
                selected.len()
            ))
            .with_hint("give every axis of the module (the backend may be left out): --where AXIS=VALUE for each")
            .into())
        }
    };
    let launcher = Launcher::resolve(args.device.launcher.as_deref())?;
    let target = jit_target(matrix, args.device.manylinux.as_deref())?;
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
        // Nothing is built or discarded here: an object that does not hash to its record is
        // answered as missing (the next compiling call rebuilds it).
        let prepared = builder.prepare(&[inst], None)?;
        let key = prepared[0].key.clone();
        builder
            .cache
            .lookup(&key, &inst.uri)
            .hit()
            .filter(|e| builder.cache.read_verified(e).is_ok())
            .map(|e| (key, e, JitSource::Cache))
    } else {
        let gen = builder.cache.compile_dir(&inst.uri)?;
        let report = builder.ensure_cached(
            &[inst],
            gen.path(),
            1,
            false,
            &HandOut::Object,
            &Ui::new(true),
        )?;
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
