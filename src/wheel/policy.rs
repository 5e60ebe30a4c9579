//! The manylinux policies as auditwheel defines them, reduced to what decides a tag for
//! flashgen's binaries: the newest libstdc++ (`GLIBCXX`, `CXXABI`) and libgcc (`GCC`) symbol
//! versions each `manylinux_2_N` allows. Transcribed from auditwheel 6.8's
//! `manylinux-policy.json`; policies whose maxima equal the previous one's are left out,
//! since the smallest policy that allows a version is the one that decides.

/// A numeric symbol version such as `3.4.30`, compared component by component.
pub type Version = Vec<u32>;

/// Parses `3.4.30` into `[3, 4, 30]`; `None` for non-numeric versions (`TM_1`, `PRIVATE`).
pub fn parse_version(s: &str) -> Option<Version> {
    s.split('.').map(|c| c.parse().ok()).collect()
}

/// The families of versioned symbols that a manylinux policy bounds besides glibc itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    Glibcxx,
    Cxxabi,
    Gcc,
}

struct Policy {
    glibc_minor: u32,
    glibcxx: &'static [u32],
    cxxabi: &'static [u32],
    gcc: &'static [u32],
}

impl Policy {
    fn max(&self, family: Family) -> &'static [u32] {
        match family {
            Family::Glibcxx => self.glibcxx,
            Family::Cxxabi => self.cxxabi,
            Family::Gcc => self.gcc,
        }
    }
}

const fn p(
    glibc_minor: u32,
    glibcxx: &'static [u32],
    cxxabi: &'static [u32],
    gcc: &'static [u32],
) -> Policy {
    Policy {
        glibc_minor,
        glibcxx,
        cxxabi,
        gcc,
    }
}

#[rustfmt::skip]
const X86_64: &[Policy] = &[
    p(17, &[3, 4, 19], &[1, 3, 7],  &[4, 8, 0]),   // manylinux2014 (CentOS 7, GCC 4.8)
    p(24, &[3, 4, 22], &[1, 3, 10], &[4, 8, 0]),   // Debian 9
    p(27, &[3, 4, 24], &[1, 3, 11], &[7, 0, 0]),   // Ubuntu 18.04 (2_28, AlmaLinux 8: same)
    p(31, &[3, 4, 28], &[1, 3, 12], &[7, 0, 0]),   // Ubuntu 20.04
    p(34, &[3, 4, 29], &[1, 3, 13], &[7, 0, 0]),   // AlmaLinux 9
    p(35, &[3, 4, 30], &[1, 3, 13], &[12, 0, 0]),  // Ubuntu 22.04 / Debian 12 (GCC 12)
    p(39, &[3, 4, 33], &[1, 3, 15], &[14, 0, 0]),  // Ubuntu 24.04 (GCC 14)
];

#[rustfmt::skip]
const AARCH64: &[Policy] = &[
    p(17, &[3, 4, 19], &[1, 3, 7],  &[4, 7, 0]),
    p(24, &[3, 4, 22], &[1, 3, 10], &[4, 7, 0]),
    p(26, &[3, 4, 24], &[1, 3, 11], &[7, 0, 0]),
    p(31, &[3, 4, 28], &[1, 3, 12], &[7, 0, 0]),
    p(34, &[3, 4, 29], &[1, 3, 13], &[11, 0]),
    p(35, &[3, 4, 30], &[1, 3, 13], &[11, 0]),
    p(39, &[3, 4, 33], &[1, 3, 15], &[14, 0, 0]),
];

/// The floor of the tag: manylinux_2_17 (manylinux2014, the glibc of CentOS 7), the first
/// manylinux on aarch64 and the oldest whose build images are still maintained. A wheel whose
/// files need nothing newer still claims 2_17: an older tag (manylinux1, manylinux2010) would
/// promise distributions that no current CUDA release supports and that nobody can test on.
pub const BASELINE_GLIBC_MINOR: u32 = 17;

pub fn known_arch(arch: &str) -> bool {
    matches!(arch, "x86_64" | "aarch64")
}

fn policies(arch: &str) -> &'static [Policy] {
    match arch {
        "x86_64" => X86_64,
        "aarch64" => AARCH64,
        _ => &[],
    }
}

/// The smallest glibc minor whose manylinux policy allows `version` of `family` on `arch`;
/// `None` when even the newest known policy does not.
pub fn minimum_glibc_minor(arch: &str, family: Family, version: &[u32]) -> Option<u32> {
    policies(arch)
        .iter()
        .find(|pol| version <= pol.max(family))
        .map(|pol| pol.glibc_minor)
}

/// Non-numeric libstdc++ versions some policies allow, with the glibc minor that allows them.
pub fn minimum_glibc_minor_named(arch: &str, version: &str) -> Option<u32> {
    match (arch, version) {
        (_, "CXXABI_TM_1") => Some(17),
        ("x86_64", "CXXABI_FLOAT128") => Some(24),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert!(parse_version("3.4.9").unwrap() < parse_version("3.4.10").unwrap());
        assert!(parse_version("11.0").unwrap() < parse_version("12.0.0").unwrap());
        assert_eq!(parse_version("TM_1"), None);
    }

    #[test]
    fn glibcxx_maps_to_the_smallest_policy_that_allows_it() {
        let m =
            |v: &str| minimum_glibc_minor("x86_64", Family::Glibcxx, &parse_version(v).unwrap());
        assert_eq!(m("3.4.9"), Some(17));
        assert_eq!(m("3.4.19"), Some(17));
        assert_eq!(m("3.4.20"), Some(24));
        assert_eq!(m("3.4.24"), Some(27));
        assert_eq!(m("3.4.29"), Some(34));
        assert_eq!(m("3.4.30"), Some(35));
        assert_eq!(m("3.4.33"), Some(39));
        assert_eq!(m("3.4.34"), None);
        let a =
            |v: &str| minimum_glibc_minor("aarch64", Family::Glibcxx, &parse_version(v).unwrap());
        assert_eq!(a("3.4.24"), Some(26));
    }

    #[test]
    fn tables_grow_monotonically() {
        for table in [X86_64, AARCH64] {
            for w in table.windows(2) {
                assert!(w[0].glibc_minor < w[1].glibc_minor);
                for f in [Family::Glibcxx, Family::Cxxabi, Family::Gcc] {
                    assert!(w[0].max(f) <= w[1].max(f));
                }
            }
        }
    }
}
