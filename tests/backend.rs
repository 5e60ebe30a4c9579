//! Per-architecture instances: a `backend` axis whose `sm90` value is built only for 9.0a, on the
//! `backend` fixture (its sm90 code runs wgmma.fence, which ptxas accepts for sm_90a alone).
//! Expansion and filters, the views that show each instance's archs, every refusal of a limit
//! that leaves an instance no arch, the generated header, builds for 8.0 and for 8.0 + 9.0a with
//! real nvcc, the manifest's per-row `runs_on`, and the JIT's choice and refusal per device.

use serde_json::{json, Value};

mod common;
use common::*;

const SM90_32: &str = "kern_backend_sm90_width_32";
const PORTABLE_32: &str = "kern_backend_portable_width_32";

fn rows(t: &Tree, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["list-variants", "--json"];
    all.extend_from_slice(args);
    json(&t.run(&all)).as_array().unwrap().clone()
}

fn row<'a>(rows: &'a [Value], uri: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["uri"] == uri)
        .unwrap_or_else(|| panic!("no row {uri} in {rows:?}"))
}

#[test]
fn backend_axis_expands_and_each_row_shows_its_archs() {
    let t = Tree::new("backend");
    let all = rows(&t, &[]);
    let uris: Vec<&str> = all.iter().map(|r| r["uri"].as_str().unwrap()).collect();
    assert_eq!(
        uris,
        [
            SM90_32,
            "kern_backend_sm90_width_64",
            PORTABLE_32,
            "kern_backend_portable_width_64"
        ]
    );
    let sm90 = row(&all, SM90_32);
    assert_eq!(sm90["params"]["backend"], "sm90");
    assert_eq!(
        sm90["codes"]["backend"], 0,
        "codes follow the declared order"
    );
    assert_eq!(sm90["arch_limit"], json!(["9.0a"]));
    assert_eq!(
        sm90["archs"],
        json!(["9.0a"]),
        "variants.json archs: 8.0 9.0a"
    );
    let portable = row(&all, PORTABLE_32);
    assert!(portable.get("arch_limit").is_none(), "{portable}");
    assert_eq!(portable["archs"], json!(["8.0", "9.0a"]));

    // Under --arch 8.0 the sm90 rows are built for nothing; the table says so.
    let for80 = rows(&t, &["--arch", "8.0"]);
    assert_eq!(row(&for80, SM90_32)["archs"], json!([]));
    assert_eq!(row(&for80, PORTABLE_32)["archs"], json!(["8.0"]));
    let table = stdout(&t.run(&["list-variants", "--arch", "8.0+PTX"]));
    assert!(table.lines().next().unwrap().contains("ARCHS"), "{table}");
    let line = |uri: &str| table.lines().find(|l| l.contains(uri)).unwrap().to_string();
    assert!(line(SM90_32).contains(" - "), "{table}");
    assert!(line(PORTABLE_32).contains("8.0+PTX"), "{table}");
    assert!(
        table.contains("4 instances, 2 precompiled, 2 built for none of these archs"),
        "{table}"
    );
}

#[test]
fn filters_select_backends_like_any_axis() {
    let t = Tree::new("backend");
    let sm90 = rows(&t, &["--where", "backend=sm90"]);
    assert_eq!(sm90.len(), 2);
    assert!(sm90.iter().all(|r| r["params"]["backend"] == "sm90"));
    let aot = rows(&t, &["--aot", "--where", "backend=port*"]);
    assert_eq!(aot.len(), 1);
    assert_eq!(aot[0]["uri"], PORTABLE_32);
    let o = t.run(&["list-variants", "--where", "backend=sm100"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_stderr_has(&o, "values on axis `backend`: sm90, portable");
}

#[test]
fn describe_carries_the_backend_order_and_what_each_runs_on() {
    let t = Tree::new("backend");
    let d = json(&t.run(&["describe"]));
    let m = &d["modules"]["kern"];
    assert_eq!(m["axes"][0]["type"], "backend");
    let supports = |runs: &str| format!("on this device kern supports backend {runs}");
    assert_eq!(
        m["backends"],
        json!({"axis": "backend", "order": [
            {"name": "sm90", "arch_limit": ["9.0a"],
             "runs_on": [{"target": "sm_90a", "min": [9, 0], "max": [9, 0]}],
             "refused": "backend='sm90' is built only for 9.0a, which does not run on a GPU of \
                         compute capability {cc}; {supports}"},
            {"name": "portable", "arch_limit": null, "runs_on": null, "refused": null},
        ],
        // The choice per device: every capability the binary accepts, in ranges.
        "by_device": [
            {"min": [1, 0], "max": [8, 9], "backends": ["portable"], "supports": supports("'portable'")},
            {"min": [9, 0], "max": [9, 0], "backends": ["sm90", "portable"],
             "supports": supports("'sm90', 'portable'")},
            {"min": [9, 1], "max": [99, 9], "backends": ["portable"], "supports": supports("'portable'")},
        ],
        "unknown": "backend='{value}' is not a backend of kern; it has sm90 (9.0a only), portable",
        "none_runs": "no backend of kern runs on a GPU of compute capability {cc}: sm90 (9.0a only), portable",
        "hint": "Leave backend unset to take the first one the device runs."})
    );
    assert!(m.get("arch_limit").is_none());
    // A module limit narrows every backend, and shows on the module.
    t.write(
        "variants.json",
        &std::fs::read_to_string(t.path("variants.json"))
            .unwrap()
            .replace("\"aot\": {", "\"archs\": [\"9.0a\", \"8.0\"], \"aot\": {"),
    );
    let d = json(&t.run(&["describe"]));
    let m = &d["modules"]["kern"];
    assert_eq!(m["arch_limit"], json!(["9.0a", "8.0"]));
    assert_eq!(m["backends"]["order"][0]["arch_limit"], json!(["9.0a"]));
    assert_eq!(
        m["backends"]["order"][1]["arch_limit"],
        json!(["9.0a", "8.0"])
    );
}

/// The fixture's variants.json with `edit` applied; the command's output.
fn with_config(edit: impl FnOnce(&mut Value), args: &[&str]) -> std::process::Output {
    let t = Tree::new("backend");
    t.edit(edit);
    t.run(args)
}

#[test]
fn a_limit_that_leaves_an_instance_no_arch_is_refused_naming_file_and_field() {
    let list = ["list-variants"];
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(Edit, Vec<&str>)> = vec![
        (
            Box::new(|c| c["modules"]["kern"]["axes"][0]["archs"]["sm90"] = json!(["10.0a"])),
            vec![
                "variants.json: modules.kern.axes[0].archs.sm90: backend `sm90` is built only for 10.0a, none of which is in variants.json `archs` (8.0 9.0a)",
                "no architecture",
                "add 10.0a to `archs`",
            ],
        ),
        (
            Box::new(|c| c["modules"]["kern"]["archs"] = json!(["8.0"])),
            vec![
                "modules.kern.axes[0].archs.sm90: backend `sm90` is built only for 9.0a, but the module only for 8.0",
                "no architecture",
            ],
        ),
        (
            Box::new(|c| {
                c["modules"]["kern"]["axes"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("archs");
                c["modules"]["kern"]["archs"] = json!(["10.0"])
            }),
            vec!["modules.kern.archs: the module is built only for 10.0, none of which is in variants.json `archs`"],
        ),
        (
            Box::new(|c| c["modules"]["kern"]["axes"][0]["archs"]["sm90"] = json!([])),
            vec!["modules.kern.axes[0].archs.sm90: an empty list of architectures builds nothing"],
        ),
        (
            Box::new(|c| c["modules"]["kern"]["axes"][0]["archs"]["sm90"] = json!(["9.0a+PTX"])),
            vec!["modules.kern.axes[0].archs.sm90[0]", "+PTX is chosen by the build"],
        ),
        (
            Box::new(|c| c["modules"]["kern"]["axes"][0]["archs"]["sm90"] = json!(["hopper"])),
            vec!["modules.kern.axes[0].archs.sm90[0]: cannot read GPU architecture `hopper`"],
        ),
        (
            Box::new(|c| c["modules"]["kern"]["axes"][0]["archs"] = json!({"sm100": ["10.0a"]})),
            vec!["modules.kern.axes[0].archs.sm100: `sm100` is not a value of axis `backend` (values: sm90, portable)"],
        ),
        (
            Box::new(|c| c["modules"]["kern"]["axes"][1]["archs"] = json!({"32": ["8.0"]})),
            vec!["modules.kern.axes[1].archs: only `backend` axes take `archs`"],
        ),
        (
            Box::new(|c| {
                c["modules"]["kern"]["axes"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "impl", "type": "backend", "values": ["a"]}))
            }),
            vec!["modules.kern.axes[2]: a module has one backend axis, and `backend` is already one"],
        ),
        (
            Box::new(|c| c["archs"] = json!(["8.0", "banana"])),
            vec!["variants.json: archs: variants.json archs: cannot read GPU architecture `banana`"],
        ),
    ];
    for (edit, needles) in cases {
        let o = with_config(edit, &list);
        assert_usage_error(&o, &needles);
    }
    // Without default archs only the limits' own overlap is checked.
    let o = with_config(
        |c| {
            c.as_object_mut().unwrap().remove("archs");
            c["modules"]["kern"]["axes"][0]["archs"]["sm90"] = json!(["10.0a"]);
        },
        &["list-variants", "--json", "--arch", "10.0a"],
    );
    assert_success(&o);
    assert_eq!(
        row(json(&o).as_array().unwrap(), SM90_32)["archs"],
        json!(["10.0a"])
    );
}

#[test]
fn the_generated_header_exposes_the_backend_to_the_sources() {
    let t = Tree::new("backend");
    let o = t.run(&["generate", "--out", "gen"]);
    assert_success(&o);
    let sm90 =
        std::fs::read_to_string(t.path(&format!("gen/{SM90_32}/flashgen_instance.cuh"))).unwrap();
    for needle in [
        "// axis backend (backend): sm90",
        "#define FLASHGEN_CODE_backend_sm90 0",
        "#define FLASHGEN_CODE_backend_portable 1",
        "#define FLASHGEN_BACKEND_sm90 1",
        "#define FLASHGEN_BACKEND_portable 0",
        "constexpr int BACKEND = 0;",
        "#define DISPATCH_backend(value, NAME, ...)",
        "constexpr int NAME = 0;",
    ] {
        assert!(sm90.contains(needle), "{needle:?} missing:\n{sm90}");
    }
    let portable =
        std::fs::read_to_string(t.path(&format!("gen/{PORTABLE_32}/flashgen_instance.cuh")))
            .unwrap();
    assert!(
        portable.contains("#define FLASHGEN_BACKEND_sm90 0\n#define FLASHGEN_BACKEND_portable 1")
    );
    // Each compile command names only the archs its instance is built for.
    let commands: Value = serde_json::from_str(
        &std::fs::read_to_string(t.path("gen/compile_commands.json")).unwrap(),
    )
    .unwrap();
    let gencodes = |uri: &str| -> Vec<String> {
        let entry = commands
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["file"].as_str().is_some() && c["output"].as_str().unwrap().contains(uri))
            .unwrap();
        entry["arguments"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str().filter(|a| a.starts_with("-gencode")))
            .map(String::from)
            .collect()
    };
    assert_eq!(gencodes(SM90_32), ["-gencode=arch=compute_90a,code=sm_90a"]);
    assert_eq!(
        gencodes(PORTABLE_32),
        [
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_90a,code=sm_90a"
        ]
    );
    // For 8.0 only, the sm90 instances are left out, with a note.
    let o = t.run(&["generate", "--out", "gen80", "--arch", "8.0"]);
    assert_success(&o);
    assert!(stderr(&o).contains("leaving out 2 instances built for none of 8.0"));
    assert!(!t.path(&format!("gen80/{SM90_32}")).exists());
    // One dispatching binary is compiled for every arch: it holds only what runs on all of them.
    let o = t.run(&["generate", "--dispatch", "--out", "disp"]);
    assert_success(&o);
    assert_stderr_has(
        &o,
        "--dispatch: 2 instances of kern are left out of its header",
    );
    let h = std::fs::read_to_string(t.path("disp/kern/flashgen_instance.cuh")).unwrap();
    assert!(h.contains("// axis backend (backend): portable\n"), "{h}");
    assert!(h.contains("#define FLASHGEN_BACKEND_sm90 0\n#define FLASHGEN_BACKEND_portable 1"));
    let h = dispatch_header(t.cmd(), &t, "disp90", "kern", &["--arch", "9.0a"]);
    assert!(
        h.contains("// axis backend (backend): sm90, portable\n"),
        "{h}"
    );
    assert!(h.contains("#define FLASHGEN_BACKEND_sm90 1\n#define FLASHGEN_BACKEND_portable 1"));
}

#[test]
fn a_build_for_8_0_never_compiles_an_sm90_instance() {
    let t = Tree::new("backend");
    let o = t
        .cmd()
        .args([
            "build", "--out", "out80", "--json", "--jobs", "2", "--arch", "8.0",
        ])
        .output()
        .unwrap();
    assert_success(&o);
    assert!(
        stderr(&o).contains("skipping 2 of 4 instances: built for none of 8.0")
            && stderr(&o).contains(&format!("built only for 9.0a: {SM90_32}")),
        "{}",
        stderr(&o)
    );
    let summary = json(&o);
    assert_eq!(summary["built"], 2);
    let manifest = read_json(&t.path("out80/manifest.json"));
    let uris: Vec<&str> = field_strs(&manifest["instances"], "uri");
    assert_eq!(uris, [PORTABLE_32, "kern_backend_portable_width_64"]);
    assert!(!t.path(&format!("out80/{SM90_32}.so")).exists());
    assert!(
        !t.path(&format!("out80/generated/{SM90_32}")).exists(),
        "not even its header is generated"
    );
    // Asking for the sm90 instances alone, for 8.0, builds nothing and says why.
    let o = t.run(&[
        "build",
        "--out",
        "sm90for80",
        "--arch",
        "8.0",
        "--where",
        "backend=sm90",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("none of the 2 selected instances is built for 8.0")
            && stderr(&o).contains("built only for 9.0a"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("nvcc failed"));
}

#[test]
fn a_build_for_8_0_and_9_0a_compiles_sm90_for_9_0a_only_and_the_manifest_says_so() {
    let t = Tree::new("backend");
    let summary = build_json(&t, "out", &["--where", "width=32"]);
    assert_eq!(summary["built"], 2, "{summary}");
    let manifest = read_json(&t.path("out/manifest.json"));
    assert_eq!(manifest["archs"], json!(["sm_80", "sm_90a"]));
    let rows = manifest["instances"].as_array().unwrap();
    let sm90 = row(rows, SM90_32);
    assert_eq!(sm90["archs"], json!(["sm_90a"]));
    assert_eq!(
        sm90["runs_on"],
        json!([{"target": "sm_90a", "min": [9, 0], "max": [9, 0]}])
    );
    assert_eq!(sm90["arch_limit"], json!(["9.0a"]));
    let portable = row(rows, PORTABLE_32);
    assert_eq!(portable["archs"], json!(["sm_80", "sm_90a"]));
    assert_eq!(portable["runs_on"], manifest["runs_on"]);
    assert_recorded_sha256(&t.path(&format!("out/{SM90_32}.so")), sm90);

    // Each binary holds its own implementation, reached through DISPATCH_backend.
    let query = |uri: &str, codes: [i64; 2]| {
        let lib = unsafe { load_instance(&t.path(&format!("out/{uri}.so"))) };
        let f: libloading::Symbol<unsafe extern "C" fn(*const i64, i64, *mut u8, i64) -> i32> =
            unsafe { lib.get(b"kern_query").unwrap() };
        let mut buf = [0u8; 128];
        let rc = unsafe { f(codes.as_ptr(), 2, buf.as_mut_ptr(), 128) };
        let end = buf.iter().position(|&b| b == 0).unwrap();
        (rc, String::from_utf8_lossy(&buf[..end]).into_owned())
    };
    assert_eq!(query(SM90_32, [0, 32]), (0, "backend=sm90 width=32".into()));
    assert_eq!(
        query(PORTABLE_32, [1, 32]),
        (0, "backend=portable width=32".into())
    );
    assert_eq!(
        query(PORTABLE_32, [0, 32]).0,
        2,
        "the portable binary holds no sm90"
    );

    // The JIT on a Hopper device takes sm90 unasked, and finds the build's very bytes (AOT is
    // JIT run ahead of time: the same flags for the same archs).
    let jit = |cc: &str, extra: &[&str]| {
        let mut args = vec![
            "jit",
            "--device-cc",
            cc,
            "--module",
            "kern",
            "--where",
            "width=32",
        ];
        args.extend_from_slice(extra);
        t.run(&args)
    };
    let o = jit("9.0", &["--no-compile"]);
    assert_success(&o);
    let a = json(&o);
    assert_eq!(a["params"]["backend"], "sm90");
    assert_eq!(
        (a["arch"].as_str(), a["source"].as_str()),
        (Some("9.0a"), Some("cache"))
    );
    assert_eq!(a["sha256"], sm90["sha256"]);

    // Without the limit, the same sm90 source fails for sm_80: the fixture proves the skip.
    let cfg = std::fs::read_to_string(t.path("variants.json")).unwrap();
    t.write(
        "variants.json",
        &cfg.replace(", \"archs\": {\"sm90\": [\"9.0a\"]}", ""),
    );
    let o = t.run(&[
        "build",
        "--out",
        "unlimited",
        "--where",
        "backend=sm90",
        "--where",
        "width=32",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert_stderr_has(
        &o,
        "Instruction 'wgmma.fence' not supported on .target 'sm_80'",
    );
}

#[test]
fn the_jit_picks_the_first_backend_the_device_runs_and_refuses_one_it_cannot() {
    let t = Tree::new("backend");
    let pick = |cc: &str| {
        let a = jit_answer(&t, cc, "64");
        (
            a["params"]["backend"].as_str().unwrap().to_string(),
            a["arch"].as_str().unwrap().to_string(),
            a["source"].as_str().unwrap().to_string(),
        )
    };
    assert_eq!(
        pick("9.0"),
        ("sm90".into(), "9.0a".into(), "missing".into())
    );
    for (cc, arch) in [
        ("8.0", "8.0"),
        ("8.6", "8.6"),
        ("10.0", "10.0"),
        ("12.0", "12.0"),
    ] {
        assert_eq!(
            pick(cc),
            ("portable".into(), arch.into(), "missing".into()),
            "{cc}"
        );
    }
    // Named, it must run on the device; the refusal names the backend, the device and what it runs.
    let o = t.run(&[
        "jit",
        "--device-cc",
        "8.0",
        "--module",
        "kern",
        "--where",
        "backend=sm90",
        "--where",
        "width=64",
    ]);
    assert_usage_error(
        &o,
        &[
            "kern: backend='sm90' is built only for 9.0a, which does not run on a GPU of compute capability 8.0",
            "on this device kern supports backend 'portable'",
        ],
    );
    // Only the backend may be left out: a selection that spans another axis is refused.
    // `jit --no-compile` of the module on a Hopper device, before any --where.
    let hopper_lookup = [
        "jit",
        "--device-cc",
        "9.0",
        "--no-compile",
        "--module",
        "kern",
    ];
    let o = t.run(&hopper_lookup);
    assert_usage_error(
        &o,
        &[
            "select exactly one instance; 4 match",
            "the backend may be left out",
        ],
    );
    // An explicit arch list is narrowed to the limit: 8.0+PTX and 9.0a on Hopper build 9.0a.
    let o = t
        .cmd()
        .env("FLASHGEN_CUDA_ARCH_LIST", "8.0+PTX 9.0a")
        .args(hopper_lookup)
        .args(wheres(&["backend=sm90", "width=64"]))
        .output()
        .unwrap();
    assert_success(&o);
    assert_eq!(json(&o)["archs"], json!(["sm_90a"]));
    // A real compile: the sm90 instance for a Hopper device.
    let o = t.run(&[
        "jit",
        "--device-cc",
        "9.0",
        "--module",
        "kern",
        "--where",
        "width=64",
    ]);
    assert_success(&o);
    let a = json(&o);
    assert_eq!(
        (a["params"]["backend"].as_str(), a["source"].as_str()),
        (Some("sm90"), Some("compiled"))
    );
}
