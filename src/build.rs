//! The build: generate each selected instance's header, key it, take it from the cache or
//! compile it with nvcc (in parallel, through rayon), and place copies of the `.so` files in the
//! output folder with a manifest. `build`, `build-wheel` and the runtime JIT all come through
//! here: [`Builder::ensure_cached`] makes every instance present and verified in the cache, and
//! [`Builder::build`] places its results in `--out`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rayon::prelude::*;

use crate::arch::Arch;
use crate::cache::{Cache, Entry, Lookup};
use crate::codegen;
use crate::compile::{self, CompileInputs, Guard, Launcher, NvccCommand};
use crate::error::UsageError;
use crate::fingerprint::{self, SourceHasher};
use crate::fsutil;
use crate::host_once::{HostObjects, HostOnce, Swap};
use crate::instance::Instance;
use crate::matrix::{HeaderPath, Matrix};
use crate::records::{BuiltRow, Manifest, ToolchainRow};
use crate::stamp;
use crate::toolchain::Toolchain;
use crate::ui::Ui;

/// A rough peak memory of one nvcc job on these kernels, for the default job count.
const BYTES_PER_JOB: u64 = 2 << 30;

/// The marker `build` writes into every output folder it creates (or finds empty); `flashgen
/// clean` clears only folders that carry it. It also lists every instance whose files the
/// builds put there (`instance <uri>` lines: `<uri>.so` and `generated/<uri>/`), which is what
/// `clean` may remove besides `manifest.json`, the stamp and flashgen's temp files.
pub const BUILD_MARKER: &str = ".flashgen-build";
const BUILD_MARKER_HEAD: &str = "flashgen build output: `flashgen clean` removes the files of the instances listed here, manifest.json and .flashgen-stamp, then this folder if nothing else is left\n";

/// How [`Builder::ensure_cached`] hands out each object: the bytes handed out are hashed in this
/// run and must match the cache record's sha256; an object that does not is discarded and rebuilt.
pub enum HandOut<'a> {
    /// The object itself (the JIT answers with its path): its bytes are hashed.
    Object,
    /// A copy at `<dir>/<uri>.so`, written from bytes just hashed; an output whose id and
    /// sha256 are those the last stamp recorded (`previous`, [`stamp::previous`]) is left
    /// unread, and one that already holds the right bytes is left as it is.
    CopyTo {
        dir: &'a Path,
        previous: &'a HashMap<String, (String, String)>,
    },
}

/// Why a hand-out failed: the object is not what its record says (discard and rebuild it), or
/// the output could not be written.
enum HandOutError {
    Corrupt(String),
    Io(anyhow::Error),
}

pub struct BuildOptions {
    pub out_dir: PathBuf,
    pub jobs: usize,
    pub keep_going: bool,
    /// Answer an unchanged rebuild from the stamp (`build-wheel` always verifies instead).
    pub use_stamp: bool,
}

/// Jobs: `--jobs`, else `MAX_JOBS`, else min(cores, available memory / per-job estimate).
/// Zero or a non-number is a usage error; more than 4 x cores is capped (with a note), as
/// such a count only thrashes.
pub fn default_jobs(cli: Option<usize>, ui: &Ui) -> Result<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (jobs, from) = if let Some(j) = cli {
        (j, "--jobs")
    } else if let Some(v) = std::env::var_os("MAX_JOBS").filter(|v| !v.is_empty()) {
        let v = v.to_string_lossy();
        match v.trim().parse::<usize>() {
            Ok(j) => (j, "MAX_JOBS"),
            Err(_) => {
                return Err(
                    UsageError::new(format!("MAX_JOBS={v:?} is not a number of jobs"))
                        .with_hint("set MAX_JOBS to a positive integer, or unset it")
                        .into(),
                )
            }
        }
    } else {
        let mut sys = sysinfo::System::new();
        sys.refresh_memory();
        let by_memory = (sys.available_memory() / BYTES_PER_JOB).max(1) as usize;
        return Ok(cores.min(by_memory));
    };
    if jobs == 0 {
        return Err(
            UsageError::new(format!("{from} 0: at least one job is needed"))
                .with_hint(format!(
                    "pass a positive {from}, or leave it out for the default"
                ))
                .into(),
        );
    }
    let cap = 4 * cores;
    if jobs > cap {
        ui.note(format!("{from} {jobs} capped at {cap} (4 x {cores} cores)"));
        return Ok(cap);
    }
    Ok(jobs)
}

/// Everything one instance needs before it is compiled or found in the cache.
pub struct Prepared<'m> {
    pub inst: &'m Instance,
    pub header: String,
    /// The folder holding `<uri>/flashgen_instance.cuh`, where the compile runs (see
    /// `compile.rs`: a relative `-I<uri>` keeps the output folder out of nvcc's input).
    pub gen_root: PathBuf,
    pub source: PathBuf,
    pub key: String,
    /// The build's archs this instance is compiled for (its arch limit allows them).
    pub archs: Vec<Arch>,
    /// Its nvcc flags: the builder's, with only those archs.
    pub flags: Vec<String>,
    /// With host-once ([`Builder::share_host_objects`]): what its host object is kept and found
    /// under, the key of its flags without any arch (see `host_once.rs`).
    pub host_key: Option<String>,
}

/// One instance's result.
pub struct Built<'m> {
    pub inst: &'m Instance,
    pub key: String,
    pub entry: Entry,
    /// Where `--out` received it.
    pub path: PathBuf,
    pub cached: bool,
    pub compile_time: Option<Duration>,
    /// The archs it was compiled for.
    pub archs: Vec<Arch>,
}

/// What went wrong for one instance; `commands/build.rs` prints each kind its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// nvcc failed (or could not start).
    Compile,
    /// nvcc succeeded but the result could not be stored (rename, record, permissions).
    Store,
    /// The built `.so` lacks an entry point the module declares; nothing was cached.
    EntryPoint,
    /// A source or header changed between its hashing for the key and the end of the compile;
    /// nothing was cached (the object may hold text the key does not name).
    SourceChanged,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Compile => "compile",
            FailureKind::Store => "store",
            FailureKind::EntryPoint => "entry_point",
            FailureKind::SourceChanged => "source_changed",
        }
    }
}

pub struct Failure {
    pub uri: String,
    pub kind: FailureKind,
    /// The nvcc command line (empty where none ran).
    pub command: String,
    /// nvcc's exit status, or the store or entry-point error (naming path and OS error).
    pub status: String,
    pub stderr: String,
}

/// One instance present and verified in the cache.
pub struct Ready<'m> {
    pub prepared: Prepared<'m>,
    /// The verified cache object: absolute path, sha256, size.
    pub entry: Entry,
    /// Found in the cache (possibly put there by a concurrent build) rather than compiled here.
    pub cached: bool,
    pub compile_time: Option<Duration>,
}

/// What [`Builder::ensure_cached`] did, in matrix order.
pub struct CacheReport<'m> {
    pub ready: Vec<Ready<'m>>,
    pub failures: Vec<Failure>,
    /// Instances never started because an earlier failure stopped the build.
    pub not_started: Vec<String>,
}

pub struct BuildReport<'m> {
    pub built: Vec<Built<'m>>,
    pub failures: Vec<Failure>,
    /// Instances never started because an earlier failure stopped the build.
    pub not_started: Vec<String>,
    pub wall: Duration,
    pub jobs: usize,
}

pub struct Builder<'m> {
    pub matrix: &'m Matrix,
    pub toolchain: Toolchain,
    pub cache: Cache,
    pub flags: Vec<String>,
    pub archs: Vec<Arch>,
    /// `-I` folders after the generated header's (see [`search_dirs`]).
    pub search_dirs: Vec<PathBuf>,
    /// In front of each compile step; never part of the key.
    pub launcher: Launcher,
    compress: bool,
    hasher: SourceHasher,
    /// A release run's host objects, shared with its other architectures' builders.
    host_once: Option<HostOnce>,
}

impl<'m> Builder<'m> {
    pub fn new(
        matrix: &'m Matrix,
        toolchain: Toolchain,
        cache: Cache,
        archs: Vec<Arch>,
        compress: bool,
    ) -> Self {
        let flags = compile::output_flags(
            &matrix.nvcc_flags,
            &archs,
            compress,
            toolchain.manylinux.is_some(),
            crate::toolchain::cuda_major(&toolchain),
        );
        let search_dirs = search_dirs(matrix);
        let hasher = SourceHasher::new(&matrix.root, search_dirs.clone());
        Builder {
            matrix,
            toolchain,
            cache,
            flags,
            archs,
            search_dirs,
            launcher: Launcher::default(),
            compress,
            hasher,
            host_once: None,
        }
    }

    /// Makes this builder one architecture of a release run that builds `later` after it, all
    /// sharing `objects`: an instance compiled here keeps its host object for the later
    /// architectures, and one whose object an earlier architecture kept compiles its device code
    /// alone into a copy of it (`host_once.rs`). Set the launcher first: host-once is off with one,
    /// as it is without objcopy or with the zig host compiler (`-v` says why).
    pub fn share_host_objects(&mut self, objects: std::sync::Arc<HostObjects>, later: Vec<Arch>) {
        match HostOnce::new(objects.clone(), later, &self.toolchain, &self.launcher) {
            Ok(h) => self.host_once = Some(h),
            Err(why) => HostOnce::say_off(&objects, &why),
        }
    }

    /// The archs of this build `inst` is compiled for: all of them, or those its arch limit
    /// allows; empty when it allows none (the commands skip such an instance).
    pub fn instance_archs(&self, inst: &Instance) -> Vec<Arch> {
        self.matrix.instance_archs(inst, &self.archs)
    }

    /// The nvcc flags of a compile for `archs`: the builder's own for its whole list (so an
    /// instance without an arch limit keeps its key), else the same flags with only `archs`.
    pub fn flags_for(&self, archs: &[Arch]) -> Vec<String> {
        if archs == self.archs.as_slice() {
            return self.flags.clone();
        }
        compile::output_flags(
            &self.matrix.nvcc_flags,
            archs,
            self.compress,
            self.toolchain.manylinux.is_some(),
            crate::toolchain::cuda_major(&self.toolchain),
        )
    }

    /// Splits `selected` into the instances this build compiles and those whose arch limit
    /// allows none of its archs (a build for 8.0 never compiles an instance limited to 9.0a).
    pub fn buildable(&self, selected: &[&'m Instance]) -> (Vec<&'m Instance>, Vec<&'m Instance>) {
        selected
            .iter()
            .partition(|i| !self.instance_archs(i).is_empty())
    }

    /// Header text, include folders and cache key of each instance (in parallel; each source file
    /// is read and hashed once). Headers are written under `gen_dir/<uri>/` only when changed.
    /// With `gen_dir` None nothing is written (for listing).
    pub fn prepare(
        &self,
        selected: &[&'m Instance],
        gen_dir: Option<&Path>,
    ) -> Result<Vec<Prepared<'m>>> {
        let tc_texts = self.toolchain_texts();
        let gen_root = gen_dir.unwrap_or(Path::new("<generated>"));
        // Every flag but the archs': the same for each architecture of a release.
        let host_flags = self.host_once.as_ref().map(|_| self.flags_for(&[]));
        selected
            .par_iter()
            .map(|inst| {
                let archs = self.instance_archs(inst);
                if archs.is_empty() {
                    anyhow::bail!(
                        "{} is built for none of the archs {} (its limit: {}); leave it out",
                        inst.uri,
                        crate::arch::spell(&self.archs),
                        crate::arch::spell(&self.matrix.arch_limit(inst).unwrap_or_default())
                    );
                }
                let flags = self.flags_for(&archs);
                let header = codegen::instance_header(self.matrix, inst);
                if gen_dir.is_some() {
                    let file = gen_root.join(&inst.uri).join(codegen::HEADER_NAME);
                    fsutil::write_if_changed(&file, header.as_bytes())?;
                }
                let source = self
                    .matrix
                    .root
                    .join("csrc")
                    .join(&self.matrix.module(inst).source);
                let inputs = self.hasher.inputs(&source, &header)?;
                let key = fingerprint::cache_key(&tc_texts, &flags, &header, &inputs);
                let host_key = host_flags
                    .as_ref()
                    .map(|f| fingerprint::cache_key(&tc_texts, f, &header, &inputs));
                Ok(Prepared {
                    inst,
                    header,
                    gen_root: gen_root.to_path_buf(),
                    source,
                    key,
                    archs,
                    flags,
                    host_key,
                })
            })
            .collect()
    }

    /// Every source and header file the build hashed, with the sha256 it compiled against.
    pub fn hashed_inputs(&self) -> Vec<(PathBuf, String)> {
        self.hasher.hashed()
    }

    /// The compile step of `p` (into `object`) and its link step (into `output`).
    pub fn commands(&self, p: &Prepared, object: &Path, output: &Path) -> [NvccCommand; 2] {
        let inputs = self.compile_inputs(p);
        [
            NvccCommand::compile(&self.toolchain, &p.flags, &inputs, object, &self.launcher),
            // The link runs beside the object, in the compile's private folder (or where the
            // caller put the object), through that folder's symlink to the toolchain.
            NvccCommand::link(
                &self.toolchain,
                &p.flags,
                object,
                output,
                object.parent().unwrap_or(Path::new(".")),
            ),
        ]
    }

    /// What a build of `p` runs to make `output`: the two steps of [`Self::commands`] (the
    /// object beside `output`) when a launcher must see the compile, else the one nvcc call
    /// that gives the same bytes, run in `output`'s folder.
    fn build_steps(&self, p: &Prepared, output: &Path) -> Vec<NvccCommand> {
        let dir = output.parent().unwrap_or(Path::new("."));
        if self.launcher.is_none() {
            let inputs = self.compile_inputs(p);
            vec![NvccCommand::compile_and_link(
                &self.toolchain,
                &p.flags,
                &inputs,
                output,
                dir,
            )]
        } else {
            self.commands(p, &dir.join(OBJECT_NAME), output).into()
        }
    }

    fn compile_inputs<'p>(&'p self, p: &'p Prepared) -> CompileInputs<'p> {
        CompileInputs {
            cwd: &p.gen_root,
            header_dir: Path::new(&p.inst.uri),
            search_dirs: &self.search_dirs,
            source: &p.source,
        }
    }

    /// Makes every selected instance present and verified in the cache, compiling the misses
    /// in a pool of `jobs` threads: headers are generated under `gen_dir/<uri>/`, each key is
    /// looked up (record and object checked, see [`Cache::lookup`]), and each miss is compiled
    /// under the key's lock (`<cache>/locks/<key>.lock`) after looking again, so concurrent
    /// builds of one instance compile it once. A corrupt object is discarded and rebuilt. A
    /// compiled `.so` is cached only when it exports every entry point of its module. Every object
    /// is handed out as `hand` says, from bytes hashed in this run; one whose bytes do not match
    /// its record is discarded and rebuilt like a corrupt one. Without `keep_going` the first
    /// failure stops new compiles; those in flight finish and are cached.
    pub fn ensure_cached(
        &self,
        selected: &[&'m Instance],
        gen_dir: &Path,
        jobs: usize,
        keep_going: bool,
        hand: &HandOut,
        ui: &Ui,
    ) -> Result<CacheReport<'m>> {
        let prepared = self.prepare(selected, Some(gen_dir))?;
        // A hit that fails its hand-out goes to `fill`, which looks again under the lock.
        let lookups: Vec<Option<Entry>> = prepared
            .par_iter()
            .map(|p| {
                let e = self.cache.lookup(&p.key, &p.inst.uri).hit()?;
                self.hand_out(&e, p.inst, hand).ok().map(|()| e)
            })
            .collect();
        let misses: Vec<usize> = (0..prepared.len())
            .filter(|&i| lookups[i].is_none())
            .collect();

        let results: Mutex<HashMap<usize, (Entry, Option<Duration>)>> = Mutex::default();
        let failures: Mutex<Vec<Failure>> = Mutex::default();
        let not_started: Mutex<Vec<String>> = Mutex::default();
        if !misses.is_empty() {
            self.cache.sweep_stale_temps();
            ui.status(format!(
                "compiling {} of {} instances with {jobs} jobs ({} cached)",
                misses.len(),
                prepared.len(),
                prepared.len() - misses.len()
            ));
            let guard = Guard::start()?;
            let scratch = Scratch::new(&self.cache);
            let stop = AtomicBool::new(false);
            let progress = ui.progress(misses.len());
            let pool = rayon::ThreadPoolBuilder::new().num_threads(jobs).build()?;
            pool.install(|| {
                misses.par_iter().with_max_len(1).for_each(|&i| {
                    let p = &prepared[i];
                    if stop.load(Ordering::SeqCst) {
                        not_started.lock().unwrap().push(p.inst.uri.clone());
                        return;
                    }
                    progress.start(&p.inst.uri);
                    match self.fill(p, &guard, &scratch, hand, ui) {
                        Ok((entry, took)) => {
                            let outcome = match took {
                                Some(t) => format!("{:.1}s", t.as_secs_f64()),
                                None => "cached".into(),
                            };
                            progress.finish(&p.inst.uri, &outcome);
                            results.lock().unwrap().insert(i, (entry, took));
                        }
                        Err(f) => {
                            progress.finish(&p.inst.uri, "FAILED");
                            if !keep_going {
                                stop.store(true, Ordering::SeqCst);
                            }
                            failures.lock().unwrap().push(f);
                        }
                    }
                });
            });
            progress.done();
        }
        let mut results = results.into_inner().unwrap();
        let mut ready = Vec::new();
        for (i, (p, hit)) in prepared.into_iter().zip(lookups).enumerate() {
            let (entry, compile_time) = match hit {
                Some(e) => (e, None),
                None => match results.remove(&i) {
                    Some(r) => r,
                    None => continue,
                },
            };
            ready.push(Ready {
                prepared: p,
                entry,
                cached: compile_time.is_none(),
                compile_time,
            });
        }
        let mut failures = failures.into_inner().unwrap();
        failures.sort_by(|a, b| a.uri.cmp(&b.uri));
        let mut not_started = not_started.into_inner().unwrap();
        not_started.sort();
        Ok(CacheReport {
            ready,
            failures,
            not_started,
        })
    }

    /// Builds `selected` into `opts.out_dir`: [`Builder::ensure_cached`], then a copy of each
    /// object at `<out>/<uri>.so`, `manifest.json` and, when nothing failed, the stamp.
    pub fn build(
        &self,
        selected: &[&'m Instance],
        opts: &BuildOptions,
        ui: &Ui,
    ) -> Result<BuildReport<'m>> {
        let start = Instant::now();
        // Absolute, so that every printed nvcc command works from any folder; `.` components and
        // a trailing slash dropped, so that checks on the folder see what it is.
        let out_dir = fsutil::lexical_absolute(&opts.out_dir)?;
        let stamp = stamp::compute(self.matrix, selected, &self.flags, &self.toolchain_texts());
        if opts.use_stamp {
            if let Some(report) = self.up_to_date(&out_dir, &stamp, selected, opts, start) {
                return Ok(report);
            }
        }
        claim_out_dir(&out_dir, "--out")?;
        record_instances(&out_dir, selected)?;
        let previous = stamp::previous(&out_dir);
        // From here on the outputs may change: no stamp may vouch for them until the end.
        match std::fs::remove_file(stamp::path(&out_dir)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let hand = HandOut::CopyTo {
            dir: &out_dir,
            previous: &previous,
        };
        let report = self.ensure_cached(
            selected,
            &out_dir.join("generated"),
            opts.jobs,
            opts.keep_going,
            &hand,
            ui,
        )?;
        let built: Vec<Built> = report
            .ready
            .into_iter()
            .map(|r| Built {
                inst: r.prepared.inst,
                path: out_dir.join(format!("{}.so", r.prepared.inst.uri)),
                key: r.prepared.key,
                archs: r.prepared.archs,
                entry: r.entry,
                cached: r.cached,
                compile_time: r.compile_time,
            })
            .collect();
        self.write_manifest(&out_dir, &built)?;
        if report.failures.is_empty() && report.not_started.is_empty() {
            let mut files: Vec<stamp::Stamped> = built
                .iter()
                .map(|b| stamp::Stamped {
                    path: b.path.clone(),
                    key_sha256: Some((b.key.clone(), b.entry.sha256.clone())),
                })
                .collect();
            files.push(stamp::Stamped {
                path: out_dir.join("manifest.json"),
                key_sha256: None,
            });
            stamp::write(&out_dir, &stamp, &files)?;
        }
        Ok(BuildReport {
            built,
            failures: report.failures,
            not_started: report.not_started,
            wall: start.elapsed(),
            jobs: opts.jobs,
        })
    }

    /// What keys the cache about the toolchain: nvcc's and the host compiler's version texts,
    /// and the `NVCC_PREPEND_FLAGS`/`NVCC_APPEND_FLAGS` nvcc adds to every command (only when
    /// set, so keys made without them stay valid).
    fn toolchain_texts(&self) -> Vec<&str> {
        let mut texts = vec![
            self.toolchain.nvcc_version_text.as_str(),
            self.toolchain.host_compiler.as_str(),
        ];
        if !self.toolchain.nvcc_env_flags.is_empty() {
            texts.push(self.toolchain.nvcc_env_flags.as_str());
        }
        texts
    }

    /// The fast path: when the stamp matches and every output (and the manifest) still has the
    /// size and mtime the stamp recorded, the report comes from the stamp (each output's key
    /// and sha256), and nothing is generated, hashed or looked up.
    fn up_to_date(
        &self,
        out_dir: &Path,
        stamp: &str,
        selected: &[&'m Instance],
        opts: &BuildOptions,
        start: Instant,
    ) -> Option<BuildReport<'m>> {
        if !out_dir.join(BUILD_MARKER).is_file() {
            return None;
        }
        let recorded = stamp::matches(out_dir, stamp)?;
        if recorded.len() != selected.len() {
            return None;
        }
        let built: Option<Vec<Built>> = selected
            .iter()
            .zip(recorded)
            .map(|(inst, r)| {
                (r.name.strip_suffix(".so") == Some(inst.uri.as_str())).then_some(())?;
                let path = out_dir.join(&r.name);
                Some(Built {
                    inst,
                    key: r.key.clone(),
                    entry: Entry {
                        uri: inst.uri.clone(),
                        key: r.key,
                        sha256: r.sha256,
                        size: r.size,
                        verified: None,
                        path: path.clone(),
                        hashed_now: false,
                    },
                    path,
                    cached: true,
                    compile_time: None,
                    archs: self.instance_archs(inst),
                })
            })
            .collect();
        Some(BuildReport {
            built: built?,
            failures: Vec::new(),
            not_started: Vec::new(),
            wall: start.elapsed(),
            jobs: opts.jobs,
        })
    }

    /// Makes one missed instance present: under its lock, looks again (a concurrent build may
    /// have stored it; `None` time then) and hands it out; discards an object that is corrupt,
    /// another instance's, or not what its record says; compiles, stores and hands out.
    fn fill(
        &self,
        p: &Prepared,
        guard: &Guard,
        scratch: &Scratch,
        hand: &HandOut,
        ui: &Ui,
    ) -> Result<(Entry, Option<Duration>), Failure> {
        let store = |e: anyhow::Error| Failure {
            uri: p.inst.uri.clone(),
            kind: FailureKind::Store,
            command: String::new(),
            status: format!("{e:#}"),
            stderr: String::new(),
        };
        let _lock = self.cache.lock(&p.key).map_err(store)?;
        let corrupt = match self.cache.lookup(&p.key, &p.inst.uri) {
            Lookup::Hit(e) => match self.hand_out(&e, p.inst, hand) {
                Ok(()) => return Ok((e, None)),
                Err(HandOutError::Io(e)) => return Err(store(e)),
                Err(HandOutError::Corrupt(why)) => Some(why),
            },
            Lookup::Corrupt(why) => Some(why),
            Lookup::Miss => None,
        };
        if let Some(why) = corrupt {
            ui.warn(format!(
                "rebuilding {}: cached object is corrupt ({why})",
                p.inst.uri
            ));
            self.cache.discard(&p.key).map_err(store)?;
        }
        let (e, took) = self.compile_one(p, guard, scratch)?;
        match self.hand_out(&e, p.inst, hand) {
            Ok(()) => Ok((e, Some(took))),
            Err(HandOutError::Io(e)) => Err(store(e)),
            Err(HandOutError::Corrupt(why)) => Err(store(anyhow::anyhow!(
                "the object just stored does not match its record: {why}"
            ))),
        }
    }

    /// Hands out the object `e` of `inst` (see [`HandOut`]).
    fn hand_out(&self, e: &Entry, inst: &Instance, hand: &HandOut) -> Result<(), HandOutError> {
        let (dir, previous) = match hand {
            HandOut::Object => {
                return self
                    .cache
                    .read_verified(e)
                    .map(drop)
                    .map_err(HandOutError::Corrupt)
            }
            HandOut::CopyTo { dir, previous } => (dir, previous),
        };
        let name = format!("{}.so", inst.uri);
        let dst = dir.join(&name);
        let now = fsutil::FileId::of_path(&dst);
        // Unchanged since the last build hashed or wrote it, and the record still names its bytes.
        if let (Some((id, sha)), Some(now)) = (previous.get(&name), now) {
            if *sha == e.sha256 && now.word() == *id {
                return Ok(());
            }
        }
        // An output that already holds the object's bytes is kept (its mtime too). When this run
        // hashed the object, its record's sha256 is the bytes' and the output is compared with
        // that; otherwise the object is read and hashed first, and the output compared with it.
        let holds = |want: &dyn Fn(&[u8]) -> bool| {
            now.is_some_and(|m| m.size == e.size) && std::fs::read(&dst).is_ok_and(|old| want(&old))
        };
        if e.hashed_now && holds(&|old| fsutil::sha256_bytes(old) == e.sha256) {
            return Ok(());
        }
        let bytes = self.cache.read_verified(e).map_err(HandOutError::Corrupt)?;
        if holds(&|old| old == bytes.as_slice()) {
            return Ok(());
        }
        fsutil::place_bytes(&bytes, &dst).map_err(HandOutError::Io)
    }

    /// Compiles one instance in two steps (see `compile.rs`), both in the guard's process group
    /// with nvcc's temporary files, the object and the `.so` in a scratch folder of the cache,
    /// checks its entry points and stores it. Call with the key locked.
    fn compile_one(
        &self,
        p: &Prepared,
        guard: &Guard,
        scratch: &Scratch,
    ) -> Result<(Entry, Duration), Failure> {
        let fail = |kind: FailureKind, command: String, status: String, stderr: String| Failure {
            uri: p.inst.uri.clone(),
            kind,
            command,
            status,
            stderr,
        };
        let store = |cmd: &NvccCommand, e: anyhow::Error| {
            fail(
                FailureKind::Store,
                cmd.shell_line(),
                format!("{e:#}"),
                String::new(),
            )
        };
        let early = |e: anyhow::Error| {
            fail(
                FailureKind::Store,
                String::new(),
                format!("{e:#}"),
                String::new(),
            )
        };
        // A failure drops the folder (removing whatever the failed step left there); a success
        // gives it back for the next compile.
        let dir = scratch.take().map_err(early)?;
        let object = dir.path().join(OBJECT_NAME);
        let tmp = dir.path().join("instance.so");
        let (steps, took, keep) = self
            .run_steps(p, dir.path(), &object, &tmp, guard)
            .map_err(|(cmd, status, stderr)| fail(FailureKind::Compile, cmd, status, stderr))?;
        let (compile, cmd) = (&steps[0], &steps[steps.len() - 1]);
        // The key names the bytes hashed before the compile; an edit since (a file saved while
        // the build ran) may be what nvcc read, so such an object is not stored under that key.
        let changed = self
            .hasher
            .changed_since_hashed(&p.source, &p.header)
            .map_err(|e| store(cmd, e))?;
        if let Some(path) = changed {
            return Err(fail(
                FailureKind::SourceChanged,
                compile.shell_line(),
                format!(
                    "{} changed while the instance was compiling; build again",
                    path.display()
                ),
                String::new(),
            ));
        }
        // Emptied, not removed (see `Scratch`): a later compile in this folder that claims
        // success without writing its object then fails to link instead of linking this one. An
        // object kept for the later architectures moves once its `.so` is stored.
        if steps.len() > 1 && keep.is_none() {
            std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&object)
                .with_context(|| format!("cannot empty {}", object.display()))
                .map_err(|e| store(cmd, e))?;
        }
        let bytes = std::fs::read(&tmp)
            .with_context(|| format!("cannot read nvcc's output {}", tmp.display()))
            .map_err(|e| store(cmd, e))?;
        let missing = missing_entry_points(&bytes, &self.matrix.module(p.inst).entry_points)
            .map_err(|e| fail(FailureKind::EntryPoint, cmd.shell_line(), e, String::new()))?;
        if !missing.is_empty() {
            let text: Vec<String> = missing
                .iter()
                .map(|s| format!("entry point `{s}` is not exported by the built .so"))
                .collect();
            return Err(fail(
                FailureKind::EntryPoint,
                cmd.shell_line(),
                text.join("; "),
                String::new(),
            ));
        }
        let entry = self
            .cache
            .insert(&p.key, &p.inst.uri, &tmp, &bytes)
            .map_err(|e| store(cmd, e))?;
        if let Some((h, host_key)) = keep {
            if let Err(e) = h.objects.keep(&self.cache, &p.inst.uri, host_key, &object) {
                crate::ui::detail(format!(
                    "{}: its host object is not kept ({e:#}); its later architectures compile in one step",
                    p.inst.uri
                ));
                // Not in the folder given back (see above).
                let _ = std::fs::remove_file(&object);
            }
        }
        scratch.give(dir);
        Ok((entry, took))
    }

    /// Runs the steps that make `p`'s `.so` at `output`, in the compile's scratch folder `dir`
    /// (`object`: the object's place there). With host-once ([`Self::share_host_objects`]):
    /// where an earlier architecture of the run kept `p`'s host object, its device code alone
    /// swapped into a copy of it, then the link (any failure there falls back to the steps
    /// below, `-v` saying why); else, where a later architecture builds `p`, the compile and the
    /// link, keeping the object (returned with its host key, to keep once the `.so` is stored);
    /// else [`Self::build_steps`]. Returns the steps run (the compile first, the link last) and
    /// their time, or the failed step's command line, status and output.
    #[allow(clippy::type_complexity)]
    fn run_steps<'s>(
        &'s self,
        p: &'s Prepared,
        dir: &Path,
        object: &Path,
        output: &Path,
        guard: &Guard,
    ) -> Result<
        (Vec<NvccCommand>, Duration, Option<(&'s HostOnce, &'s str)>),
        (String, String, String),
    > {
        let run = |steps: &[NvccCommand]| {
            let mut took = Duration::ZERO;
            for step in steps {
                took += step
                    .run(dir, guard)
                    .map_err(|(status, stderr)| (step.shell_line(), status, stderr))?;
            }
            Ok(took)
        };
        let host = self.host_once.as_ref().zip(p.host_key.as_deref());
        let Some((h, host_key)) = host else {
            let steps = self.build_steps(p, output);
            return run(&steps).map(|took| (steps, took, None));
        };
        let later = !self.matrix.instance_archs(p.inst, &h.later).is_empty();
        let kept = h.objects.find(&p.inst.uri, host_key);
        let swap = kept.as_ref().map(|_| h.objects.swap());
        if swap == Some(Swap::No) && !later {
            h.objects.forget(&p.inst.uri);
        }
        if let (Some(kept), Some(swap @ (Swap::Trusted | Swap::Check))) = (kept, swap) {
            let fatbin = dir.join(FATBIN_NAME);
            let inputs = self.compile_inputs(p);
            let steps = vec![
                NvccCommand::fatbin(&self.toolchain, &p.flags, &inputs, &fatbin),
                NvccCommand::swap_fatbin(&h.objcopy, &fatbin, &kept, object),
                NvccCommand::link(&self.toolchain, &p.flags, object, output, dir),
            ];
            let ran = run(&steps);
            let _ = std::fs::remove_file(&fatbin);
            if !later {
                h.objects.forget(&p.inst.uri);
            }
            match ran {
                Ok(took) if matches!(swap, Swap::Trusted) => return Ok((steps, took, None)),
                // The run's first swap is built in one step too: the swapped bytes are trusted
                // only if they are the one-step build's (the host object may one day depend on
                // the target, e.g. with another nvcc).
                Ok(took) => {
                    let one_step = dir.join("one-step.so");
                    let steps = self.build_steps(p, &one_step);
                    let took = match run(&steps) {
                        Ok(one) => took + one,
                        Err(e) => {
                            h.objects.unchecked();
                            return Err(e);
                        }
                    };
                    let swapped = std::fs::read(output).ok();
                    let same = swapped.is_some() && swapped == std::fs::read(&one_step).ok();
                    h.objects.checked(same, &p.inst.uri);
                    let _ = std::fs::remove_file(object);
                    std::fs::rename(&one_step, output).map_err(|e| {
                        (
                            format!("mv {} {}", one_step.display(), output.display()),
                            e.to_string(),
                            String::new(),
                        )
                    })?;
                    return Ok((steps, took, None));
                }
                Err((cmd, status, stderr)) => {
                    if matches!(swap, Swap::Check) {
                        h.objects.unchecked();
                    }
                    crate::ui::detail(format!(
                        "{}: the device code swap into its host object failed ({status}: {}; `{cmd}`); building it in one step",
                        p.inst.uri,
                        stderr.lines().next().unwrap_or("").trim()
                    ));
                    let _ = std::fs::remove_file(object);
                    let _ = std::fs::remove_file(output);
                }
            }
        }
        if later {
            let steps: Vec<NvccCommand> = self.commands(p, object, output).into();
            return run(&steps).map(|took| (steps, took, Some((h, host_key))));
        }
        let steps = self.build_steps(p, output);
        run(&steps).map(|took| (steps, took, None))
    }

    /// The manifest of `built`: what `--out/manifest.json` holds and what the wheel ships.
    pub fn manifest(&self, built: &[Built]) -> Manifest {
        Manifest {
            flashgen_version: env!("CARGO_PKG_VERSION").into(),
            toolchain: Some(ToolchainRow::of(&self.toolchain)),
            manylinux: self.toolchain.manylinux.map(|g| g.spelling()),
            archs: self.archs.iter().flat_map(Arch::targets).collect(),
            runs_on: crate::arch::runs_on_all(&self.archs),
            instances: built.iter().map(|b| self.built_row(b, false)).collect(),
            module_rows: None,
            kernel_packages: Vec::new(),
        }
    }

    /// One entry per built instance; rewritten only when it changes.
    fn write_manifest(&self, out_dir: &Path, built: &[Built]) -> Result<()> {
        fsutil::write_if_changed(
            &out_dir.join("manifest.json"),
            serde_json::to_string_pretty(&self.manifest(built))?.as_bytes(),
        )?;
        Ok(())
    }

    /// An instance as the manifest (relative path) or the `--json` summary (absolute) shows it.
    pub fn built_row(&self, b: &Built, absolute: bool) -> BuiltRow {
        let path = if absolute {
            std::path::absolute(&b.path)
                .unwrap_or_else(|_| b.path.clone())
                .display()
                .to_string()
        } else {
            b.path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        };
        BuiltRow {
            instance: self.matrix.instance_row(b.inst),
            fingerprint: b.key.clone(),
            path,
            sha256: b.entry.sha256.clone(),
            archs: b.archs.iter().flat_map(Arch::targets).collect(),
            runs_on: crate::arch::runs_on_all(&b.archs),
        }
    }
}

/// The compile step's output in a scratch folder, when the build takes two steps (or the copy
/// of a kept host object with this architecture's fatbin).
const OBJECT_NAME: &str = "instance.o";

/// The device-only step's output in a scratch folder (host-once; removed once swapped in).
const FATBIN_NAME: &str = "instance.fatbin";

/// Private folders under `<cache>/tmp` (`nvcc-job.*/`) for the compiles of one
/// [`Builder::ensure_cached`]: nvcc's `TMPDIR`, the object and the `.so` until it is stored. One
/// per compile in flight, handed from compile to compile and removed at the end (or on a
/// failure). Not one per compile: on ext4 without a journal (this project's CI machines) every
/// file or folder created scans the inodes freed in the last 5 to 10 s of its block group, so
/// removing two per compile made each creation of a 10,000-instance build slower than the last.
struct Scratch<'c> {
    cache: &'c Cache,
    free: Mutex<Vec<tempfile::TempDir>>,
}

impl<'c> Scratch<'c> {
    fn new(cache: &'c Cache) -> Self {
        Scratch {
            cache,
            free: Mutex::default(),
        }
    }

    fn take(&self) -> Result<tempfile::TempDir> {
        match self.free.lock().unwrap().pop() {
            Some(d) => Ok(d),
            None => self.cache.compile_dir("job"),
        }
    }

    fn give(&self, dir: tempfile::TempDir) {
        self.free.lock().unwrap().push(dir);
    }
}

/// `-I` folders after the generated header's: `include/`, then user variants' folders.
pub fn search_dirs(matrix: &Matrix) -> Vec<PathBuf> {
    let mut dirs = vec![matrix.root.join("include")];
    for v in &matrix.variants {
        if let HeaderPath::External(p) = &v.header {
            let d = p.parent().unwrap_or(Path::new("/")).to_path_buf();
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// Which of `names` the ELF shared object `bytes` does not export as defined dynamic symbols
/// of default visibility; an error when it is not an ELF file.
fn missing_entry_points(bytes: &[u8], names: &[String]) -> Result<Vec<String>, String> {
    use goblin::elf::sym::{STB_GLOBAL, STB_WEAK, STV_DEFAULT};
    let elf = goblin::elf::Elf::parse(bytes)
        .map_err(|e| format!("the built .so is not a readable ELF file: {e}"))?;
    let exported: std::collections::HashSet<&str> = elf
        .dynsyms
        .iter()
        .filter(|s| {
            s.st_shndx != goblin::elf::section_header::SHN_UNDEF as usize
                && matches!(s.st_bind(), STB_GLOBAL | STB_WEAK)
                && s.st_visibility() == STV_DEFAULT
        })
        .filter_map(|s| elf.dynstrtab.get_at(s.st_name))
        .collect();
    Ok(names
        .iter()
        .filter(|n| !exported.contains(n.as_str()))
        .cloned()
        .collect())
}

/// The refusal of a folder that is neither new, empty, nor flashgen's, or `None`. A folder that
/// holds only a marker's temp file is a concurrent build creating it: its marker is waited for
/// (up to a second). An `--out` that is a symlink to a folder is that folder.
fn unclaimable(dir: &Path, flag: &str) -> Result<Option<anyhow::Error>> {
    let mut names = Vec::new();
    for attempt in 0..50 {
        let meta = match std::fs::metadata(dir) {
            Err(_) => return Ok(None),
            Ok(m) => m,
        };
        if !meta.is_dir() {
            return Ok(Some(
                UsageError::new(format!("{flag} {}: it is not a folder", dir.display()))
                    .with_hint(format!("pass a new or empty folder as {flag}"))
                    .into(),
            ));
        }
        if dir.join(BUILD_MARKER).is_file() {
            return Ok(None);
        }
        names = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect::<Vec<String>>();
        if names.is_empty() {
            return Ok(None);
        }
        if attempt < 49 && names.iter().all(|n| fsutil::is_atomic_temp(n)) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        break;
    }
    names.sort();
    let more = names.len().saturating_sub(5);
    names.truncate(5);
    Ok(Some(
        UsageError::new(format!(
            "{flag} {}: not a flashgen build folder (no {BUILD_MARKER}), and not empty ({}{}); flashgen writes only into a folder it created, so that `flashgen clean` never deletes anyone's files",
            dir.display(),
            names.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ))
        .with_hint(format!(
            "pass a new or empty folder as {flag} (flashgen creates it), or move the files out of {}",
            dir.display()
        ))
        .into(),
    ))
}

/// Refuses (exit 2) an output folder a build would not claim (see [`claim_out_dir`]), before
/// anything is built or written.
pub fn check_out_claimable(dir: &Path, flag: &str) -> Result<()> {
    match unclaimable(&fsutil::lexical_absolute(dir)?, flag)? {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Makes `dir` a build folder: created and marked when it does not exist, marked when it is
/// empty, kept when it carries the marker; anything else is refused (exit 2), whatever it
/// holds, so that `flashgen clean` never meets files flashgen did not make.
pub fn claim_out_dir(dir: &Path, flag: &str) -> Result<()> {
    if let Some(e) = unclaimable(dir, flag)? {
        return Err(e);
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the output folder {}", dir.display()))?;
    let marker = dir.join(BUILD_MARKER);
    if !marker.is_file() {
        fsutil::write_atomic(&marker, BUILD_MARKER_HEAD.as_bytes())?;
    }
    Ok(())
}

/// The instances the build marker of `dir` lists.
fn recorded_instances(dir: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_to_string(dir.join(BUILD_MARKER))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("instance "))
        .map(str::to_string)
        .collect()
}

/// Adds `selected` to the instances the marker lists, before any of their files is written.
fn record_instances(dir: &Path, selected: &[&Instance]) -> Result<()> {
    let mut known = recorded_instances(dir);
    let before = known.len();
    known.extend(selected.iter().map(|i| i.uri.clone()));
    if known.len() == before {
        return Ok(());
    }
    let mut text = BUILD_MARKER_HEAD.to_string();
    for uri in &known {
        text.push_str(&format!("instance {uri}\n"));
    }
    fsutil::write_atomic(&dir.join(BUILD_MARKER), text.as_bytes())
}

/// Whether `dir` (already made absolute and lexical, see [`fsutil::lexical_absolute`]) is a real
/// folder (not a symlink) that carries the build marker.
pub fn is_build_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
        && std::fs::symlink_metadata(dir.join(BUILD_MARKER)).is_ok_and(|m| m.is_file())
}

/// What `flashgen clean` removes from the build folder `dir` (see [`is_build_dir`]): the files of
/// the instances its marker lists (and those its manifest and stamp name: folders of older
/// flashgen releases list none), `manifest.json`, the stamp and flashgen's `.tmp-*` files, each
/// only when this user owns it; `generated/`, the marker and `dir` last, once nothing else is
/// left. Anything else is kept. True when `dir` is gone (or would be).
pub fn remove_own_outputs(dir: &Path, sweep: &mut fsutil::Sweep) -> Result<bool> {
    use fsutil::Own;
    let mut uris = recorded_instances(dir);
    uris.extend(
        stamp::previous(dir)
            .into_keys()
            .filter_map(|n| n.strip_suffix(".so").map(str::to_string)),
    );
    if let Ok(text) = std::fs::read_to_string(dir.join("manifest.json")) {
        if let Ok(m) = serde_json::from_str::<Manifest>(&text) {
            uris.extend(
                m.instances
                    .iter()
                    .filter_map(|r| r.path.strip_suffix(".so").map(str::to_string)),
            );
        }
    }
    // Plain names only: a listed `..` or `a/b` names nothing of ours.
    uris.retain(|u| !u.is_empty() && !u.starts_with('.') && !u.contains('/'));
    let temp = |n: &str| fsutil::is_atomic_temp(n);
    let header = |n: &str| {
        if n == codegen::HEADER_NAME || temp(n) {
            Own::File
        } else {
            Own::No
        }
    };
    let generated = |n: &str| {
        if uris.contains(n) {
            Own::Dir(&header)
        } else if temp(n) {
            Own::File
        } else {
            Own::No
        }
    };
    let root = |n: &str| {
        let output = n.strip_suffix(".so").is_some_and(|u| uris.contains(u));
        match n {
            "generated" => Own::Dir(&generated),
            "manifest.json" | ".flashgen-stamp" => Own::File,
            n if output || temp(n) => Own::File,
            _ => Own::No,
        }
    };
    sweep.clear(dir, &root, Some(BUILD_MARKER))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::testing::Toy;

    /// The toolchain a key names, without running anything: no test here compiles (every
    /// object is stored beforehand), so no nvcc is needed.
    fn toolchain() -> Toolchain {
        Toolchain {
            nvcc_version_text: "Cuda compilation tools, release 13.0, V13.0.88".into(),
            host_compiler: "g++ (test) 13".into(),
            nvcc_env_flags: String::new(),
            ..Toolchain::placeholder()
        }
    }

    fn builder<'m>(m: &'m Matrix, cache_dir: &Path) -> Builder<'m> {
        let archs = crate::arch::parse_list("8.0", "--arch").unwrap();
        let cache = Cache::open(cache_dir.to_path_buf()).unwrap();
        Builder::new(m, toolchain(), cache, archs, true)
    }

    fn keys(b: &Builder, m: &Matrix) -> Vec<String> {
        let all: Vec<&Instance> = m.instances.iter().collect();
        b.prepare(&all, None)
            .unwrap()
            .into_iter()
            .map(|p| p.key)
            .collect()
    }

    /// Stores a stand-in object for every instance, as a build that compiled them would.
    fn fill_cache(b: &Builder, m: &Matrix) {
        let all: Vec<&Instance> = m.instances.iter().collect();
        for p in b.prepare(&all, None).unwrap() {
            let dir = b.cache.compile_dir("t").unwrap();
            let built = dir.path().join("instance.so");
            let bytes = format!("object of {}", p.inst.uri).into_bytes();
            std::fs::write(&built, &bytes).unwrap();
            b.cache.insert(&p.key, &p.inst.uri, &built, &bytes).unwrap();
        }
    }

    /// The instances whose key `after` differs from `before`: what a build compiles again.
    fn rebuilt<'m>(m: &'m Matrix, before: &[String], after: &[String]) -> Vec<&'m str> {
        m.instances
            .iter()
            .zip(before.iter().zip(after))
            .filter(|(_, (b, a))| b != a)
            .map(|(i, _)| i.uri.as_str())
            .collect()
    }

    #[test]
    fn planning_gives_each_instance_its_own_stable_key_and_flags() {
        let toy = Toy::new();
        let m = toy.matrix();
        let cache = tempfile::tempdir().unwrap();
        let b = builder(&m, &cache.path().join("c"));
        let all: Vec<&Instance> = m.instances.iter().collect();
        let (buildable, none) = b.buildable(&all);
        assert_eq!((buildable.len(), none.len()), (48, 0));
        let prepared = b.prepare(&all, None).unwrap();
        let distinct: HashSet<&str> = prepared.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(distinct.len(), 48);
        for p in &prepared {
            assert_eq!(p.source, m.root.join("csrc/toy.cu"));
            assert_eq!(p.header, codegen::instance_header(&m, p.inst));
            assert_eq!(p.flags, b.flags);
            assert!(p.flags.iter().any(|f| f.contains("sm_80")), "{:?}", p.flags);
        }
        // Another builder of the same tree (a later run) derives the same keys.
        assert_eq!(
            keys(&builder(&m, &cache.path().join("c")), &m),
            keys(&b, &m)
        );
        // Another nvcc is another key for every instance.
        let mut other = builder(&m, &cache.path().join("c"));
        other.toolchain.nvcc_version_text.push_str(" (patched)");
        let changed = rebuilt(&m, &keys(&b, &m), &keys(&other, &m));
        assert_eq!(changed.len(), 48);
    }

    #[test]
    fn an_edit_rebuilds_exactly_the_instances_that_include_the_file() {
        let toy = Toy::new();
        let m = toy.matrix();
        let cache = tempfile::tempdir().unwrap();
        let before = keys(&builder(&m, &cache.path().join("c")), &m);

        // A file nothing includes: nothing is rebuilt.
        toy.write("include/toy/unused.cuh", "// not included\n");
        let after = keys(&builder(&m, &cache.path().join("c")), &m);
        assert!(rebuilt(&m, &before, &after).is_empty());

        // One variant's header: that variant's instances, and only those.
        let scaled = toy.path("include/toy/variants/scaled.cuh");
        let text = std::fs::read_to_string(&scaled).unwrap();
        std::fs::write(&scaled, format!("{text}// edited\n")).unwrap();
        let after = keys(&builder(&m, &cache.path().join("c")), &m);
        let changed = rebuilt(&m, &before, &after);
        assert_eq!(changed.len(), 24);
        assert!(changed.iter().all(|u| u.ends_with("_variant_scaled")));

        // The module's source: every instance.
        toy.write(
            "csrc/toy.cu",
            "// rewritten\n#include <flashgen_instance.cuh>\n",
        );
        let last = keys(&builder(&m, &cache.path().join("c")), &m);
        assert_eq!(rebuilt(&m, &after, &last).len(), 48);
    }

    #[test]
    fn a_warm_cache_builds_without_compiling_and_a_corrupt_object_is_a_miss() {
        let toy = Toy::new();
        let m = toy.matrix();
        let cache = tempfile::tempdir().unwrap();
        let b = builder(&m, &cache.path().join("c"));
        fill_cache(&b, &m);
        let ui = Ui::new(true);
        let out = toy.path("out");
        let opts = BuildOptions {
            out_dir: out.clone(),
            jobs: 1,
            keep_going: false,
            use_stamp: true,
        };
        let all: Vec<&Instance> = m.instances.iter().collect();
        let report = b.build(&all, &opts, &ui).unwrap();
        assert!(report.failures.is_empty() && report.not_started.is_empty());
        assert_eq!(report.built.len(), 48);
        assert!(report
            .built
            .iter()
            .all(|x| x.cached && x.compile_time.is_none()));
        let first = &m.instances[0];
        assert_eq!(
            std::fs::read(out.join(format!("{}.so", first.uri))).unwrap(),
            format!("object of {}", first.uri).into_bytes()
        );
        let manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap())
                .unwrap();
        assert!(manifest.to_string().contains(&first.uri));
        assert!(is_build_dir(&out));
        assert!(stamp::path(&out).is_file());

        // Unchanged: the stamp answers, and the same outputs are reported.
        let again = b.build(&all, &opts, &ui).unwrap();
        assert_eq!(again.built.len(), 48);

        // A corrupt object is not handed out: its instance is a miss again.
        let p = &b.prepare(&[first], None).unwrap()[0];
        let object = b.cache.lookup(&p.key, &first.uri).hit().unwrap().path;
        std::fs::remove_file(&object).unwrap();
        std::fs::write(&object, b"tampered").unwrap();
        assert!(matches!(
            b.cache.lookup(&p.key, &first.uri),
            Lookup::Corrupt(_)
        ));
        let rest: Vec<&Instance> = m.instances[1..].iter().collect();
        let report = b
            .ensure_cached(&rest, &toy.path("gen"), 1, false, &HandOut::Object, &ui)
            .unwrap();
        assert_eq!(report.ready.len(), 47, "the others are still hits");
    }
}
