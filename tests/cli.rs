//! Drives the real `flashgen` binary on fixture matrices: expansion, filters, JSON, generated
//! headers, every bad-input case, the cache, reproducibility, nvcc failures and the dispatching
//! header (compiled with real nvcc and queried through its exported host function).

use std::path::{Path, PathBuf};
use std::process::Output;

use assert_cmd::Command;
use serde_json::Value;

mod common;
use common::*;

// ---- expansion, URIs, filters, JSON ------------------------------------------------------

#[test]
fn expands_every_combination_with_unique_readable_uris() {
    let t = Tree::new("toy");
    let rows = json(&t.run(&["list-variants", "--json"]));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), TOY_INSTANCES);
    let uris: std::collections::HashSet<_> =
        rows.iter().map(|r| r["uri"].as_str().unwrap()).collect();
    assert_eq!(uris.len(), TOY_INSTANCES);
    assert_eq!(
        rows[0]["uri"],
        "toy_dtype_f16_width_32_fast_false_mode_sum_variant_plain"
    );
    assert_eq!(rows[0]["params"]["width"], 32);
    assert_eq!(rows[0]["params"]["fast"], false);
    assert_eq!(rows[0]["codes"]["dtype"], 0);
    assert!(rows.iter().all(|r| r["uri"]
        .as_str()
        .unwrap()
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')));
}

#[test]
fn aot_subset_is_include_minus_exclude() {
    let t = Tree::new("toy");
    let rows = json(&t.run(&["list-variants", "--json", "--aot"]));
    // width=64 and fast=true: 2 dtypes x 2 modes x 2 variants, minus scaled+max (2 dtypes).
    assert_eq!(rows.as_array().unwrap().len(), 6);
    assert!(rows.as_array().unwrap().iter().all(|r| r["aot"] == true
        && r["params"]["width"] == 64
        && !(r["params"]["variant"] == "scaled" && r["params"]["mode"] == "max")));
}

/// The repository's batch_decode: an fp8 KV cache is its `kv_dtype` axis (`same`, the model
/// dtype, first); no fp8 instance is precompiled, and there is none with rope_llama (whose RoPE
/// pre-pass rotates 16-bit keys only: variants.json declares the combination unsupported).
#[test]
fn batch_decode_has_an_fp8_kv_dtype_axis_outside_the_aot_set() {
    let o = Command::cargo_bin("flashgen")
        .unwrap()
        .arg("--config")
        .arg(repo().join("variants.json"))
        .args(["list-variants", "--json", "--module", "batch_decode"])
        .output()
        .unwrap();
    let rows = json(&o);
    let rows = rows.as_array().unwrap();
    let kv = |r: &Value| r["params"]["kv_dtype"].as_str().unwrap().to_string();
    let count = |v: &str| rows.iter().filter(|r| kv(r) == v).count();
    let rope = |r: &Value| r["params"]["pos_encoding"] == "rope_llama";
    let unrotated = rows.iter().filter(|r| kv(r) == "same" && !rope(r)).count();
    assert!(rows.iter().any(|r| kv(r) == "same" && rope(r)));
    assert_eq!(count("fp8_e4m3"), unrotated);
    assert_eq!(count("fp8_e5m2"), unrotated);
    for r in rows {
        let uri = r["uri"].as_str().unwrap();
        assert!(uri.ends_with(&format!("_kv_dtype_{}", kv(r))), "{uri}");
        assert_eq!(
            r["codes"]["kv_dtype"],
            ["same", "fp8_e4m3", "fp8_e5m2"]
                .iter()
                .position(|v| *v == kv(r))
                .unwrap()
        );
        let fp8 = kv(r) != "same";
        assert!(!(fp8 && r["aot"] == true), "{uri} is precompiled");
        assert!(!(fp8 && rope(r)), "{uri} is declared unsupported");
        let outside = r["outside_release"].as_str();
        if !rope(r) {
            // Without in-kernel RoPE only fp8 with ALiBi or sigmoid is left to the JIT.
            let variant = r["params"]["variant"].as_str().unwrap();
            let jit_only = fp8 && matches!(variant, "alibi" | "sigmoid");
            assert_eq!(outside.is_some(), jit_only, "{uri}");
        }
    }
    assert!(rows.iter().any(|r| kv(r) == "same" && r["aot"] == true));
}

/// The repository's batch prefill modules: the same `kv_dtype` axis; the release holds their fp8
/// instances for fp8_e4m3 at head_dim 128 without in-kernel RoPE, with the default, soft_cap,
/// sliding_window and attention_sink variants (every page size and mask, both backends), and
/// says why it leaves out each of the others.
#[test]
fn batch_prefill_has_an_fp8_kv_dtype_axis_and_a_release_slice_of_it() {
    for module in ["batch_prefill_paged", "batch_prefill_ragged"] {
        let o = Command::cargo_bin("flashgen")
            .unwrap()
            .arg("--config")
            .arg(repo().join("variants.json"))
            .args(["list-variants", "--json", "--module", module])
            .output()
            .unwrap();
        let rows = json(&o);
        let rows = rows.as_array().unwrap();
        let param = |r: &Value, axis: &str| r["params"][axis].to_string().replace('"', "");
        let mut shipped = 0;
        for r in rows {
            let uri = r["uri"].as_str().unwrap();
            let kv = param(r, "kv_dtype");
            assert!(uri.ends_with(&format!("_kv_dtype_{kv}")), "{uri}");
            if kv == "same" {
                continue;
            }
            assert!(r["aot"] != true, "{uri} is precompiled");
            let outside = r["outside_release"].as_str();
            assert_ne!(
                param(r, "pos_encoding"),
                "rope_llama",
                "{uri} is declared unsupported"
            );
            let variant = param(r, "variant");
            let ships = kv == "fp8_e4m3"
                && param(r, "head_dim") == "128"
                && matches!(
                    variant.as_str(),
                    "default" | "soft_cap" | "sliding_window" | "attention_sink"
                );
            assert_eq!(outside.is_none(), ships, "{uri}: {outside:?}");
            shipped += usize::from(ships);
        }
        // dtype x mask x backend x 4 variants, x 4 page sizes for the paged cache
        let pages = if module == "batch_prefill_paged" {
            4
        } else {
            1
        };
        assert_eq!(shipped, 2 * 2 * 2 * 4 * pages, "{module}");
    }
}

#[test]
fn where_terms_and_together_and_take_globs() {
    let t = Tree::new("toy");
    let rows = json(&t.run(&[
        "list-variants",
        "--json",
        "--where",
        "width=*6*",
        "--where",
        "dtype=bf16",
    ]));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 8);
    assert!(rows
        .iter()
        .all(|r| r["params"]["width"] == 64 && r["params"]["dtype"] == "bf16"));
    let table = stdout(&t.run(&[
        "list-variants",
        "--module",
        "toy",
        "--where",
        "variant=sc*",
        "--where",
        "width=128",
    ]));
    assert!(table.starts_with("MODULE"), "{table}");
    assert!(table.contains("toy_dtype_bf16_width_128_fast_true_mode_max_variant_scaled"));
    assert!(table.contains("8 instances, 0 precompiled"), "{table}");
}

#[test]
fn unknown_where_axis_lists_the_valid_ones() {
    let t = Tree::new("toy");
    let o = t.run(&["list-variants", "--where", "head_dim=128"]);
    assert_usage_error(
        &o,
        &[
            "unknown axis `head_dim`",
            "dtype, fast, mode, variant, width",
        ],
    );
}

#[test]
fn where_value_matching_nothing_exits_nonzero_with_existing_values() {
    let t = Tree::new("toy");
    let o = t.run(&["list-variants", "--where", "width=96"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_stderr_has(&o, "values on axis `width`: 32, 64, 128");
    let o = t.run(&["list-variants", "--module", "nope"]);
    assert_usage_error(&o, &["no module `nope`", "modules: toy"]);
}

// ---- bad config: exit 2, file and field named, nothing written ----------------------------

fn bad_config(edit: impl FnOnce(&mut Value)) -> (Tree, Output) {
    let t = Tree::new("toy");
    t.edit(edit);
    let o = t.run(&["build", "--out", "out"]);
    assert!(
        !t.path("out").exists(),
        "a rejected config must write nothing"
    );
    (t, o)
}

#[test]
fn malformed_json_names_file_line_and_column() {
    let t = Tree::new("toy");
    t.write(
        "variants.json",
        "{\n  \"archs\": [\"8.0\",\n  \"modules\": {}\n}\n",
    );
    let o = t.run(&["list-variants"]);
    assert_usage_error(&o, &["variants.json:3:"]);
}

#[test]
fn unknown_keys_are_errors() {
    let (_, o) = bad_config(|c| c["modules"]["toy"]["axes"][0]["valuez"] = Value::from(1));
    assert_usage_error(&o, &["variants.json:", "unknown field `valuez`"]);
    let (_, o) = bad_config(|c| c["nvcc_flag"] = Value::from("-O3"));
    assert_usage_error(&o, &["unknown field `nvcc_flag`"]);
}

#[test]
fn empty_and_duplicated_axes_are_errors() {
    let (_, o) = bad_config(|c| c["modules"]["toy"]["axes"][1]["values"] = serde_json::json!([]));
    assert_usage_error(
        &o,
        &["modules.toy.axes[1].values", "axis `width` has no values"],
    );
    let (_, o) = bad_config(|c| {
        let dup = c["modules"]["toy"]["axes"][1].clone();
        c["modules"]["toy"]["axes"]
            .as_array_mut()
            .unwrap()
            .push(dup);
    });
    assert_usage_error(
        &o,
        &["modules.toy.axes[5]", "axis `width` is declared twice"],
    );
    let (_, o) =
        bad_config(|c| c["modules"]["toy"]["axes"][1]["values"] = serde_json::json!([32, 32]));
    assert_usage_error(&o, &["value `32` appears twice"]);
}

#[test]
fn variants_need_a_header_and_a_declaration() {
    let (_, o) =
        bad_config(|c| c["variants"]["plain"]["header"] = Value::from("toy/variants/missing.cuh"));
    assert_usage_error(
        &o,
        &[
            "variants.plain.header",
            "include/toy/variants/missing.cuh does not exist",
        ],
    );
    let (_, o) = bad_config(|c| {
        c["modules"]["toy"]["axes"][4]["values"] = serde_json::json!(["plain", "ghost"])
    });
    assert_usage_error(
        &o,
        &[
            "modules.toy.axes[4].values[1]",
            "variant `ghost` is not declared",
        ],
    );
}

#[test]
fn aot_selection_outside_its_axis_is_an_error() {
    let (_, o) =
        bad_config(|c| c["modules"]["toy"]["aot"]["include"][0]["width"] = serde_json::json!([96]));
    assert_usage_error(
        &o,
        &[
            "modules.toy.aot.include[0].width",
            "value `96` is not on axis `width` (values: 32, 64, 128)",
        ],
    );
    let (_, o) = bad_config(|c| {
        c["modules"]["toy"]["aot"]["exclude"][0]["colour"] = serde_json::json!(["red"])
    });
    assert_usage_error(&o, &["aot.exclude[0].colour", "no axis `colour`"]);
}

#[test]
fn colliding_uris_are_an_error() {
    // Module `a_b` with axis `c` and module `a` with axis `b_c` both spell `a_b_c_1`.
    let (_, o) = bad_config(|c| {
        c["modules"]["a_b"] = serde_json::json!({"source": "toy.cu", "entry_points": ["x"], "axes": [{"name": "c", "type": "int", "values": [1]}]});
        c["modules"]["a"] = serde_json::json!({"source": "toy.cu", "entry_points": ["x"], "axes": [{"name": "b_c", "type": "int", "values": [1]}]});
    });
    assert_usage_error(&o, &["two instances map to the URI `a_b_c_1`"]);
}

// ---- generated headers ---------------------------------------------------------------------

#[test]
fn generated_header_matches_snapshot_and_is_not_rewritten_when_unchanged() {
    let t = Tree::new("toy");
    let uri = "toy_dtype_bf16_width_128_fast_true_mode_max_variant_scaled";
    let filters = wheres(&[
        "dtype=bf16",
        "width=128",
        "fast=true",
        "mode=max",
        "variant=scaled",
    ]);
    let o = t
        .cmd()
        .args(["generate", "--out", "gen"])
        .args(&filters)
        .output()
        .unwrap();
    assert_success(&o);
    let header_path = t.path("gen").join(uri).join("flashgen_instance.cuh");
    let header = std::fs::read_to_string(&header_path).unwrap();
    snapshot("toy_instance_header.cuh", &header);
    assert!(header.starts_with("// @generated by flashgen"));
    assert!(header.contains("Regenerate with: flashgen generate"));

    let cc = first_compile_command(&t.path("gen"));
    let args = arguments(&cc);
    // The compile step, run in the output folder with the header's folder relative to it.
    assert!(args.contains(&format!("-I{uri}").as_str()), "{args:?}");
    assert!(
        args.contains(&"-c") && !args.contains(&"-shared"),
        "{args:?}"
    );
    assert!(cc["directory"].as_str().unwrap().ends_with("gen"));
    assert!(
        args.contains(&"-gencode=arch=compute_80,code=sm_80"),
        "{args:?}"
    );

    let before = std::fs::metadata(&header_path).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(t
        .cmd()
        .args(["generate", "--out", "gen"])
        .args(&filters)
        .output()
        .unwrap()
        .status
        .success());
    assert_eq!(
        std::fs::metadata(&header_path).unwrap().modified().unwrap(),
        before
    );
}

#[test]
fn dispatching_header_matches_snapshot() {
    let t = Tree::new("toy");
    let header = dispatch_header(
        t.cmd(),
        &t,
        "gen",
        "toy",
        &["--where", "width=32", "--where", "width=*"],
    );
    snapshot("toy_dispatch_header.cuh", &header);
}

/// Compares with tests/snapshots/NAME; `UPDATE_SNAPSHOTS=1` rewrites it.
fn snapshot(name: &str, actual: &str) {
    let path = repo().join("tests/snapshots").join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "missing snapshot {} (run with UPDATE_SNAPSHOTS=1)",
            path.display()
        )
    });
    assert_eq!(
        actual, expected,
        "snapshot {name} differs (UPDATE_SNAPSHOTS=1 rewrites it)"
    );
}

// ---- real nvcc -----------------------------------------------------------------------------

#[test]
fn cache_hits_and_only_instances_that_include_a_changed_header_rebuild() {
    let t = Tree::new("toy");
    let sel = wheres(&["dtype=f16", "width=64", "fast=true", "mode=sum"]);
    let first = build_json(&t, "out", &sel);
    assert_eq!(
        (first["built"].as_u64(), first["cached"].as_u64()),
        (Some(2), Some(0))
    );
    let again = build_json(&t, "out", &sel);
    assert_eq!(
        (again["built"].as_u64(), again["cached"].as_u64()),
        (Some(0), Some(2))
    );

    // Edit the header only the `scaled` instance includes.
    let h = t.path("include/toy/variants/scaled.cuh");
    let text = std::fs::read_to_string(&h).unwrap();
    std::fs::write(&h, format!("{text}\n// edited\n")).unwrap();
    let after = build_json(&t, "out", &sel);
    assert_eq!(
        (after["built"].as_u64(), after["cached"].as_u64()),
        (Some(1), Some(1))
    );
    assert_ne!(
        after["instances"][1]["fingerprint"],
        first["instances"][1]["fingerprint"]
    );
    assert_eq!(
        after["instances"][0]["fingerprint"],
        first["instances"][0]["fingerprint"]
    );

    // The manifest lists every built instance with the sha256 of its file.
    let manifest = read_json(&t.path("out/manifest.json"));
    for inst in manifest["instances"].as_array().unwrap() {
        assert_recorded_sha256(&t.path("out").join(inst["path"].as_str().unwrap()), inst);
    }
}

#[test]
fn same_inputs_give_identical_bytes_whatever_the_output_or_cache_folder() {
    let t = Tree::new("toy");
    let sel = wheres(&[
        "dtype=bf16",
        "width=32",
        "fast=false",
        "mode=max",
        "variant=scaled",
    ]);
    let a = build_json(&t, "out-a", &sel);
    let b = build_json_with(
        t.cmd().env("FLASHGEN_CACHE_DIR", t.path("other-cache")),
        "elsewhere/out-b",
        &sel,
    );
    assert_eq!(
        b["built"], 1,
        "the second cache starts empty, so nvcc ran again"
    );
    let pa = a["instances"][0]["path"].as_str().unwrap();
    let pb = b["instances"][0]["path"].as_str().unwrap();
    assert_ne!(pa, pb);
    assert_eq!(std::fs::read(pa).unwrap(), std::fs::read(pb).unwrap());
    // Only libc, libm, libgcc_s, libstdc++ and the shared CUDA runtime are needed.
    let ldd = std::process::Command::new("ldd").arg(pa).output().unwrap();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let lib = line.split_whitespace().next().unwrap_or("");
        assert!(
            [
                "linux-vdso",
                "libc.so",
                "libm.so",
                "libgcc_s",
                "libstdc++",
                "libcudart.so.13",
                "/lib64/ld-linux"
            ]
            .iter()
            .any(|ok| lib.starts_with(ok)),
            "unexpected dependency {line}"
        );
    }
}

#[test]
fn nvcc_failure_shows_uri_command_and_stderr_and_keeps_successes_cached() {
    let t = Tree::new("toy");
    // Break only the `scaled` variant.
    t.write(
        "include/toy/variants/scaled.cuh",
        "#pragma once\n#error scaled is broken on purpose\n",
    );
    let sel = wheres(&["dtype=f16", "width=32", "fast=false"]);
    let o = t
        .cmd()
        .args(["build", "--out", "out", "--keep-going", "--jobs", "1"])
        .args(&sel)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("nvcc failed for toy_dtype_f16_width_32_fast_false_mode_sum_variant_scaled"),
        "{err}"
    );
    assert!(err.contains("scaled is broken on purpose"), "{err}");
    assert!(
        err.contains("4 instances in out: 2 compiled, 0 cached, 2 failed"),
        "{err}"
    );
    // The printed command reproduces the failure alone.
    let line = err
        .lines()
        .skip_while(|l| !l.starts_with("command"))
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    let again = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .current_dir("/")
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("scaled is broken on purpose"));
    // Successes stay cached.
    let o = t
        .cmd()
        .args(["build", "--out", "out", "--json"])
        .args(wheres(&["variant=plain"]))
        .args(&sel)
        .output()
        .unwrap();
    assert_eq!(json(&o)["cached"], 2);
    // Without --keep-going the build stops after the first failure.
    let o = t
        .cmd()
        .args(["build", "--out", "out2", "--jobs", "1"])
        .args(wheres(&["variant=scaled", "dtype=bf16"]))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_stderr_has(&o, "not started");
}

#[test]
fn dispatching_header_reaches_each_listed_instantiation() {
    let t = Tree::new("toy");
    let o = t.run(&[
        "generate",
        "--dispatch",
        "--ninja",
        "--out",
        "gen",
        "--where",
        "width=[36]*",
        "--where",
        "fast=true",
    ]);
    assert_success(&o);
    // Compiled and linked by ninja, from the plan `generate --ninja` wrote.
    let ninja = tool("ninja").expect("ninja (ci/requirements-test.txt): run ci/setup.sh");
    let run = std::process::Command::new(ninja)
        .arg("-C")
        .arg(t.path("gen"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
    let so = t.path("gen/toy.so");

    let lib = unsafe { load_instance(&so) };
    let query: libloading::Symbol<unsafe extern "C" fn(*const i64, i64, *mut u8, i64) -> i32> =
        unsafe { lib.get(b"toy_query").unwrap() };
    let ask = |codes: [i64; 5]| {
        let mut buf = [0u8; 256];
        let rc = unsafe { query(codes.as_ptr(), 5, buf.as_mut_ptr(), 256) };
        (
            rc,
            String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap()]).into_owned(),
        )
    };
    for (dcode, dname) in [(0, "f16"), (1, "bf16")] {
        for width in [32, 64] {
            for (mode, vcode, vname, label) in
                [(0, 0, "plain", "Plain"), (1, 1, "scaled", "Scaled")]
            {
                let (rc, text) = ask([dcode, width, 1, mode, vcode]);
                assert_eq!(rc, 0);
                assert_eq!(text, format!("dtype={dname} width={width} fast=true mode={mode} variant={vname} struct={label}"));
            }
        }
    }
    // Values outside the listed ones reach nothing.
    assert_eq!(ask([0, 128, 1, 0, 0]).0, 2);
    assert_eq!(ask([0, 32, 0, 0, 0]).0, 2);
}

#[test]
fn no_nvcc_is_one_clear_error() {
    let t = Tree::new("toy");
    let o = without_toolchain(t.cmd())
        .env("FLASHGEN_PYTHON", "/nonexistent/python")
        .args(["build", "--out", "out", "--aot"])
        .output()
        .unwrap();
    assert_usage_error(
        &o,
        &["nvcc not found", "pip install 'flashgen[jit]'", "CUDA_HOME"],
    );
}

#[test]
fn arch_list_precedence_and_spellings() {
    let t = Tree::new("toy");
    let doctor = |envs: &[(&str, &str)], args: &[&str]| {
        let mut c = t.cmd();
        for (k, v) in envs {
            c.env(k, v);
        }
        json(&c.args(["doctor", "--json"]).args(args).output().unwrap())["archs"].clone()
    };
    assert_eq!(doctor(&[], &[])["list"], "8.0");
    assert_eq!(
        doctor(&[("TORCH_CUDA_ARCH_LIST", "8.6;9.0+PTX")], &[])["list"],
        "8.6 9.0+PTX"
    );
    assert_eq!(
        doctor(
            &[
                ("TORCH_CUDA_ARCH_LIST", "8.6"),
                ("FLASHGEN_CUDA_ARCH_LIST", "80;90a")
            ],
            &[]
        )["list"],
        "8.0 9.0a"
    );
    assert_eq!(
        doctor(&[("FLASHGEN_CUDA_ARCH_LIST", "80")], &["--arch", "9.0a"])["list"],
        "9.0a"
    );
}

// ---- build-wheel ---------------------------------------------------------------------------

fn wheel_names(path: &Path) -> Vec<String> {
    let mut zip = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
    (0..zip.len())
        .map(|i| zip.by_index(i).unwrap().name().to_string())
        .collect()
}

#[test]
fn build_wheel_packs_the_aot_subset_reproducibly_with_an_exact_file_list() {
    let t = Tree::new("toy");
    t.with_python_package();
    t.write("README.md", "# toy\n");
    let build = |out: &str| {
        let o = t
            .cmd()
            .env("SOURCE_DATE_EPOCH", "1700000000")
            // A small ELF stands in for the binary: deflating a debug build twice is slow.
            .args(["build-wheel", "--binary", "/bin/true", "--out", out])
            .args(wheres(&["dtype=bf16", "width=64", "fast=true", "mode=sum"]))
            .output()
            .unwrap();
        assert_success(&o);
        assert_stderr_has(&o, "largest entries");
        PathBuf::from(stdout(&o).trim())
    };
    let a = build("dist-a");
    let b = build("dist-b");
    let name = a.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("flashgen-0.1.0-py3-none-manylinux_2_") && name.ends_with("_x86_64.whl"),
        "{name}"
    );
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        "two builds differ"
    );

    let u1 = "toy_dtype_bf16_width_64_fast_true_mode_sum_variant_plain";
    let u2 = "toy_dtype_bf16_width_64_fast_true_mode_sum_variant_scaled";
    let expected = [
        "flashgen/__init__.py".to_string(),
        "flashgen/_aot/manifest.json".into(),
        "flashgen/_aot/rows/toy.json".into(),
        format!("flashgen/_aot/{u1}.so"),
        format!("flashgen/_aot/{u2}.so"),
        "flashgen/_bin/flashgen".into(),
        "flashgen/_data/instances/toy.json".into(),
        "flashgen/_data/matrix.json".into(),
        "flashgen/_src/csrc/toy.cu".into(),
        "flashgen/_src/include/toy/toy.cuh".into(),
        "flashgen/_src/include/toy/variants/plain.cuh".into(),
        "flashgen/_src/include/toy/variants/scaled.cuh".into(),
        "flashgen/_src/variants.json".into(),
        "flashgen-0.1.0.dist-info/METADATA".into(),
        "flashgen-0.1.0.dist-info/WHEEL".into(),
        "flashgen-0.1.0.dist-info/entry_points.txt".into(),
        "flashgen-0.1.0.dist-info/RECORD".into(),
    ];
    assert_eq!(wheel_names(&a), expected);
    assert!(
        std::fs::read_dir(t.path("dist-a")).unwrap().count() == 1,
        "no temp files left beside the wheel"
    );

    // pip accepts it, and the installed package holds the same bytes the build produced.
    let target = t.path("site");
    let pip = std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--target",
        ])
        .arg(&target)
        .arg(&a)
        .output()
        .unwrap();
    assert_success(&pip);
    let manifest = installed_manifest(&target.join("flashgen"));
    assert_eq!(manifest["instances"].as_array().unwrap().len(), 2);
    assert_eq!(
        std::fs::read(target.join(format!("flashgen/_aot/{u1}.so"))).unwrap(),
        std::fs::read(t.path(&format!("build/wheel/{u1}.so"))).unwrap()
    );
}

#[test]
fn a_build_killed_mid_compile_leaves_nothing_a_later_run_trusts() {
    let t = Tree::new("toy");
    let sel = wheres(&["dtype=f16", "width=128", "fast=false"]);
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("flashgen"))
        .current_dir(t.dir.path())
        .env("FLASHGEN_CACHE_DIR", t.path(".cache"))
        .env(
            "FLASHGEN_NVCC",
            project_nvcc().expect("the project venv's nvcc"),
        )
        .args(["build", "--out", "out", "--quiet", "--jobs", "2"])
        .args(&sel)
        .spawn()
        .unwrap();
    // Kill once nvcc has started writing into the cache's temp folder.
    let tmp = t.path(".cache/tmp");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_dir(&tmp).map_or(true, |mut d| d.next().is_none())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Every object in the cache has its record; the next run builds the rest and all load.
    let after = build_json(&t, "out", &sel);
    assert_eq!(
        after["built"].as_u64().unwrap() + after["cached"].as_u64().unwrap(),
        4
    );
    for inst in after["instances"].as_array().unwrap() {
        assert_recorded_sha256(Path::new(inst["path"].as_str().unwrap()), inst);
    }
}

#[test]
fn unchanged_rebuild_takes_the_stamp_and_a_missing_or_failed_output_does_not() {
    let t = Tree::new("toy");
    let sel = wheres(&["dtype=bf16", "width=32", "fast=true", "mode=sum"]);
    let first = build_json(&t, "out", &sel);
    assert_eq!(first["built"], 2);
    assert!(t.path("out/.flashgen-stamp").is_file());
    let noop = build_json(&t, "out", &sel);
    assert_eq!(
        (noop["built"].as_u64(), noop["cached"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(
        noop["instances"], first["instances"],
        "the fast path reports what the build wrote"
    );

    // An output removed by hand is put back (from the cache, no compile).
    let gone = PathBuf::from(first["instances"][0]["path"].as_str().unwrap());
    std::fs::remove_file(&gone).unwrap();
    let back = build_json(&t, "out", &sel);
    assert_eq!(back["cached"], 2);
    assert!(gone.is_file());

    // A failed build removes the stamp, so reverting the edit cannot resurrect a stale vouch.
    let h = t.path("include/toy/variants/scaled.cuh");
    let good = std::fs::read_to_string(&h).unwrap();
    std::fs::write(&h, "#pragma once\n#error broken\n").unwrap();
    let o = t
        .cmd()
        .args(["build", "--out", "out"])
        .args(&sel)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(!t.path("out/.flashgen-stamp").exists());
    std::fs::write(&h, good).unwrap();
    let again = build_json(&t, "out", &sel);
    assert_eq!(again["cached"], 2);
    assert!(t.path("out/.flashgen-stamp").is_file());
}

#[test]
fn generated_files_never_go_inside_csrc() {
    let t = Tree::new("toy");
    let o = t.run(&["generate", "--out", "csrc/gen"]);
    assert_usage_error(&o, &["generated files never go inside", "csrc"]);
    assert!(!t.path("csrc/gen").exists());
    let o = t.run(&["build", "--out", "csrc", "--aot"]);
    assert_usage_error(&o, &["generated files never go inside"]);
}

#[test]
fn clean_removes_output_and_cache_and_reports_what_it_freed() {
    let t = Tree::new("toy");
    let sel = wheres(&[
        "dtype=f16",
        "width=32",
        "fast=true",
        "mode=sum",
        "variant=plain",
    ]);
    build_json(&t, "build/flashgen", &sel);
    assert!(t.path(".cache/objects").is_dir());
    let o = t.run(&["clean"]);
    assert_success(&o);
    assert!(!t.path("build/flashgen").exists() && t.path(".cache/objects").is_dir());
    assert!(
        stderr(&o).contains("removed") && stderr(&o).contains("freed"),
        "{}",
        stderr(&o)
    );
    let o = t.run(&["clean", "--cache"]);
    assert!(o.status.success());
    assert!(!t.path(".cache").exists());
    assert_stderr_has(&o, &format!("removed {}", t.path(".cache").display()));
}

#[test]
fn pypi_nvcc_is_found_through_the_interpreter_that_asks() {
    let t = Tree::new("toy");
    let o = without_toolchain(t.cmd())
        .env("FLASHGEN_PYTHON", project_venv().join("bin/python"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let tc = assert_found_in_the_python_package(&o);
    assert_eq!(tc["nvcc_version"], "13.0.88");
}

/// doctor's toolchain (from `doctor --json`), which must be the PyPI nvcc; returned.
fn assert_found_in_the_python_package(o: &Output) -> Value {
    let tc = json(o)["toolchain"].clone();
    assert!(
        tc["found_by"]
            .as_str()
            .unwrap_or("")
            .starts_with("python package nvidia-cuda-nvcc"),
        "{tc}"
    );
    tc
}

// ---- child processes: nothing in the working folder runs ---------------------------------

/// A folder another user wrote (owned by a second user when the tests run as root), holding
/// Python modules the binary's Python children import by name and programs a PATH lookup of `.`
/// would find; each leaves a marker in the returned folder when it runs.
fn planted_folder(t: &Tree) -> (PathBuf, PathBuf) {
    let dir = t.path("theirs");
    let marks = t.path("marks");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&marks).unwrap();
    let py = |name: &str| format!("open({:?}, 'w').write('ran')\n", marks.join(name));
    let sh = |name: &str| format!("#!/bin/sh\necho ran > '{}'\n", marks.join(name).display());
    let files: Vec<(String, String, bool)> = ["sysconfig.py", "torch.py", "json.py"]
        .iter()
        .map(|m| (m.to_string(), py(m), false))
        .chain(
            ["python3", "nvidia-smi", "nvcc", "g++", "c++", "zig"]
                .iter()
                .map(|p| (p.to_string(), sh(p), true)),
        )
        .collect();
    let files: Vec<(&str, &str, bool)> = files
        .iter()
        .map(|(n, t, x)| (n.as_str(), t.as_str(), *x))
        .collect();
    plant(&dir, &files);
    (dir, marks)
}

fn ran(marks: &Path) -> Vec<String> {
    std::fs::read_dir(marks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The caller's folder holds the plants, PATH has `.` and an empty entry, and the Python
/// variables point into the folder: `flashgen` started there must run none of it.
fn in_planted_folder(t: &Tree, dir: &Path, path: &str) -> assert_cmd::Command {
    let mut c = without_toolchain(t.cmd());
    c.current_dir(dir)
        .env("PATH", path)
        .env("PYTHONPATH", ".")
        .env("PYTHONSTARTUP", dir.join("sysconfig.py"))
        .arg("--config")
        .arg(t.path("variants.json"));
    c
}

#[test]
fn doctor_runs_no_code_from_the_working_folder() {
    let t = Tree::new("toy");
    let (dir, marks) = planted_folder(&t);
    // python3 from PATH, then the interpreter the loader names (Debian's: its site-packages is
    // not under the prefix, so the binary asks it where it is).
    let cases = [
        ("/usr/bin:/bin", Some("/usr/bin/python3")),
        (".::/usr/bin:/bin", Some("/usr/bin/python3")),
        (".::/usr/bin:/bin", None),
    ];
    for (path, python) in cases {
        let mut c = in_planted_folder(&t, &dir, path);
        if let Some(py) = python {
            c.env("FLASHGEN_PYTHON", py);
        }
        let o = c.args(["doctor", "--json"]).output().unwrap();
        let v = json(&o);
        assert_eq!(
            ran(&marks),
            Vec::<String>::new(),
            "PATH={path} FLASHGEN_PYTHON={python:?}"
        );
        assert_error_field(&v, "toolchain", |e| e.contains("nvcc not found"));
    }
}

#[test]
fn a_build_of_another_config_runs_no_code_from_the_working_folder() {
    let t = Tree::new("toy");
    let (dir, marks) = planted_folder(&t);
    for path in ["/usr/bin:/bin", ".::/usr/bin:/bin"] {
        let o = in_planted_folder(&t, &dir, path)
            .env("FLASHGEN_PYTHON", "/usr/bin/python3")
            .args(["build", "--out"])
            .arg(t.path("out"))
            .output()
            .unwrap();
        assert_eq!(ran(&marks), Vec::<String>::new(), "PATH={path}");
        assert_usage_error(&o, &["nvcc not found"]);
    }
}

// ---- packing follows no symlink out of the tree ------------------------------------------

/// A JIT-only wheel of the toy tree (no toolchain needed); `/bin/true` stands in for the binary.
fn jit_only_wheel(t: &Tree) -> Output {
    t.with_python_package();
    let mut c = without_toolchain(t.cmd());
    c.args([
        "build-wheel",
        "--no-aot",
        "--binary",
        "/bin/true",
        "--out",
        "dist",
        "-q",
    ])
    .timeout(std::time::Duration::from_secs(60));
    c.output().unwrap()
}

#[test]
fn build_wheel_packs_no_file_a_symlink_leads_to_outside_the_tree() {
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("secret"), "TOP-SECRET-BYTES\n").unwrap();
    for link in [
        "include/toy/leak.cuh",
        "csrc/leak.cu",
        "python/flashgen/leak.py",
    ] {
        let t = Tree::new("toy");
        std::fs::create_dir_all(t.path("python/flashgen")).unwrap();
        std::os::unix::fs::symlink(secret.path().join("secret"), t.path(link)).unwrap();
        let o = jit_only_wheel(&t);
        assert_usage_error(
            &o,
            &[
                &format!(
                    "{link} is a symlink to {}",
                    secret.path().join("secret").display()
                ),
                "outside",
                "the wheel packs no file from outside the tree",
            ],
        );
        assert!(
            !t.path("dist").exists() || std::fs::read_dir(t.path("dist")).unwrap().count() == 0
        );
    }
    // A folder symlinked from outside is refused too; a link that stays inside is packed.
    let t = Tree::new("toy");
    std::os::unix::fs::symlink(secret.path(), t.path("include/toy/outside")).unwrap();
    assert_usage_error(
        &jit_only_wheel(&t),
        &["include/toy/outside is a symlink to"],
    );
    let t = Tree::new("toy");
    std::os::unix::fs::symlink("toy.cuh", t.path("include/toy/alias.cuh")).unwrap();
    let o = jit_only_wheel(&t);
    assert_success(&o);
    let names = wheel_names(&t.path(stdout(&o).trim()));
    assert!(
        names
            .iter()
            .any(|n| n == "flashgen/_src/include/toy/alias.cuh"),
        "{names:?}"
    );
}

#[test]
fn build_wheel_refuses_a_fifo_in_the_tree_instead_of_hanging() {
    let t = Tree::new("toy");
    let fifo = t.path("include/toy/pipe.cuh");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let o = jit_only_wheel(&t);
    assert_usage_error(&o, &["include/toy/pipe.cuh is not a regular file"]);
}

#[test]
fn an_empty_flashgen_nvcc_means_unset() {
    let t = Tree::new("toy");
    let o = without_toolchain(t.cmd())
        .env("FLASHGEN_NVCC", "")
        .env("FLASHGEN_PYTHON", project_venv().join("bin/python"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    assert_found_in_the_python_package(&o);
    // Unset everywhere else, the error lists where it looked, not "FLASHGEN_NVCC= is not a file".
    let o = without_toolchain(t.cmd())
        .env("FLASHGEN_NVCC", "")
        .env("FLASHGEN_PYTHON", "/nonexistent/python3")
        .args(["build", "--out", "out"])
        .output()
        .unwrap();
    assert_usage_error(&o, &["nvcc not found (looked at FLASHGEN_NVCC"]);
    assert!(!stderr(&o).contains("is not a file"), "{}", stderr(&o));
}

#[test]
fn children_see_no_relative_search_path_entries() {
    let nvcc = project_nvcc().expect("the project venv's nvcc is missing: run ci/setup.sh");
    let t = Tree::new("toy");
    // A launcher that records what a compile step inherits, then fails the step.
    let seen = t.path("seen.txt");
    let launcher = t.path("record-env");
    t.write(
        "record-env",
        &format!(
            "#!/bin/sh\nprintf 'PATH=%s\\nLD_LIBRARY_PATH=%s\\n' \"$PATH\" \"${{LD_LIBRARY_PATH-unset}}\" > '{}'\nexit 1\n",
            seen.display()
        ),
    );
    std::fs::set_permissions(
        &launcher,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    let o = t
        .cmd()
        .env("FLASHGEN_NVCC", &nvcc)
        .env("PATH", format!(".::{path}:bin"))
        .env("LD_LIBRARY_PATH", ":.:/opt/absent-lib")
        .args(["build", "--out", "out", "--launcher"])
        .arg(&launcher)
        .args(wheres(&[
            "dtype=bf16",
            "width=64",
            "fast=true",
            "mode=sum",
            "variant=plain",
        ]))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let text = std::fs::read_to_string(&seen).unwrap_or_else(|_| panic!("{}", stderr(&o)));
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap()
            .to_string()
    };
    let absolute: Vec<&str> = path.split(':').filter(|e| e.starts_with('/')).collect();
    assert_eq!(get("PATH"), absolute.join(":"), "{text}");
    assert_eq!(get("LD_LIBRARY_PATH"), "/opt/absent-lib", "{text}");
}

#[test]
fn relative_tool_paths_still_name_files_of_the_working_folder() {
    // Children start in `/`; a relative FLASHGEN_NVCC or FLASHGEN_PYTHON still means the file
    // the caller named from where it stands.
    let nvcc = project_nvcc().expect("the project venv's nvcc is missing: run ci/setup.sh");
    let t = Tree::new("toy");
    std::os::unix::fs::symlink(nvcc.parent().unwrap().parent().unwrap(), t.path("cu")).unwrap();
    std::os::unix::fs::symlink(project_venv(), t.path("venv")).unwrap();
    let o = without_toolchain(t.cmd())
        .env("FLASHGEN_NVCC", "cu/bin/nvcc")
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        json(&o)["toolchain"]["nvcc_version"],
        "13.0.88",
        "{}",
        stderr(&o)
    );
    let o = without_toolchain(t.cmd())
        .env("FLASHGEN_PYTHON", "venv/bin/python")
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let tc = &json(&o)["toolchain"];
    assert_eq!(tc["nvcc_version"], "13.0.88", "{tc}");
}

/// A dispatching header reaches every combination of the values it lists. Over the repository's
/// batch_decode with rope_llama and the fp8 caches listed, its generated dispatch skips the
/// combination variants.json declares unsupported without instantiating it (the module's `run`
/// static_asserts against it), so the module compiles.
#[test]
fn a_dispatching_build_skips_what_variants_json_declares_unsupported() {
    let Some(nvcc) = require(project_nvcc(), "needs nvcc") else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let o = Command::cargo_bin("flashgen")
        .unwrap()
        .current_dir(repo())
        .env("FLASHGEN_NVCC", &nvcc)
        .args(["generate", "--dispatch", "--out"])
        .arg(out.path())
        .args(["--module", "batch_decode", "--arch", "8.0"])
        .args(wheres(&[
            "dtype=bf16",
            "head_dim=128",
            "page_size=16",
            "variant=default",
            "kv_dtype={same,fp8_e4m3}",
        ]))
        .output()
        .unwrap();
    assert_success(&o);
    let header =
        std::fs::read_to_string(out.path().join("batch_decode/flashgen_instance.cuh")).unwrap();
    assert!(
        header.contains(
            // Among the listed values only fp8_e4m3 (code 1) is declared with rope_llama.
            "std::bool_constant<!(((FG_pos_encoding == 1) && (FG_kv_dtype == 1)))>"
        ),
        "{header}"
    );
    let entry = first_compile_command(out.path());
    let o = std::process::Command::new(&nvcc)
        .args(&arguments(&entry)[1..])
        .current_dir(out.path())
        .output()
        .unwrap();
    assert_success(&o);
}
