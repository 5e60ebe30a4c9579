//! The wheel's platform tag from the bundled ELF files, as auditwheel decides it: the newest
//! `GLIBC_2.N` any file needs from glibc sets `manylinux_2_N`, raised where a file needs a
//! libstdc++ or libgcc version that the manylinux policy for that glibc does not allow.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use goblin::elf::header::{machine_to_str, EM_AARCH64, EM_X86_64};
use goblin::elf::Elf;

use crate::wheel::error::WheelError;
use crate::wheel::policy::{
    known_arch, minimum_glibc_minor, minimum_glibc_minor_named, parse_version, Family, Version,
    BASELINE_GLIBC_MINOR,
};

/// The libraries glibc ships; their `GLIBC_*` versions bound the tag.
const GLIBC_LIBS: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
    "libresolv.so.2",
    "libanl.so.1",
    "libnsl.so.1",
];

/// What the bundled binaries need, and the tag that follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformReport {
    /// `manylinux_2_N_<arch>`.
    pub tag: String,
    /// The newest version needed in each family (`GLIBC_2.34`, `GLIBCXX_3.4.30`, `CXXABI_1.3.13`,
    /// `GCC_7.0.0`), with a file that needs it.
    pub newest: Vec<(String, PathBuf)>,
    /// One line each on why the tag is what it is, for the caller to print.
    pub notes: Vec<String>,
}

/// One versioned dependency of one file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Need {
    library: String,
    version: String,
}

/// Reads every file in `elf_files` (all must be ELF for `arch`, `x86_64` or `aarch64`) and
/// returns the manylinux tag they allow.
pub fn platform_tag(elf_files: &[PathBuf], arch: &str) -> Result<PlatformReport> {
    if !known_arch(arch) {
        return Err(WheelError::UnsupportedArch(arch.to_string()).into());
    }
    let mut all = Vec::new();
    for path in elf_files {
        for need in read_needs(path, arch)? {
            all.push((path.clone(), need));
        }
    }
    decide(&all, arch)
}

/// The versions `path` needs from other libraries (its `.gnu.version_r`), checked to be an
/// ELF file for `arch`.
fn read_needs(path: &Path, arch: &str) -> Result<BTreeSet<Need>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let not_elf = |reason: String| WheelError::NotElf {
        path: path.to_path_buf(),
        reason,
    };
    if !bytes.starts_with(b"\x7fELF") {
        return Err(not_elf("it does not start with the ELF magic bytes".into()).into());
    }
    let elf = Elf::parse(&bytes).map_err(|e| not_elf(e.to_string()))?;
    let wanted = if arch == "x86_64" {
        EM_X86_64
    } else {
        EM_AARCH64
    };
    if elf.header.e_machine != wanted {
        return Err(WheelError::WrongArch {
            path: path.to_path_buf(),
            found: machine_to_str(elf.header.e_machine).to_string(),
            wanted: arch.to_string(),
        }
        .into());
    }
    let mut needs = BTreeSet::new();
    if let Some(verneed) = &elf.verneed {
        for need in verneed.iter() {
            let library = elf.dynstrtab.get_at(need.vn_file).unwrap_or_default();
            for aux in need.iter() {
                if let Some(version) = elf.dynstrtab.get_at(aux.vna_name) {
                    needs.insert(Need {
                        library: library.to_string(),
                        version: version.to_string(),
                    });
                }
            }
        }
    }
    Ok(needs)
}

fn is_glibc(library: &str) -> bool {
    GLIBC_LIBS.contains(&library) || library.starts_with("ld-linux")
}

/// The newest version of one family seen so far, and who needs it.
#[derive(Default)]
struct Newest(Option<(Version, String, PathBuf)>);

impl Newest {
    fn offer(&mut self, v: Version, name: &str, path: &Path) {
        let newer = match &self.0 {
            Some((cur, _, _)) => v > *cur,
            None => true,
        };
        if newer {
            self.0 = Some((v, name.to_string(), path.to_path_buf()));
        }
    }
}

fn decide(needs: &[(PathBuf, Need)], arch: &str) -> Result<PlatformReport> {
    let unsupported =
        |path: &Path, version: &str, hint: &'static str| WheelError::UnsupportedSymbolVersion {
            path: path.to_path_buf(),
            version: version.to_string(),
            hint,
        };
    const STDCXX_HINT: &str = "Build with an older GCC (the manylinux images' devtoolset), or link libstdc++ statically (-static-libstdc++).";

    let (mut glibc, mut glibcxx, mut cxxabi, mut gcc) = (
        Newest::default(),
        Newest::default(),
        Newest::default(),
        Newest::default(),
    );
    let mut minor = BASELINE_GLIBC_MINOR;
    let mut notes = vec![format!(
        "baseline manylinux_2_{BASELINE_GLIBC_MINOR} (manylinux2014)"
    )];
    let mut unchecked = BTreeSet::new();

    for (path, Need { library, version }) in needs {
        let (family, number) = version.split_once('_').unwrap_or((version, ""));
        if is_glibc(library) {
            if family != "GLIBC" {
                unchecked.insert(format!("{version} from {library}"));
                continue;
            }
            match number {
                // The marker of DT_RELR relocations, which glibc 2.36 introduced.
                "ABI_DT_RELR" => glibc.offer(vec![2, 36], version, path),
                "PRIVATE" => {
                    return Err(unsupported(
                        path,
                        version,
                        "GLIBC_PRIVATE symbols change between glibc releases; the file must not use them.",
                    )
                    .into())
                }
                _ => match parse_version(number) {
                    Some(v) if v.first() == Some(&2) && v.len() >= 2 => glibc.offer(v, version, path),
                    _ => return Err(unsupported(path, version, "It is not a glibc 2.x version.").into()),
                },
            }
        } else if library.starts_with("libstdc++.so") || library.starts_with("libgcc_s.so") {
            let slot = match family {
                "GLIBCXX" => &mut glibcxx,
                "CXXABI" => &mut cxxabi,
                "GCC" => &mut gcc,
                _ => {
                    unchecked.insert(format!("{version} from {library}"));
                    continue;
                }
            };
            match parse_version(number) {
                Some(v) => slot.offer(v, version, path),
                None => match minimum_glibc_minor_named(arch, version) {
                    Some(m) => {
                        if m > minor {
                            notes.push(format!(
                                "{version} (needed by {}) needs manylinux_2_{m}",
                                path.display()
                            ));
                            minor = m;
                        }
                    }
                    None => return Err(unsupported(path, version, STDCXX_HINT).into()),
                },
            }
        } else {
            unchecked.insert(format!("{version} from {library}"));
        }
    }

    let mut newest = Vec::new();
    if let Some((v, name, path)) = glibc.0 {
        newest.push((name.clone(), path.clone()));
        if v[1] > minor {
            minor = v[1];
        }
        notes.push(format!("{name} needed by {}", path.display()));
    }
    for (slot, family) in [
        (glibcxx, Family::Glibcxx),
        (cxxabi, Family::Cxxabi),
        (gcc, Family::Gcc),
    ] {
        let Some((v, name, path)) = slot.0 else {
            continue;
        };
        let Some(m) = minimum_glibc_minor(arch, family, &v) else {
            return Err(unsupported(&path, &name, STDCXX_HINT).into());
        };
        if m > minor {
            notes.push(format!(
                "{name} needed by {}: auditwheel's policies allow it from manylinux_2_{m}, raising the tag from manylinux_2_{minor}",
                path.display()
            ));
            minor = m;
        } else {
            notes.push(format!(
                "{name} needed by {} (allowed from manylinux_2_{m})",
                path.display()
            ));
        }
        newest.push((name, path));
    }
    if !unchecked.is_empty() {
        notes.push(format!(
            "not bounded by manylinux policies here (check they are bundled or system-provided): {}",
            unchecked.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(PlatformReport {
        tag: format!("manylinux_2_{minor}_{arch}"),
        newest,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(list: &[(&str, &str)]) -> Vec<(PathBuf, Need)> {
        list.iter()
            .map(|(library, version)| {
                (
                    PathBuf::from("x.so"),
                    Need {
                        library: library.to_string(),
                        version: version.to_string(),
                    },
                )
            })
            .collect()
    }

    fn tag(list: &[(&str, &str)]) -> String {
        decide(&needs(list), "x86_64").unwrap().tag
    }

    /// Each row: the symbol versions the binaries need, and the tag they must get.
    fn assert_tags(rows: &[(&[(&str, &str)], &str)]) {
        for (list, want) in rows {
            assert_eq!(tag(list), *want, "{list:?}");
        }
    }

    #[test]
    fn nothing_needed_gives_the_baseline() {
        assert_tags(&[
            (&[], "manylinux_2_17_x86_64"),
            (&[("libc.so.6", "GLIBC_2.2.5")], "manylinux_2_17_x86_64"),
        ]);
    }

    #[test]
    fn the_newest_glibc_version_sets_the_tag() {
        assert_tags(&[
            (
                &[
                    ("libc.so.6", "GLIBC_2.2.5"),
                    ("libm.so.6", "GLIBC_2.29"),
                    ("libc.so.6", "GLIBC_2.14"),
                ],
                "manylinux_2_29_x86_64",
            ),
            (
                &[("ld-linux-x86-64.so.2", "GLIBC_2.3")],
                "manylinux_2_17_x86_64",
            ),
            (
                &[("libc.so.6", "GLIBC_ABI_DT_RELR")],
                "manylinux_2_36_x86_64",
            ),
        ]);
    }

    #[test]
    fn a_newer_libstdcxx_raises_the_tag() {
        // GCC 12's libstdc++ (Debian 12) needs manylinux_2_35 even with an old glibc.
        let r = decide(
            &needs(&[
                ("libc.so.6", "GLIBC_2.17"),
                ("libstdc++.so.6", "GLIBCXX_3.4.30"),
                ("libstdc++.so.6", "CXXABI_1.3.9"),
            ]),
            "x86_64",
        )
        .unwrap();
        assert_eq!(r.tag, "manylinux_2_35_x86_64");
        assert!(
            r.notes.iter().any(|n| n.contains("GLIBCXX_3.4.30")),
            "{r:?}"
        );
        assert_tags(&[
            (
                &[
                    ("libc.so.6", "GLIBC_2.28"),
                    ("libstdc++.so.6", "GLIBCXX_3.4.21"),
                ],
                "manylinux_2_28_x86_64",
            ),
            (&[("libgcc_s.so.1", "GCC_7.0.0")], "manylinux_2_27_x86_64"),
            (
                &[("libstdc++.so.6", "CXXABI_FLOAT128")],
                "manylinux_2_24_x86_64",
            ),
        ]);
    }

    #[test]
    fn versions_no_policy_allows_are_errors() {
        for bad in [
            ("libstdc++.so.6", "GLIBCXX_3.4.99"),
            ("libc.so.6", "GLIBC_PRIVATE"),
            ("libstdc++.so.6", "CXXABI_SOMETHING"),
        ] {
            let e = decide(&needs(&[bad]), "x86_64").unwrap_err();
            assert!(
                matches!(
                    e.downcast_ref(),
                    Some(WheelError::UnsupportedSymbolVersion { .. })
                ),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn other_libraries_are_reported_not_judged() {
        let r = decide(&needs(&[("libz.so.1", "ZLIB_1.2.9")]), "x86_64").unwrap();
        assert_eq!(r.tag, "manylinux_2_17_x86_64");
        assert!(r
            .notes
            .iter()
            .any(|n| n.contains("ZLIB_1.2.9 from libz.so.1")));
    }
}
