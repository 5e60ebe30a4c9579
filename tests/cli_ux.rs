//! The command line as users meet it: a bare `flashgen`, `-v` on every verb (nvcc commands
//! echoed as they start), `doctor`'s report of the installation around it, and a JIT-only
//! wheel (`build-wheel --no-aot`) built without any CUDA toolchain.

use std::path::Path;

use serde_json::Value;

mod common;
use common::*;

/// The toy instance the compiling tests build (width 32 is its cheapest).
const ONE: &[&str] = &[
    "--module",
    "toy",
    "--where",
    "dtype=f16",
    "--where",
    "width=32",
    "--where",
    "fast=false",
    "--where",
    "mode=sum",
    "--where",
    "variant=plain",
];

fn traced(o: &std::process::Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| l.starts_with("+ "))
        .map(str::to_string)
        .collect()
}

#[test]
fn bare_flashgen_prints_the_help_and_exits_0() {
    let t = Tree::new("toy");
    let o = t.run(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for verb in [
        "list-variants",
        "describe",
        "generate",
        "build",
        "build-wheel",
        "clean",
        "doctor",
        "jit",
    ] {
        assert!(out.contains(verb), "the help lacks {verb}:\n{out}");
    }
    assert!(out.contains("--verbose"), "{out}");
}

#[test]
fn every_verb_takes_verbose() {
    let t = Tree::new("toy");
    let cases: &[&[&str]] = &[
        &["list-variants", "-v", "--json"],
        &["describe", "--verbose"],
        &["-v", "generate", "--out", "gen"],
        &["clean", "-v", "--dry-run"],
    ];
    for args in cases {
        let o = t.run(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    }
    // doctor exits 2 where there is no nvcc, but reports all the same.
    assert!(json(&t.run(&["doctor", "-v", "--json"]))["cache"].is_string());
    // The verbs that compile, checked for parsing only here (the compiles are below).
    for verb in ["build", "build-wheel", "jit"] {
        let o = t.run(&[verb, "-v", "--help"]);
        assert_eq!(o.status.code(), Some(0), "{verb}: {}", stderr(&o));
    }
}

#[test]
fn verbose_build_and_jit_print_each_nvcc_command_as_it_runs() {
    let Some(_) = require(
        project_nvcc(),
        "no nvcc (FLASHGEN_NVCC or the project venv)",
    ) else {
        return;
    };
    let t = Tree::new("toy");
    let o = t
        .cmd()
        .args(["build", "-v", "--out", "out", "--arch", "8.0"])
        .args(ONE)
        .output()
        .unwrap();
    assert_success(&o);
    let nvcc = traced(&o)
        .into_iter()
        .filter(|l| l.contains("toy.cu"))
        .collect::<Vec<_>>();
    assert_eq!(nvcc.len(), 1, "one compile, one nvcc line:\n{}", stderr(&o));
    assert!(nvcc[0].contains("nvcc") && nvcc[0].contains("-gencode=arch=compute_80,code=sm_80"));

    // The JIT's compile (another arch, so not a cache hit) is echoed too; stdout stays JSON.
    let o = t
        .cmd()
        .args(["jit", "-v", "--device-cc", "9.0"])
        .args(ONE)
        .output()
        .unwrap();
    assert_success(&o);
    assert_eq!(json(&o)["source"], "compiled");
    assert!(
        traced(&o).iter().any(|l| l.contains("sm_90a")),
        "{}",
        stderr(&o)
    );

    // Without -v nothing is echoed, and an inherited FLASHGEN_TRACE_FD (here stdout) is
    // ignored: the JSON on stdout stays clean.
    std::fs::remove_dir_all(t.path(".cache")).unwrap();
    let o = t
        .cmd()
        .env("FLASHGEN_TRACE_FD", "1")
        .args(["build", "--json", "--out", "out2", "--arch", "8.0"])
        .args(ONE)
        .output()
        .unwrap();
    assert_success(&o);
    assert_eq!(json(&o)["built"], 1);
    assert!(traced(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn doctor_reports_version_host_compiler_origin_torch_and_gpu() {
    let t = Tree::new("toy");
    let o = t
        .cmd()
        .env("NVCC_CCBIN", which_gxx())
        .env("FLASHGEN_PYTHON", "/nonexistent/python3")
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v = json(&o);
    assert_eq!(v["flashgen_version"], env!("CARGO_PKG_VERSION"));
    assert!(v["wheel"].is_null(), "not inside a wheel: {v}");
    assert_error_field(&v, "torch", |e| e.contains("/nonexistent/python3"));
    // A GPU is reported or its absence explained; either way the key is there.
    assert!(
        v["gpus"].is_array() || v["gpus"]["error"].is_string(),
        "{v}"
    );
    if require(
        project_nvcc(),
        "doctor's toolchain checks need nvcc (FLASHGEN_NVCC or the project venv)",
    )
    .is_some()
    {
        assert_eq!(
            v["toolchain"]["host_compiler_found_by"], "NVCC_CCBIN",
            "{v}"
        );
        let text = stdout(
            &t.cmd()
                .env("NVCC_CCBIN", which_gxx())
                .arg("doctor")
                .output()
                .unwrap(),
        );
        assert!(
            text.contains(&format!("flashgen:      {}", env!("CARGO_PKG_VERSION"))),
            "{text}"
        );
        assert!(text.contains("from NVCC_CCBIN"), "{text}");
        assert!(text.contains("torch:") && text.contains("gpu:"), "{text}");
    }
}

#[test]
fn doctor_inside_an_installed_wheel_reports_its_precompiled_set() {
    let t = Tree::new("toy");
    // The installed layout: <package>/_bin/flashgen beside <package>/_aot/manifest.json.
    let pkg = t.path("site/flashgen");
    std::fs::create_dir_all(pkg.join("_bin")).unwrap();
    std::fs::create_dir_all(pkg.join("_aot")).unwrap();
    let bin = pkg.join("_bin/flashgen");
    std::fs::copy(assert_cmd::cargo::cargo_bin("flashgen"), &bin).unwrap();
    let manifest = serde_json::json!({"archs": ["sm_80", "sm_90a"],
        "instances": [{"uri": "a"}, {"uri": "b"}, {"uri": "c"}]});
    std::fs::write(pkg.join("_aot/manifest.json"), manifest.to_string()).unwrap();
    let o = std::process::Command::new(&bin)
        .current_dir(t.path(""))
        .env("FLASHGEN_CACHE_DIR", t.path(".cache"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let w = &json(&o)["wheel"];
    assert_eq!(w["precompiled"], 3, "{w}");
    assert_eq!(w["archs"], serde_json::json!(["sm_80", "sm_90a"]));
    let text = stdout(
        &std::process::Command::new(&bin)
            .current_dir(t.path(""))
            .env("FLASHGEN_CACHE_DIR", t.path(".cache"))
            .arg("doctor")
            .output()
            .unwrap(),
    );
    assert!(
        text.contains("3 precompiled instances for sm_80 sm_90a"),
        "{text}"
    );
}

#[test]
fn a_jit_only_wheel_needs_no_toolchain_and_ships_an_empty_manifest() {
    let t = Tree::new("toy");
    t.with_python_package();
    let o = without_toolchain(t.cmd())
        .args(["build-wheel", "--no-aot", "--out", "dist", "-q"])
        .output()
        .unwrap();
    assert_success(&o);
    let path = stdout(&o).trim().to_string();
    assert!(path.ends_with(".whl"), "{path}");
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&path).unwrap()).unwrap();
    let names: Vec<String> = zip.file_names().map(str::to_string).collect();
    assert!(!names.iter().any(|n| n.ends_with(".so")), "{names:?}");
    for needed in [
        "flashgen/_bin/flashgen",
        "flashgen/_src/variants.json",
        "flashgen/_data/matrix.json",
    ] {
        assert!(names.iter().any(|n| n == needed), "no {needed}: {names:?}");
    }
    let manifest: Value =
        serde_json::from_str(&zip_text(&mut zip, "flashgen/_aot/manifest.json")).unwrap();
    assert_eq!(manifest["instances"], serde_json::json!([]));
    assert_eq!(manifest["runs_on"], serde_json::json!([]));
    assert!(
        !Path::new(&t.path("build/wheel")).exists(),
        "nothing was built"
    );

    // Filters would select what to precompile: they contradict --no-aot.
    let o = t.run(&["build-wheel", "--no-aot", "--module", "toy"]);
    assert_usage_error(&o, &["--no-aot", "--module"]);
}

fn which_gxx() -> String {
    ["/usr/bin/g++", "/usr/bin/c++"]
        .iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or(&"g++")
        .to_string()
}
