//! Bad input is refused early and clearly, and nothing panics: the real binary on edited copies
//! of the toy fixture (paths outside the tree, integer ranges, C names, parameter types, matrix
//! size, odd arguments), then property tests of the arch list parser and of config validation.
//! None of these compile anything, so none needs nvcc.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::Output;

use assert_cmd::Command;
use serde_json::{json, Value};

mod common;
use common::{
    assert_error_field, assert_stderr_has, assert_success, assert_usage_error, copy_dir,
    dispatch_header, repo, stderr, stdout,
};

/// A private copy of the toy fixture (see `common::Tree`, which this derefs to) whose commands
/// find no toolchain: a command that got past validation fails differently from the refusals
/// asserted here.
struct Tree(common::Tree);

impl std::ops::Deref for Tree {
    type Target = common::Tree;
    fn deref(&self) -> &common::Tree {
        &self.0
    }
}

impl Tree {
    fn new() -> Tree {
        Tree(common::Tree::new("toy"))
    }
    fn cmd(&self) -> Command {
        let mut c = self.0.cmd();
        c.env("FLASHGEN_NVCC", "/nonexistent/nvcc")
            .env_remove("FLASHGEN_MAX_INSTANCES");
        c
    }
    fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}

fn assert_no_panic(o: &Output) {
    assert_ne!(o.status.code(), Some(101), "panicked:\n{}", stderr(o));
    assert!(o.status.code().is_some(), "killed by a signal");
    assert!(!stderr(o).contains("panicked"), "{}", stderr(o));
}

/// Edits the toy config, runs `build`, and checks it was refused before anything was written.
fn refused(edit: impl FnOnce(&mut Value)) -> Output {
    let t = Tree::new();
    t.edit(edit);
    let o = t.run(&["build", "--out", "out"]);
    assert!(
        !t.path("out").exists(),
        "a refused config must write nothing"
    );
    o
}

// ---- 1. paths stay inside the project ------------------------------------------------------

#[test]
fn variant_headers_stay_under_include() {
    let o = refused(|c| c["variants"]["plain"]["header"] = json!("../../../../../../etc/passwd"));
    assert_usage_error(&o, &["variants.json: variants.plain.header", "outside"]);
    assert!(!stderr(&o).contains("root:"), "file contents leaked");
    let o = refused(|c| c["variants"]["plain"]["header"] = json!("/etc/passwd"));
    assert_usage_error(
        &o,
        &[
            "variants.plain.header",
            "absolute path",
            "relative to include/",
        ],
    );
    // A header reached through `..` that stays inside is fine.
    let t = Tree::new();
    t.edit(|c| c["variants"]["plain"]["header"] = json!("toy/../toy/variants/plain.cuh"));
    let o = t.run(&["list-variants"]);
    assert_success(&o);
}

#[test]
fn a_symlink_cannot_lead_out_of_include() {
    let t = Tree::new();
    std::os::unix::fs::symlink("/etc/passwd", t.path("include/toy/variants/evil.cuh")).unwrap();
    t.edit(|c| c["variants"]["plain"]["header"] = json!("toy/variants/evil.cuh"));
    let o = t.run(&["build", "--out", "out"]);
    assert_usage_error(
        &o,
        &["variants.plain.header", "resolves to /etc/passwd, outside"],
    );
    assert!(!t.path("out").exists());
}

#[test]
fn sources_stay_under_csrc_and_includes_under_include() {
    let o = refused(|c| c["modules"]["toy"]["source"] = json!("../include/toy/toy.cuh"));
    assert_usage_error(&o, &["modules.toy.source", "outside"]);
    let o = refused(|c| c["modules"]["toy"]["source"] = json!("/etc/passwd"));
    assert_usage_error(&o, &["modules.toy.source", "absolute path"]);
    let o = refused(|c| c["includes"] = json!(["toy/toy.cuh", "../csrc/toy.cu"]));
    assert_usage_error(&o, &["variants.json: includes[1]", "outside"]);
    let o = refused(|c| c["includes"] = json!(["/etc/passwd"]));
    assert_usage_error(&o, &["includes[0]", "absolute path"]);
}

#[test]
fn user_variant_headers_stay_beside_their_variants_file() {
    let t = Tree::new();
    let user = t.path("user");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("mine.cuh"), "#pragma once\n").unwrap();
    let write = |header: &str| {
        let vf = json!({"variants": {"mine": {"header": header, "struct": "Mine",
            "params": [{"name": "bias", "type": "float"}]}}});
        std::fs::write(user.join("custom.json"), vf.to_string()).unwrap();
    };
    let list = || {
        t.run(&[
            "list-variants",
            "--json",
            "--variants-file",
            "user/custom.json",
            "--where",
            "variant=mine",
        ])
    };
    // What the loader writes: an absolute path in the variants file's folder; relative works too.
    for header in [
        user.join("mine.cuh").to_str().unwrap(),
        "mine.cuh",
        "./mine.cuh",
    ] {
        write(header);
        let o = list();
        assert!(o.status.success(), "{header}: {}", stderr(&o));
        assert_eq!(
            serde_json::from_slice::<Value>(&o.stdout)
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            24
        );
    }
    // A header under the tree's include/ is allowed as well.
    write("../include/toy/variants/plain.cuh");
    assert!(list().status.success());
    // Anything else is refused, naming the variants file and the field.
    for header in [
        "/etc/passwd",
        "../../../../../../etc/passwd",
        "../variants.json",
    ] {
        write(header);
        let o = list();
        assert_usage_error(
            &o,
            &[
                "custom.json: variants.mine.header",
                "outside the variants file's folder",
            ],
        );
        assert!(!stderr(&o).contains("root:"));
    }
}

// ---- 2. integer axes in range ----------------------------------------------------------------

#[test]
fn int_values_outside_the_default_range_are_refused() {
    for bad in [0, -64, 65537] {
        let o = refused(|c| c["modules"]["toy"]["axes"][1]["values"] = json!([32, bad]));
        assert_usage_error(
            &o,
            &[
                "modules.toy.axes[1].values[1]",
                &format!("{bad} is outside the range 1..=65536 of axis `width`"),
                "\"min\" and \"max\"",
            ],
        );
    }
}

#[test]
fn an_axis_declares_its_own_range() {
    let o = refused(|c| c["modules"]["toy"]["axes"][1]["max"] = json!(64));
    assert_usage_error(
        &o,
        &[
            "modules.toy.axes[1].values[2]",
            "128 is outside the range 1..=64",
        ],
    );
    let t = Tree::new();
    t.edit(|c| {
        c["modules"]["toy"]["axes"][1]["min"] = json!(-8);
        c["modules"]["toy"]["axes"][1]["values"] = json!([-4, 0, 70000]);
        c["modules"]["toy"]["axes"][1]["max"] = json!(70000);
        c["modules"]["toy"]["aot"] = json!({});
    });
    let o = t.run(&["list-variants", "--where", "width=-4"]);
    assert_success(&o);
    assert!(
        stdout(&o).contains("toy_dtype_f16_width_neg4_"),
        "{}",
        stdout(&o)
    );
    let o = refused(|c| c["modules"]["toy"]["axes"][0]["min"] = json!(1));
    assert_usage_error(
        &o,
        &["modules.toy.axes[0].min", "only `int` axes take a range"],
    );
    let o = refused(|c| {
        c["modules"]["toy"]["axes"][1]["min"] = json!(10);
        c["modules"]["toy"]["axes"][1]["max"] = json!(5);
    });
    assert_usage_error(&o, &["modules.toy.axes[1].min", "min 10 is above max 5"]);
}

#[test]
fn huge_numbers_are_errors_not_panics() {
    for raw in ["1e400", "18446744073709551616", "-1e400", "1.5"] {
        let t = Tree::new();
        let text = std::fs::read_to_string(t.path("variants.json"))
            .unwrap()
            .replace("[32, 64, 128]", &format!("[32, {raw}]"));
        std::fs::write(t.path("variants.json"), text).unwrap();
        let o = t.run(&["list-variants"]);
        assert_usage_error(&o, &["variants.json"]);
    }
    let o = refused(|c| c["modules"]["toy"]["axes"][1]["values"] = json!([32, u64::MAX]));
    assert_usage_error(&o, &["modules.toy.axes[1].values[1]", "is not an integer"]);
}

// ---- 3. C identifiers ------------------------------------------------------------------------

/// An edit of the config, for tables of refusals.
type Edit = Box<dyn FnOnce(&mut Value)>;

#[test]
fn names_must_be_plain_unreserved_c_identifiers() {
    let cases: Vec<(Edit, &[&str])> = vec![
        (
            Box::new(|c| {
                let toy = c["modules"]["toy"].take();
                c["modules"] = json!({"int": toy});
            }),
            &["modules.int", "`int` is a C/C++ keyword"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][1]["name"] = json!("class")),
            &["modules.toy.axes[1].name", "`class` is a C/C++ keyword"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][1]["name"] = json!("xor_eq")),
            &["`xor_eq` is a C/C++ keyword"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["DType", "__x"])),
            &["modules.toy.axes[0].c_names[1]", "reserved"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["_Bool"])),
            &["modules.toy.axes[0].c_names[0]", "keyword"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["_DType"])),
            &["modules.toy.axes[0].c_names[0]", "reserved"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["FLASHGEN_MODULE"])),
            &[
                "c_names[0]",
                "collides with the names the generated header defines",
            ],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["DISPATCH_width"])),
            &["c_names[0]", "already taken by the macro `DISPATCH_width`"],
        ),
        (
            // The width axis's default c_name is WIDTH.
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["DType", "WIDTH"])),
            &[
                "modules.toy.axes[1].name",
                "`WIDTH` is already taken by axis `dtype`",
            ],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["A", "A"])),
            &["c_names[1]", "this axis's own c_names"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][0]["c_names"] = json!(["Scaled"])),
            &["c_names[0]", "a variant's struct"],
        ),
        (
            Box::new(|c| c["variants"]["scaled"]["struct"] = json!("ATTENTION_VARIANT")),
            &["variants.scaled.struct", "collides"],
        ),
        (
            Box::new(|c| c["variants"]["scaled"]["params"][0]["name"] = json!("and")),
            &["variants.scaled.params[0].name", "keyword"],
        ),
        (
            Box::new(|c| c["variants"]["scaled"]["params"][0]["name"] = json!("flashgen_x")),
            &["variants.scaled.params[0].name", "collides"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["entry_points"] = json!(["toy_query", "toy apply"])),
            &["modules.toy.entry_points[1]", "not a C identifier"],
        ),
        (
            Box::new(|c| c["modules"]["toy"]["axes"][3]["values"] = json!(["sum", "_max"])),
            &["modules.toy.axes[3].values[1]", "FLASHGEN_CODE_mode__max"],
        ),
    ];
    for (edit, needles) in cases {
        let o = refused(edit);
        assert_usage_error(&o, needles);
        assert_stderr_has(&o, "hint:");
    }
}

#[test]
fn one_parameter_name_has_one_type_across_variants() {
    // The dispatching header declares the union of the variants' parameters, once per name.
    let o = refused(|c| {
        c["variants"]["plain"]["params"] = json!([{"name": "scale", "type": "double"}]);
    });
    assert_usage_error(
        &o,
        &[
            "variants.scaled.params[0].type",
            "`scale` is `float` here but `double` in variant `plain`",
        ],
    );
    // The same type under two spellings is one type.
    let t = Tree::new();
    t.edit(|c| c["variants"]["plain"]["params"] = json!([{"name": "scale", "type": " float "}]));
    assert!(t.run(&["list-variants"]).status.success());
}

// ---- 4. one table of parameter types ---------------------------------------------------------

#[test]
fn param_types_are_normalized_and_anything_else_is_refused() {
    for bad in [
        "float\n; evil",
        "float;",
        "const float",
        "float**",
        "int",
        "void*",
        "Float",
    ] {
        let o = refused(|c| c["variants"]["scaled"]["params"][0]["type"] = json!(bad));
        assert_usage_error(
            &o,
            &[
                "variants.scaled.params[0].type",
                "unsupported C type",
                "float, double, bool, int32_t, int64_t, uint32_t, uint64_t",
            ],
        );
    }
    let t = Tree::new();
    t.edit(|c| {
        c["variants"]["scaled"]["params"] = json!([
            {"name": "scale", "type": "float"},
            {"name": "table", "type": "const\tint64_t  *"},
            {"name": "out", "type": " uint32_t* "}
        ])
    });
    let o = t.run(&["describe", "--json"]);
    assert_success(&o);
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        d["variants"]["scaled"]["params"],
        json!([
            {"name": "scale", "type": "float"},
            {"name": "table", "type": "const int64_t*"},
            {"name": "out", "type": "uint32_t*"}
        ])
    );
    // The dispatching header declares them with that spelling (no compiler needed for it).
    let h = dispatch_header(t.cmd(), &t, "gen", "toy", &["--where", "variant=scaled"]);
    assert!(
        h.contains(
            "#define ADDITIONAL_PARAMS_DECL float scale; const int64_t* table; uint32_t* out;\n"
        ),
        "{h}"
    );
}

#[test]
fn a_pointer_parameter_may_name_its_length_and_describe_exports_it() {
    let o = refused(|c| {
        c["variants"]["scaled"]["params"][0]["len"] = json!("num_qo_heads");
    });
    assert_usage_error(
        &o,
        &[
            "variants.scaled.params[0].len",
            "`len` is for pointer parameters; `scale` is a value",
        ],
    );
    let o = refused(|c| {
        c["variants"]["scaled"]["params"] =
            json!([{"name": "table", "type": "const float*", "len": "kv_len"}]);
    });
    assert_usage_error(
        &o,
        &[
            "variants.scaled.params[0].len",
            "unknown length `kv_len`",
            "`len` takes num_qo_heads",
        ],
    );
    let t = Tree::new();
    t.edit(|c| {
        c["variants"]["scaled"]["params"] =
            json!([{"name": "table", "type": "const float *", "len": "num_qo_heads"}])
    });
    let o = t.run(&["describe", "--json"]);
    assert_success(&o);
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        d["variants"]["scaled"]["params"],
        json!([{"name": "table", "type": "const float*", "len": "num_qo_heads"}])
    );
}

#[test]
fn describe_exports_the_whole_param_type_table() {
    let t = Tree::new();
    let o = t.run(&["describe"]);
    assert_success(&o);
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut expected = Vec::new();
    for (c, ctypes, dtype) in [
        ("float", "c_float", "f32"),
        ("double", "c_double", "f64"),
        ("bool", "c_bool", "bool"),
        ("int32_t", "c_int32", "i32"),
        ("int64_t", "c_int64", "i64"),
        ("uint32_t", "c_uint32", "u32"),
        ("uint64_t", "c_uint64", "u64"),
    ] {
        expected.push(json!({"c": c, "ctypes": ctypes, "dtype": dtype}));
        expected.push(json!({"c": format!("const {c}*"), "ctypes": "c_void_p", "dtype": dtype}));
        expected.push(json!({"c": format!("{c}*"), "ctypes": "c_void_p", "dtype": dtype}));
    }
    assert_eq!(d["param_types"], Value::Array(expected));
}

// ---- 5. matrix size --------------------------------------------------------------------------

#[test]
fn a_matrix_of_10_pow_20_instances_fails_fast_naming_its_sizes() {
    let start = std::time::Instant::now();
    let o = refused(|c| {
        let axes: Vec<Value> = (0..20)
            .map(|i| json!({"name": format!("a{i}"), "type": "int", "values": (1..=10).collect::<Vec<_>>()}))
            .collect();
        c["modules"]["big"] =
            json!({"source": "toy.cu", "entry_points": ["big_query"], "axes": axes});
    });
    assert_usage_error(
        &o,
        &[
            "modules.big",
            "the matrix has 100000000000000000048 instances, more than the limit of 1000000",
            "big: 100000000000000000000 = a0 10 x a1 10 x",
            "toy: 48 = dtype 2 x width 3 x fast 2 x mode 2 x variant 2",
            "FLASHGEN_MAX_INSTANCES",
        ],
    );
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
    // Past u128 too.
    let o = refused(|c| {
        let axes: Vec<Value> = (0..40)
            .map(|i| json!({"name": format!("a{i}"), "type": "int", "values": (1..=10).collect::<Vec<_>>()}))
            .collect();
        c["modules"]["big"] =
            json!({"source": "toy.cu", "entry_points": ["big_query"], "axes": axes});
    });
    assert_usage_error(&o, &["more than 2^128 instances"]);
}

#[test]
fn the_instance_limit_is_overridable_and_must_parse() {
    let t = Tree::new();
    let o = t
        .cmd()
        .env("FLASHGEN_MAX_INSTANCES", "47")
        .args(["list-variants"])
        .output()
        .unwrap();
    assert_usage_error(
        &o,
        &["modules.toy", "48 instances, more than the limit of 47"],
    );
    let o = t
        .cmd()
        .env("FLASHGEN_MAX_INSTANCES", "48")
        .args(["list-variants"])
        .output()
        .unwrap();
    assert_success(&o);
    for bad in ["abc", "", "-1", "0", "1e6"] {
        let o = t
            .cmd()
            .env("FLASHGEN_MAX_INSTANCES", bad)
            .args(["list-variants"])
            .output()
            .unwrap();
        assert_usage_error(
            &o,
            &["FLASHGEN_MAX_INSTANCES", "not a positive whole number"],
        );
    }
}

// ---- 6. no panic on any input ----------------------------------------------------------------

#[test]
fn non_ascii_and_odd_arch_lists_are_usage_errors() {
    let t = Tree::new();
    for arch in [
        "9é",
        "é",
        "9éPTX",
        "99é+",
        "sm_é",
        "+PTX",
        "9.",
        ".9",
        "99999999999",
        ";;",
        " ",
    ] {
        for cmd in [
            ["doctor", "--json", "--arch", arch],
            ["list-variants", "--json", "--arch", arch],
        ] {
            let o = t.run(&cmd);
            assert_no_panic(&o);
        }
        // build resolves the archs before it looks for nvcc.
        let o = t.run(&["build", "--out", "out", "--arch", arch]);
        assert_usage_error(&o, &["--arch: "]);
        let o = t.run(&["doctor", "--json", "--arch", arch]);
        let doctor: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_error_field(&doctor, "archs", |e| e.starts_with("--arch: "));
    }
}

#[test]
fn very_long_names_are_refused_without_panicking() {
    let t = Tree::new();
    let long = "a".repeat(1 << 20);
    t.edit(|c| {
        let toy = c["modules"]["toy"].take();
        c["modules"] = json!({ long.clone(): toy });
    });
    let o = t.run(&["list-variants"]);
    assert_usage_error(&o, &["its instance URIs reach", "at most 200"]);
    // The longest argument Linux passes is 128 KiB.
    let t = Tree::new();
    let o = t.run(&["list-variants", "--module", &"m".repeat(100_000)]);
    assert_usage_error(&o, &["no module `mmm"]);
    // A glob that long made globset panic building its regex.
    let o = t.run(&[
        "list-variants",
        "--where",
        &format!("width={}", "*".repeat(100_000)),
    ]);
    assert_usage_error(&o, &["--where width=...", "more than 256"]);
    let o = t.run(&[
        "list-variants",
        "--where",
        &format!("width={}", "*".repeat(256)),
    ]);
    assert_success(&o);
}

#[test]
fn odd_where_values_never_panic() {
    let t = Tree::new();
    for w in [
        "",
        "=",
        "==",
        "width",
        "=32",
        "width=",
        "width=[",
        "width=[z-a]",
        "width=**{",
        "width={a,{b}}",
        "width=\\",
        "width=é",
        "width=32=32",
        "é=1",
    ] {
        let o = t.run(&["list-variants", "--where", w]);
        assert_no_panic(&o);
        assert!(
            matches!(o.status.code(), Some(0..=2)),
            "{w:?}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn deeply_nested_json_is_a_syntax_error() {
    let t = Tree::new();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let text = std::fs::read_to_string(t.path("variants.json"))
        .unwrap()
        .replace("[32, 64, 128]", &deep);
    std::fs::write(t.path("variants.json"), text).unwrap();
    let o = t.run(&["list-variants"]);
    assert_usage_error(&o, &["variants.json:", "recursion limit"]);
}

#[test]
fn non_utf8_files_and_arguments_are_usage_errors() {
    let t = Tree::new();
    let mut bytes = std::fs::read(t.path("variants.json")).unwrap();
    bytes.splice(3..3, [0xff, 0xfe]);
    std::fs::write(t.path("variants.json"), &bytes).unwrap();
    let o = t.run(&["list-variants"]);
    assert_usage_error(&o, &["variants.json: not UTF-8 text"]);

    let t = Tree::new();
    std::fs::write(t.path("v\u{e9}.json"), [b'{', 0xc3, b'}']).unwrap();
    let o = t.run(&["list-variants", "--variants-file", "v\u{e9}.json"]);
    assert_usage_error(&o, &["v\u{e9}.json: not UTF-8 text"]);

    let bad = OsStr::from_bytes(b"\xff\xfe");
    let o = t.run(&[OsStr::new("list-variants"), OsStr::new("--module"), bad]);
    assert_no_panic(&o);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = t.run(&[OsStr::new("list-variants"), OsStr::new("--where"), bad]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = t.run(&[OsStr::new("--config"), bad, OsStr::new("list-variants")]);
    assert_usage_error(&o, &["cannot read"]);
    let o = t.run(&[
        OsStr::new("--variants-file"),
        bad,
        OsStr::new("list-variants"),
    ]);
    assert_usage_error(&o, &["cannot read"]);
}

#[test]
fn the_real_matrices_still_load() {
    for dir in [repo(), repo().join("tests/fixtures/toy")] {
        let o = Command::cargo_bin("flashgen")
            .unwrap()
            .current_dir(&dir)
            .env("FLASHGEN_NVCC", "/nonexistent/nvcc")
            .env_remove("FLASHGEN_MAX_INSTANCES")
            .args(["list-variants"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}: {}", dir.display(), stderr(&o));
    }
}

// ---- property tests: the parsers never panic, and every refusal is a usage error -------------

mod props {
    use super::*;
    use flashgen::matrix::Matrix;
    use proptest::prelude::*;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 384,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    fn toy_path() -> PathBuf {
        repo().join("tests/fixtures/toy/variants.json")
    }

    fn toy() -> Value {
        serde_json::from_str(&std::fs::read_to_string(toy_path()).unwrap()).unwrap()
    }

    /// Validation, plus the headers of a few instances when it passes (codegen trusts it).
    fn check(text: String) -> Result<(), TestCaseError> {
        match Matrix::from_text(&toy_path(), text, &[], 2000) {
            Ok(m) => {
                for inst in m.instances.iter().take(4) {
                    flashgen::codegen::instance_header(&m, inst);
                }
                Ok(())
            }
            Err(e) => {
                prop_assert_eq!(
                    flashgen::error::exit_code(&e),
                    2,
                    "not a usage error: {:#}",
                    e
                );
                Ok(())
            }
        }
    }

    /// Values a mutation writes into the config: the edge cases of every field's type.
    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!(null)),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            prop_oneof![Just(0i64), Just(-64), Just(1), Just(65536), Just(65537)]
                .prop_map(Value::from),
            Just(json!(u64::MAX)),
            any::<f64>().prop_map(|f| json!(f)),
            "[a-zA-Z_0-9]{0,8}".prop_map(Value::from),
            prop_oneof![
                Just("../../../etc/passwd"),
                Just("/etc/passwd"),
                Just("const float*"),
                Just("float\n; evil"),
                Just("FLASHGEN_MODULE"),
                Just("int"),
                Just("__x"),
                Just("toy/variants/plain.cuh"),
                Just("f16"),
                Just("plain"),
                Just("9é"),
            ]
            .prop_map(Value::from),
            any::<String>().prop_map(Value::from),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Walks `path` (child picks, modulo the width) from the root, then replaces the node reached,
    /// or on the way removes a key (op 1) or appends to an array (op 2).
    fn mutate(node: &mut Value, path: &[usize], op: u8, new: Value) {
        let Some((&pick, rest)) = path.split_first() else {
            *node = new;
            return;
        };
        match node {
            Value::Object(m) if !m.is_empty() => {
                let key = m.keys().nth(pick % m.len()).unwrap().clone();
                if op == 1 && rest.is_empty() {
                    m.shift_remove(&key);
                } else {
                    mutate(m.get_mut(&key).unwrap(), rest, op, new);
                }
            }
            Value::Array(a) if !a.is_empty() => {
                if op == 2 && rest.is_empty() {
                    a.push(new);
                } else {
                    let n = a.len();
                    mutate(&mut a[pick % n], rest, op, new);
                }
            }
            other => *other = new,
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn arch_lists_never_panic(list in prop_oneof![
            any::<String>(),
            "[0-9.,; +a-zA-Z_é]{0,16}",
        ]) {
            if let Err(e) = flashgen::arch::parse_list(&list, "--arch") {
                prop_assert_eq!(flashgen::error::exit_code(&e), 2);
            }
        }

        #[test]
        fn arbitrary_text_is_refused_as_bad_input(text in any::<String>()) {
            check(text)?;
        }

        #[test]
        fn mutated_configs_never_panic(
            edits in prop::collection::vec(
                (prop::collection::vec(any::<usize>(), 0..7), 0u8..4, value()),
                1..4,
            )
        ) {
            let mut cfg = toy();
            for (path, op, new) in edits {
                mutate(&mut cfg, &path, op, new);
            }
            check(serde_json::to_string(&cfg).unwrap())?;
        }

        #[test]
        fn mutated_bytes_never_panic(
            edits in prop::collection::vec((any::<usize>(), any::<char>()), 1..6)
        ) {
            let mut text: Vec<char> = std::fs::read_to_string(toy_path()).unwrap().chars().collect();
            for (at, c) in edits {
                let n = text.len();
                text[at % n] = c;
            }
            check(text.into_iter().collect())?;
        }
    }
}

/// A module without a variant axis still gets an (empty) `ADDITIONAL_PARAMS_DECL`, so the shared
/// flashgen/params.cuh builds for it: params need no variant axis.
#[test]
fn a_module_without_a_variant_axis_declares_empty_additional_params() {
    let t = common::Tree::bare(
        r#"{"archs": ["9.0a"], "modules": {"m": {"source": "m.cu", "entry_points": ["m_run"],
            "axes": [{"name": "head_dim", "type": "int", "values": [64]}]}}}"#,
    );
    let o = t.run(&["generate", "--out", "gen"]);
    assert_success(&o);
    let header =
        std::fs::read_to_string(t.path("gen/m_head_dim_64/flashgen_instance.cuh")).unwrap();
    assert!(
        header.contains("#define ADDITIONAL_PARAMS_DECL\n"),
        "{header}"
    );
}

/// `--module` takes a shell-style glob as `--where` does; one that matches no module names the
/// modules that exist.
#[test]
fn module_filter_takes_globs() {
    let run = |args: &[&str]| {
        assert_cmd::Command::cargo_bin("flashgen")
            .unwrap()
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("FLASHGEN_CACHE_DIR", tempfile::tempdir().unwrap().path())
            .args(args)
            .output()
            .unwrap()
    };
    let o = run(&["list-variants", "--json", "--module", "*_decode"]);
    assert_success(&o);
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let modules: std::collections::BTreeSet<&str> =
        common::field_strs(&rows, "module").into_iter().collect();
    assert_eq!(
        modules.into_iter().collect::<Vec<_>>(),
        ["batch_decode", "single_decode"]
    );
    let o = run(&["list-variants", "--module", "nope*"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("modules: single_decode, batch_decode"));
}

/// A declared C ABI must carry every axis's runtime value (`<axis>_code`, or an int axis's own
/// field): the generated dispatch reads them.
#[test]
fn declared_args_must_carry_every_axis() {
    let t = common::Tree::bare(
        r#"{"archs": ["9.0a"], "modules": {"m": {"source": "m.cu", "entry_points": ["m_run"],
            "args": {"call": [{"name": "q", "type": "const void*"}],
                     "shape": [{"name": "head_dim", "type": "int64_t"}]},
            "axes": [{"name": "head_dim", "type": "int", "values": [64]},
                     {"name": "mode", "type": "enum", "values": ["a", "b"]}]}}}"#,
    );
    let o = t.run(&["list-variants"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("modules.m.args.shape") && err.contains("`mode_code`"),
        "{err}"
    );
}

// ---- variant parameters never shadow a core field ------------------------------------------

/// The repository's own matrix (the modules declare their C ABI there).
fn real_describe() -> Value {
    let o = Command::cargo_bin("flashgen")
        .unwrap()
        .args(["--config"])
        .arg(repo().join("variants.json"))
        .args(["describe", "--json"])
        .output()
        .unwrap();
    assert_success(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The data members of every params struct in params.cuh (`struct ... : AdditionalParams` or
/// `: ParamsBase<...>`; a variant reads them as `params.<name>`, as it reads its own parameters).
fn params_struct_members() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("include/flashgen/params.cuh")).unwrap();
    let mut out = Vec::new();
    // Brace depth inside a params struct (1: its members; more: a member function's body).
    let mut depth = 0usize;
    for line in text.lines() {
        let code = line.split("//").next().unwrap().trim();
        if code.starts_with("struct ")
            && (code.contains(": AdditionalParams") || code.contains(": ParamsBase<"))
        {
            depth = 1;
            continue;
        }
        if depth == 0 {
            continue; // outside the params structs (free functions' bodies)
        }
        let at = depth;
        depth = (depth + code.matches('{').count()).saturating_sub(code.matches('}').count());
        if at != 1
            || code.starts_with("using ")
            || code.contains(['(', '{', '}'])
            || !code.ends_with(';')
        {
            continue;
        }
        // `const T* a;`, `int64_t a, b, c;`: the names follow the type's last word.
        let decl = code.trim_end_matches(';').replace('*', " ");
        let mut parts = decl.split(',');
        let first = parts.next().unwrap().split_whitespace().last().unwrap();
        out.push(first.to_string());
        out.extend(parts.map(|p| p.trim().to_string()));
    }
    out
}

#[test]
fn every_params_struct_member_is_a_reserved_parameter_name() {
    let reserved = real_describe()["reserved_params"].clone();
    let members = params_struct_members();
    assert!(
        members.len() > 40,
        "parsed too little of params.cuh: {members:?}"
    );
    for m in [
        "sm_scale",
        "kv_len",
        "q",
        "o",
        "lse",
        "num_qo_heads",
        "paged_kv",
    ] {
        assert!(
            members.iter().any(|x| x == m),
            "{m} not parsed: {members:?}"
        );
    }
    let missing: Vec<_> = members
        .iter()
        .filter(|m| reserved.get(m.as_str()).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "params.cuh members that modules.<m>.args does not declare (describe's reserved_params \
         misses them): {missing:?}"
    );
}

#[test]
fn a_variant_parameter_named_like_a_core_field_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine.cuh"), "#pragma once\n").unwrap();
    let vfile = dir.path().join("custom.json");
    let run = |pname: &str| {
        let vf = json!({"variants": {"mine": {"header": "mine.cuh", "struct": "Mine",
            "params": [{"name": "bias", "type": "float"}, {"name": pname, "type": "float"}]}}});
        std::fs::write(&vfile, vf.to_string()).unwrap();
        Command::cargo_bin("flashgen")
            .unwrap()
            .arg("--config")
            .arg(repo().join("variants.json"))
            .arg("--variants-file")
            .arg(&vfile)
            .args(["list-variants", "--json", "--where", "variant=mine"])
            .output()
            .unwrap()
    };
    for name in [
        "sm_scale",
        "kv_len",
        "q",
        "o",
        "lse",
        "num_qo_heads",
        "rope_theta",
        "workspace",
    ] {
        let o = run(name);
        assert_usage_error(
            &o,
            &[
                "custom.json: variants.mine.params[1].name",
                &format!("parameter `{name}` is a core field"),
                "single_decode",
                "rename the parameter",
            ],
        );
    }
    assert!(run("my_scale").status.success());
    // A module without a variant axis (merge_state) passes no variant parameters: its fields
    // reserve no name, and describe does not list them.
    for name in ["num_states_a", "v_a", "mask"] {
        assert!(run(name).status.success(), "{name} is not reserved");
    }
    let reserved = real_describe()["reserved_params"].clone();
    assert!(reserved.get("num_states_a").is_none(), "{reserved}");
    assert!(!reserved.to_string().contains("merge_state"), "{reserved}");
    // The same in the project's variants.json.
    let t = tempfile::tempdir().unwrap();
    copy_dir(&repo().join("include"), &t.path().join("include"));
    copy_dir(&repo().join("csrc"), &t.path().join("csrc"));
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("variants.json")).unwrap())
            .unwrap();
    cfg["variants"]["soft_cap"]["params"][0]["name"] = json!("sm_scale");
    std::fs::write(t.path().join("variants.json"), cfg.to_string()).unwrap();
    let o = Command::cargo_bin("flashgen")
        .unwrap()
        .current_dir(t.path())
        .env("FLASHGEN_CACHE_DIR", t.path().join(".cache"))
        .env("FLASHGEN_NVCC", "/nonexistent/nvcc")
        .args(["build", "--out", "out"])
        .output()
        .unwrap();
    assert_usage_error(
        &o,
        &[
            "variants.json: variants.soft_cap.params[0].name",
            "`sm_scale` is a core field",
        ],
    );
    assert!(!t.path().join("out").exists());
}

// ---- the same refusal everywhere a value is read ---------------------------------------------

#[test]
fn an_unreadable_arch_list_is_refused_by_list_variants_as_by_build() {
    let t = Tree::new();
    for bad in ["9.0\u{e4}", "+9.0", "\u{669}.\u{660}", "9.0 sm_\u{b2}0"] {
        for args in [
            vec!["list-variants", "--arch", bad],
            vec!["list-variants", "--json", "--arch", bad],
            vec!["build", "--out", "out", "--arch", bad],
        ] {
            let o = t.run(&args);
            assert_usage_error(&o, &["--arch", "cannot read GPU architecture"]);
            assert!(stdout(&o).is_empty(), "{args:?}: {}", stdout(&o));
        }
        let o = t
            .cmd()
            .env("FLASHGEN_CUDA_ARCH_LIST", bad)
            .args(["list-variants"])
            .output()
            .unwrap();
        assert_usage_error(&o, &["FLASHGEN_CUDA_ARCH_LIST"]);
    }
    // No list anywhere is not an error for a view: the column says so.
    t.edit(|c| {
        c.as_object_mut().unwrap().remove("archs");
    });
    let o = t.run(&["list-variants", "--json"]);
    assert_success(&o);
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(rows[0]["archs"], Value::Null);
}

#[test]
fn a_device_capability_is_ascii_digits_only() {
    let t = Tree::new();
    for bad in ["\u{669}.\u{660}", "\u{b2}.0", "+9.0", "9.+0", "9.0\u{e4}"] {
        let o = t.run(&["jit", "--device-cc", bad, "--module", "toy"]);
        assert_usage_error(
            &o,
            &["--device-cc", "is not a compute capability", "e.g. 9.0"],
        );
    }
}

#[test]
fn the_ninja_hint_quotes_the_folder() {
    let t = Tree::new();
    let o = t.run(&["generate", "--ninja", "--out", "gen dir; rm -rf x"]);
    assert_success(&o);
    let dir = t.path("gen dir; rm -rf x");
    assert_stderr_has(&o, &format!("ninja -C '{}'", dir.display()));
}

// ---- combinations no instance serves (`modules.<m>.unsupported`) ---------------------------

/// The toy with `mode=max` declared unsupported with `scaled`, for this reason.
const MAX_SCALED: &str = "max of scaled rows overflows: call mode=sum";

fn toy_with_unsupported(unsupported: Value) -> Tree {
    let t = Tree::new();
    t.edit(|v| v["modules"]["toy"]["unsupported"] = unsupported);
    t
}

/// An unsupported combination is no instance: not listed, not built, not in describe's
/// instances (describe carries the declaration for the loader); a `--where` that selects only
/// such combinations names the declaration and its reason, and a build of them writes nothing.
#[test]
fn an_unsupported_combination_is_no_instance_and_a_filter_for_it_says_why() {
    let t = toy_with_unsupported(
        json!([{"where": {"variant": ["scaled"], "mode": ["max"]}, "reason": MAX_SCALED}]),
    );
    let o = t.run(&["list-variants", "--json"]);
    assert_success(&o);
    let rows: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    // dtype 2 x width 3 x fast 2 x mode 2 x variant 2, less the 12 of max with scaled.
    assert_eq!(rows.len(), 36);
    assert!(!rows
        .iter()
        .any(|r| r["params"]["mode"] == "max" && r["params"]["variant"] == "scaled"));
    assert!(stdout(&t.run(&["list-variants"])).contains("36 instances"));

    let o = t.run(&["describe"]);
    assert_success(&o);
    let d: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        d["modules"]["toy"]["unsupported"],
        json!([{"where": {"mode": ["max"], "variant": ["scaled"]}, "reason": MAX_SCALED}])
    );
    assert_eq!(d["instances"].as_array().unwrap().len(), 36);

    for args in [
        &[
            "build",
            "--out",
            "out",
            "--where",
            "mode=max",
            "--where",
            "variant=scaled",
        ][..],
        &[
            "list-variants",
            "--where",
            "mode=m*",
            "--where",
            "variant=s*",
            "--where",
            "width=64",
        ],
    ] {
        let o = t.run(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        for needle in [
            "they select combinations that",
            "declares unsupported",
            "toy mode=max variant=scaled (modules.toy.unsupported[0]): ",
            MAX_SCALED,
        ] {
            assert_stderr_has(&o, needle);
        }
    }
    assert!(!t.path("out").exists(), "nothing is built");
    // A filter that misses for another reason says nothing of the declaration.
    let o = t.run(&["list-variants", "--where", "mode=max", "--where", "width=7"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!stderr(&o).contains("unsupported"), "{}", stderr(&o));
}

/// A declaration is checked as `release.exclude` is: its selection against the module's axes
/// and values, a reason, and it may not empty the module.
#[test]
fn an_unsupported_declaration_names_its_field_when_it_is_wrong() {
    for (unsupported, needles) in [
        (
            json!([{"where": {"depth": [1]}, "reason": "r"}]),
            vec!["modules.toy.unsupported[0].where.depth", "no axis `depth`"],
        ),
        (
            json!([{"where": {"mode": ["min"]}, "reason": "r"}]),
            vec![
                "modules.toy.unsupported[0].where.mode",
                "value `min` is not on axis `mode` (values: sum, max)",
            ],
        ),
        (
            json!([{"where": {"mode": ["max"]}, "reason": " "}]),
            vec![
                "modules.toy.unsupported[0].reason",
                "say why no instance serves",
            ],
        ),
        (
            json!([{"where": {}, "reason": "r"}]),
            vec![
                "modules.toy.unsupported[0].where",
                "an empty selection declares every combination",
            ],
        ),
        (
            json!([{"where": {"mode": ["max"]}, "reason": "r"},
                   {"where": {"mode": ["sum"]}, "reason": "r"}]),
            vec!["modules.toy.unsupported", "the module has no instance"],
        ),
        (json!([{"where": {"mode": ["max"]}}]), vec!["reason"]),
    ] {
        let t = toy_with_unsupported(unsupported);
        let o = t.run(&["list-variants"]);
        assert_no_panic(&o);
        assert_usage_error(&o, &needles);
    }
    // A release exclusion inside a declaration excludes nothing; one that reaches past it does.
    for (exclude, refused) in [
        (
            json!({"mode": ["max"], "variant": ["scaled"], "width": [32]}),
            true,
        ),
        (
            json!({"mode": ["max"], "variant": ["scaled", "plain"]}),
            false,
        ),
    ] {
        let t = toy_with_unsupported(
            json!([{"where": {"variant": ["scaled"], "mode": ["max"]}, "reason": MAX_SCALED}]),
        );
        t.edit(|v| {
            v["modules"]["toy"]["release"] =
                json!({"exclude": [{"where": exclude, "reason": "left to the JIT"}]})
        });
        let o = t.run(&["list-variants"]);
        if !refused {
            assert_success(&o);
            continue;
        }
        assert_usage_error(
            &o,
            &[
                "modules.toy.release.exclude[0]",
                "it selects only combinations that unsupported[0] declares",
            ],
        );
    }
}
