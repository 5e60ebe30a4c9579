//! Scale-out: the two nvcc steps give the one-step bytes, the compile launcher, `generate
//! --ninja` run by ninja, sccache hitting across output folders (skipped without sccache), and
//! a loopback sccache-dist cluster (skipped where sccache-dist or bubblewrap cannot run).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::*;

const ONE: [&str; 5] = [
    "dtype=bf16",
    "width=32",
    "fast=false",
    "mode=max",
    "variant=scaled",
];

/// The loopback sccache-dist test runs alone: its build server and scheduler time out or fall
/// back to local compiles when the other tests of this file compile beside it on a small
/// machine. The others share the lock among themselves.
static DIST_ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    DIST_ALONE.read().unwrap_or_else(|e| e.into_inner())
}

fn uri(terms: &[&str]) -> String {
    let mut u = "toy".to_string();
    for t in terms {
        let (k, v) = t.split_once('=').unwrap();
        u.push_str(&format!("_{k}_{v}"));
    }
    u
}

#[test]
fn two_steps_give_the_bytes_of_the_one_step_build() {
    let _shared = shared();
    let t = Tree::new("toy");
    // Two steps (a launcher in front of the compile: `env`, which only runs it) and, with a
    // cache of its own, the build's one nvcc call when there is no launcher.
    let mut split_args = vec!["--launcher".to_string(), "env".to_string()];
    split_args.extend(wheres(&ONE));
    let b = build_json(&t, "out", &split_args);
    let split = std::fs::read(b["instances"][0]["path"].as_str().unwrap()).unwrap();
    let one_step = build_json_with(
        t.cmd().env("FLASHGEN_CACHE_DIR", t.path("cache-one-step")),
        "one-step",
        &wheres(&ONE),
    );
    assert_eq!(one_step["built"], 1, "{one_step}");
    assert_eq!(
        one_step["instances"][0]["fingerprint"],
        b["instances"][0]["fingerprint"]
    );
    assert!(
        std::fs::read(one_step["instances"][0]["path"].as_str().unwrap()).unwrap() == split,
        "the one-step build differs from compile + link"
    );

    // The one-step command written out by hand, with the same flags, through the link step's
    // relative layout (`.cuda` -> the toolchain's root).
    let o = t
        .cmd()
        .args(["generate", "--out", "gen"])
        .args(wheres(&ONE))
        .output()
        .unwrap();
    assert_success(&o);
    let nvcc = project_nvcc().expect("the project venv's nvcc");
    let root = nvcc.parent().unwrap().parent().unwrap();
    let one = t.path("one.so");
    std::os::unix::fs::symlink(root, t.path(".cuda")).unwrap();
    let mut cmd = std::process::Command::new(".cuda/bin/nvcc");
    cmd.current_dir(t.path("."))
        .args([
            "-shared",
            "-Xcompiler=-fPIC",
            "-cudart=none",
            "-Xlinker=--strip-all",
            "-Xlinker=--build-id=none",
            "-Xlinker=-l:libcudart.so.13",
            "-O2",
            "-std=c++17",
            "-Xcompiler=-fvisibility=hidden",
            "-Xfatbin=-compress-all",
            "--compress-mode=size",
            "-gencode=arch=compute_80,code=sm_80",
        ])
        .arg(format!("-I{}", t.path("gen").join(uri(&ONE)).display()))
        .arg(format!("-I{}", t.path("include").display()));
    for lib in ["lib64", "lib"].iter().filter(|d| root.join(d).is_dir()) {
        cmd.arg(format!("-L.cuda/{lib}"));
    }
    let run = cmd
        .arg(t.path("csrc/toy.cu"))
        .arg("-o")
        .arg(&one)
        .output()
        .unwrap();
    assert_success(&run);
    assert!(
        std::fs::read(&one).unwrap() == split,
        "compile + link differs from the one-step build"
    );
}

#[test]
fn so_bytes_do_not_depend_on_where_the_toolchain_is_installed() {
    let _shared = shared();
    let t = Tree::new("toy");
    let nvcc = project_nvcc().expect("the project venv's nvcc");
    let root = nvcc.parent().unwrap().parent().unwrap();
    // The same toolchain at another path (a symlink: nvcc takes its folder from how it was
    // started, so to nvcc this is another installation), with its own cache.
    let elsewhere = t.path("opt/other place/cu13");
    std::fs::create_dir_all(elsewhere.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(root, &elsewhere).unwrap();
    let build = |nvcc: &Path, out: &str| {
        let o = t
            .cmd()
            .env("FLASHGEN_NVCC", nvcc)
            .env("FLASHGEN_CACHE_DIR", t.path(&format!("cache-{out}")))
            .args(["build", "--json", "--no-compress", "--out", out])
            .args(wheres(&ONE))
            .output()
            .unwrap();
        assert_success(&o);
        let b = json(&o);
        assert_eq!(b["built"], 1, "{b}");
        std::fs::read(b["instances"][0]["path"].as_str().unwrap()).unwrap()
    };
    let here = build(&nvcc, "here");
    let there = build(&elsewhere.join("bin/nvcc"), "there");
    assert!(here == there, "the .so depends on the toolchain's path");
    // Neither path is in the bytes (uncompressed fatbins would show one in a device link's option
    // string; with the shared runtime nvcc runs no device link, so there is none).
    for path in [root, elsewhere.as_path()] {
        let p = path.display().to_string();
        assert!(
            !here.windows(p.len()).any(|w| w == p.as_bytes()),
            "{p} is in the .so"
        );
    }
    let text = String::from_utf8_lossy(&here);
    assert!(!text.contains("-L .cuda/lib"), "a device link ran");
}

/// The project's own modules, one instance each (sm_90a, both backends among them), built from
/// two copies of the sources at different paths give the same bytes, so an instance the JIT
/// builds from an installed wheel's `_src/` equals the one the wheel ships. What this guards:
/// nvcc names an anonymous namespace after a hash of the source file's real path, and a kernel's
/// name is in the `.so`, so a kernel in an anonymous namespace made batch_decode's bytes depend
/// on the checkout's path.
#[test]
fn so_bytes_do_not_depend_on_where_the_sources_are() {
    let _shared = shared();
    let nvcc = project_nvcc().expect("the project venv's nvcc");
    let top = tempfile::tempdir().unwrap();
    const COMMON: [&str; 4] = [
        "dtype=bf16",
        "head_dim=128",
        "pos_encoding=none",
        "variant=default",
    ];
    let modules: [(&str, &[&str]); 6] = [
        ("single_decode", &["backend=sm90"]),
        ("batch_decode", &["page_size=16", "kv_dtype=same"]),
        (
            "single_prefill",
            &["mask=causal", "backend=portable", "kv_dtype=same"],
        ),
        (
            "batch_prefill_ragged",
            &["mask=causal", "backend=sm90", "kv_dtype=same"],
        ),
        (
            "batch_prefill_paged",
            &[
                "mask=causal",
                "page_size=16",
                "backend=portable",
                "kv_dtype=same",
            ],
        ),
        ("merge_state", &[]),
    ];
    // merge_state has none of the attention axes, only the dtype.
    let common = |module: &str| {
        if module == "merge_state" {
            &COMMON[..1]
        } else {
            &COMMON[..]
        }
    };
    let build = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::copy(repo().join("variants.json"), dir.join("variants.json")).unwrap();
        copy_dir(&repo().join("csrc"), &dir.join("csrc"));
        copy_dir(&repo().join("include"), &dir.join("include"));
        let mut built = Vec::new();
        for (module, terms) in modules {
            let o = assert_cmd::Command::cargo_bin("flashgen")
                .unwrap()
                .current_dir(dir)
                .env("FLASHGEN_CACHE_DIR", dir.join(".cache"))
                .env("FLASHGEN_NVCC", &nvcc)
                .env_remove("FLASHGEN_MANYLINUX")
                .args(["build", "--json", "--no-compress", "--out", "out"])
                .args(["--arch", "9.0a", "--module", module])
                .args(wheres(common(module)))
                .args(wheres(terms))
                .output()
                .unwrap();
            assert!(o.status.success(), "{module}: {}", stderr(&o));
            let b = json(&o);
            assert_eq!(b["built"], 1, "{module}: {b}");
            let path = b["instances"][0]["path"].as_str().unwrap().to_string();
            built.push((module.to_string(), std::fs::read(&path).unwrap()));
        }
        built
    };
    let here = build(&top.path().join("checkout"));
    let there = build(&top.path().join("site packages/flashgen/_src"));
    for ((module, a), (_, b)) in here.iter().zip(&there) {
        assert!(a == b, "{module}: the .so depends on where the sources are");
        let text = String::from_utf8_lossy(a);
        assert!(
            !text.contains("_GLOBAL__N_"),
            "{module}: a name in the .so is in an anonymous namespace (nvcc hashes the source's path into it)"
        );
    }
}

#[test]
fn a_failing_compile_prints_the_step_alone() {
    let _shared = shared();
    let t = Tree::new("toy");
    t.write(
        "include/toy/variants/scaled.cuh",
        "#error broken on purpose\n",
    );
    // Without a launcher the build is one nvcc call; with one, the compile step fails alone.
    for launcher in [&[][..], &["--launcher", "env"][..]] {
        let o = t
            .cmd()
            .args(["build", "--out", "out"])
            .args(launcher)
            .args(wheres(&ONE))
            .output()
            .unwrap();
        assert!(!o.status.success());
        let err = stderr(&o);
        let line = err
            .lines()
            .skip_while(|l| !l.starts_with("command (reproduces"))
            .nth(1)
            .unwrap_or_else(|| panic!("{err}"))
            .trim();
        if launcher.is_empty() {
            // Run in the build's private folder, which the failure removed: the line makes it.
            assert!(
                line.starts_with("mkdir -p ") && line.contains(" && cd "),
                "{line}"
            );
            assert!(
                line.contains("-shared") && line.contains("toy.cu "),
                "{line}"
            );
            assert!(!line.contains(" -c "), "{line}");
        } else {
            assert!(line.starts_with("cd ") && line.contains("env "), "{line}");
            assert!(line.contains(" -c ") && !line.contains("-shared"), "{line}");
        }
        // Pasted into a shell, it fails the same way.
        let again = std::process::Command::new("sh")
            .args(["-c", line])
            .current_dir("/")
            .output()
            .unwrap();
        assert!(!again.status.success());
        assert!(
            String::from_utf8_lossy(&again.stderr).contains("broken on purpose"),
            "{line}"
        );
    }
}

#[test]
fn a_launcher_that_is_not_found_is_a_usage_error() {
    let _shared = shared();
    let t = Tree::new("toy");
    let o = t.run(&["build", "--out", "out", "--launcher", "no-such-launcher-x"]);
    assert_usage_error(&o, &["--launcher", "`no-such-launcher-x` was not found"]);
    let o = t
        .cmd()
        .env("FLASHGEN_NVCC_LAUNCHER", "/no/such/launcher --flag")
        .args(["jit", "--device-cc", "8.0", "--module", "toy"])
        .args(wheres(&ONE))
        .output()
        .unwrap();
    assert_usage_error(&o, &["FLASHGEN_NVCC_LAUNCHER", "/no/such/launcher"]);
    let o = t.run(&["build", "--out", "out", "--launcher", "'unterminated"]);
    assert_usage_error(&o, &["unterminated single quote"]);
}

/// A launcher that records its arguments, then runs them.
fn recording_launcher(t: &Tree) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = t.path("launch.sh");
    t.write(
        "launch.sh",
        &format!(
            "#!/bin/sh\necho \"$@\" >> {}\nexec \"$@\"\n",
            t.path("launched.txt").display()
        ),
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn the_launcher_runs_the_compile_only_and_stays_out_of_the_key() {
    let _shared = shared();
    let t = Tree::new("toy");
    let plain = build_json(&t, "plain", &wheres(&ONE));
    let launcher = recording_launcher(&t);
    // A fresh cache: the launched build compiles, with the same key and bytes.
    let launched = build_json_with(
        t.cmd()
            .env("FLASHGEN_CACHE_DIR", t.path("cache2"))
            .env("FLASHGEN_NVCC_LAUNCHER", format!("{} ", launcher.display())),
        "launched",
        &wheres(&ONE),
    );
    assert_eq!(launched["built"], 1);
    let log = std::fs::read_to_string(t.path("launched.txt")).unwrap();
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(log.contains(" -c ") && !log.contains("-shared"), "{log}");
    let (a, b) = (&plain["instances"][0], &launched["instances"][0]);
    assert_eq!(a["fingerprint"], b["fingerprint"]);
    assert_eq!(a["sha256"], b["sha256"]);
    // doctor shows it.
    let o = t
        .cmd()
        .env("FLASHGEN_NVCC_LAUNCHER", launcher.display().to_string())
        .args(["doctor"])
        .output()
        .unwrap();
    assert!(
        stdout(&o).contains(&format!("launcher:      {}", launcher.display())),
        "{}",
        stdout(&o)
    );
}

#[test]
fn the_jit_honours_the_launcher_variable() {
    let _shared = shared();
    // The Python loader runs `flashgen jit` with its own environment, so the variable reaches it.
    let t = Tree::new("toy");
    let launcher = recording_launcher(&t);
    let o = t
        .cmd()
        .env("FLASHGEN_NVCC_LAUNCHER", &launcher)
        .args(["jit", "--device-cc", "8.0", "--module", "toy"])
        .args(wheres(&ONE))
        .output()
        .unwrap();
    assert_success(&o);
    assert_eq!(json(&o)["source"], "compiled");
    let log = std::fs::read_to_string(t.path("launched.txt")).unwrap();
    assert!(
        log.contains(" -c ") && log.contains(&format!("-I{}", uri(&ONE))),
        "{log}"
    );
}

#[test]
fn nvcc_environment_flags_key_the_cache() {
    let _shared = shared();
    let t = Tree::new("toy");
    let key = |var: Option<(&str, &str)>| -> Value {
        let mut c = t.cmd();
        c.env_remove("NVCC_PREPEND_FLAGS")
            .env_remove("NVCC_APPEND_FLAGS");
        if let Some((k, v)) = var {
            c.env(k, v);
        }
        let o = c
            .args(["list-variants", "--json", "--module", "toy"])
            .args(wheres(&ONE))
            .output()
            .unwrap();
        assert_success(&o);
        json(&o)[0]["built"].clone()
    };
    // Built without the variables: cached for a build without them, not for one with them.
    build_json(&t, "out", &wheres(&ONE));
    assert_eq!(key(None), Value::Bool(true));
    assert_eq!(
        key(Some(("NVCC_APPEND_FLAGS", "-DTOY_EXTRA=1"))),
        Value::Bool(false)
    );
    assert_eq!(
        key(Some(("NVCC_PREPEND_FLAGS", "-lineinfo"))),
        Value::Bool(false)
    );
    assert_eq!(key(Some(("NVCC_APPEND_FLAGS", ""))), Value::Bool(true));
}

fn read_so(dir: &Path, uri: &str) -> Vec<u8> {
    std::fs::read(dir.join(format!("{uri}.so"))).unwrap()
}

#[test]
fn ninja_builds_the_plan_with_flashgens_bytes() {
    let _shared = shared();
    let Some(ninja) = tool("ninja") else {
        panic!("ninja (ci/requirements-test.txt) is missing: run ci/setup.sh")
    };
    let t = Tree::new("toy");
    let sel = wheres(&[
        "dtype=f16",
        "fast=true",
        "mode=sum",
        "variant=plain",
        "width=32",
    ]);
    let b = build_json(&t, "out", &sel);
    let launcher = recording_launcher(&t);
    let o = t
        .cmd()
        .args(["generate", "--ninja", "--out", "gen", "--launcher"])
        .arg(&launcher)
        .args(&sel)
        .output()
        .unwrap();
    assert_success(&o);
    let text = std::fs::read_to_string(t.path("gen/build.ninja")).unwrap();
    assert!(
        text.contains("rule compile\n  command = $launcher $cmd"),
        "{text}"
    );
    let run = std::process::Command::new(ninja)
        .arg("-C")
        .arg(t.path("gen"))
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stdout(&run));
    for row in b["instances"].as_array().unwrap() {
        let uri = row["uri"].as_str().unwrap();
        assert!(
            read_so(&t.path("gen"), uri) == read_so(&t.path("out"), uri),
            "{uri}: ninja's bytes differ from flashgen's"
        );
    }
    assert_eq!(
        std::fs::read_to_string(t.path("launched.txt"))
            .unwrap()
            .lines()
            .count(),
        1
    );
    // compile_commands.json lists the compile step, as ninja ran it.
    let cc = first_compile_command(&t.path("gen"));
    let args = arguments(&cc);
    assert!(args.contains(&"-c") && !args.iter().any(|a| a.starts_with("-L")));
}

/// A free port on 127.0.0.1 (the listener is closed on return).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private sccache server (own folder, own port, own config), stopped when dropped.
struct Sccache {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    conf: PathBuf,
}

impl Sccache {
    /// No user config: a local disk cache, no distributed compilation.
    fn start(bin: PathBuf, dir: PathBuf) -> Sccache {
        Sccache::start_with(bin, dir, "/dev/null".into())
    }
    fn start_with(bin: PathBuf, dir: PathBuf, conf: PathBuf) -> Sccache {
        let port = free_port();
        let s = Sccache {
            bin,
            dir,
            port,
            conf,
        };
        let o = s.cmd().arg("--start-server").output().unwrap();
        assert_success(&o);
        s
    }
    fn cmd(&self) -> std::process::Command {
        let mut c = std::process::Command::new(&self.bin);
        c.envs(self.vars());
        c
    }
    /// The server's private settings, for sccache and for the builds that launch it.
    fn vars(&self) -> [(&'static str, String); 4] {
        [
            ("SCCACHE_DIR", self.dir.display().to_string()),
            ("SCCACHE_SERVER_PORT", self.port.to_string()),
            ("SCCACHE_IDLE_TIMEOUT", "300".into()),
            ("SCCACHE_CONF", self.conf.display().to_string()),
        ]
    }
    /// `sccache --show-stats --stats-format json`.
    fn stats(&self) -> Value {
        let o = self
            .cmd()
            .args(["--show-stats", "--stats-format", "json"])
            .output()
            .unwrap();
        assert_success(&o);
        serde_json::from_slice(&o.stdout).unwrap()
    }
    /// Cache hits so far, per sccache's language counters summed.
    fn hits(&self) -> (u64, Value) {
        let v = self.stats();
        let counts = &v["stats"]["cache_hits"]["counts"];
        let n = counts
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        (n, counts.clone())
    }
}

impl Drop for Sccache {
    fn drop(&mut self) {
        let _ = self.cmd().arg("--stop-server").output();
    }
}

#[test]
fn sccache_hits_across_output_folders_with_the_same_bytes() {
    let _shared = shared();
    let Some(bin) = require(
        tool("sccache"),
        "sccache (ci/requirements-test.txt) is not installed",
    ) else {
        return;
    };
    let t = Tree::new("toy");
    let server = Sccache::start(bin.clone(), t.path("sccache"));
    let sel = wheres(&["dtype=bf16", "fast=false", "mode=max", "variant=scaled"]);
    let build = |cache: &str, out: &str| {
        let start = Instant::now();
        let o = t
            .cmd()
            .envs(server.vars())
            .env("FLASHGEN_CACHE_DIR", t.path(cache))
            .args(["build", "--json", "--jobs", "2", "--out", out, "--launcher"])
            .arg(&bin)
            .args(&sel)
            .output()
            .unwrap();
        assert_success(&o);
        let v = json(&o);
        assert_eq!(
            v["built"], 3,
            "every instance compiled (the flashgen cache is empty)"
        );
        (v, start.elapsed())
    };
    let (a, cold) = build("cache-a", "out-a");
    let (before, _) = server.hits();
    let (b, warm) = build("cache-b", "elsewhere/out-b");
    let (after, counts) = server.hits();
    eprintln!(
        "sccache: cold {:.2}s, warm {:.2}s, hits {before} -> {after} ({counts})",
        cold.as_secs_f64(),
        warm.as_secs_f64()
    );
    assert_eq!(
        counts["CUDA"].as_u64(),
        Some(3),
        "each compile hits from the other folder: {counts}"
    );
    for (ra, rb) in zip_instances(&a, &b) {
        assert_eq!(ra["sha256"], rb["sha256"]);
        let (pa, pb) = (ra["path"].as_str().unwrap(), rb["path"].as_str().unwrap());
        assert_ne!(pa, pb);
        assert!(std::fs::read(pa).unwrap() == std::fs::read(pb).unwrap());
    }
}

/// Polls `ready` every 200 ms for at most `limit`; whether it became true.
fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if ready() {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One `sccache-dist` daemon (scheduler or build server) of the loopback cluster, in the
/// foreground under `timeout`, so it ends by itself even if this test is killed; dropping it
/// stops it (SIGTERM, which `timeout` passes to its whole process group: the daemon and the
/// sandboxed compiles it started) and reaps it.
struct DistDaemon {
    child: std::process::Child,
    log: PathBuf,
}

/// The most any daemon of the loopback cluster may live.
const DIST_LIFETIME: &str = "300";

impl DistDaemon {
    fn start(dist: &Path, role: &str, conf: &Path, log: PathBuf) -> DistDaemon {
        let out = std::fs::File::create(&log).unwrap();
        let child = std::process::Command::new("timeout")
            .args(["-k", "5", DIST_LIFETIME])
            .arg(dist)
            .args([role, "--config"])
            .arg(conf)
            .env("SCCACHE_NO_DAEMON", "1")
            .env("SCCACHE_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        DistDaemon { child, log }
    }
    fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for DistDaemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: kill(2) on our own child's pid, which is not reaped yet.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            if !wait_until(Duration::from_secs(10), || {
                self.child.try_wait().ok().flatten().is_some()
            }) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

/// `sccache-dist auth <verb> <args>`: the one line it prints.
fn dist_auth(dist: &Path, args: &[&str]) -> String {
    let o = std::process::Command::new(dist)
        .arg("auth")
        .args(args)
        .output()
        .unwrap();
    assert_success(&o);
    stdout(&o).trim().to_string()
}

/// sccache and sccache-dist (which CI installs), or None after a skip (see `require`).
fn dist_tools() -> Option<(PathBuf, PathBuf)> {
    let sccache = require(
        tool("sccache"),
        "sccache (ci/requirements-test.txt) is not installed",
    )?;
    let dist = require(
        tool("sccache-dist"),
        "sccache-dist (shipped with sccache, ci/requirements-test.txt) is not installed",
    )?;
    Some((sccache, dist))
}

/// Why this machine cannot run a loopback sccache-dist cluster, if it cannot: what CI may lack
/// too (bubblewrap is installed with apt, as root or through sudo; the build server runs as
/// root), so the test skips on it even under CI, saying why.
fn dist_unavailable() -> Result<(), String> {
    let bwrap = tool("bwrap").ok_or(
        "bubblewrap (`bwrap`, Debian package `bubblewrap`) is not installed; \
         ci/setup.sh installs it under CI or as root",
    )?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the sccache-dist build server runs as root (its sandbox needs it)".into());
    }
    let probe = std::process::Command::new(&bwrap)
        .args([
            "--ro-bind",
            "/",
            "/",
            "--unshare-all",
            "--die-with-parent",
            "true",
        ])
        .output()
        .map_err(|e| format!("bwrap does not run: {e}"))?;
    if !probe.status.success() {
        return Err(format!(
            "bwrap cannot make a sandbox here: {}",
            stderr(&probe).trim()
        ));
    }
    Ok(())
}

#[test]
fn sccache_dist_on_loopback_distributes_the_compiles_with_the_same_bytes() {
    let _alone = DIST_ALONE.write().unwrap_or_else(|e| e.into_inner());
    let Some((sccache, dist)) = dist_tools() else {
        return;
    };
    if let Err(why) = dist_unavailable() {
        return skip_even_under_ci(&format!("loopback sccache-dist: {why}"));
    }
    let t = Tree::new("toy");
    let sel = wheres(&["dtype=bf16", "fast=false", "mode=max", "variant=scaled"]);
    // The reference: a local build without a launcher.
    let local = build_json(&t, "local", &sel);

    // A scheduler and one build server on 127.0.0.1, as a real cluster is set up: the client
    // authenticates to the scheduler with a shared token, the server with a JWT the scheduler's
    // key signed for the server's own address.
    let (sched_port, server_port) = (free_port(), free_port());
    let scheduler_url = format!("http://127.0.0.1:{sched_port}");
    let server_addr = format!("127.0.0.1:{server_port}");
    let client_token = dist_auth(&dist, &["generate-shared-token"]);
    let key = dist_auth(&dist, &["generate-jwt-hs256-key"]);
    // `--secret-key=KEY` in one argument: the random key may begin with '-' (its alphabet is
    // base64url), which the CLI would take for an option (seen: "unexpected argument '-F'").
    let secret_key = format!("--secret-key={key}");
    let server_token = dist_auth(
        &dist,
        &[
            "generate-jwt-hs256-server-token",
            &secret_key,
            "--server",
            &server_addr,
        ],
    );
    t.write(
        "scheduler.conf",
        &format!(
            "public_addr = \"127.0.0.1:{sched_port}\"\n\
             [client_auth]\ntype = \"token\"\ntoken = \"{client_token}\"\n\
             [server_auth]\ntype = \"jwt_hs256\"\nsecret_key = \"{key}\"\n"
        ),
    );
    t.write(
        "server.conf",
        &format!(
            "cache_dir = \"{}\"\npublic_addr = \"{server_addr}\"\n\
             scheduler_url = \"{scheduler_url}\"\n\
             [builder]\ntype = \"overlay\"\nbuild_dir = \"{}\"\nbwrap_path = \"{}\"\n\
             [scheduler_auth]\ntype = \"jwt_token\"\ntoken = \"{server_token}\"\n",
            t.path("server-toolchains").display(),
            t.path("server-build").display(),
            tool("bwrap").unwrap().display(),
        ),
    );
    // The client packages each compiler nvcc runs (cicc, ptxas, cudafe++, the host g++) itself:
    // no `[[dist.toolchains]]` entry is needed for a Linux nvcc.
    t.write(
        "client.conf",
        &format!(
            "[dist]\nscheduler_url = \"{scheduler_url}\"\ntoolchains = []\ncache_dir = \"{}\"\n\
             [dist.auth]\ntype = \"token\"\ntoken = \"{client_token}\"\n",
            t.path("client-toolchains").display(),
        ),
    );
    let mut scheduler = DistDaemon::start(
        &dist,
        "scheduler",
        &t.path("scheduler.conf"),
        t.path("scheduler.log"),
    );
    let mut server = DistDaemon::start(
        &dist,
        "server",
        &t.path("server.conf"),
        t.path("server.log"),
    );
    let client = Sccache::start_with(sccache.clone(), t.path("sccache"), t.path("client.conf"));
    let mut status = String::new();
    let registered = wait_until(Duration::from_secs(30), || {
        if scheduler.exited() || server.exited() {
            return true;
        }
        let o = client.cmd().arg("--dist-status").output().unwrap();
        status = stdout(&o);
        serde_json::from_str::<Value>(&status).is_ok_and(|v| {
            v["SchedulerStatus"][1]["num_servers"]
                .as_u64()
                .is_some_and(|n| n >= 1)
        })
    });
    if !registered || scheduler.exited() || server.exited() {
        return skip_even_under_ci(&format!(
            "loopback sccache-dist: the build server did not register within 30 s \
             (status {status:?})\nscheduler log:\n{}\nserver log:\n{}",
            scheduler.log_tail(),
            server.log_tail()
        ));
    }

    drop(client);

    // One distributed build through a fresh client (its own sccache cache, so every compile
    // misses locally) into a fresh flashgen cache and output folder. A second attempt is made
    // only when sccache reports a distributed step that failed and fell back to a local compile:
    // on a loaded 2-core machine the build server (bubblewrap, packaging the toolchain) has timed
    // out on one step now and then; both attempts failing is a failure.
    let attempt = |n: u32| {
        let client = Sccache::start_with(
            sccache.clone(),
            t.path(&format!("sccache-{n}")),
            t.path("client.conf"),
        );
        let out = format!("dist-{n}");
        let start = Instant::now();
        let o = t
            .cmd()
            .envs(client.vars())
            .env("FLASHGEN_CACHE_DIR", t.path(&format!("cache-dist-{n}")))
            .args([
                "build",
                "--json",
                "--jobs",
                "2",
                "--out",
                &out,
                "--launcher",
            ])
            .arg(&sccache)
            .args(&sel)
            .output()
            .unwrap();
        let wall = start.elapsed();
        assert!(
            o.status.success(),
            "{}\nserver log:\n{}",
            stderr(&o),
            server.log_tail()
        );
        (json(&o), client.stats(), wall, out)
    };
    let (mut built, mut stats, mut wall, mut out) = attempt(1);
    if stats["stats"]["dist_errors"].as_u64() != Some(0) {
        eprintln!(
            "sccache-dist: attempt 1 had dist_errors {}; trying once more\nserver log:\n{}",
            stats["stats"]["dist_errors"],
            server.log_tail()
        );
        (built, stats, wall, out) = attempt(2);
    }
    assert_eq!(built["built"], 3, "every instance compiled");
    let s = &stats["stats"];
    let distributed: u64 = s["dist_compiles"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    eprintln!(
        "sccache-dist: build {:.2}s; dist_compiles {}, dist_errors {}, misses {}",
        wall.as_secs_f64(),
        s["dist_compiles"],
        s["dist_errors"],
        s["cache_misses"]["adv_counts"]
    );
    assert_eq!(
        s["dist_errors"].as_u64(),
        Some(0),
        "{s}\nserver log:\n{}",
        server.log_tail()
    );
    assert!(
        distributed >= 3,
        "each instance's compile ran on the build server: {}",
        s["dist_compiles"]
    );
    assert!(
        s["dist_compiles"].get(&server_addr).is_some(),
        "{}",
        s["dist_compiles"]
    );
    // The same bytes as the local build without a launcher, and the same keys.
    for (rl, rd) in zip_instances(&local, &built) {
        assert_eq!(rl["uri"], rd["uri"]);
        assert_eq!(rl["fingerprint"], rd["fingerprint"]);
        let uri = rl["uri"].as_str().unwrap();
        assert!(
            read_so(&t.path("local"), uri) == read_so(&t.path(&out), uri),
            "{uri}: the distributed build's bytes differ from the local build's"
        );
    }
}
