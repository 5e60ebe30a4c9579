//! `--manylinux 2_17`: a toy instance built through the zig host compiler needs nothing newer
//! than GLIBC_2.17 and no libstdc++, loads, carries the same device code as the g++ build, and
//! gets the wheel tag `manylinux_2_17`; a wheel whose binary needs a newer glibc is refused.
//! Skipped without nvcc or zig 0.13 (`FLASHGEN_ZIG`, else the PyPI `ziglang` beside nvcc).

mod common;

use std::path::{Path, PathBuf};

use common::*;

const INSTANCE: &[&str] = &[
    "dtype=f16",
    "width=32",
    "fast=false",
    "mode=sum",
    "variant=plain",
];

/// The tree, with FLASHGEN_ZIG set, or None when a tool is missing (a skip, see `require`).
#[track_caller]
fn setup() -> Option<(Tree, PathBuf)> {
    let zig = require(project_nvcc().and(zig()), NEEDS_ZIG)?;
    Some((Tree::new("toy"), zig))
}

fn build(t: &Tree, zig: &Path, out: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "build",
        "--json",
        "--no-compress",
        "--out",
        out,
        "--module",
        "toy",
    ];
    let w = wheres(INSTANCE);
    args.extend(w.iter().map(String::as_str));
    args.extend(extra);
    let o = t
        .cmd()
        .env("FLASHGEN_ZIG", zig)
        .env_remove("FLASHGEN_MANYLINUX")
        .args(&args)
        .output()
        .unwrap();
    assert_success(&o);
    json(&o)
}

/// The bytes of one ELF section.
fn section(file: &Path, name: &str) -> Vec<u8> {
    let bytes = std::fs::read(file).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let sh = elf
        .section_headers
        .iter()
        .find(|sh| elf.shdr_strtab.get_at(sh.sh_name) == Some(name))
        .unwrap_or_else(|| panic!("{}: no {name}", file.display()));
    bytes[sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize].to_vec()
}

/// Every `GLIBC_*` version the file's dynamic symbols need, and its DT_NEEDED libraries.
fn needs(file: &Path) -> (Vec<String>, Vec<String>) {
    let bytes = std::fs::read(file).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let mut versions: Vec<String> = elf
        .verneed
        .iter()
        .flat_map(|v| v.iter().flat_map(|n| n.iter().collect::<Vec<_>>()))
        .filter_map(|aux| elf.dynstrtab.get_at(aux.vna_name).map(str::to_string))
        .collect();
    versions.sort();
    versions.dedup();
    let libs = elf.libraries.iter().map(|s| s.to_string()).collect();
    (versions, libs)
}

#[test]
fn manylinux_2_17_instance_needs_glibc_2_17_loads_and_keeps_the_device_code() {
    let Some((t, zig)) = setup() else { return };
    let zig_build = build(&t, &zig, "zig", &["--manylinux", "2_17"]);
    let gcc_build = build(&t, &zig, "gcc", &[]);
    let so = |b: &serde_json::Value| PathBuf::from(b["instances"][0]["path"].as_str().unwrap());
    let (zso, gso) = (so(&zig_build), so(&gcc_build));
    // The target and the host compiler key the cache: two objects, both compiled.
    assert_ne!(
        zig_build["instances"][0]["fingerprint"],
        gcc_build["instances"][0]["fingerprint"]
    );
    assert_eq!(zig_build["built"], 1);

    let (versions, libs) = needs(&zso);
    // The shared CUDA runtime's own version node is not glibc's.
    for v in versions.iter().filter(|v| !v.starts_with("libcudart.so.")) {
        let minor: u32 = v
            .strip_prefix("GLIBC_2.")
            .unwrap_or_else(|| panic!("{v}: not a glibc version"))
            .split('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(minor <= 17, "{} needs {v}", zso.display());
    }
    assert!(
        !libs
            .iter()
            .any(|l| l.contains("stdc++") || l.contains("gcc_s")),
        "{libs:?}"
    );

    // It loads: the C++ ABI runtime is linked in (no undefined __gxx_personality_v0).
    // SAFETY: loading a library this test built; nothing from it is called.
    unsafe {
        let lib = load_instance(&zso);
        lib.get::<unsafe extern "C" fn()>(b"toy_query\0").unwrap();
        std::mem::forget(lib); // unloaded in a process of its own, below
    }
    dlopen_dlclose_and_exit(&zso);

    // The device code is nvcc's alone: uncompressed, the fatbins (cubins and nvlink's option
    // string) are byte-identical to the g++ build's.
    assert_eq!(section(&zso, ".nv_fatbin"), section(&gso, ".nv_fatbin"));
}

/// Loads and unloads `so` three times in a process of its own, which must then exit cleanly.
/// Regression: zig linked no crtbegin, so nothing finalized the exit handlers that cudart's
/// static init registers; after dlclose the process crashed at exit, calling into the unmapped
/// `.so` (SIGSEGV).
fn dlopen_dlclose_and_exit(so: &Path) {
    let code = "import ctypes, _ctypes, sys\n\
                for _ in range(3):\n    \
                    _ctypes.dlclose(ctypes.CDLL(sys.argv[1])._handle)\n\
                print('unloaded')\n";
    let o = std::process::Command::new("python3")
        .args(["-c", code])
        .arg(so)
        .env("LD_LIBRARY_PATH", cuda_runtime_dir())
        .output()
        .unwrap();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("unloaded"),
        "dlopen/dlclose of {}: {} {}",
        so.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_missing_zig_is_a_clear_error() {
    let Some((t, _)) = setup() else { return };
    // An nvcc with no ziglang beside it, no Python environment, no zig on PATH.
    let fake = t.path("bin/nvcc");
    std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut args = vec!["jit", "--device-cc", "9.0", "--module", "toy"];
    let w = wheres(INSTANCE);
    args.extend(w.iter().map(String::as_str));
    for how in [&["--manylinux", "2_17"][..], &[]] {
        let o = t
            .cmd()
            .env("FLASHGEN_NVCC", &fake)
            .env("FLASHGEN_MANYLINUX", "2_17")
            .env("FLASHGEN_PYTHON", t.path("no/python3"))
            .env("PATH", "/usr/bin:/bin")
            .env_remove("FLASHGEN_ZIG")
            .env_remove("VIRTUAL_ENV")
            .env_remove("CONDA_PREFIX")
            .args(&args)
            .args(how)
            .output()
            .unwrap();
        assert_usage_error(
            &o,
            &[
                "zig 0.13",
                "none was found",
                "pip install ziglang==0.13.0",
                "FLASHGEN_MANYLINUX=off",
            ],
        );
    }
}

#[test]
fn manylinux_wheel_is_tagged_2_17_and_a_newer_binary_is_refused() {
    let Some((t, zig)) = setup() else { return };
    t.with_python_package();
    // A stand-in for the static flashgen binary: any ELF that needs no newer glibc.
    std::fs::write(t.path("stub.c"), "int main(void) { return 0; }\n").unwrap();
    let stub = t.path("stub");
    let o = std::process::Command::new(&zig)
        .args(["cc", "-target", "x86_64-linux-gnu.2.17", "-o"])
        .arg(&stub)
        .arg(t.path("stub.c"))
        .output()
        .unwrap();
    assert_success(&o);

    let mut args: Vec<String> = [
        "build-wheel",
        "--manylinux",
        "2_17",
        "--module",
        "toy",
        "-q",
    ]
    .map(String::from)
    .to_vec();
    args.extend(wheres(INSTANCE));
    let o = t
        .cmd()
        .env("FLASHGEN_ZIG", &zig)
        .args(&args)
        .arg("--binary")
        .arg(&stub)
        .output()
        .unwrap();
    assert_success(&o);
    let wheel = stdout(&o).trim().to_string();
    assert!(
        wheel.ends_with("-py3-none-manylinux_2_17_x86_64.whl"),
        "{wheel}"
    );
    // Its jit extra brings the zig its JIT builds with, and its manifest says for which glibc.
    let metadata = wheel_member(Path::new(&wheel), ".dist-info/METADATA");
    assert!(
        metadata.contains("\nRequires-Dist: ziglang==0.13.0; extra == \"jit\"\n"),
        "{metadata}"
    );
    let manifest: serde_json::Value =
        serde_json::from_str(&wheel_member(Path::new(&wheel), "_aot/manifest.json")).unwrap();
    assert_eq!(manifest["manylinux"], "2_17");

    // The test's own binary is dynamic and built on this glibc: refused, not tagged higher.
    // (Skipped where this machine's glibc is itself 2.17.)
    let o = t
        .cmd()
        .env("FLASHGEN_ZIG", &zig)
        .args(&args)
        .output()
        .unwrap();
    if o.status.success() {
        assert!(stdout(&o).contains("manylinux_2_17"), "{}", stdout(&o));
    } else {
        assert_usage_error(&o, &["--manylinux manylinux_2_17", "crt-static"]);
    }
}
