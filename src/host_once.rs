//! Host code once per instance (issue 24; benches/NOTES-build.md, "Host code once per instance").
//!
//! `build-wheel --release` builds every instance once per architecture of `release.archs`, one
//! [`Builder`](crate::build::Builder) per architecture, and each one-step `nvcc -shared` compiles
//! the instance's host code again (host preprocessing, cudafe++, the host compile: 1.7 to 2.5
//! CPU-s of every compile). That host code does not depend on the architecture: the only
//! per-architecture part of nvcc's object is the fatbin in its `.nv_fatbin` section. So within one
//! release run, an instance's first compiled architecture takes two steps (`nvcc -c`, then the
//! link: the bytes of the one-step build, `compile.rs`) and keeps its object here; each later
//! architecture compiles only its device code (`nvcc -fatbin`), puts it into a copy of that object
//! (`objcopy --update-section .nv_fatbin=...`) and runs the same link. The `.so` is byte-identical
//! to the one-step build's (`tests/host_once.rs`), so it keeps its cache key and the cache, `flashgen
//! build` and the JIT see no difference.
//!
//! The kept objects are intermediates of one run: they live in a private folder of the cache's
//! `tmp/` (`nvcc-host.*`, swept like the compile folders when a killed run leaves it) that
//! [`HostObjects`] creates on first use and removes when dropped, at the end of the release. An
//! object is kept only after its `.so` was checked and stored, and found again only under the
//! same instance and the same host key (toolchain, every flag but the architecture's, generated
//! header, and every source's sha256, as hashed by the later architecture's build): a source
//! edited between two architectures is compiled afresh.
//!
//! Off (each architecture compiles in one step, as `flashgen build` does) where `objcopy` is not
//! found beside the host compiler or on PATH, for `--manylinux`'s zig host compiler (whose
//! objects were never measured), and with a compile launcher (sccache caches only `nvcc -c`: a
//! warm cache would answer every architecture's compile, which the `-fatbin` step it cannot cache
//! would undo; a distributing launcher would see the device work run here). A swap that fails for
//! any reason falls back to the one-step build of that instance; `-v` says why.
//!
//! The identity is nvcc's to keep (a host object that read `__CUDA_ARCH_LIST__`, or another nvcc,
//! would break it), so it is checked in every run: the run's first swap is also built in one step
//! and compared ([`Swap::Check`]); until then no other swap runs, and where the bytes differ the
//! one-step ones are stored and host-once is off for the rest of the run, with a warning.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};

use crate::arch::Arch;
use crate::cache::Cache;
use crate::compile::Launcher;
use crate::toolchain::Toolchain;

/// One release run's host objects, by instance URI: each with the host key it was compiled
/// under. Shared by the run's builders (one per architecture); removed when dropped.
#[derive(Default)]
pub struct HostObjects {
    /// `<cache>/tmp/nvcc-host.*/`, made on the first object kept.
    dir: Mutex<Option<tempfile::TempDir>>,
    kept: Mutex<HashMap<String, (String, PathBuf)>>,
    /// Why host-once is off was said once (with `-v`) for this run.
    said_off: AtomicBool,
    /// The run's check of its first swap against the one-step build: [`UNCHECKED`],
    /// [`CHECKING`], [`SAME`] or [`DIFFERENT`].
    check: AtomicU8,
}

const UNCHECKED: u8 = 0;
const CHECKING: u8 = 1;
const SAME: u8 = 2;
const DIFFERENT: u8 = 3;

/// Whether an instance whose host object was kept may be built by a swap now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swap {
    /// The run's check found the swapped bytes equal to the one-step build's.
    Trusted,
    /// This swap is the run's check: build it in one step too, compare, and say
    /// ([`HostObjects::checked`]).
    Check,
    /// Another compile is making the check, or it found other bytes: build without the swap.
    No,
}

impl HostObjects {
    /// Whether a swap may run now (the first one of the run is the check; see [`Swap`]).
    pub fn swap(&self) -> Swap {
        match self
            .check
            .compare_exchange(UNCHECKED, CHECKING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Swap::Check,
            Err(SAME) => Swap::Trusted,
            Err(_) => Swap::No,
        }
    }

    /// The check's answer for `uri`: with other bytes, host-once is off for the rest of the run
    /// (and says so: the one-step bytes are what the cache keys).
    pub fn checked(&self, same: bool, uri: &str) {
        self.check
            .store(if same { SAME } else { DIFFERENT }, Ordering::Release);
        if !same {
            crate::ui::warning(format!(
                "{uri}: its device code swapped into the host object of another architecture does not give the one-step build's bytes with this toolchain; host code once per instance is off for the rest of this release (each architecture compiles in one step)"
            ));
        }
    }

    /// The check did not run to its end (its swap failed): the next swap makes it.
    pub fn unchecked(&self) {
        let _ =
            self.check
                .compare_exchange(CHECKING, UNCHECKED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The object kept for `uri` under `host_key`, if any (none once the check found other
    /// bytes).
    pub fn find(&self, uri: &str, host_key: &str) -> Option<PathBuf> {
        if self.check.load(Ordering::Acquire) == DIFFERENT {
            return None;
        }
        let kept = self.kept.lock().unwrap();
        match kept.get(uri) {
            Some((key, path)) if key == host_key => Some(path.clone()),
            _ => None,
        }
    }

    /// Moves `object` (an instance's `nvcc -c` output, whose `.so` was just checked and stored)
    /// into the run's folder as `uri`'s host object under `host_key`.
    pub fn keep(&self, cache: &Cache, uri: &str, host_key: &str, object: &Path) -> Result<()> {
        let mut dir = self.dir.lock().unwrap();
        if dir.is_none() {
            *dir = Some(cache.compile_dir("host")?);
        }
        let path = dir.as_ref().unwrap().path().join(format!("{uri}.o"));
        std::fs::rename(object, &path)
            .with_context(|| format!("cannot move {} to {}", object.display(), path.display()))?;
        self.kept
            .lock()
            .unwrap()
            .insert(uri.to_string(), (host_key.to_string(), path));
        Ok(())
    }

    /// Removes `uri`'s object: no later architecture of the run needs it.
    pub fn forget(&self, uri: &str) {
        if let Some((_, path)) = self.kept.lock().unwrap().remove(uri) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A builder's part in a release run's host-once: the shared objects, the architectures the
/// run builds after this builder's, and the objcopy that swaps the fatbin.
pub struct HostOnce {
    pub objects: std::sync::Arc<HostObjects>,
    pub later: Vec<Arch>,
    pub objcopy: PathBuf,
}

impl HostOnce {
    /// Host-once for a builder with `toolchain` and `launcher`, or why it is off.
    pub fn new(
        objects: std::sync::Arc<HostObjects>,
        later: Vec<Arch>,
        toolchain: &Toolchain,
        launcher: &Launcher,
    ) -> Result<HostOnce, String> {
        if !launcher.is_none() {
            return Err(format!(
                "a compile launcher ({} {}) caches or places `nvcc -c` steps, not the device-only ones",
                launcher.from,
                launcher.shell_line()
            ));
        }
        if toolchain.manylinux.is_some() {
            return Err("the host compiler is --manylinux's zig".into());
        }
        let objcopy = find_objcopy(&toolchain.host_compiler_path).ok_or_else(|| {
            format!(
                "no objcopy beside the host compiler {} or on PATH",
                toolchain.host_compiler_path.display()
            )
        })?;
        Ok(HostOnce {
            objects,
            later,
            objcopy,
        })
    }

    /// Says (with `-v`, once per run) why host-once is off.
    pub fn say_off(objects: &HostObjects, why: &str) {
        if !objects.said_off.swap(true, Ordering::Relaxed) {
            crate::ui::detail(format!(
                "host code once per instance is off ({why}): each architecture compiles in one step"
            ));
        }
    }
}

/// `objcopy` for `host_compiler`: beside it (`x86_64-linux-gnu-objcopy` beside
/// `x86_64-linux-gnu-g++`, else `objcopy`), else on PATH. `NVCC_CCBIN` may name a folder, or a
/// bare name found on PATH.
pub fn find_objcopy(host_compiler: &Path) -> Option<PathBuf> {
    let host = if host_compiler.components().count() == 1 {
        which::which(host_compiler).ok()
    } else {
        Some(host_compiler.to_path_buf())
    };
    let mut candidates = Vec::new();
    if let Some(host) = host {
        if host.is_dir() {
            candidates.push(host.join("objcopy"));
        } else if let (Some(dir), Some(name)) = (host.parent(), host.file_name()) {
            let name = name.to_string_lossy();
            let prefix = ["g++", "c++", "gcc", "cc"]
                .iter()
                .find_map(|c| name.strip_suffix(c))
                .filter(|p| p.ends_with('-'));
            if let Some(p) = prefix {
                candidates.push(dir.join(format!("{p}objcopy")));
            }
            candidates.push(dir.join("objcopy"));
        }
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .or_else(|| which::which("objcopy").ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objcopy_is_found_beside_the_host_compiler_first() {
        let d = tempfile::tempdir().unwrap();
        let touch = |n: &str| {
            let p = d.path().join(n);
            std::fs::write(&p, "").unwrap();
            p
        };
        let gxx = touch("x86_64-linux-gnu-g++");
        let plain = touch("objcopy");
        assert_eq!(find_objcopy(&gxx), Some(plain.clone()));
        let prefixed = touch("x86_64-linux-gnu-objcopy");
        assert_eq!(find_objcopy(&gxx), Some(prefixed));
        assert_eq!(find_objcopy(d.path()), Some(plain));
    }

    #[test]
    fn a_launcher_zig_or_no_objcopy_turns_it_off_and_says_why() {
        let objects = std::sync::Arc::new(HostObjects::default());
        let d = tempfile::tempdir().unwrap();
        let gxx = d.path().join("g++");
        std::fs::write(&gxx, "").unwrap();
        std::fs::write(d.path().join("objcopy"), "").unwrap();
        let tc = Toolchain {
            host_compiler_path: gxx,
            ..Toolchain::placeholder()
        };
        let on = |tc: &Toolchain, launcher: &Launcher| {
            HostOnce::new(objects.clone(), Vec::new(), tc, launcher).map(|h| h.objcopy)
        };
        assert_eq!(on(&tc, &Launcher::default()), Ok(d.path().join("objcopy")));
        let sccache = Launcher {
            words: vec!["/usr/bin/sccache".into()],
            from: "--launcher",
        };
        assert!(on(&tc, &sccache).unwrap_err().contains("launcher"));
        let zig = Toolchain {
            manylinux: Some(crate::manylinux::Glibc {
                major: 2,
                minor: 28,
            }),
            ..tc.clone()
        };
        assert!(on(&zig, &Launcher::default()).unwrap_err().contains("zig"));
    }

    #[test]
    fn a_kept_object_is_found_only_under_its_host_key_and_goes_with_the_run() {
        let c = tempfile::tempdir().unwrap();
        let cache = Cache::open(c.path().join("c")).unwrap();
        let objects = HostObjects::default();
        let scratch = cache.compile_dir("t").unwrap();
        let o = scratch.path().join("instance.o");
        std::fs::write(&o, b"host").unwrap();
        objects.keep(&cache, "u", "k1", &o).unwrap();
        assert!(!o.exists(), "moved, not copied");
        let kept = objects.find("u", "k1").unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"host");
        assert!(kept.starts_with(c.path().join("c/tmp")));
        assert_eq!(objects.find("u", "k2"), None, "another host key");
        assert_eq!(objects.find("v", "k1"), None, "another instance");
        let folder = kept.parent().unwrap().to_path_buf();
        drop(objects);
        assert!(!folder.exists(), "removed with the run");
    }
}
