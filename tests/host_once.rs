//! Host code once per instance (src/host_once.rs): `build-wheel --release` compiles an
//! instance's host code for its first architecture only and, for each later one, its device code
//! alone swapped into a copy of that object. The `.so` files must be the bytes of the one-step
//! build `flashgen build --arch A` makes (and the cache keys them as such); without objcopy the
//! release builds each architecture in one step, with the same bytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;
use common::*;

/// The release's architectures, and the folder each one's kernel wheel is built in.
const ARCHS: [(&str, &str); 3] = [("8.0+PTX", "sm80"), ("9.0a", "sm90a"), ("10.0", "sm100")];

/// The `backend` fixture for a three-architecture release, narrowed (`--where width=64`) to a
/// portable instance, built for all three, and an sm90 one, built for 9.0a alone.
fn fixture() -> Tree {
    if project_nvcc().is_none() {
        panic!("no nvcc: install ci/requirements-cuda.txt into .venv (ci/setup.sh)");
    }
    let t = Tree::new("backend");
    t.with_python_package();
    t.edit(|v| {
        v["release"] = serde_json::json!({"archs": ARCHS.map(|(a, _)| a)});
    });
    t
}

/// Every `.so` in `dir`, by file name.
fn so_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".so"))
        .map(|n| {
            let bytes = std::fs::read(dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

/// `build-wheel --release -v` into `build` with the cache `cache` (and `path` as PATH when
/// given): its stderr, and each architecture's `.so` files.
fn release(
    t: &Tree,
    build: &str,
    cache: &str,
    path: Option<&Path>,
) -> (String, Vec<BTreeMap<String, Vec<u8>>>) {
    let mut c = t.cmd();
    c.env("FLASHGEN_CACHE_DIR", t.path(cache));
    if let Some(p) = path {
        c.env("PATH", p);
    }
    let o = c
        .args([
            "build-wheel",
            "--release",
            "-v",
            "-j",
            "2",
            "--where",
            "width=64",
        ])
        .args(["--out", &format!("dist-{build}"), "--build-dir", build])
        .output()
        .unwrap();
    assert_success(&o);
    let sos = ARCHS
        .iter()
        .map(|(_, extra)| so_files(&t.path(build).join(extra)))
        .collect();
    (stderr(&o), sos)
}

/// Each architecture's `.so` files as `flashgen build --arch A` makes them, in one step each, from
/// a cache of their own (none of the release's objects).
fn one_step_builds(t: &Tree) -> Vec<BTreeMap<String, Vec<u8>>> {
    ARCHS
        .iter()
        .map(|(arch, extra)| {
            let out = format!("ref-{extra}");
            let o = t
                .cmd()
                .env("FLASHGEN_CACHE_DIR", t.path("ref-cache"))
                .args([
                    "build", "--arch", arch, "-q", "-j", "2", "--where", "width=64",
                ])
                .args(["--out", &out])
                .output()
                .unwrap();
            assert_success(&o);
            so_files(&t.path(&out))
        })
        .collect()
}

/// The `-v` lines of the commands run whose words include `word`.
fn ran(log: &str, word: &str) -> usize {
    log.lines()
        .filter(|l| l.starts_with("+ ") && l.split(' ').any(|w| w == word))
        .count()
}

#[track_caller]
fn assert_same_bytes(got: &[BTreeMap<String, Vec<u8>>], want: &[BTreeMap<String, Vec<u8>>]) {
    for (((arch, _), g), w) in ARCHS.iter().zip(got).zip(want) {
        assert_eq!(
            g.keys().collect::<Vec<_>>(),
            w.keys().collect::<Vec<_>>(),
            "{arch}"
        );
        for (name, bytes) in g {
            assert!(
                bytes == &w[name],
                "{arch}: {name} differs from the one-step build"
            );
        }
    }
}

#[test]
fn a_release_compiles_host_code_once_and_gives_the_one_step_bytes() {
    let t = fixture();
    let (log, sos) = release(&t, "build-once", "cache-once", None);
    // The portable instance: `nvcc -c` for 8.0+PTX, then the device code alone, swapped in, for
    // 9.0a and 10.0. The sm90 one (9.0a alone) in one step, as `flashgen build` does.
    assert_eq!(ran(&log, "-c"), 1, "{log}");
    assert_eq!(ran(&log, "-fatbin"), 2, "{log}");
    assert_eq!(ran(&log, "--update-section"), 2, "{log}");
    // The run's first swap was checked against its one-step build, and matched.
    assert!(!log.contains("warning:"), "{log}");
    assert_eq!(sos.iter().map(BTreeMap::len).collect::<Vec<_>>(), [1, 2, 1]);
    let want = one_step_builds(&t);
    assert_same_bytes(&sos, &want);
    // The host objects were the run's own: nothing is left in the cache's temp folder.
    let left: Vec<PathBuf> = std::fs::read_dir(t.path("cache-once/tmp"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // A second release with that cache compiles nothing: the keys are the one-step build's.
    let (again, _) = release(&t, "build-again", "cache-once", None);
    assert_eq!(ran(&again, "-c") + ran(&again, "-fatbin"), 0, "{again}");

    // A release whose first architecture is cached compiles the host code for the second.
    let o = t
        .cmd()
        .env("FLASHGEN_CACHE_DIR", t.path("cache-first"))
        .args(["build", "--arch", ARCHS[0].0, "-q", "--where", "width=64"])
        .args(["--out", "first"])
        .output()
        .unwrap();
    assert_success(&o);
    let (log, sos) = release(&t, "build-first", "cache-first", None);
    assert_eq!(ran(&log, "-c"), 1, "{log}");
    assert_eq!(ran(&log, "-fatbin"), 1, "{log}");
    assert_same_bytes(&sos, &want);
}

#[test]
fn without_objcopy_a_release_builds_each_architecture_in_one_step_with_the_same_bytes() {
    let t = fixture();
    // A PATH of the host toolchain but objcopy.
    let bin = host_compiler_bin(&t, "bin-without-objcopy");
    let (log, sos) = release(&t, "build-fallback", "cache-fallback", Some(&bin));
    assert!(
        log.contains("host code once per instance is off (no objcopy beside the host compiler"),
        "{log}"
    );
    assert_eq!(ran(&log, "-fatbin") + ran(&log, "-c"), 0, "{log}");
    assert_same_bytes(&sos, &one_step_builds(&t));
}

#[test]
fn a_swap_that_does_not_give_the_one_step_bytes_turns_host_once_off_for_the_run() {
    let t = fixture();
    // A toolchain whose swapped object would not be the one-step build's (as if the host object
    // depended on the target): an objcopy that changes a byte of the fatbin it swaps in.
    let bin = host_compiler_bin(&t, "bin-other-bytes");
    let objcopy = tool_on_path("objcopy").expect("objcopy on PATH");
    let script = bin.join("objcopy");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in .nv_fatbin=*) \
             printf '\\377' | dd of=\"${{a#.nv_fatbin=}}\" bs=1 seek=64 conv=notrunc 2>/dev/null;; \
             esac; done\nexec {} \"$@\"\n",
            objcopy.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut path = std::ffi::OsString::from(bin.as_os_str());
    path.push(":/usr/bin:/bin");
    let (log, sos) = release(&t, "build-other", "cache-other", Some(Path::new(&path)));
    assert!(
        log.contains("does not give the one-step build's bytes with this toolchain; host code once per instance is off for the rest of this release"),
        "{log}"
    );
    // One swap, the check; the last architecture in one step; and the cache holds the one-step
    // bytes.
    assert_eq!(ran(&log, "--update-section"), 1, "{log}");
    assert_same_bytes(&sos, &one_step_builds(&t));
}

/// A folder `name` in the tree holding g++ (nvcc's host compiler) and what it runs, linked to
/// PATH's, and no objcopy.
fn host_compiler_bin(t: &Tree, name: &str) -> PathBuf {
    let bin = t.path(name);
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["g++", "gcc", "as", "ld"] {
        let Some(found) = tool_on_path(tool) else {
            panic!("no {tool} on PATH");
        };
        std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
    }
    bin
}

fn tool_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
