//! The PyPI packages of a CUDA release that a wheel names: the shared runtime every instance
//! needs at run time, and the toolchain its JIT needs to compile (the `jit` extra).
//!
//! An instance links the toolkit's shared runtime (`libcudart.so.<major>`, see
//! [`crate::toolchain::runtime_soname`]) instead of a static copy, so the wheel requires the
//! runtime package of that major release; torch and cupy installations already carry it. The
//! compiler is optional: a wheel whose kernels are all precompiled never runs it, and `pip install
//! 'flashgen[jit]'` brings the pinned nvcc (and zig, for a wheel built for a glibc target) for the
//! kernels it lacks.

/// The extra that brings the compile toolchain.
pub const JIT_EXTRA: &str = "jit";

/// The packages of CUDA 13's toolchain on PyPI that nvcc needs to compile an instance, besides
/// the runtime (which every install has): the compiler driver, its headers and its device
/// compiler. CUDA 12 ships them in one package, `nvidia-cuda-nvcc-cu12`.
const TOOLCHAIN_PACKAGES: &[&str] = &[
    "nvidia-cuda-nvcc",
    "nvidia-cuda-crt",
    "nvidia-cuda-cccl",
    "nvidia-nvvm",
];

/// The PyPI name of a CUDA package for `major` (`nvidia-cuda-runtime`, `nvidia-cuda-runtime-cu12`).
fn package(name: &str, major: u32) -> String {
    if major >= 13 {
        name.to_string()
    } else {
        format!("{name}-cu{major}")
    }
}

/// The CUDA major releases whose packages this names (CUDA 12's are spelled `-cu12`).
pub const CUDA_MAJORS: [u32; 2] = [12, 13];

/// [`runtime_requirement`] of each of [`CUDA_MAJORS`], by major: what the loader tells a user
/// to install when an instance's runtime is missing (`describe`'s `wheel.runtime_requirements`).
pub fn runtime_requirements() -> indexmap::IndexMap<String, String> {
    CUDA_MAJORS
        .iter()
        .map(|&m| (m.to_string(), runtime_requirement(m)))
        .collect()
}

/// The requirement of the shared runtime an instance built by CUDA `major` needs: any release
/// of that major (the runtime is compatible within it).
pub fn runtime_requirement(major: u32) -> String {
    format!("{}=={major}.*", package("nvidia-cuda-runtime", major))
}

/// The requirements of the `jit` extra for a wheel built by nvcc `nvcc_version` (`13.0.88`):
/// that toolchain's `major.minor` release, so a JIT compiles with the compiler the wheel was
/// built with (a newer minor can need a newer driver), and `zig` when the wheel's kernels were
/// linked by it.
pub fn jit_requirements(nvcc_version: &str, zig: Option<&str>) -> Vec<String> {
    let mut parts = nvcc_version.split('.');
    let major: u32 = parts
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(crate::toolchain::DEFAULT_CUDA_MAJOR);
    let minor = parts
        .next()
        .filter(|m| m.chars().all(|c| c.is_ascii_digit()) && !m.is_empty())
        .map(|m| format!("{m}.*"))
        .unwrap_or_else(|| "*".to_string());
    let packages = if major >= 13 {
        TOOLCHAIN_PACKAGES
    } else {
        &TOOLCHAIN_PACKAGES[..1]
    };
    packages
        .iter()
        .map(|p| format!("{}=={major}.{minor}", package(p, major)))
        .chain(zig.map(str::to_string))
        .map(|r| format!("{r}; extra == \"{JIT_EXTRA}\""))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_13_packages_have_no_suffix_and_12_has_one() {
        assert_eq!(runtime_requirement(13), "nvidia-cuda-runtime==13.*");
        assert_eq!(runtime_requirement(12), "nvidia-cuda-runtime-cu12==12.*");
    }

    #[test]
    fn the_jit_extra_pins_the_toolchain_release_and_zig() {
        let reqs = jit_requirements("13.0.88", Some("ziglang==0.13.0"));
        assert_eq!(
            reqs,
            [
                "nvidia-cuda-nvcc==13.0.*; extra == \"jit\"",
                "nvidia-cuda-crt==13.0.*; extra == \"jit\"",
                "nvidia-cuda-cccl==13.0.*; extra == \"jit\"",
                "nvidia-nvvm==13.0.*; extra == \"jit\"",
                "ziglang==0.13.0; extra == \"jit\"",
            ]
        );
        assert_eq!(
            jit_requirements("unknown", None)[0],
            "nvidia-cuda-nvcc==13.*; extra == \"jit\""
        );
    }
}
