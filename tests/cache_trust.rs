//! The cache trusts nothing it did not check: its root, each object before it is handed out,
//! each output before a stamp vouches for it. Also locks, store failures, process hygiene, job
//! counts, entry points, `generate` without nvcc and a `clean` that deletes only marked folders.
//! All through the real binary and real nvcc on the toy fixture.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

/// One toy instance (one compile).
fn one() -> Vec<String> {
    wheres(&[
        "dtype=f16",
        "width=32",
        "fast=true",
        "mode=sum",
        "variant=plain",
    ])
}

/// `build --out OUT --json EXTRA... <one()>` through `cmd`: its output, success or not.
fn build_one(
    mut cmd: impl std::borrow::BorrowMut<assert_cmd::Command>,
    out: &str,
    extra: &[&str],
) -> std::process::Output {
    cmd.borrow_mut()
        .args(["build", "--out", out, "--json"])
        .args(extra)
        .args(one())
        .output()
        .unwrap()
}

/// An nvcc stand-in at `<tree>/wrap/bin/nvcc` (with `lib` beside it, as the toolchain expects)
/// that appends a line to `<tree>/nvcc.log` for every compile, runs `extra` shell text, then
/// execs the real nvcc.
fn nvcc_wrapper(t: &Tree, extra: &str) -> PathBuf {
    let real = project_nvcc().expect("the project venv's nvcc");
    let root = real.parent().unwrap().parent().unwrap();
    std::fs::create_dir_all(t.path("wrap/bin")).unwrap();
    std::os::unix::fs::symlink(root.join("lib"), t.path("wrap/lib")).unwrap();
    let script = format!(
        // Logs (and delays) the call that compiles the source, one per instance: the one-step
        // build, or the compile step of two (a link names no `.cu`).
        "#!/bin/sh\ncase \" $* \" in *\".cu \"*) echo \"$$\" >> '{log}'; {extra} ;; esac\nexec '{real}' \"$@\"\n",
        log = t.path("nvcc.log").display(),
        real = real.display()
    );
    let path = t.path("wrap/bin/nvcc");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn compiles_logged(t: &Tree) -> usize {
    std::fs::read_to_string(t.path("nvcc.log")).map_or(0, |s| s.lines().count())
}

// ---- the cache root ------------------------------------------------------------------------

#[test]
fn cache_root_follows_one_rule() {
    let t = Tree::new("toy");
    let home = t.path("home");
    let dir = |envs: &[(&str, &str)]| {
        let mut c = t.cmd();
        c.env_remove("FLASHGEN_CACHE_DIR")
            .env_remove("XDG_CACHE_HOME")
            .env("HOME", &home);
        for (k, v) in envs {
            c.env(k, v);
        }
        json(&c.args(["doctor", "--json"]).output().unwrap())["cache_dir"].clone()
    };
    let s = |p: PathBuf| Value::from(p.display().to_string());
    assert_eq!(dir(&[]), s(home.join(".cache/flashgen")));
    assert_eq!(
        dir(&[("FLASHGEN_CACHE_DIR", "")]),
        s(home.join(".cache/flashgen"))
    );
    let xdg = t.path("xdg");
    assert_eq!(
        dir(&[("XDG_CACHE_HOME", xdg.to_str().unwrap())]),
        s(xdg.join("flashgen"))
    );
    assert_eq!(
        dir(&[("XDG_CACHE_HOME", "relative/xdg")]),
        s(home.join(".cache/flashgen")),
        "a relative XDG_CACHE_HOME is ignored"
    );
    assert_eq!(dir(&[("FLASHGEN_CACHE_DIR", "~/fc")]), s(home.join("fc")));
    assert_eq!(dir(&[("FLASHGEN_CACHE_DIR", "rel/c")]), s(t.path("rel/c")));
}

#[test]
fn a_new_cache_is_private_and_marked() {
    let t = Tree::new("toy");
    let o = t.run(&["doctor", "--json"]);
    assert_success(&o);
    let meta = std::fs::metadata(t.path(".cache")).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o700);
    for sub in ["objects", "tmp", "locks"] {
        let m = std::fs::metadata(t.path(".cache").join(sub)).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700, "{sub}");
    }
    let tag = std::fs::read_to_string(t.path(".cache/CACHEDIR.TAG")).unwrap();
    assert!(tag.starts_with("Signature: 8a477f597d28d172789f06886806bc55\n"));
    assert!(tag.contains("flashgen"));
}

#[test]
fn an_unsafe_or_foreign_cache_root_is_refused_with_the_fix() {
    let t = Tree::new("toy");
    let build = |envs: &[(&str, &Path)]| {
        let mut c = t.cmd();
        for (k, v) in envs {
            c.env(k, v);
        }
        c.args(["build", "--out", "out"])
            .args(one())
            .output()
            .unwrap()
    };
    // Writable by others.
    std::fs::create_dir(t.path("open")).unwrap();
    std::fs::set_permissions(t.path("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = build(&[("FLASHGEN_CACHE_DIR", &t.path("open"))]);
    let open = t.path("open").display().to_string();
    assert_usage_error(
        &o,
        &[
            &open,
            "writable by group or others (mode 777)",
            "chmod 700",
            "FLASHGEN_CACHE_DIR",
        ],
    );
    // A symlink, even to a good cache.
    assert!(t.run(&["doctor"]).status.success());
    std::os::unix::fs::symlink(t.path(".cache"), t.path("link")).unwrap();
    let o = build(&[("FLASHGEN_CACHE_DIR", &t.path("link"))]);
    assert_usage_error(&o, &["is a symbolic link"]);
    // The source tree itself: not adopted, nothing written into it.
    let o = build(&[("FLASHGEN_CACHE_DIR", Path::new("."))]);
    assert_usage_error(&o, &["is not a flashgen cache", "csrc"]);
    assert!(!t.path("CACHEDIR.TAG").exists() && !t.path("objects").exists());
    assert!(!t.path("out").exists());
    // An empty folder is adopted.
    std::fs::create_dir(t.path("empty")).unwrap();
    std::fs::set_permissions(t.path("empty"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let o = t
        .cmd()
        .env("FLASHGEN_CACHE_DIR", t.path("empty"))
        .args(["doctor"])
        .output()
        .unwrap();
    assert_success(&o);
    assert!(t.path("empty/CACHEDIR.TAG").is_file());
}

// ---- objects and outputs -------------------------------------------------------------------

#[test]
fn a_corrupt_object_is_rebuilt_and_never_reported_cached() {
    let t = Tree::new("toy");
    let o = build_one(t.cmd(), "a", &["--jobs", "100000"]);
    assert_success(&o);
    assert_stderr_has(&o, "--jobs 100000 capped at");
    let first = json(&o);
    let obj = object(&t, &first["instances"][0]);
    let good = std::fs::read(&obj).unwrap();

    // Same bytes, new mtime: re-hashed, still good.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&obj, &good).unwrap();
    let again = build_json(&t, "b", &one());
    assert_eq!(
        (again["built"].as_u64(), again["cached"].as_u64()),
        (Some(0), Some(1))
    );

    // Same size, other bytes: corrupt, removed and rebuilt.
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&obj, &bad).unwrap();
    let o = build_one(t.cmd(), "c", &[]);
    assert_success(&o);
    assert_stderr_has(&o, "cached object is corrupt");
    let rebuilt = json(&o);
    assert_eq!(rebuilt["built"], 1);
    assert_eq!(std::fs::read(&obj).unwrap(), good);

    // A symlink in place of the object is never followed.
    let elsewhere = t.path("elsewhere.so");
    std::fs::write(&elsewhere, &good).unwrap();
    std::fs::remove_file(&obj).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &obj).unwrap();
    let o = build_one(t.cmd(), "d", &[]);
    assert_success(&o);
    assert!(
        stderr(&o).contains("not a regular file") || stderr(&o).contains("cannot open"),
        "{}",
        stderr(&o)
    );
    assert_eq!(json(&o)["built"], 1);
    assert!(!std::fs::symlink_metadata(&obj)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn outputs_are_copies_and_a_changed_output_is_put_back() {
    let t = Tree::new("toy");
    let first = build_json(&t, "out", &one());
    let row = &first["instances"][0];
    let out = PathBuf::from(row["path"].as_str().unwrap());
    let obj = object(&t, row);
    assert!(t.path("out/.flashgen-build").is_file());
    let (m_out, m_obj) = (
        std::fs::metadata(&out).unwrap(),
        std::fs::metadata(&obj).unwrap(),
    );
    assert_ne!(m_out.ino(), m_obj.ino(), "an output is a copy, not a link");
    assert_eq!(m_obj.nlink(), 1);
    let obj_sha = sha256(&obj);

    // Truncating the output leaves the cache alone; the stamp notices and the build repairs it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&out)
        .unwrap()
        .set_len(100)
        .unwrap();
    assert_eq!(sha256(&obj), obj_sha);
    let again = build_json(&t, "out", &one());
    assert_eq!(
        (again["built"].as_u64(), again["cached"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(sha256(&out), obj_sha);
    assert_recorded_sha256(&out, &again["instances"][0]);

    // An edit that keeps the size is caught too (mtime in the stamp, sha256 on the slow path).
    let mut bytes = std::fs::read(&out).unwrap();
    bytes[10] ^= 0xff;
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&out, &bytes).unwrap();
    build_json(&t, "out", &one());
    assert_eq!(sha256(&out), obj_sha);
}

#[test]
fn a_missing_entry_point_fails_the_instance_and_caches_nothing() {
    let t = Tree::new("toy");
    let cfg = std::fs::read_to_string(t.path("variants.json")).unwrap();
    t.write(
        "variants.json",
        &cfg.replace(
            r#""entry_points": ["toy_query", "toy_apply"]"#,
            r#""entry_points": ["toy_query", "toy_apply", "toy_missing"]"#,
        ),
    );
    let o = build_one(t.cmd(), "out", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let uri = "toy_dtype_f16_width_32_fast_true_mode_sum_variant_plain";
    assert_stderr_has(
        &o,
        &format!("{uri}: entry point `toy_missing` is not exported by the built .so"),
    );
    assert!(!stderr(&o).contains("nvcc failed"), "{}", stderr(&o));
    assert_eq!(json(&o)["failed"][0]["kind"], "entry_point");
    let objects: Vec<_> = walk(&t.path(".cache/objects"));
    assert!(objects.is_empty(), "cached: {objects:?}");
}

#[test]
fn a_store_failure_names_the_path_and_is_not_an_nvcc_failure() {
    let t = Tree::new("toy");
    let first = build_json(&t, "a", &one());
    let obj = object(&t, &first["instances"][0]);
    // The object's folder becomes a file: nvcc succeeds, storing cannot.
    let shard = obj.parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&shard).unwrap();
    std::fs::write(&shard, "not a folder").unwrap();
    let o = build_one(t.cmd(), "b", &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("could not be stored"), "{err}");
    assert!(err.contains(&shard.display().to_string()), "{err}");
    assert!(err.contains("os error"), "{err}");
    assert!(!err.contains("nvcc failed"), "{err}");
    assert_eq!(json(&o)["failed"][0]["kind"], "store");
}

// ---- concurrency and process hygiene -------------------------------------------------------

#[test]
fn a_header_saved_during_the_compile_is_not_cached_under_the_key_of_its_old_text() {
    let t = Tree::new("toy");
    // The compile step saves a new text of a header the instance includes, as an editor would
    // while a build runs; nvcc may read either text, and the key names the old one.
    let header = t.path("include/toy/toy.cuh");
    let nvcc = nvcc_wrapper(
        &t,
        &format!("echo '// saved during the build' >> '{}'", header.display()),
    );
    let o = build_one(t.cmd().env("FLASHGEN_NVCC", &nvcc), "out", &[]);
    assert!(!o.status.success(), "the build claimed success");
    assert_stderr_has(
        &o,
        "toy.cuh changed while the instance was compiling; build again",
    );
    assert_eq!(
        json(&o)["failed"][0]["kind"],
        "source_changed",
        "{}",
        stdout(&o)
    );
    assert_eq!(compiles_logged(&t), 1);
    assert!(
        walk(&t.path(".cache/objects")).is_empty(),
        "an object was stored: {:?}",
        walk(&t.path(".cache/objects"))
    );
    // Built again with the text now on disk, it compiles (nothing cached) and stores it.
    let v = build_json(&t, "out", &one());
    assert_eq!(
        (v["built"].as_u64(), v["cached"].as_u64()),
        (Some(1), Some(0)),
        "{v}"
    );
    let objects = walk(&t.path(".cache/objects"));
    assert_eq!(
        objects
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "so"))
            .count(),
        1,
        "{objects:?}"
    );
}

#[test]
fn concurrent_builds_of_one_instance_compile_it_once() {
    let t = Tree::new("toy");
    let nvcc = nvcc_wrapper(&t, "sleep 1");
    let spawn = |out: &str| {
        t.cmd()
            .env("FLASHGEN_NVCC", &nvcc)
            .args(["build", "--out", out, "--json"])
            .args(one())
            .output()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| spawn("out-a").unwrap());
        let b = s.spawn(|| spawn("out-b").unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_success(&a);
    assert_success(&b);
    assert_eq!(compiles_logged(&t), 1, "nvcc ran more than once");
    let built = json(&a)["built"].as_u64().unwrap() + json(&b)["built"].as_u64().unwrap();
    assert_eq!(built, 1);
    assert_eq!(
        std::fs::read(t.path("out-a").join(format!(
            "{}.so",
            json(&a)["instances"][0]["uri"].as_str().unwrap()
        )))
        .unwrap(),
        std::fs::read(t.path("out-b").join(format!(
            "{}.so",
            json(&b)["instances"][0]["uri"].as_str().unwrap()
        )))
        .unwrap()
    );
}

/// Pids of live processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmd.contains(needle).then_some((pid, cmd))
        })
        .collect()
}

#[test]
fn kill_9_of_a_build_leaves_no_nvcc_running_and_publishes_nothing() {
    let t = Tree::new("toy");
    // A grandchild that would outlive nvcc, as cicc or ptxas would.
    // (`; true` keeps sh from exec'ing sleep, so the command line keeps the marker path.)
    let needle = t.dir.path().display().to_string();
    let nvcc = nvcc_wrapper(
        &t,
        &format!("sh -c 'sleep 60; true' '{needle}/slow-child' &"),
    );
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("flashgen"))
        .current_dir(t.dir.path())
        .env("FLASHGEN_CACHE_DIR", t.path(".cache"))
        .env("FLASHGEN_NVCC", &nvcc)
        .args(["build", "--out", "out", "--quiet", "--jobs", "2"])
        .args(wheres(&["dtype=f16", "width=32", "fast=true", "mode=sum"]))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while compiles_logged(&t) < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(compiles_logged(&t), 2, "both compiles started");
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        processes_mentioning(&format!("{needle}/slow-child")).len() >= 2,
        "the slow grandchildren run"
    );
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = processes_mentioning(&needle);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = processes_mentioning(&needle);
    }
    assert!(left.is_empty(), "still running: {left:?}");
    assert!(
        walk(&t.path(".cache/objects")).is_empty(),
        "nothing is published"
    );
    assert!(!t.path("out/manifest.json").exists());
}

// ---- jobs, generate, clean -----------------------------------------------------------------

#[test]
fn bad_job_counts_are_usage_errors() {
    let t = Tree::new("toy");
    let o = t.run(&["build", "--out", "out", "--jobs", "0"]);
    assert_usage_error(&o, &["--jobs 0"]);
    for v in ["abc", "0"] {
        let o = t
            .cmd()
            .env("MAX_JOBS", v)
            .args(["build", "--out", "out"])
            .output()
            .unwrap();
        assert_usage_error(&o, &["MAX_JOBS"]);
    }
    assert!(walk(&t.path(".cache/objects")).is_empty());
}

#[test]
fn generate_without_nvcc_writes_commands_that_name_nvcc() {
    let t = Tree::new("toy");
    let o = without_toolchain(t.cmd())
        .env("FLASHGEN_PYTHON", "/nonexistent/python")
        .args(["generate", "--out", "gen"])
        .args(one())
        .output()
        .unwrap();
    assert_success(&o);
    assert!(stderr(&o).contains("compile_commands.json will say `nvcc`"));
    let cc: Value = serde_json::from_str(
        &std::fs::read_to_string(t.path("gen/compile_commands.json")).unwrap(),
    )
    .unwrap();
    let args = cc[0]["arguments"].as_array().unwrap();
    assert_eq!(args[0], "nvcc");
    assert!(
        args.iter()
            .any(|a| a == "-gencode=arch=compute_80,code=sm_80"),
        "{args:?}"
    );
    assert!(
        args.iter()
            .any(|a| a.as_str().unwrap().ends_with("/include")),
        "{args:?}"
    );
}

#[test]
fn clean_removes_only_marked_folders_and_the_cache_only_when_asked() {
    let t = Tree::new("toy");
    // An unmarked folder at the default output path survives.
    std::fs::create_dir_all(t.path("build/flashgen")).unwrap();
    t.write("build/flashgen/notes.txt", "mine");
    // A marked one goes, but not in a dry run.
    std::fs::create_dir_all(t.path("build/wheel")).unwrap();
    t.write("build/wheel/.flashgen-build", "");
    assert!(t.run(&["doctor"]).status.success(), "creates the cache");

    let o = t.run(&["clean", "--cache", "--dry-run"]);
    assert_success(&o);
    assert_stderr_has(&o, "would remove");
    assert!(t.path("build/wheel").is_dir() && t.path(".cache").is_dir());

    let o = t.run(&["clean"]);
    assert_success(&o);
    assert_stderr_has(&o, "not a flashgen build folder");
    assert!(t.path("build/flashgen/notes.txt").is_file());
    assert!(!t.path("build/wheel").exists());
    assert!(t.path(".cache").is_dir(), "the cache needs --cache");

    // FLASHGEN_CACHE_DIR=. in a source tree: nothing deleted, and the reason given.
    let o = t
        .cmd()
        .env("FLASHGEN_CACHE_DIR", ".")
        .args(["clean", "--cache"])
        .output()
        .unwrap();
    assert_success(&o);
    assert_stderr_has(&o, "not a flashgen cache");
    assert!(t.path("variants.json").is_file() && t.path("csrc").is_dir());

    let o = t.run(&["clean", "--cache"]);
    assert_success(&o);
    assert!(!t.path(".cache").exists());
}

/// Regular files under `dir` (none when it does not exist).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .flat_map(|e| {
            if e.file_type().unwrap().is_dir() {
                walk(&e.path())
            } else {
                vec![e.path()]
            }
        })
        .collect()
}
