//! `--manylinux 2_N`: nvcc's host compiler becomes `zig c++` targeting glibc 2.N, so every `.so`
//! needs nothing newer from glibc and the wheel can be tagged `manylinux_2_N`.
//!
//! Why: `libcudart_static.a`, linked by the system's g++, binds its pthread/dl/sem/shm calls to
//! the symbol versions of the glibc it is linked on (2.34 on current distributions), and pip then
//! refuses the wheel on older systems (Ubuntu 20.04, RHEL 8). zig ships the symbol lists of every
//! glibc release and links against stubs of the one asked for.
//!
//! The compiler is the pinned PyPI `ziglang==0.13.0` (clang 18; later releases fail with nvcc),
//! run through a small wrapper that flashgen writes into the cache, named by its content:
//! - `-target <arch>-linux-gnu.2.N`;
//! - `-nostdinc++` and the GNU libstdc++ headers of the system's g++ (as `-I`, so that their
//!   `#include_next <math.h>` reaches zig's libc headers, which zig passes as `-isystem`): the
//!   objects then use the same C++ library as a g++ build;
//! - on a link only (no `-c`/`-E`/`-S`/`-M`): `-Wl,--no-gc-sections` (zig's linker would
//!   otherwise drop the device-link cubins, which nothing references by symbol) and
//!   `-nostdlib++ -lstdc++`, which zig answers with its own static LLVM libc++/libc++abi/libunwind:
//!   that brings the C++ ABI runtime (`__gxx_personality_v0`, `__cxa_guard_*`,
//!   `_Unwind_Resume`), without which the `.so` links but fails to load. The `.so` then needs no
//!   libstdc++ at all. (g++'s own `libstdc++.a` is no substitute: it is built against the
//!   system's glibc and needs its newer symbols, `__libc_single_threaded` for one.)
//!
//! - on a link, an object flashgen compiles once per cache from [`DSO_FINI_SOURCE`]: it defines
//!   `__dso_handle` and calls `__cxa_finalize` when the `.so` is unloaded, as GCC's `crtbeginS.o`
//!   does for a g++ link. zig links no `crtbegin`: its linker (LLD) then makes `__dso_handle` the
//!   address of the ELF header, so glibc's `atexit` stub (which passes `__dso_handle`'s value,
//!   the header's first 8 bytes) registers cudart's exit handlers under a handle no
//!   `__cxa_finalize` ever names, and nothing finalizes them on `dlclose`; the process then
//!   crashed at exit, calling into the unmapped `.so`.
//!
//! zig 0.13's linker refuses `--build-id=none`; it writes no build ID unless asked, so the flag
//! is dropped from the link ([`crate::compile::output_flags`]) and the bytes stay reproducible.
//!
//! What keys the cache: the target glibc, `zig version`, zig's clang version line, the g++
//! version line (its libstdc++ headers), and the hash of the wrapper's template (its flags) and
//! of [`DSO_FINI_SOURCE`], never a path.
//!
//! A wheel built this way records its target in its manifest (`"manylinux": "2_17"`) and
//! requires [`ZIG_REQUIREMENT`], so the loader's JIT builds missing instances with the same
//! compiler and target, finding zig beside the installed flashgen package.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::error::UsageError;
use crate::fsutil;

/// The variable that selects a target when `--manylinux` is not given (the Python loader passes
/// its environment to `flashgen jit`, so a JIT builds like the wheel it came with).
pub const MANYLINUX_ENV: &str = "FLASHGEN_MANYLINUX";

/// The variable naming the zig to use instead of the search.
pub const ZIG_ENV: &str = "FLASHGEN_ZIG";

/// The zig release the wrapper is written for (`ziglang==0.13.0` on PyPI).
pub const ZIG_RELEASE: &str = "0.13.";

/// The requirement a wheel built for a glibc target declares (`Requires-Dist`), so that its JIT
/// finds the same compiler; `ci/requirements-cuda.txt` pins the same (a test checks it).
pub const ZIG_REQUIREMENT: &str = "ziglang==0.13.0";

/// Compiled once per cache and linked into every zig-built `.so`: what `crtbeginS.o` gives a g++
/// link (see the module doc). Priority 101 puts the call last among the `.so`'s destructors, where
/// crtbegin's is.
const DSO_FINI_SOURCE: &str = r#"// Linked into every .so that flashgen builds with zig (see src/manylinux.rs).
extern "C" {
__attribute__((visibility("hidden"))) void* __dso_handle = &__dso_handle;
void __cxa_finalize(void*) __attribute__((weak));
}
__attribute__((destructor(101))) static void flashgen_dso_fini() {
  if (__cxa_finalize) __cxa_finalize(__dso_handle);
}
"#;

/// A target glibc, `2.N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Glibc {
    pub major: u32,
    pub minor: u32,
}

impl Glibc {
    /// `2_17`, `2.17` or `manylinux_2_17`.
    pub fn parse(text: &str, from: &str) -> Result<Glibc> {
        let t = text.trim().trim_start_matches("manylinux_");
        let parsed = t.split_once(['_', '.']).and_then(|(a, b)| {
            Some(Glibc {
                major: a.parse().ok()?,
                minor: b.parse().ok()?,
            })
        });
        match parsed {
            // zig 0.13 knows glibc 2.17 and newer; 2.17 is also manylinux2014's baseline.
            Some(g) if g.major == 2 && g.minor >= 17 => Ok(g),
            _ => Err(UsageError::new(format!(
                "{from} {text:?}: not a glibc target flashgen can build for"
            ))
            .with_hint(
                "give a manylinux glibc version of 2.17 or newer, e.g. --manylinux 2_17, or `off` for the system's g++",
            )
            .into()),
        }
    }

    /// `--manylinux`, else [`MANYLINUX_ENV`] when set and not empty; None (also for `off`)
    /// builds with g++.
    pub fn resolve(cli: Option<&str>) -> Result<Option<Glibc>> {
        let (text, from) = match (cli, std::env::var(MANYLINUX_ENV)) {
            (Some(t), _) => (t.to_string(), "--manylinux"),
            (None, Ok(t)) if !t.trim().is_empty() => (t, MANYLINUX_ENV),
            _ => return Ok(None),
        };
        if text.trim() == "off" {
            return Ok(None);
        }
        Glibc::parse(&text, from).map(Some)
    }

    /// `2_17`, as `--manylinux` and the manifest spell it.
    pub fn spelling(&self) -> String {
        format!("{}_{}", self.major, self.minor)
    }

    /// `manylinux_2_17`, the wheel tag's prefix.
    pub fn tag(&self) -> String {
        format!("manylinux_{}_{}", self.major, self.minor)
    }

    /// zig's target triple, e.g. `x86_64-linux-gnu.2.17`.
    pub fn zig_target(&self) -> String {
        format!(
            "{}-linux-gnu.{}.{}",
            std::env::consts::ARCH,
            self.major,
            self.minor
        )
    }
}

/// The wrapper, before the paths are filled in. Its hash is part of the cache key, so changing a
/// flag here rebuilds every zig-built instance.
const WRAPPER_TEMPLATE: &str = r#"#!/bin/sh
# nvcc's host compiler for @TAG@, written by flashgen (see DEVELOPERS.md, "manylinux").
# zig c++ links against glibc @GLIBC@'s symbol versions; GNU libstdc++'s headers replace zig's
# libc++ so the objects match a g++ build. A link (no -c, -E, -S, -M) keeps every section (zig's
# linker would drop nvcc's device-link cubins) and takes the C++ ABI runtime from zig's static
# libc++abi/libunwind (zig's answer to -lstdc++), so the .so loads and needs no libstdc++; and
# links the object that finalizes the .so's exit handlers on dlclose (crtbeginS.o's part) and
# the shared CUDA runtime, by path (zig takes no -l:libcudart.so.N).
link=1
for a in "$@"; do
  case "$a" in -c|-E|-S|-M|-MM) link=0 ;; esac
done
if [ "$link" = 1 ]; then
  exec @ZIG@ c++ -target @TARGET@ -nostdinc++ @INCLUDES@ "$@" @FINI@ @CUDART@ -Wl,--no-gc-sections -nostdlib++ -lstdc++
fi
exec @ZIG@ c++ -target @TARGET@ -nostdinc++ @INCLUDES@ "$@"
"#;

/// The host compiler nvcc gets for a glibc target.
#[derive(Debug, Clone)]
pub struct ZigHost {
    /// The wrapper in the cache (passed as `-ccbin`).
    pub wrapper: PathBuf,
    /// What keys the cache (see the module doc); also what `doctor` and manifests show.
    pub identity: String,
    /// The zig binary and how it was found.
    pub zig: PathBuf,
    pub found_by: String,
}

/// What the probes found, memoized in the cache by the programs' path, size and mtime.
#[derive(Serialize, Deserialize)]
struct Probe {
    zig_version: String,
    clang_version: String,
    gxx_version: String,
    includes: Vec<PathBuf>,
}

impl ZigHost {
    /// Finds zig and g++'s libstdc++ headers, and writes the wrapper into `cache_dir/toolchain/` (a
    /// temp folder when there is no usable cache). `nvcc` is the nvcc in use: the PyPI zig is
    /// looked for in the same Python environment as the PyPI nvcc. `runtime`: the shared CUDA
    /// runtime file (`libcudart.so.13`) the wrapper links, by path, on a link, or why there is
    /// none (reported once zig is found).
    pub fn prepare(
        target: Glibc,
        nvcc: &Path,
        gxx: &Path,
        runtime: Result<PathBuf, UsageError>,
        cache_dir: Option<&Path>,
    ) -> Result<Self> {
        let (zig, found_by) = find_zig(nvcc)?;
        let runtime = runtime?;
        let probe = probe(&zig, gxx, cache_dir)?;
        if !probe.zig_version.starts_with(ZIG_RELEASE) {
            return Err(UsageError::new(format!(
                "--manylinux: {} is zig {}; flashgen's wrapper is written for zig {ZIG_RELEASE}x (clang 18)",
                zig.display(),
                probe.zig_version
            ))
            .with_hint(format!(
                "pip install ziglang==0.13.0 (later releases fail with nvcc), or point {ZIG_ENV} at a zig 0.13"
            ))
            .into());
        }
        // The wrapper and its object are executed and linked, so they live only in the
        // private, verified cache.
        let dir = cache_dir
            .ok_or_else(|| {
                anyhow::anyhow!("--manylinux needs a usable cache to hold its compiler wrapper")
            })?
            .join("toolchain");
        let (fini, fini_sha) = dso_fini_object(&zig, &probe, target, &dir)?;
        let quote = |p: &Path| crate::ui::shell_quote(&p.display().to_string());
        let includes: Vec<String> = probe
            .includes
            .iter()
            .map(|d| format!("-I{}", quote(d)))
            .collect();
        let text = WRAPPER_TEMPLATE
            .replace("@TAG@", &target.tag())
            .replace("@GLIBC@", &format!("{}.{}", target.major, target.minor))
            .replace("@TARGET@", &target.zig_target())
            .replace("@ZIG@", &quote(&zig))
            .replace("@INCLUDES@", &includes.join(" "))
            .replace("@FINI@", &quote(&fini))
            .replace("@CUDART@", &quote(&runtime));
        let wrapper = dir.join(format!(
            "zig-cxx-{}",
            &fsutil::sha256_bytes(text.as_bytes())[..16]
        ));
        write_executable(&wrapper, text.as_bytes())?;
        let identity = format!(
            "zig {} c++ -target {} ({}); libstdc++ of {}; wrapper {}; dso-fini {}",
            probe.zig_version,
            target.zig_target(),
            probe.clang_version,
            probe.gxx_version,
            &fsutil::sha256_bytes(format!("{WRAPPER_TEMPLATE}{DSO_FINI_SOURCE}").as_bytes())[..16],
            &fini_sha[..16],
        );
        Ok(ZigHost {
            wrapper,
            identity,
            zig,
            found_by,
        })
    }
}

/// The record beside a dso-fini object (`<name>.json`): its sha256 when built, and the file's id
/// when its bytes last hashed to it (as a cache object's record, `cache.rs`).
#[derive(Serialize, Deserialize)]
struct FiniRecord {
    sha256: String,
    verified: Option<fsutil::FileId>,
}

/// `dir/zig-dso-fini-<hash>.o`, compiled from [`DSO_FINI_SOURCE`] by this zig for `target`
/// (named by the source, the compiler and the target; written by rename), and its sha256. It is
/// linked into every zig-built `.so`, so it is checked like a cache object: used only when it is
/// a regular file we own that no one else can write and its bytes hash to the sha256 recorded
/// when it was built (not re-hashed while its id is the one recorded then); anything else is
/// compiled again. The caller puts the sha256 into the cache key.
fn dso_fini_object(
    zig: &Path,
    probe: &Probe,
    target: Glibc,
    dir: &Path,
) -> Result<(PathBuf, String)> {
    // `-g0`: zig's driver emits debug info by default, whose compilation folder would make the
    // object, and so the key that holds its sha256, differ from one cache to another.
    let flags = ["-c", "-O2", "-fPIC", "-g0"];
    let name = format!(
        "zig-dso-fini-{}",
        &fsutil::sha256_bytes(
            format!(
                "{DSO_FINI_SOURCE}\n{}\n{}\n{}\n{}",
                probe.zig_version,
                probe.clang_version,
                target.zig_target(),
                flags.join(" ")
            )
            .as_bytes()
        )[..16]
    );
    let object = dir.join(format!("{name}.o"));
    let record = dir.join(format!("{name}.json"));
    if let Some(sha) = verified_fini(&object, &record) {
        return Ok((object, sha));
    }
    let source = format!("{name}.cpp");
    fsutil::write_if_changed(&dir.join(&source), DSO_FINI_SOURCE.as_bytes())?;
    // Relative names, run in `dir`: no path of this machine goes into the object.
    let tmp = format!("{name}.{}.tmp.o", std::process::id());
    run(Command::new(zig)
        .current_dir(dir)
        .args(["c++", "-target", &target.zig_target()])
        .args(flags)
        .args([source.as_str(), "-o", tmp.as_str()]))?;
    let bytes = std::fs::read(dir.join(&tmp))
        .with_context(|| format!("cannot read {}", dir.join(&tmp).display()))?;
    let sha = fsutil::sha256_bytes(&bytes);
    // Whatever the umask: a file others could write would fail the check above on every run.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(&tmp), std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("cannot chmod {}", dir.join(&tmp).display()))?;
    }
    std::fs::rename(dir.join(&tmp), &object)
        .with_context(|| format!("cannot write {}", object.display()))?;
    let verified = std::fs::symlink_metadata(&object)
        .ok()
        .map(|m| fsutil::FileId::of(&m))
        .filter(|id| id.size == bytes.len() as u64);
    let rec = FiniRecord {
        sha256: sha.clone(),
        verified,
    };
    fsutil::write_atomic(&record, serde_json::to_string(&rec)?.as_bytes())?;
    Ok((object, sha))
}

/// The sha256 of the dso-fini `object` when it is ours and matches its `record` (see
/// [`dso_fini_object`]); a successful re-hash records the object's new id.
fn verified_fini(object: &Path, record: &Path) -> Option<String> {
    use std::io::Read;
    let (mut f, _) = crate::cache::open_private(record).ok()??;
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    let mut rec: FiniRecord = serde_json::from_str(&text).ok()?;
    let (mut f, meta) = crate::cache::open_private(object).ok()??;
    let id = fsutil::FileId::of(&meta);
    if rec.verified == Some(id) {
        return Some(rec.sha256);
    }
    if fsutil::sha256_reader(&mut f).ok()? != rec.sha256 {
        return None;
    }
    rec.verified = Some(id);
    if let Ok(text) = serde_json::to_string(&rec) {
        let _ = fsutil::write_atomic(record, text.as_bytes());
    }
    Some(rec.sha256)
}

/// Writes the wrapper unless the same bytes are there, mode 0755. The name is the content's
/// hash, but the bytes are compared anyway: the cache is private, yet a wrapper is executed.
fn write_executable(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let ok = std::fs::read(path).is_ok_and(|old| old == bytes)
        && std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o777 == 0o755);
    if !ok {
        fsutil::write_atomic(path, bytes)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot make {} executable", path.display()))?;
    }
    Ok(())
}

/// `FLASHGEN_ZIG`, else `ziglang/zig` in the site-packages that holds the PyPI nvcc (ci/setup.sh
/// installs both into `.venv`), else in the active Python environment, else `zig` on PATH.
fn find_zig(nvcc: &Path) -> Result<(PathBuf, String)> {
    if let Some(p) = std::env::var_os(ZIG_ENV) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok((p, ZIG_ENV.into()))
        } else {
            Err(UsageError::new(format!("{ZIG_ENV}={} is not a file", p.display())).into())
        };
    }
    // An installed wheel: <site>/flashgen/_bin/flashgen, and the wheel's ziglang requirement
    // installed beside it (also with pip install --target).
    if let Some(site) = std::env::current_exe()
        .ok()
        .filter(|exe| exe.parent().is_some_and(|b| b.ends_with("flashgen/_bin")))
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
    {
        let p = site.join("ziglang/zig");
        if p.is_file() {
            return Ok((
                p,
                format!(
                    "python package ziglang beside flashgen in {}",
                    site.display()
                ),
            ));
        }
    }
    let nvcc = std::fs::canonicalize(nvcc).unwrap_or_else(|_| nvcc.to_path_buf());
    // <site>/nvidia/cu13/bin/nvcc: the site-packages folder is four levels up.
    if let Some(site) = nvcc.ancestors().nth(4) {
        let p = site.join("ziglang/zig");
        if p.is_file() {
            return Ok((
                p,
                format!("python package ziglang beside nvcc in {}", site.display()),
            ));
        }
    }
    for site in crate::python_env::python_site_packages() {
        let p = site.join("ziglang/zig");
        if p.is_file() {
            return Ok((p, format!("python package ziglang in {}", site.display())));
        }
    }
    if let Ok(p) = which::which("zig") {
        return Ok((p, "PATH".into()));
    }
    Err(UsageError::new(format!(
        "--manylinux (or {MANYLINUX_ENV}, or the installed wheel's manifest) builds with zig 0.13 as nvcc's host compiler, and none was found (looked at {ZIG_ENV}, the ziglang package beside the flashgen package, beside nvcc and in the Python environment, then PATH)",
    ))
    .with_hint(format!(
        "pip install {ZIG_REQUIREMENT} (a wheel built for manylinux requires it; ci/setup.sh installs it into .venv), or point {ZIG_ENV} at a zig 0.13; {MANYLINUX_ENV}=off builds with the system's g++ instead, whose bytes differ from a zig-built wheel's"
    ))
    .into())
}

fn probe(zig: &Path, gxx: &Path, cache_dir: Option<&Path>) -> Result<Probe> {
    fsutil::memoized(cache_dir, "zig-probe 3\n", &[zig, gxx], || {
        let zig_version = output(Command::new(zig).arg("version"))?.trim().to_string();
        let clang_version = first_line(&output(Command::new(zig).args(["c++", "--version"]))?);
        let gxx_version = first_line(&output(Command::new(gxx).arg("--version"))?);
        // g++'s own search list; its libstdc++ folders are those with `c++` in the path.
        let search = output_all(Command::new(gxx).args(["-xc++", "-E", "-v", "/dev/null"]))?;
        let includes: Vec<PathBuf> = search
            .lines()
            .skip_while(|l| !l.starts_with("#include <...>"))
            .skip(1)
            .take_while(|l| !l.starts_with("End of search list"))
            .map(|l| PathBuf::from(l.trim()))
            .filter(|p| p.components().any(|c| c.as_os_str() == "c++"))
            .collect();
        if includes.is_empty() {
            return Err(UsageError::new(format!(
                "--manylinux: {} lists no GNU libstdc++ headers in its search path",
                gxx.display()
            ))
            .with_hint(
                "install g++ (apt-get install g++), or set NVCC_CCBIN to a g++ that has them",
            )
            .into());
        }
        Ok(Probe {
            zig_version,
            clang_version,
            gxx_version,
            includes,
        })
    })
}
fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

fn output(cmd: &mut Command) -> Result<String> {
    run(cmd).map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// stdout and stderr (g++ -v writes its search list on stderr).
fn output_all(cmd: &mut Command) -> Result<String> {
    run(cmd).map(|o| {
        String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout)
    })
}

fn run(cmd: &mut Command) -> Result<std::process::Output> {
    let mut argv = vec![cmd.get_program().to_string_lossy().into_owned()];
    argv.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    crate::ui::trace(&argv);
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", argv.join(" ")))?;
    if !out.status.success() {
        anyhow::bail!(
            "`{}` failed ({}):\n{}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wheels_zig_requirement_is_the_pin_ci_installs() {
        let pins = include_str!("../ci/requirements-cuda.txt");
        assert!(
            pins.lines().any(|l| l.trim() == ZIG_REQUIREMENT),
            "ci/requirements-cuda.txt does not pin {ZIG_REQUIREMENT}"
        );
    }

    #[test]
    fn off_means_the_system_gxx() {
        assert_eq!(Glibc::resolve(Some("off")).unwrap(), None);
        assert_eq!(
            Glibc::resolve(Some("2_17")).unwrap().unwrap().spelling(),
            "2_17"
        );
    }

    #[test]
    fn glibc_targets_parse_in_every_spelling() {
        for t in ["2_17", "2.17", "manylinux_2_17", " 2_17 "] {
            assert_eq!(
                Glibc::parse(t, "--manylinux").unwrap(),
                Glibc {
                    major: 2,
                    minor: 17
                }
            );
        }
        assert_eq!(Glibc::parse("2_28", "x").unwrap().tag(), "manylinux_2_28");
        for bad in ["2_5", "3_1", "217", "", "2_x", "manylinux2014"] {
            assert!(Glibc::parse(bad, "--manylinux").is_err(), "{bad}");
        }
    }
}
