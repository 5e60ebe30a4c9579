//! End-to-end tests of the wheel writer: real wheels written to temporary folders and read
//! back with the zip crate, and platform tags of real ELF files on this machine.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::wheel::{platform_tag, WheelBuilder, WheelError, WheelMetadata, WheelTag, WrittenWheel};

fn meta(name: &str) -> WheelMetadata {
    WheelMetadata {
        name: name.into(),
        version: "0.1.0".into(),
        summary: "A demo of the flashgen wheel writer".into(),
        requires_python: ">=3.9".into(),
        license: "Apache-2.0".into(),
        readme: Some(("text/markdown".into(), "# Demo\n\nSmall.\n".into())),
        requires_dist: vec!["numpy>=1.24".into()],
        provides_extra: vec![],
    }
}

fn tag() -> WheelTag {
    WheelTag::new("py3", "none", "manylinux_2_17_x86_64")
}

/// Source files for a small wheel: a package, a data file and an executable.
struct Inputs {
    dir: tempfile::TempDir,
}

impl Inputs {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("lib.so"), vec![7u8; 100_000]).unwrap();
        fs::write(dir.path().join("tool"), b"#!/bin/sh\necho hi\n").unwrap();
        set_mode(&dir.path().join("tool"), 0o700);
        Inputs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn builder(&self) -> WheelBuilder {
        let mut b = WheelBuilder::new(meta("flashgen-demo"), tag());
        b.add_bytes("flashgen_demo/__init__.py", b"X = 1\n".to_vec(), false)
            .unwrap();
        b.add_file("flashgen_demo/_lib/lib.so", &self.path("lib.so"))
            .unwrap();
        b.add_file("flashgen_demo/_bin/tool", &self.path("tool"))
            .unwrap();
        b.add_bytes("flashgen_demo/_data/matrix.json", b"{}".to_vec(), false)
            .unwrap();
        b.add_script("flashgen-demo", &self.path("tool")).unwrap();
        b
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn read_zip(path: &Path) -> Vec<(String, Vec<u8>, u32, zip::DateTime)> {
    let mut archive = zip::ZipArchive::new(fs::File::open(path).unwrap()).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut f = archive.by_index(i).unwrap();
            let mut bytes = Vec::new();
            f.read_to_end(&mut bytes).unwrap();
            let mode = f.unix_mode().unwrap();
            let time = f.last_modified().unwrap();
            (f.name().to_string(), bytes, mode, time)
        })
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn write_small(out: &Path, sde: Option<u64>) -> WrittenWheel {
    Inputs::new().builder().write(out, sde).unwrap()
}

/// The entries of the small wheel, written to a temporary folder and read back from the zip.
fn small_wheel_entries(sde: Option<u64>) -> Vec<(String, Vec<u8>, u32, zip::DateTime)> {
    let out = tempfile::tempdir().unwrap();
    read_zip(&write_small(out.path(), sde).path)
}

#[test]
fn small_wheel_has_exactly_these_entries_in_this_order() {
    let out = tempfile::tempdir().unwrap();
    let w = write_small(out.path(), None);
    assert_eq!(
        w.path,
        out.path()
            .join("flashgen_demo-0.1.0-py3-none-manylinux_2_17_x86_64.whl")
    );
    let names: Vec<&str> = w.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        names,
        [
            "flashgen_demo/__init__.py",
            "flashgen_demo/_bin/tool",
            "flashgen_demo/_data/matrix.json",
            "flashgen_demo/_lib/lib.so",
            "flashgen_demo-0.1.0.data/scripts/flashgen-demo",
            "flashgen_demo-0.1.0.dist-info/METADATA",
            "flashgen_demo-0.1.0.dist-info/WHEEL",
            "flashgen_demo-0.1.0.dist-info/RECORD",
        ]
    );
    let lib = w
        .entries
        .iter()
        .find(|e| e.path.ends_with("lib.so"))
        .unwrap();
    assert_eq!(lib.size, 100_000);
    assert!(lib.compressed_size < 1_000, "{lib:?}");
    let bytes = fs::read(&w.path).unwrap();
    assert_eq!(w.size, bytes.len() as u64);
    assert_eq!(
        w.sha256,
        crate::wheel::hashing::hex(&Sha256::digest(&bytes))
    );
}

#[test]
fn record_lists_every_entry_with_a_hash_recomputed_from_the_zip() {
    let entries = small_wheel_entries(None);
    let (record_name, record, _, _) = entries.last().unwrap();
    assert_eq!(record_name, "flashgen_demo-0.1.0.dist-info/RECORD");
    let record = String::from_utf8(record.clone()).unwrap();
    let lines: Vec<&str> = record.lines().collect();
    assert_eq!(lines.len(), entries.len());
    assert_eq!(
        *lines.last().unwrap(),
        "flashgen_demo-0.1.0.dist-info/RECORD,,"
    );
    for ((name, bytes, _, _), line) in entries.iter().zip(&lines).take(entries.len() - 1) {
        let hash = URL_SAFE_NO_PAD.encode(Sha256::digest(bytes));
        assert_eq!(*line, format!("{name},sha256={hash},{}", bytes.len()));
    }
}

#[test]
fn modes_and_times_are_fixed() {
    let modes: BTreeMap<String, u32> = small_wheel_entries(None)
        .into_iter()
        .map(|(name, _, mode, time)| {
            assert_eq!((time.year(), time.month(), time.day()), (1980, 1, 1));
            (name, mode)
        })
        .collect();
    assert_eq!(modes["flashgen_demo/_bin/tool"], 0o100755);
    assert_eq!(
        modes["flashgen_demo-0.1.0.data/scripts/flashgen-demo"],
        0o100755
    );
    assert_eq!(modes["flashgen_demo/_lib/lib.so"], 0o100644);
    assert_eq!(modes["flashgen_demo-0.1.0.dist-info/RECORD"], 0o100644);

    // 2023-11-14T22:13:20Z
    for (_, _, _, t) in small_wheel_entries(Some(1_700_000_000)) {
        assert_eq!(
            (
                t.year(),
                t.month(),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            ),
            (2023, 11, 14, 22, 13, 20)
        );
    }
}

#[test]
fn same_inputs_give_byte_identical_wheels() {
    let (a, b, c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    // Separate input folders too: source paths and their times must not leak into the wheel.
    let wa = write_small(a.path(), Some(1_700_000_000));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let wb = write_small(b.path(), Some(1_700_000_000));
    assert_eq!(fs::read(&wa.path).unwrap(), fs::read(&wb.path).unwrap());
    assert_eq!(wa.sha256, wb.sha256);
    let wc = write_small(c.path(), Some(1_800_000_000));
    assert_ne!(wa.sha256, wc.sha256, "the timestamp should reach the bytes");
}

#[test]
fn a_failed_write_leaves_nothing_at_the_destination() {
    let inputs = Inputs::new();
    let out = tempfile::tempdir().unwrap();
    let b = inputs.builder();
    fs::remove_file(inputs.path("lib.so")).unwrap();
    let err = b.write(out.path(), None).unwrap_err();
    assert!(format!("{err:#}").contains("lib.so"), "{err:#}");
    assert_eq!(files_in(out.path()), Vec::<String>::new());
}

#[test]
fn a_failed_write_keeps_the_previous_wheel() {
    let out = tempfile::tempdir().unwrap();
    let good = write_small(out.path(), None);
    let before = fs::read(&good.path).unwrap();
    let inputs = Inputs::new();
    let b = inputs.builder();
    fs::remove_file(inputs.path("tool")).unwrap();
    b.write(out.path(), None).unwrap_err();
    assert_eq!(fs::read(&good.path).unwrap(), before);
    assert_eq!(files_in(out.path()).len(), 1);
}

#[test]
fn a_successful_write_leaves_only_the_wheel() {
    let out = tempfile::tempdir().unwrap();
    write_small(out.path(), None);
    write_small(out.path(), None); // replaces the first
    assert_eq!(
        files_in(out.path()),
        ["flashgen_demo-0.1.0-py3-none-manylinux_2_17_x86_64.whl"]
    );
    let out_nested = out.path().join("new/folder");
    write_small(&out_nested, None);
    assert_eq!(files_in(&out_nested).len(), 1);
}

#[test]
fn bad_entries_are_refused_when_added() {
    let inputs = Inputs::new();
    let mut b = inputs.builder();
    let dup = b
        .add_bytes("flashgen_demo/__init__.py", vec![], false)
        .unwrap_err();
    assert!(
        matches!(dup.downcast_ref(), Some(WheelError::DuplicateEntry(p)) if p == "flashgen_demo/__init__.py")
    );
    for reserved in [
        "flashgen_demo-0.1.0.dist-info/RECORD",
        "flashgen_demo-0.1.0.dist-info/WHEEL",
        "other-1.0.dist-info/METADATA",
        "other-1.0.data/scripts/x",
    ] {
        let e = b.add_bytes(reserved, vec![], false).unwrap_err();
        assert!(
            matches!(e.downcast_ref(), Some(WheelError::ReservedPath(_))),
            "{reserved}: {e}"
        );
    }
    let e = b.add_bytes("../escape.py", vec![], false).unwrap_err();
    assert!(matches!(
        e.downcast_ref(),
        Some(WheelError::InvalidPath { .. })
    ));
    assert!(b.add_file("x/missing", &inputs.path("missing")).is_err());
    assert!(b.add_file("x/dir", inputs.dir.path()).is_err());
    assert!(b.add_script("a/b", &inputs.path("tool")).is_err());
    // Files in the distribution's own dist-info folder are allowed.
    b.add_bytes(
        "flashgen_demo-0.1.0.dist-info/licenses/LICENSE",
        b"x".to_vec(),
        false,
    )
    .unwrap();
}

#[test]
fn name_is_normalized_in_the_file_name_and_folders() {
    let out = tempfile::tempdir().unwrap();
    let mut b = WheelBuilder::new(meta("Flash.Gen__Demo"), tag());
    b.add_bytes("flash_gen_demo/__init__.py", vec![], false)
        .unwrap();
    let w = b.write(out.path(), None).unwrap();
    assert_eq!(
        w.path.file_name().unwrap(),
        "flash_gen_demo-0.1.0-py3-none-manylinux_2_17_x86_64.whl"
    );
    assert!(w
        .entries
        .iter()
        .any(|e| e.path == "flash_gen_demo-0.1.0.dist-info/METADATA"));

    let bad = WheelBuilder::new(meta("-bad"), tag()).write(out.path(), None);
    assert!(matches!(
        bad.unwrap_err().downcast_ref(),
        Some(WheelError::InvalidName(_))
    ));
    let bad_tag = WheelBuilder::new(meta("ok"), WheelTag::new("py3", "none", "linux-x86_64"))
        .write(out.path(), None);
    assert!(matches!(
        bad_tag.unwrap_err().downcast_ref(),
        Some(WheelError::InvalidTag(_))
    ));
}

#[test]
fn metadata_and_wheel_files_inside_the_wheel() {
    let entries: BTreeMap<String, String> = small_wheel_entries(None)
        .into_iter()
        .map(|(n, b, _, _)| (n, String::from_utf8_lossy(&b).into_owned()))
        .collect();
    let metadata = &entries["flashgen_demo-0.1.0.dist-info/METADATA"];
    for line in [
        "Metadata-Version: 2.1",
        "Name: flashgen-demo",
        "Version: 0.1.0",
        "Summary: A demo of the flashgen wheel writer",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        "Requires-Dist: numpy>=1.24",
        "Description-Content-Type: text/markdown",
    ] {
        assert!(
            metadata.lines().any(|l| l == line),
            "missing {line:?} in\n{metadata}"
        );
    }
    assert!(metadata.ends_with("\n\n# Demo\n\nSmall.\n"), "{metadata}");
    let wheel = &entries["flashgen_demo-0.1.0.dist-info/WHEEL"];
    assert_eq!(
        *wheel,
        format!(
            "Wheel-Version: 1.0\nGenerator: flashgen {}\nRoot-Is-Purelib: false\nTag: py3-none-manylinux_2_17_x86_64\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

// ---- platform tags of real ELF files ---------------------------------------------------

/// The newest `GLIBC_2.N` minor that `objdump -p` lists among a file's version references: an
/// oracle independent of goblin. `None` when objdump is not installed.
fn objdump_glibc_minor(path: &Path) -> Option<u32> {
    let out = Command::new("objdump").arg("-p").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let refs = text.split("Version References:").nth(1)?;
    refs.split_whitespace()
        .filter_map(|w| w.strip_prefix("GLIBC_2."))
        .filter_map(|rest| rest.split('.').next()?.parse().ok())
        .max()
}

fn host_files() -> Option<Vec<PathBuf>> {
    let files = [
        PathBuf::from("/bin/ls"),
        PathBuf::from("/lib/x86_64-linux-gnu/libstdc++.so.6"),
    ];
    if !cfg!(target_arch = "x86_64") || !files.iter().all(|f| f.exists()) {
        eprintln!("skipped: not an x86_64 Debian-style layout");
        return None;
    }
    Some(files.to_vec())
}

#[test]
fn platform_tag_of_system_binaries_matches_objdump() {
    let Some(files) = host_files() else { return };
    for f in &files {
        let r = platform_tag(std::slice::from_ref(f), "x86_64").unwrap();
        assert!(
            r.tag.starts_with("manylinux_2_") && r.tag.ends_with("_x86_64"),
            "{r:?}"
        );
        if let Some(minor) = objdump_glibc_minor(f) {
            assert_eq!(
                r.tag,
                format!("manylinux_2_{}_x86_64", minor.max(17)),
                "{f:?}: {r:#?}"
            );
        }
    }
    // Several files: the newest need wins.
    let all = platform_tag(&files, "x86_64").unwrap();
    let each: Vec<String> = files
        .iter()
        .map(|f| platform_tag(std::slice::from_ref(f), "x86_64").unwrap().tag)
        .collect();
    let minor = |t: &str| -> u32 { t.split('_').nth(2).unwrap().parse().unwrap() };
    assert_eq!(
        minor(&all.tag),
        each.iter().map(|t| minor(t)).max().unwrap()
    );
    // libstdc++ itself needs GCC_* from libgcc_s, which the report names.
    assert!(
        all.newest.iter().any(|(v, _)| v.starts_with("GCC_")),
        "{all:#?}"
    );
}

#[test]
fn platform_tag_of_a_cuda_shared_object() {
    // The pinned toolchain in the crate's `.venv`, or the nvcc that `NVCC` names.
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(".venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc")
        });
    if !nvcc.exists() {
        eprintln!("skipped: no nvcc at {}", nvcc.display());
        return;
    }
    let root = nvcc.parent().unwrap().parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cu = dir.path().join("k.cu");
    let so = dir.path().join("k.so");
    fs::write(
        &cu,
        "__global__ void k(){} extern \"C\" void f(){k<<<1,1>>>();}\n",
    )
    .unwrap();
    let status = Command::new(&nvcc)
        .args([
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-cudart",
            "static",
            "-arch=sm_80",
        ])
        .arg(format!("-L{}", root.join("lib").display()))
        .arg(&cu)
        .arg("-o")
        .arg(&so)
        .status()
        .unwrap();
    assert!(status.success());
    let r = platform_tag(std::slice::from_ref(&so), "x86_64").unwrap();
    if let Some(minor) = objdump_glibc_minor(&so) {
        assert_eq!(
            r.tag,
            format!("manylinux_2_{}_x86_64", minor.max(17)),
            "{r:#?}"
        );
    }
    // nvcc's host code is C++: the report names its libstdc++ ABI needs.
    assert!(
        r.newest.iter().any(|(v, _)| v.starts_with("CXXABI_")),
        "{r:#?}"
    );
}

/// The names of the `GLIBC_*`/`GLIBCXX_*` versions `objdump -p` lists for a file.
fn objdump_versions(path: &Path) -> Vec<String> {
    let Ok(out) = Command::new("objdump").arg("-p").arg(path).output() else {
        return vec![];
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let refs = text.split("Version References:").nth(1).unwrap_or_default();
    refs.split_whitespace()
        .filter(|w| w.starts_with("GLIBC"))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_newer_libstdcxx_raises_the_tag_of_a_real_file() {
    // std::to_chars(double, chars_format) and condition_variable::wait are GLIBCXX_3.4.29/30
    // in GCC 11/12 while needing nothing newer than GLIBC_2.2.5 from glibc.
    let dir = tempfile::tempdir().unwrap();
    let cpp = dir.path().join("c.cpp");
    let so = dir.path().join("c.so");
    fs::write(
        &cpp,
        "#include <charconv>\n#include <condition_variable>\n#include <mutex>\n\
         extern \"C\" int g(double d, char* b) { return int(std::to_chars(b, b + 64, d, std::chars_format::general).ptr - b); }\n\
         extern \"C\" void h(std::condition_variable* cv, std::mutex* m) { std::unique_lock<std::mutex> l(*m); cv->wait(l); }\n",
    )
    .unwrap();
    let built = Command::new("g++")
        .args(["-std=c++17", "-shared", "-fPIC", "-O1"])
        .arg(&cpp)
        .arg("-o")
        .arg(&so)
        .status()
        .is_ok_and(|s| s.success());
    if !built || !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: no g++ that builds this for x86_64");
        return;
    }
    let r = platform_tag(std::slice::from_ref(&so), "x86_64").unwrap();
    let versions = objdump_versions(&so);
    let glibc_ok = objdump_glibc_minor(&so).is_some_and(|m| m < 35);
    if versions.iter().any(|v| v == "GLIBCXX_3.4.30") && glibc_ok {
        // auditwheel 6.8 `show` says the same for this file.
        assert_eq!(r.tag, "manylinux_2_35_x86_64", "{r:#?}");
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("GLIBCXX_3.4.30") && n.contains("raising")),
            "{r:#?}"
        );
    } else {
        assert!(
            r.newest.iter().any(|(v, _)| v.starts_with("GLIBCXX_")),
            "{r:#?}"
        );
    }
}

#[test]
fn non_elf_files_and_wrong_arches_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    fs::write(&text, "hello").unwrap();
    let e = platform_tag(std::slice::from_ref(&text), "x86_64").unwrap_err();
    assert!(matches!(e.downcast_ref(), Some(WheelError::NotElf { path, .. }) if *path == text));
    assert!(e.to_string().contains("notes.txt"));

    let missing = dir.path().join("missing.so");
    let e = platform_tag(&[missing], "x86_64").unwrap_err();
    assert!(format!("{e:#}").contains("missing.so"));

    if let Some(files) = host_files() {
        let e = platform_tag(&files[..1], "aarch64").unwrap_err();
        assert!(
            matches!(e.downcast_ref(), Some(WheelError::WrongArch { .. })),
            "{e}"
        );
        let e = platform_tag(&files[..1], "riscv64").unwrap_err();
        assert!(matches!(
            e.downcast_ref(),
            Some(WheelError::UnsupportedArch(_))
        ));
    }
}
