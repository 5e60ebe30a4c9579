//! The release through the real binary: `build-wheel --release` precompiles the whole matrix for
//! variants.json's `release.archs`, and every wheel is measured against the size budget, which
//! refuses (and removes) a wheel that is over and names what takes the room.

use std::path::Path;

use serde_json::Value;

mod common;
use common::*;

/// Replaces the fixture's variants.json top-level `release`.
fn set_release(t: &Tree, release: Value) {
    t.edit(|v| v["release"] = release);
}

fn manifest_of(wheel: &Path) -> Value {
    wheel_manifest(wheel, "flashgen")
}

#[test]
fn the_budget_refuses_and_removes_a_wheel_that_is_over_and_says_what_takes_the_room() {
    let t = Tree::new("toy");
    t.with_python_package();
    // The shipped binary alone (this test binary's flashgen, several MiB) is over 1 MiB.
    let o = without_toolchain(t.cmd())
        .args([
            "build-wheel",
            "--no-aot",
            "--out",
            "dist",
            "-q",
            "--max-wheel-mib",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("over the budget of 1.0 MiB (--max-wheel-mib)"),
        "{err}"
    );
    assert!(err.contains("the flashgen binary (1 files)"), "{err}");
    assert!(err.contains("it was removed"), "{err}");
    let left: Vec<_> = std::fs::read_dir(t.path("dist"))
        .unwrap()
        .flatten()
        .collect();
    assert!(
        left.is_empty(),
        "an over-budget wheel is not left behind: {left:?}"
    );

    // The budget variants.json declares applies without the flag; a roomy one passes.
    set_release(&t, serde_json::json!({"max_wheel_mib": 1}));
    let o = without_toolchain(t.cmd())
        .args(["build-wheel", "--no-aot", "--out", "dist", "-q"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_stderr_has(&o, "variants.json release.max_wheel_mib");
    set_release(&t, serde_json::json!({"max_wheel_mib": 100}));
    let o = without_toolchain(t.cmd())
        .args(["build-wheel", "--no-aot", "--out", "dist", "-q"])
        .output()
        .unwrap();
    assert_success(&o);

    // A budget that is not a whole number of MiB is bad input.
    set_release(&t, serde_json::json!({"max_wheel_mib": 0.5}));
    let o = t.run(&["list-variants"]);
    assert_usage_error(&o, &["release.max_wheel_mib", "0.5"]);
}

#[test]
fn a_release_is_a_core_wheel_and_one_kernel_wheel_per_release_arch() {
    if project_nvcc().is_none() {
        panic!("no nvcc: install ci/requirements-cuda.txt into .venv (ci/setup.sh)");
    }
    let t = Tree::new("toy");
    t.with_python_package();
    // A two-instance matrix whose AOT subset is one of them; two release archs, one with PTX.
    two_widths(&t, &["8.0+PTX", "9.0a"], serde_json::json!([]));

    let wheels = |args: &[&str]| -> Vec<std::path::PathBuf> {
        // An inherited arch list narrows a plain build, never a release.
        let o = t
            .cmd()
            .env("FLASHGEN_CUDA_ARCH_LIST", "8.0")
            .args(["build-wheel", "--out", "dist", "-q", "-j", "2"])
            .args(args)
            .output()
            .unwrap();
        assert_success(&o);
        stdout(&o).lines().map(std::path::PathBuf::from).collect()
    };
    let summary = |m: &Value| {
        let widths = widths_of(m);
        let targets: Vec<String> = m["runs_on"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["target"].as_str().unwrap().to_string())
            .collect();
        (widths, targets)
    };

    let release = wheels(&["--release"]);
    let names: Vec<String> = release
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[0].starts_with("flashgen_kernels_sm80-0.1.0-py3-none-"),
        "{names:?}"
    );
    assert!(
        names[1].starts_with("flashgen_kernels_sm90a-0.1.0-py3-none-"),
        "{names:?}"
    );
    assert!(
        names[2].starts_with("flashgen-0.1.0-py3-none-"),
        "{names:?}"
    );
    // Each kernel wheel: the whole matrix, built for its architecture alone.
    for (wheel, package, targets) in [
        (
            &release[0],
            "flashgen_kernels_sm80",
            vec!["sm_80", "compute_80"],
        ),
        (&release[1], "flashgen_kernels_sm90a", vec!["sm_90a"]),
    ] {
        let m = wheel_manifest(wheel, package);
        assert_eq!(
            summary(&m),
            (
                vec![32, 64],
                targets.iter().map(|t| t.to_string()).collect()
            )
        );
        let meta = wheel_member(wheel, ".dist-info/METADATA");
        assert!(
            meta.contains("\nRequires-Dist: flashgen==0.1.0\n"),
            "{meta}"
        );
    }
    // The core: no kernels; its manifest names the kernel packages, its extras install them.
    let core = &release[2];
    let m = wheel_manifest(core, "flashgen");
    assert_eq!(m["instances"], serde_json::json!([]));
    let packages: Vec<&str> = field_strs(&m["kernel_packages"], "package");
    assert_eq!(
        packages,
        ["flashgen_kernels_sm80", "flashgen_kernels_sm90a"]
    );
    let meta = wheel_member(core, ".dist-info/METADATA");
    for line in [
        "Provides-Extra: sm80",
        "Provides-Extra: sm90a",
        "Provides-Extra: all",
        "Requires-Dist: flashgen-kernels-sm80==0.1.0; extra == \"sm80\"",
        "Requires-Dist: flashgen-kernels-sm90a==0.1.0; extra == \"all\"",
    ] {
        assert!(meta.contains(line), "{line}: {meta}");
    }
    assert!(
        !std::fs::read_dir(t.path("dist"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains(".tmp")),
        "nothing half-written is left"
    );

    // Reproducible: a cold rebuild (another build folder, an empty cache) gives the same bytes.
    let again = t
        .cmd()
        .env("FLASHGEN_CACHE_DIR", t.path("cold-cache"))
        .args([
            "build-wheel",
            "--release",
            "--out",
            "dist-again",
            "-q",
            "-j",
            "2",
        ])
        .args(["--build-dir", "build-again"])
        .output()
        .unwrap();
    assert_success(&again);
    let rebuilt: Vec<std::path::PathBuf> = stdout(&again)
        .lines()
        .map(std::path::PathBuf::from)
        .collect();
    assert_eq!(rebuilt.len(), release.len());
    for (a, b) in release.iter().zip(&rebuilt) {
        assert_eq!(a.file_name(), b.file_name());
        assert!(
            std::fs::read(a).unwrap() == std::fs::read(b).unwrap(),
            "{} differs after a cold rebuild",
            a.display()
        );
    }

    // Without --release and without filters, one wheel: the AOT subset for `archs`.
    let plain = wheels(&[]);
    assert_eq!(plain.len(), 1);
    assert_eq!(
        summary(&manifest_of(&plain[0])),
        (vec![64], vec!["sm_80".to_string()])
    );
}

/// `jit --no-compile` for `kern width=W` on a device of `cc` answers `backend`, found in
/// `source` (`cache`, `missing`, ...).
#[track_caller]
fn expect_jit(t: &Tree, cc: &str, width: &str, backend: &str, source: &str) {
    let a = jit_answer(t, cc, width);
    assert_eq!(
        (a["params"]["backend"].as_str(), a["source"].as_str()),
        (Some(backend), Some(source)),
        "{cc} width={width}: {a}"
    );
}

#[test]
fn warm_fills_the_jit_cache_with_what_the_device_would_compile() {
    if project_nvcc().is_none() {
        panic!("no nvcc: install ci/requirements-cuda.txt into .venv (ci/setup.sh)");
    }
    let t = Tree::new("backend");
    expect_jit(&t, "9.0", "64", "sm90", "missing");
    // Hopper: each width's sm90 instance (its preferred backend), not the portable one.
    let o = t.run(&["warm", "--device-cc", "9.0", "-j", "2", "--module", "kern"]);
    assert_success(&o);
    assert_eq!(stdout(&o).trim(), "2", "{}", stderr(&o));
    assert_stderr_has(&o, "leaving out 2 of 4");
    for width in ["32", "64"] {
        expect_jit(&t, "9.0", width, "sm90", "cache");
    }
    expect_jit(&t, "8.0", "64", "portable", "missing");
    // Ampere takes the portable backend; a filter narrows the selection; a second warm finds
    // everything ready and compiles nothing.
    let o = t.run(&["warm", "--device-cc", "8.0", "--where", "width=64"]);
    assert_success(&o);
    expect_jit(&t, "8.0", "64", "portable", "cache");
    expect_jit(&t, "8.0", "32", "portable", "missing");
    let o = t.run(&["warm", "--device-cc", "9.0", "--module", "kern"]);
    assert_success(&o);
    assert!(!stderr(&o).contains("compiling"), "{}", stderr(&o));
    // A compute capability that is not MAJOR.MINOR is bad input, named.
    let o = t.run(&["warm", "--device-cc", "x.y"]);
    assert_usage_error(&o, &["--device-cc"]);
}

/// The `width` of each instance a manifest lists.
fn widths_of(manifest: &Value) -> Vec<i64> {
    manifest["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["params"]["width"].as_i64().unwrap())
        .collect()
}

/// Sets the toy module's axes to one value each but `width` (32 and 64; the AOT subset is 64),
/// the module's `release.exclude` and the release's `archs`.
fn two_widths(t: &Tree, archs: &[&str], exclude: Value) {
    t.edit(|v| {
        let axes = &mut v["modules"]["toy"]["axes"];
        for (i, values) in [
            serde_json::json!(["f16"]),
            serde_json::json!([32, 64]),
            serde_json::json!([true]),
            serde_json::json!(["sum"]),
            serde_json::json!(["plain"]),
        ]
        .into_iter()
        .enumerate()
        {
            axes[i]["values"] = values;
        }
        v["modules"]["toy"]["aot"] = serde_json::json!({"include": [{"width": [64]}]});
        v["modules"]["toy"]["release"] = serde_json::json!({ "exclude": exclude });
        v["release"] = serde_json::json!({ "archs": archs });
    });
}

#[test]
fn a_release_leaves_out_what_variants_json_excludes_and_says_why() {
    let t = Tree::new("toy");
    t.with_python_package();
    let reason = "width 32 is for experiments; its first use compiles it";
    two_widths(
        &t,
        &["8.0"],
        serde_json::json!([{"where": {"width": [32]}, "reason": reason}]),
    );
    // list-variants shows which instances a release leaves out, with the reason.
    let o = t.run(&["list-variants", "--json"]);
    assert_success(&o);
    let rows: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let outside: Vec<(i64, Option<&str>)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["params"]["width"].as_i64().unwrap(),
                r["outside_release"].as_str(),
            )
        })
        .collect();
    assert_eq!(outside, [(32, Some(reason)), (64, None)]);

    let o = t
        .cmd()
        .args(["build-wheel", "--release", "--out", "dist", "-j", "2"])
        .output()
        .unwrap();
    assert_success(&o);
    assert!(
        stderr(&o).contains(&format!(
            "the release leaves out 1 instance of toy: {reason}"
        )),
        "{}",
        stderr(&o)
    );
    let kernels = stdout(&o)
        .lines()
        .map(std::path::PathBuf::from)
        .find(|p| p.to_string_lossy().contains("flashgen_kernels_sm80"))
        .expect("a kernel wheel for 8.0");
    let m = wheel_manifest(&kernels, "flashgen_kernels_sm80");
    assert_eq!(widths_of(&m), [64], "only the instance in the release set");

    // A release whose filters select only excluded instances builds nothing, and says so.
    let o = t
        .cmd()
        .args(["build-wheel", "--release", "--out", "dist2", "-q"])
        .args(["--where", "width=32"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the release selects no instance"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_release_exclusion_names_its_field_when_it_is_wrong() {
    for (exclude, needles) in [
        (
            serde_json::json!([{"where": {"depth": [1]}, "reason": "r"}]),
            vec![
                "modules.toy.release.exclude[0].where.depth",
                "no axis `depth`",
            ],
        ),
        (
            serde_json::json!([{"where": {"width": [48]}, "reason": "r"}]),
            vec![
                "release.exclude[0].where.width",
                "value `48` is not on axis",
            ],
        ),
        (
            serde_json::json!([{"where": {"width": [32]}, "reason": " "}]),
            vec!["release.exclude[0].reason", "say why"],
        ),
        (
            serde_json::json!([{"where": {"width": [32]}}]),
            vec!["reason"],
        ),
    ] {
        let t = Tree::new("toy");
        two_widths(&t, &["8.0"], exclude);
        let o = t.run(&["list-variants"]);
        assert_usage_error(&o, &needles);
    }
}
