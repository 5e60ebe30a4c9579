//! Trust, round two (issue 23), the storage half: flashgen claims and deletes only what is
//! provably its own, and hands out an object only after hashing the bytes it hands out. Each test
//! is one finding of the review, through the real binary (and real nvcc on the toy fixture where
//! a compile is involved).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;

mod common;
use common::*;

const A: &[&str] = &[
    "dtype=f16",
    "width=32",
    "fast=true",
    "mode=sum",
    "variant=plain",
];
const B: &[&str] = &[
    "dtype=bf16",
    "width=32",
    "fast=true",
    "mode=sum",
    "variant=plain",
];
const A_URI: &str = "toy_dtype_f16_width_32_fast_true_mode_sum_variant_plain";

fn mtime(path: &Path) -> SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

fn set_mtime(path: &Path, when: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

/// What the review did: flip a byte in the middle, then set the mtime back (os.utime). The size
/// and mtime are the old ones; only the ctime says the file changed.
fn flip_byte_keep_mtime(path: &Path) {
    let was = mtime(path);
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(path, &bytes).unwrap();
    set_mtime(path, was);
    assert_eq!(mtime(path), was);
}

fn three_days_ago() -> SystemTime {
    SystemTime::now() - Duration::from_secs(3 * 24 * 3600)
}

/// `build --out OUT --json` of `which`; the output, which must succeed.
fn build(t: &Tree, out: &str, which: &[&str]) -> std::process::Output {
    let o = t
        .cmd()
        .args(["build", "--out", out, "--json", "--jobs", "2"])
        .args(wheres(which))
        .output()
        .unwrap();
    assert!(o.status.success(), "build failed:\n{}", stderr(&o));
    o
}

/// The one output of a build summary: its bytes hash to the manifest's and the summary's sha256,
/// which is `sha`.
fn assert_output_is(t: &Tree, out: &str, summary: &Value, sha: &str) {
    let row = &summary["instances"][0];
    let path = PathBuf::from(row["path"].as_str().unwrap());
    assert_eq!(sha256(&path), sha, "{}", path.display());
    assert_recorded_sha256(&path, row);
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(t.path(out).join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["instances"][0]["sha256"], sha);
}

// ---- adopt and delete only what is provably ours --------------------------------------------

#[test]
fn a_folder_flashgen_did_not_create_is_never_claimed_as_out_nor_cleaned() {
    let t = Tree::new("toy");
    // What the review found adopted: only .so files, only generated/, only manifest.json.
    let cases: [(&str, &[&str]); 4] = [
        ("mylibs", &["libmine.so", "libother.so"]),
        ("proj", &["generated/api.h"]),
        ("withmanifest", &["manifest.json"]),
        ("wheelbuild", &["notes.txt"]),
    ];
    for (dir, files) in cases {
        for f in files {
            let p = t.path(dir).join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "the user's").unwrap();
        }
        let o = if dir == "wheelbuild" {
            t.run(&["build-wheel", "--build-dir", dir, "--out", "dist"])
        } else {
            t.run(&["build", "--out", dir])
        };
        let flag = if dir == "wheelbuild" {
            "--build-dir"
        } else {
            "--out"
        };
        assert_usage_error(
            &o,
            &[
                &t.path(dir).display().to_string(),
                "not a flashgen build folder",
                &format!("pass a new or empty folder as {flag}"),
            ],
        );
        assert!(
            !t.path(dir).join(".flashgen-build").exists(),
            "{dir} marked"
        );
        let o = t.run(&["clean", "--out", dir]);
        assert_success(&o);
        assert_stderr_has(&o, "skipped");
        for f in files {
            assert_eq!(
                std::fs::read_to_string(t.path(dir).join(f)).unwrap(),
                "the user's"
            );
        }
    }
}

#[test]
fn a_private_folder_with_files_is_never_claimed_as_the_cache_nor_cleaned() {
    let t = Tree::new("toy");
    let private = t.path("private");
    std::fs::create_dir_all(private.join("tmp")).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let notes = private.join("tmp/notes.txt");
    std::fs::write(&notes, "mine").unwrap();
    set_mtime(&notes, three_days_ago());
    let with_cache = |args: &[&str]| {
        t.cmd()
            .env("FLASHGEN_CACHE_DIR", &private)
            .args(args)
            .output()
            .unwrap()
    };
    let o = with_cache(&["build", "--out", "out"]);
    assert_usage_error(
        &o,
        &[
            &private.display().to_string(),
            "is not a flashgen cache",
            "tmp",
            "FLASHGEN_CACHE_DIR to a new or empty private folder",
        ],
    );
    assert!(!private.join("CACHEDIR.TAG").exists());
    let o = with_cache(&["clean", "--cache"]);
    assert_success(&o);
    assert_stderr_has(&o, "not a flashgen cache");
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "mine");
}

#[test]
fn trailing_slashes_and_dots_do_not_slip_past_the_symlink_checks() {
    let t = Tree::new("toy");
    assert!(t.run(&["doctor"]).status.success(), "creates the cache");
    std::os::unix::fs::symlink(t.path(".cache"), t.path("link")).unwrap();
    for spelling in ["link/", "link/.", "./link//"] {
        let o = t
            .cmd()
            .env("FLASHGEN_CACHE_DIR", t.path(spelling))
            .args(["build", "--out", "out"])
            .output()
            .unwrap();
        assert_usage_error(&o, &["is a symbolic link"]);
        let o = t
            .cmd()
            .env("FLASHGEN_CACHE_DIR", t.path(spelling))
            .args(["clean", "--cache"])
            .output()
            .unwrap();
        assert_success(&o);
        assert!(stderr(&o).contains("skipped"), "{spelling}: {}", stderr(&o));
    }
    assert!(t.path(".cache/CACHEDIR.TAG").is_file());
    // A marked build folder behind a link: `clean --out link/` is the link, and skipped.
    std::fs::create_dir(t.path("real")).unwrap();
    t.write("real/.flashgen-build", "");
    t.write("real/manifest.json", "{}");
    std::os::unix::fs::symlink(t.path("real"), t.path("outlink")).unwrap();
    for spelling in ["outlink/", "outlink/.", "./outlink"] {
        let o = t.run(&["clean", "--out", spelling]);
        assert_success(&o);
        assert!(
            stderr(&o).contains("not a flashgen build folder"),
            "{spelling}: {}",
            stderr(&o)
        );
        assert!(t.path("real/manifest.json").is_file(), "{spelling}");
    }
}

#[test]
fn clean_and_the_temp_sweep_remove_only_what_flashgen_made() {
    let t = Tree::new("toy");
    let first = json(&build(&t, "out", A));
    let obj = object(&t, &first["instances"][0]);
    // The user's files inside flashgen's folders, and a stale temp folder of a killed build.
    t.write("out/mine.so", "mine");
    t.write("out/generated/api.h", "mine");
    t.write(".cache/tmp/notes.txt", "mine");
    t.write(".cache/objects/keep.txt", "mine");
    set_mtime(&t.path(".cache/tmp/notes.txt"), three_days_ago());
    std::fs::create_dir(t.path(".cache/tmp/nvcc-job.killed")).unwrap();
    t.write(".cache/tmp/nvcc-job.killed/instance.o", "");
    std::fs::File::open(t.path(".cache/tmp/nvcc-job.killed"))
        .unwrap()
        .set_modified(three_days_ago())
        .unwrap();

    // A build that compiles sweeps the stale temps: flashgen's only.
    let second = json(&build(&t, "out", B));
    assert_eq!(second["built"], 1);
    assert!(!t.path(".cache/tmp/nvcc-job.killed").exists());
    assert!(t.path(".cache/tmp/notes.txt").is_file());

    let o = t.run(&["clean", "--out", "out", "--cache", "--dry-run"]);
    assert_success(&o);
    assert!(obj.is_file() && t.path("out/manifest.json").is_file());

    let o = t.run(&["clean", "--out", "out", "--cache"]);
    assert_success(&o);
    let err = stderr(&o);
    assert!(err.contains("kept the folder"), "{err}");
    // Both instances' files went (A's only from the marker: the last manifest names B alone).
    assert!(
        !t.path(format!("out/{A_URI}.so").as_str()).exists(),
        "{err}"
    );
    assert!(!t.path("out/manifest.json").exists());
    assert!(!t.path(format!("out/generated/{A_URI}").as_str()).exists());
    assert!(!obj.exists());
    assert!(!t.path(".cache/locks").exists());
    // The user's files stay, and so do the markers of the folders that hold them.
    for f in [
        "out/mine.so",
        "out/generated/api.h",
        ".cache/tmp/notes.txt",
        ".cache/objects/keep.txt",
    ] {
        assert_eq!(std::fs::read_to_string(t.path(f)).unwrap(), "mine", "{f}");
        assert!(err.contains(&t.path(f).display().to_string()), "{f}: {err}");
    }
    assert!(t.path("out/.flashgen-build").is_file());
    assert!(t.path(".cache/CACHEDIR.TAG").is_file());

    // With those moved out, the folders go.
    for f in [
        "out/mine.so",
        "out/generated/api.h",
        ".cache/tmp/notes.txt",
        ".cache/objects/keep.txt",
    ] {
        std::fs::remove_file(t.path(f)).unwrap();
    }
    let o = t.run(&["clean", "--out", "out", "--cache"]);
    assert_success(&o);
    assert!(!t.path("out").exists() && !t.path(".cache").exists());
}

// ---- hash before handing out ----------------------------------------------------------------

#[test]
fn a_corrupt_or_foreign_object_is_rebuilt_never_handed_out() {
    let t = Tree::new("toy");
    let a = json(&build(&t, "out", A));
    let b = json(&build(&t, "out-b", B));
    let (obj_a, obj_b) = (
        object(&t, &a["instances"][0]),
        object(&t, &b["instances"][0]),
    );
    let good = sha256(&obj_a);
    let rebuilt = |out: &str| {
        let o = build(&t, out, A);
        assert!(
            stderr(&o).contains("cached object is corrupt"),
            "{out}: {}",
            stderr(&o)
        );
        let s = json(&o);
        assert_eq!(
            (s["built"].as_u64(), s["cached"].as_u64()),
            (Some(1), Some(0))
        );
        assert_output_is(&t, out, &s, &good);
        assert_eq!(sha256(&obj_a), good);
    };

    // A flipped byte, the mtime set back: size and mtime are the record's.
    flip_byte_keep_mtime(&obj_a);
    rebuilt("o1");

    // A record whose sha256 is wrong, everything else as written (the object untouched).
    let record = obj_a.with_extension("json");
    let text = std::fs::read_to_string(&record).unwrap();
    std::fs::write(&record, text.replace(&good, &"0".repeat(64))).unwrap();
    rebuilt("o2");

    // B's object and record under A's key.
    std::fs::copy(&obj_b, &obj_a).unwrap();
    std::fs::copy(obj_b.with_extension("json"), &record).unwrap();
    rebuilt("o3");

    // A record of an older flashgen, which names no key: not taken on trust either.
    let mut old: Value = serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    old.as_object_mut().unwrap().remove("key");
    std::fs::write(&record, old.to_string()).unwrap();
    rebuilt("o4");

    // The JIT: the same object, corrupt again, is rebuilt before its path is answered.
    flip_byte_keep_mtime(&obj_a);
    let mut args = vec!["jit", "--device-cc", "8.0", "--module", "toy"];
    let w = wheres(A);
    args.extend(w.iter().map(String::as_str));
    let o = t.run(&args);
    assert_success(&o);
    let answer = json(&o);
    assert_eq!(answer["source"], "compiled", "{answer}");
    assert_eq!(answer["sha256"], good.as_str());
    assert_eq!(sha256(Path::new(answer["path"].as_str().unwrap())), good);
    // And a record edited under it: --no-compile answers missing, a compiling call rebuilds.
    let text = std::fs::read_to_string(&record).unwrap();
    std::fs::write(&record, text.replace(&good, &"0".repeat(64))).unwrap();
    args.push("--no-compile");
    let o = t.run(&args);
    assert_success(&o);
    assert_eq!(json(&o)["source"], "missing");
    args.pop();
    let o = t.run(&args);
    assert_success(&o);
    assert_eq!(json(&o)["source"], "compiled");
}

#[test]
fn an_output_edited_with_its_mtime_set_back_is_rewritten() {
    let t = Tree::new("toy");
    let first = json(&build(&t, "out", A));
    let good = sha256(&object(&t, &first["instances"][0]));
    let out = t.path(format!("out/{A_URI}.so").as_str());
    flip_byte_keep_mtime(&out);
    let again = json(&build(&t, "out", A));
    assert_eq!(again["cached"], 1);
    assert_output_is(&t, "out", &again, &good);
    // Unchanged since, the next build is the no-op, and reads the stamp's figures.
    let third = json(&build(&t, "out", A));
    assert_eq!(third["cached"], 1);
    assert_output_is(&t, "out", &third, &good);
    // A link to a build folder names that folder to `build` (only `clean` refuses links).
    std::os::unix::fs::symlink(t.path("out"), t.path("outlink")).unwrap();
    let linked = json(&build(&t, "outlink/", A));
    assert_eq!(linked["cached"], 1);
}

#[test]
fn build_wheel_rebuilds_a_corrupt_object_instead_of_refusing_it_every_run() {
    let t = Tree::new("toy");
    t.with_python_package();
    let wheel = |out: &str| {
        let o = t
            .cmd()
            .args(["build-wheel", "--binary", "/bin/true", "--out", out, "-q"])
            .args(wheres(A))
            .output()
            .unwrap();
        assert_success(&o);
        o
    };
    wheel("dist-1");
    let first = json(&build(&t, "out", A));
    let obj = object(&t, &first["instances"][0]);
    let good = sha256(&obj);
    flip_byte_keep_mtime(&obj);
    let o = wheel("dist-2");
    assert_stderr_has(&o, "cached object is corrupt");
    assert_eq!(sha256(&obj), good);
    let whl = PathBuf::from(stdout(&o).trim());
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&whl).unwrap()).unwrap();
    let mut packed = Vec::new();
    std::io::Read::read_to_end(
        &mut zip.by_name(&format!("flashgen/_aot/{A_URI}.so")).unwrap(),
        &mut packed,
    )
    .unwrap();
    use sha2::Digest;
    assert_eq!(format!("{:x}", sha2::Sha256::digest(&packed)), good);
    // And the next run is a plain success too.
    wheel("dist-3");
}

// ---- the zig dso-fini object ------------------------------------------------------------------

#[test]
fn the_zig_dso_fini_object_is_verified_and_rebuilt() {
    let Some(zig) = require(project_nvcc().and(zig()), NEEDS_ZIG) else {
        return;
    };
    let t = Tree::new("toy");
    let doctor = || {
        let o = t
            .cmd()
            .env("FLASHGEN_ZIG", &zig)
            .args(["doctor", "--json"])
            .env("FLASHGEN_MANYLINUX", "2_17")
            .output()
            .unwrap();
        assert_success(&o);
        json(&o)["toolchain"]["host_compiler"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", stdout(&o)))
            .to_string()
    };
    let identity = doctor();
    let fini: Vec<PathBuf> = std::fs::read_dir(t.path(".cache/toolchain"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with("zig-dso-fini-") && n.ends_with(".o")
        })
        .collect();
    assert_eq!(fini.len(), 1, "{fini:?}");
    let fini = &fini[0];
    assert!(fini.with_extension("json").is_file());
    let good = std::fs::read(fini).unwrap();
    let sha = sha256(fini);
    assert!(
        identity.contains(&format!("dso-fini {}", &sha[..16])),
        "{identity}"
    );
    // Garbage of the same size, its mtime set back: compiled again, the same bytes.
    let was = mtime(fini);
    std::fs::write(fini, vec![0u8; good.len()]).unwrap();
    set_mtime(fini, was);
    assert_eq!(doctor(), identity);
    assert_eq!(std::fs::read(fini).unwrap(), good);
    // Missing its record: compiled again too.
    std::fs::remove_file(fini.with_extension("json")).unwrap();
    std::fs::write(fini, b"garbage").unwrap();
    assert_eq!(doctor(), identity);
    assert_eq!(std::fs::read(fini).unwrap(), good);
}
