//! The build: generate each selected instance's header, key it, take it from the cache or
//! compile it with nvcc (in parallel, through rayon), and place the `.so` files in the output
//! folder with a manifest. `build`, `build-wheel` and the runtime JIT all come through here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde_json::{json, Value as Json};

use crate::arch::Arch;
use crate::cache::{Cache, Entry};
use crate::codegen;
use crate::compile::{self, NvccCommand};
use crate::fingerprint::{self, SourceHasher};
use crate::fsutil;
use crate::instance::Instance;
use crate::matrix::{HeaderPath, Matrix};
use crate::stamp;
use crate::toolchain::Toolchain;
use crate::ui::Ui;

/// A rough peak memory of one nvcc job on these kernels, for the default job count.
const BYTES_PER_JOB: u64 = 2 << 30;

pub struct BuildOptions {
    pub out_dir: PathBuf,
    pub archs: Vec<Arch>,
    pub jobs: usize,
    pub keep_going: bool,
    pub compress: bool,
}

/// Jobs: `--jobs`, else `MAX_JOBS`, else min(cores, available memory / per-job estimate).
pub fn default_jobs(cli: Option<usize>) -> usize {
    if let Some(j) = cli {
        return j.max(1);
    }
    if let Some(j) = std::env::var("MAX_JOBS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return j.max(1);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    let by_memory = (sys.available_memory() / BYTES_PER_JOB).max(1) as usize;
    cores.min(by_memory)
}

/// Everything one instance needs before it is compiled or found in the cache.
pub struct Prepared<'m> {
    pub inst: &'m Instance,
    pub header: String,
    pub include_dirs: Vec<PathBuf>,
    pub source: PathBuf,
    pub key: String,
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
}

pub struct Failure {
    pub uri: String,
    pub command: String,
    pub status: String,
    pub stderr: String,
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
    hasher: SourceHasher,
}

impl<'m> Builder<'m> {
    pub fn new(
        matrix: &'m Matrix,
        toolchain: Toolchain,
        cache: Cache,
        archs: Vec<Arch>,
        compress: bool,
    ) -> Self {
        let flags = compile::output_flags(&matrix.nvcc_flags, &archs, compress);
        let search_dirs = search_dirs(matrix);
        let hasher = SourceHasher::new(&matrix.root, search_dirs.clone());
        Builder {
            matrix,
            toolchain,
            cache,
            flags,
            archs,
            search_dirs,
            hasher,
        }
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
        selected
            .par_iter()
            .map(|inst| {
                let header = codegen::instance_header(self.matrix, inst);
                let dir = gen_dir.unwrap_or(Path::new("<generated>")).join(&inst.uri);
                if gen_dir.is_some() {
                    fsutil::write_if_changed(&dir.join(codegen::HEADER_NAME), header.as_bytes())?;
                }
                let source = self
                    .matrix
                    .root
                    .join("csrc")
                    .join(&self.matrix.module(inst).source);
                let inputs = self.hasher.inputs(&source, &header)?;
                let key = fingerprint::cache_key(&tc_texts, &self.flags, &header, &inputs);
                let mut include_dirs = vec![dir];
                include_dirs.extend(self.search_dirs.iter().cloned());
                Ok(Prepared {
                    inst,
                    header,
                    include_dirs,
                    source,
                    key,
                })
            })
            .collect()
    }

    /// Every source and header file the build hashed, with the sha256 it compiled against.
    pub fn hashed_inputs(&self) -> Vec<(PathBuf, String)> {
        self.hasher.hashed()
    }

    pub fn command(&self, p: &Prepared, output: &Path) -> NvccCommand {
        NvccCommand::new(
            &self.toolchain,
            &self.flags,
            &p.include_dirs,
            &p.source,
            output,
        )
    }

    pub fn build(
        &self,
        selected: &[&'m Instance],
        opts: &BuildOptions,
        ui: &Ui,
    ) -> Result<BuildReport<'m>> {
        let start = Instant::now();
        // Absolute, so that every printed nvcc command works from any folder.
        let out_dir = std::path::absolute(&opts.out_dir)?;
        let stamp = stamp::compute(self.matrix, selected, &self.flags, &self.toolchain_texts());
        if let Some(report) = self.up_to_date(&out_dir, &stamp, selected, opts, start) {
            return Ok(report);
        }
        std::fs::create_dir_all(&out_dir)
            .with_context(|| format!("cannot create the output folder {}", out_dir.display()))?;
        // From here on the outputs may change: no stamp may vouch for them until the end.
        match std::fs::remove_file(stamp::path(&out_dir)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let prepared = self.prepare(selected, Some(&out_dir.join("generated")))?;
        let lookups: Vec<Option<Entry>> = prepared
            .par_iter()
            .map(|p| self.cache.lookup(&p.key))
            .collect();
        let misses: Vec<&Prepared> = prepared
            .iter()
            .zip(&lookups)
            .filter(|(_, hit)| hit.is_none())
            .map(|(p, _)| p)
            .collect();

        let results: Mutex<Vec<(String, Entry, Duration)>> = Mutex::default();
        let failures: Mutex<Vec<Failure>> = Mutex::default();
        let not_started: Mutex<Vec<String>> = Mutex::default();
        if !misses.is_empty() {
            self.cache.sweep_stale_temps();
            ui.status(format!(
                "compiling {} of {} instances with {} jobs ({} cached)",
                misses.len(),
                prepared.len(),
                opts.jobs,
                prepared.len() - misses.len()
            ));
            let stop = AtomicBool::new(false);
            let progress = ui.progress(misses.len());
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(opts.jobs)
                .build()?;
            pool.install(|| {
                misses.par_iter().with_max_len(1).for_each(|p| {
                    if stop.load(Ordering::SeqCst) {
                        not_started.lock().unwrap().push(p.inst.uri.clone());
                        return;
                    }
                    progress.start(&p.inst.uri);
                    match self.compile_one(p) {
                        Ok((entry, took)) => {
                            progress.finish(&p.inst.uri, &format!("{:.1}s", took.as_secs_f64()));
                            results.lock().unwrap().push((p.key.clone(), entry, took));
                        }
                        Err(f) => {
                            progress.finish(&p.inst.uri, "FAILED");
                            if !opts.keep_going {
                                stop.store(true, Ordering::SeqCst);
                            }
                            failures.lock().unwrap().push(f);
                        }
                    }
                });
            });
            progress.done();
        }
        let mut results: HashMap<String, (Entry, Duration)> = results
            .into_inner()
            .unwrap()
            .into_iter()
            .map(|(k, e, t)| (k, (e, t)))
            .collect();

        // Place every finished instance in --out, in matrix order.
        let mut built = Vec::new();
        for (p, hit) in prepared.iter().zip(lookups) {
            let (entry, cached, compile_time) = match hit {
                Some(e) => (e, true, None),
                None => match results.remove(&p.key) {
                    Some((e, t)) => (e, false, Some(t)),
                    None => continue,
                },
            };
            built.push(Built {
                inst: p.inst,
                key: p.key.clone(),
                entry,
                path: out_dir.join(format!("{}.so", p.inst.uri)),
                cached,
                compile_time,
            });
        }
        built
            .par_iter()
            .try_for_each(|b| place_if_needed(&b.entry.path, &b.path))?;
        self.write_manifest(&out_dir, &built)?;

        let mut failures = failures.into_inner().unwrap();
        failures.sort_by(|a, b| a.uri.cmp(&b.uri));
        let mut not_started = not_started.into_inner().unwrap();
        not_started.sort();
        if failures.is_empty() && not_started.is_empty() {
            fsutil::write_atomic(&stamp::path(&out_dir), stamp.as_bytes())?;
        }
        Ok(BuildReport {
            built,
            failures,
            not_started,
            wall: start.elapsed(),
            jobs: opts.jobs,
        })
    }

    fn toolchain_texts(&self) -> [&str; 2] {
        [
            self.toolchain.nvcc_version_text.as_str(),
            self.toolchain.host_compiler.as_str(),
        ]
    }

    /// The fast path: when the stamp matches and every output is in place, the report comes
    /// from the manifest the last build wrote, and nothing is generated, hashed or looked up.
    fn up_to_date(
        &self,
        out_dir: &Path,
        stamp: &str,
        selected: &[&'m Instance],
        opts: &BuildOptions,
        start: Instant,
    ) -> Option<BuildReport<'m>> {
        if !stamp::matches(out_dir, stamp) {
            return None;
        }
        let text = std::fs::read_to_string(out_dir.join("manifest.json")).ok()?;
        let manifest: Json = serde_json::from_str(&text).ok()?;
        let rows = manifest["instances"].as_array()?;
        if rows.len() != selected.len() {
            return None;
        }
        let built: Option<Vec<Built>> = selected
            .par_iter()
            .zip(rows)
            .map(|(inst, row)| {
                let path = out_dir.join(row["path"].as_str()?);
                let size = std::fs::metadata(&path).ok()?.len();
                (row["uri"] == inst.uri.as_str()).then_some(())?;
                Some(Built {
                    inst,
                    key: row["fingerprint"].as_str()?.to_string(),
                    entry: Entry {
                        uri: inst.uri.clone(),
                        sha256: row["sha256"].as_str()?.to_string(),
                        size,
                        path: path.clone(),
                    },
                    path,
                    cached: true,
                    compile_time: None,
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

    fn compile_one(&self, p: &Prepared) -> Result<(Entry, Duration), Failure> {
        let fail = |command: String, status: String, stderr: String| Failure {
            uri: p.inst.uri.clone(),
            command,
            status,
            stderr,
        };
        let tmp = self
            .cache
            .temp_output(&p.inst.uri)
            .map_err(|e| fail(String::new(), e.to_string(), String::new()))?;
        let cmd = self.command(p, &tmp);
        let took = cmd
            .run()
            .map_err(|(status, stderr)| fail(cmd.shell_line(), status, stderr))?;
        let entry = self.cache.insert(&p.key, &p.inst.uri, tmp).map_err(|e| {
            fail(
                cmd.shell_line(),
                format!("cannot store the result: {e:#}"),
                String::new(),
            )
        })?;
        Ok((entry, took))
    }

    /// One entry per built instance; rewritten only when it changes.
    fn write_manifest(&self, out_dir: &Path, built: &[Built]) -> Result<()> {
        let manifest = json!({
            "flashgen_version": env!("CARGO_PKG_VERSION"),
            "toolchain": {
                "nvcc": self.toolchain.nvcc,
                "nvcc_version": self.toolchain.nvcc_version,
                "host_compiler": self.toolchain.host_compiler,
            },
            "archs": self.archs.iter().flat_map(Arch::targets).collect::<Vec<_>>(),
            "instances": built.iter().map(|b| self.instance_json(b, false)).collect::<Vec<_>>(),
        });
        fsutil::write_if_changed(
            &out_dir.join("manifest.json"),
            serde_json::to_string_pretty(&manifest)?.as_bytes(),
        )?;
        Ok(())
    }

    /// An instance as the manifest (relative path) or the `--json` summary (absolute) shows it.
    pub fn instance_json(&self, b: &Built, absolute: bool) -> Json {
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
        let mut row = self.matrix.instance_json(b.inst);
        row.insert("fingerprint".into(), json!(b.key));
        row.insert("path".into(), json!(path));
        row.insert("sha256".into(), json!(b.entry.sha256));
        Json::Object(row)
    }
}

/// `-I` folders after the generated header's: `include/`, then user variants' folders.
fn search_dirs(matrix: &Matrix) -> Vec<PathBuf> {
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

/// Links (or copies) a cache object into `--out`, unless that exact file is already there.
fn place_if_needed(src: &Path, dst: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(a), Ok(b)) = (std::fs::metadata(src), std::fs::metadata(dst)) {
        if a.ino() == b.ino() && a.dev() == b.dev() {
            return Ok(());
        }
    }
    fsutil::place_file(src, dst)
}
