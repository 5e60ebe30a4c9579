//! Scale-out: the two nvcc steps give the one-step bytes, the compile launcher, `generate
//! --ninja` run by ninja, and sccache hitting across output folders (skipped without sccache).

use std::path::{Path, PathBuf};
use std::time::Instant;

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
    let t = Tree::new("toy");
    let b = build_json(&t, "out", &wheres(&ONE));
    let split = std::fs::read(b["instances"][0]["path"].as_str().unwrap()).unwrap();

    // The command flashgen ran before the split, with the same flags, in one nvcc call.
    let o = t
        .cmd()
        .args(["generate", "--out", "gen"])
        .args(wheres(&ONE))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let nvcc = project_nvcc().expect("the project venv's nvcc");
    let root = nvcc.parent().unwrap().parent().unwrap();
    let one = t.path("one.so");
    let mut cmd = std::process::Command::new(&nvcc);
    cmd.args([
        "-shared",
        "-Xcompiler=-fPIC",
        "-cudart=static",
        "-Xlinker=--strip-all",
        "-Xlinker=--build-id=none",
        "-O2",
        "-std=c++17",
        "-Xcompiler=-fvisibility=hidden",
        "-Xfatbin=-compress-all",
        "-gencode=arch=compute_80,code=sm_80",
    ])
    .arg(format!("-I{}", t.path("gen").join(uri(&ONE)).display()))
    .arg(format!("-I{}", t.path("include").display()));
    for lib in ["lib64", "lib"]
        .map(|d| root.join(d))
        .iter()
        .filter(|d| d.is_dir())
    {
        cmd.arg(format!("-L{}", lib.display()));
    }
    let run = cmd
        .arg(t.path("csrc/toy.cu"))
        .arg("-o")
        .arg(&one)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        std::fs::read(&one).unwrap() == split,
        "compile + link differs from the one-step build"
    );
}

#[test]
fn a_failing_compile_prints_the_step_alone() {
    let t = Tree::new("toy");
    t.write(
        "include/toy/variants/scaled.cuh",
        "#error broken on purpose\n",
    );
    let o = t
        .cmd()
        .args(["build", "--out", "out"])
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
    assert!(line.starts_with("cd ") && line.contains(" -c "), "{line}");
    assert!(!line.contains("-shared"), "{line}");
    // Pasted into a shell, it fails the same way.
    let again = std::process::Command::new("sh")
        .args(["-c", line])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("broken on purpose"));
}

#[test]
fn a_launcher_that_is_not_found_is_a_usage_error() {
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
    let t = Tree::new("toy");
    let plain = build_json(&t, "plain", &wheres(&ONE));
    let launcher = recording_launcher(&t);
    // A fresh cache: the launched build compiles, with the same key and bytes.
    let o = t
        .cmd()
        .env("FLASHGEN_CACHE_DIR", t.path("cache2"))
        .env("FLASHGEN_NVCC_LAUNCHER", format!("{} ", launcher.display()))
        .args(["build", "--out", "launched", "--json"])
        .args(wheres(&ONE))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let launched = json(&o);
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
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json(&o)["source"], "compiled");
    let log = std::fs::read_to_string(t.path("launched.txt")).unwrap();
    assert!(
        log.contains(" -c ") && log.contains(&format!("-I{}", uri(&ONE))),
        "{log}"
    );
}

#[test]
fn nvcc_environment_flags_key_the_cache() {
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
        assert!(o.status.success(), "{}", stderr(&o));
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
    assert!(o.status.success(), "{}", stderr(&o));
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
    let cc: Value = serde_json::from_str(
        &std::fs::read_to_string(t.path("gen/compile_commands.json")).unwrap(),
    )
    .unwrap();
    let args: Vec<&str> = cc[0]["arguments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"-c") && !args.iter().any(|a| a.starts_with("-L")));
}

/// A private sccache server (own folder, own port), stopped when dropped.
struct Sccache {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Sccache {
    fn start(bin: PathBuf, dir: PathBuf) -> Sccache {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let s = Sccache { bin, dir, port };
        let o = s.cmd().arg("--start-server").output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
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
            // No user config: a local disk cache, no distributed compilation.
            ("SCCACHE_CONF", "/dev/null".into()),
        ]
    }
    /// Cache hits so far, per sccache's language counters summed.
    fn hits(&self) -> (u64, Value) {
        let o = self
            .cmd()
            .args(["--show-stats", "--stats-format", "json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
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
    let Some(bin) = tool("sccache") else {
        eprintln!("SKIPPED: sccache (ci/requirements-test.txt) is not installed");
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
        assert!(o.status.success(), "{}", stderr(&o));
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
    for (ra, rb) in a["instances"]
        .as_array()
        .unwrap()
        .iter()
        .zip(b["instances"].as_array().unwrap())
    {
        assert_eq!(ra["sha256"], rb["sha256"]);
        let (pa, pb) = (ra["path"].as_str().unwrap(), rb["path"].as_str().unwrap());
        assert_ne!(pa, pb);
        assert!(std::fs::read(pa).unwrap() == std::fs::read(pb).unwrap());
    }
}
