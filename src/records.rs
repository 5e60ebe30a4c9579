//! The JSON documents that cross the boundary to the Python loader and other tools, as typed
//! structs: the build manifest (`<out>/manifest.json`, shipped in the wheel), the matrix
//! (`describe --json`, shipped as `_data/matrix.json`), the JIT's answer (`jit`), and the
//! instance rows they share. Writers build these structs, never ad-hoc JSON, so a field cannot
//! be spelled two ways; readers (the stamp fast path) deserialize the same types.

use std::path::PathBuf;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::arch::RunsOn;
use crate::config::ParamDecl;

/// What every JSON view of an instance shares.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstanceRow {
    pub uri: String,
    pub module: String,
    /// Axis name -> value, in axis order.
    pub params: Map<String, Json>,
    /// Axis name -> the runtime code the entry points receive.
    pub codes: Map<String, Json>,
    /// In the precompiled (AOT) subset of variants.json.
    pub aot: bool,
    /// The only architectures it is built for (its module's `archs` and its backend value's),
    /// spelled as in variants.json (`9.0a`); absent: every architecture of the build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch_limit: Option<Vec<String>>,
    /// Why a release leaves it out (`modules.<m>.release.exclude`); absent: a release
    /// precompiles it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside_release: Option<String>,
}

/// One built instance in a manifest (or, with an absolute `path`, in `build --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuiltRow {
    #[serde(flatten)]
    pub instance: InstanceRow,
    /// The cache key (sha256 over everything the compile read).
    pub fingerprint: String,
    /// The `.so` file name beside the manifest (absolute in `build --json`).
    pub path: String,
    pub sha256: String,
    /// The targets this binary holds (`sm_90a`): the build's archs its arch limit allows.
    pub archs: Vec<String>,
    /// Which compute capabilities those targets run on; the loader takes this instance only
    /// on a device one of these rows admits.
    pub runs_on: Vec<RunsOn>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolchainRow {
    pub nvcc: PathBuf,
    pub nvcc_version: String,
    pub host_compiler: String,
}

impl ToolchainRow {
    /// What a manifest says of the toolchain `tc` that built its instances.
    pub fn of(tc: &crate::toolchain::Toolchain) -> ToolchainRow {
        ToolchainRow {
            nvcc: tc.nvcc.clone(),
            nvcc_version: tc.nvcc_version.clone(),
            host_compiler: tc.host_compiler.clone(),
        }
    }
}

/// `<out>/manifest.json` and the wheel's `_aot/manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub flashgen_version: String,
    /// What built the instances (None in a JIT-only wheel).
    pub toolchain: Option<ToolchainRow>,
    /// The glibc target the host code was built for (`2_17`: through zig, see `manylinux.rs`),
    /// None for the system's g++. The loader's JIT builds missing instances the same way.
    #[serde(default)]
    pub manylinux: Option<String>,
    /// The targets of the build (`sm_90a`, `compute_90`); an instance with an arch limit holds
    /// those it allows (its row's `archs`).
    pub archs: Vec<String>,
    /// Which compute capabilities the build's targets run on (each row has its own).
    pub runs_on: Vec<RunsOn>,
    /// The built instances. A wheel's manifest keeps them in one file per module instead
    /// ([`Layout::manifest_rows`], counted in `module_rows`), so a process reads only the rows of
    /// the modules it calls: this is then empty.
    #[serde(default)]
    pub instances: Vec<BuiltRow>,
    /// In a wheel: each module with built instances, and how many rows its file holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_rows: Option<IndexMap<String, usize>>,
    /// A release's core wheel: the kernel packages of its per-architecture wheels, which the
    /// loader looks for beside the `flashgen` package (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_packages: Vec<KernelPackage>,
}

/// One per-architecture kernel wheel of a release, as its core wheel's manifest names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KernelPackage {
    /// The core wheel's extra that installs it (`sm80`: `pip install 'flashgen[sm80]'`).
    pub extra: String,
    /// Its distribution (`flashgen-kernels-sm80`) and import package (`flashgen_kernels_sm80`).
    pub distribution: String,
    pub package: String,
    /// The compute capabilities its code runs on.
    pub runs_on: Vec<RunsOn>,
}

/// A `list-variants --json` row.
#[derive(Debug, Clone, Serialize)]
pub struct ListRow {
    #[serde(flatten)]
    pub instance: InstanceRow,
    /// In the cache for the resolved archs (null when no toolchain could key it; false when
    /// the instance is built for none of them).
    pub built: Option<bool>,
    /// The resolved archs it is built for, as `--arch` spells them (empty: none of them, so a
    /// build skips it; null when no arch list could be resolved).
    pub archs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VariantRow {
    #[serde(rename = "struct")]
    pub struct_name: String,
    pub params: Vec<ParamDecl>,
    /// Added by `--variants-file` (never precompiled).
    pub user: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct AxisRow {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: crate::config::AxisKind,
    pub values: Vec<Json>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModuleRow {
    pub source: String,
    pub entry_points: Vec<String>,
    /// The C name of its arguments struct (`FlashgenSingleDecodeArgs`).
    pub args_struct: String,
    /// The declared C ABI (`call` and `shape` fields with normalized types), if any: the loader
    /// builds the arguments struct's ctypes mirror from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<crate::config::ArgsDecl>,
    pub axes: Vec<AxisRow>,
    /// `modules.<m>.archs`: the only architectures the module is built for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arch_limit: Option<Vec<String>>,
    /// With a `backend` axis: the binary's choice of one per device, and its refusals
    /// (`commands::choice`), which the loader reads instead of deciding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backends: Option<BackendTable>,
    /// `modules.<m>.unsupported`: combinations that are not instances; the loader refuses a call
    /// asking for one with its reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<UnsupportedRow>,
}

/// One `unsupported` declaration: axis -> the values it names (in axis order), and its reason.
#[derive(Debug, Clone, Serialize)]
pub struct UnsupportedRow {
    #[serde(rename = "where")]
    pub selection: IndexMap<String, Vec<Json>>,
    pub reason: String,
}

/// The choice among a module's implementations (`describe`'s `modules.<m>.backends`), as
/// `commands::choice` decides it: the loader reads the choice and its refusals from here.
#[derive(Debug, Clone, Serialize)]
pub struct BackendTable {
    /// The axis that holds them (`backend`).
    pub axis: String,
    /// In the order of preference variants.json declares.
    pub order: Vec<BackendRow>,
    /// Every compute capability the binary accepts (1.0 to 99.9), in ranges, with the
    /// backends a GPU of that range runs, in order of preference: the first is its choice.
    pub by_device: Vec<DeviceRow>,
    /// Refusal of a value that is not a backend (template: `{value}`).
    pub unknown: String,
    /// Refusal when no backend runs on the device (template: `{cc}`).
    pub none_runs: String,
    /// What a refusal of a named backend adds: how to get the device's choice.
    pub hint: String,
}

impl BackendTable {
    /// The row of `by_device` that holds `cc`.
    pub fn device(&self, cc: crate::arch::Capability) -> Option<&DeviceRow> {
        let cc = [cc.major, cc.minor];
        self.by_device.iter().find(|d| d.min <= cc && cc <= d.max)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BackendRow {
    pub name: String,
    /// The only architectures its instances are built for (module and value limits); null: all.
    pub arch_limit: Option<Vec<String>>,
    /// The compute capabilities those run on; null: any (the JIT builds for the device).
    pub runs_on: Option<Vec<RunsOn>>,
    /// Its refusal on a device it does not run on (template: `{cc}`, `{supports}`, the
    /// latter from the device's `by_device` row); null without an arch limit (it runs on any).
    pub refused: Option<String>,
}

/// The backends GPUs of compute capability `min..=max` run, in order of preference.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceRow {
    pub min: [u32; 2],
    pub max: [u32; 2],
    pub backends: Vec<String>,
    /// What the refusal of a backend says these devices do run.
    pub supports: String,
}

/// One row of the variant parameter type table (`param_types`).
#[derive(Debug, Clone, Serialize)]
pub struct ParamTypeRow {
    /// The normalized C spelling (`float`, `const float*`).
    pub c: String,
    /// The `ctypes` name of a struct member of this type.
    pub ctypes: &'static str,
    /// The tensor dtype a pointer must point to (for values: the value's own dtype).
    pub dtype: &'static str,
}

/// The C ABI every instance exports (`include/flashgen/abi.h`, which a test checks against
/// this), as data: the loader binds what it names, with these status codes and names.
#[derive(Debug, Clone, Serialize)]
pub struct Abi {
    /// `FLASHGEN_ABI_VERSION`, which `flashgen_abi_version()` returns.
    pub version: u32,
    /// `enum FlashgenStatus`: name (without `FLASHGEN_`) -> code.
    pub status: IndexMap<&'static str, u32>,
    /// The entry points every instance exports once, by role.
    pub entry_points: IndexMap<&'static str, &'static str>,
    /// Each module's entry points, by role, with `{module}` for its name.
    pub module_entry_points: IndexMap<&'static str, &'static str>,
}

/// `FLASHGEN_ABI_VERSION` in `include/flashgen/abi.h`.
pub const ABI_VERSION: u32 = 3;

/// The one statement of the C ABI's names and codes in Rust (`abi.h` holds them for C).
pub fn abi() -> Abi {
    Abi {
        version: ABI_VERSION,
        status: [
            ("OK", 0),
            ("INVALID_ARGUMENT", 1),
            ("NO_INSTANCE", 2),
            ("WORKSPACE_TOO_SMALL", 3),
            ("CUDA_ERROR", 4),
        ]
        .into_iter()
        .collect(),
        entry_points: [
            ("last_error", "flashgen_last_error"),
            ("abi_version", "flashgen_abi_version"),
        ]
        .into_iter()
        .collect(),
        module_entry_points: [
            ("kernel", "flashgen_{module}"),
            ("workspace_size", "flashgen_{module}_workspace_size"),
            ("query", "flashgen_{module}_query"),
        ]
        .into_iter()
        .collect(),
    }
}

/// Where an installed wheel keeps its files, relative to its package folder: `build-wheel`
/// writes them there, the binary finds its sources and manifest there, and the loader reads
/// them from `describe`'s `wheel.layout` (only `matrix`, which holds this, is written in Python
/// as well; the parity test checks it).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Layout {
    /// The import package (`flashgen`); a release's kernel packages hold an `aot` folder too.
    pub package: &'static str,
    pub binary: &'static str,
    pub sources: &'static str,
    pub variants: &'static str,
    pub matrix: &'static str,
    /// One module's instances (`describe`'s `instances` of that module), `{module}` its name:
    /// the wheel's matrix leaves them out, so a process parses only the modules it calls.
    pub instances: &'static str,
    pub aot: &'static str,
    pub manifest: &'static str,
    /// One module's rows of a package's manifest (`{module}`: its name), relative to the package.
    pub manifest_rows: &'static str,
}

pub const LAYOUT: Layout = Layout {
    package: "flashgen",
    binary: "_bin/flashgen",
    sources: "_src",
    variants: "_src/variants.json",
    matrix: "_data/matrix.json",
    instances: "_data/instances/{module}.json",
    aot: "_aot",
    manifest: "_aot/manifest.json",
    manifest_rows: "_aot/rows/{module}.json",
};

impl Layout {
    /// The package folder of a wheel whose binary is `exe` (`<package>/_bin/flashgen`): the
    /// folder as many levels up as the layout puts the binary down.
    pub fn package_of_binary(&self, exe: &std::path::Path) -> Option<PathBuf> {
        let depth = std::path::Path::new(self.binary).components().count();
        exe.ancestors().nth(depth).map(std::path::Path::to_path_buf)
    }

    /// A per-module path of the layout (`instances`, `manifest_rows`) for `module`.
    pub fn of_module(path: &str, module: &str) -> String {
        path.replace("{module}", module)
    }
}

/// The extra that installs every kernel wheel of a release.
pub const ALL_KERNELS_EXTRA: &str = "all";

/// `Requires-Python` of every wheel and sdist.
pub const REQUIRES_PYTHON: &str = ">=3.9";

/// The package metadata that does not depend on a build: the wheel's METADATA starts from it,
/// and the PEP 517 backend writes the sdist's PKG-INFO from it (`backend/metadata.json`'s
/// `metadata`, which a test keeps equal to this).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PackageMetadata {
    pub name: String,
    pub version: String,
    pub summary: String,
    pub license: String,
    pub requires_python: String,
    /// The README's content type (the long description).
    pub readme_content_type: String,
    /// The extra that installs the toolchain the JIT needs.
    pub jit_extra: String,
    /// The extra that installs every kernel wheel of a release.
    pub all_kernels_extra: String,
}

pub fn package_metadata() -> PackageMetadata {
    PackageMetadata {
        name: LAYOUT.package.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        summary: env!("CARGO_PKG_DESCRIPTION").into(),
        license: env!("CARGO_PKG_LICENSE").into(),
        requires_python: REQUIRES_PYTHON.into(),
        readme_content_type: "text/markdown".into(),
        jit_extra: crate::cuda_packages::JIT_EXTRA.into(),
        all_kernels_extra: ALL_KERNELS_EXTRA.into(),
    }
}

/// What a wheel or an sdist packs of a source folder (bytecode caches and dot files left out),
/// and the time its entries carry when `SOURCE_DATE_EPOCH` is unset or earlier (zip's first).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TreeRules {
    /// Folders and files of these names are left out.
    pub skip_names: Vec<String>,
    /// Names that start with one of these are left out.
    pub skip_prefixes: Vec<String>,
    /// Names that end with one of these are left out.
    pub skip_suffixes: Vec<String>,
    /// Seconds since 1970 (1980-01-01T00:00:00Z).
    pub min_epoch: u64,
}

impl TreeRules {
    /// Whether a file or folder named `name` is left out.
    pub fn skips(&self, name: &str) -> bool {
        self.skip_names.iter().any(|n| n == name)
            || self
                .skip_prefixes
                .iter()
                .any(|p| name.starts_with(p.as_str()))
            || self
                .skip_suffixes
                .iter()
                .any(|s| name.ends_with(s.as_str()))
    }
}

pub fn tree_rules() -> TreeRules {
    TreeRules {
        skip_names: vec!["__pycache__".into()],
        skip_prefixes: vec![".".into()],
        skip_suffixes: vec![".pyc".into()],
        min_epoch: crate::wheel::ZIP_EPOCH,
    }
}

/// `describe`'s `wheel`: how an installed wheel is laid out, and its metadata.
#[derive(Debug, Clone, Serialize)]
pub struct WheelData {
    pub layout: Layout,
    pub metadata: PackageMetadata,
    /// CUDA major -> the requirement of its shared runtime (`nvidia-cuda-runtime==13.*`).
    pub runtime_requirements: IndexMap<String, String>,
    /// What the wheel (and the sdist) packs of a source folder.
    pub tree: TreeRules,
}

#[derive(Debug, Clone, Serialize)]
pub struct CapabilityRange {
    pub min: [u32; 2],
    pub max: [u32; 2],
}

/// `describe --json`: what the loader needs about the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct Describe {
    pub flashgen_version: String,
    /// The C ABI of every instance.
    pub abi: Abi,
    /// The installed wheel's layout and metadata.
    pub wheel: WheelData,
    /// The compute capabilities the binary accepts (`--device-cc`; the loader's
    /// `FLASHGEN_DEVICE_CC`): `MAJOR.MINOR` in ASCII digits, from `min` to `max`.
    pub capabilities: CapabilityRange,
    pub archs: Vec<String>,
    pub variants: IndexMap<String, VariantRow>,
    /// The one table of variant parameter types; the loader builds its ctypes structs from it.
    pub param_types: Vec<ParamTypeRow>,
    /// Words a C identifier may not be (keywords), for the loader's early check of a Variant.
    pub reserved_words: Vec<&'static str>,
    /// Names a variant parameter may not take: the core fields of the modules' params structs,
    /// each with the modules that have it (`matrix::core_fields`).
    pub reserved_params: IndexMap<String, Vec<String>>,
    /// The longest instance URI, in bytes (URIs name files); a custom variant's name is part of
    /// its instances' URIs.
    pub max_uri_bytes: usize,
    pub modules: IndexMap<String, ModuleRow>,
    /// Every instance; absent from the wheel's copy, which keeps them per module
    /// ([`Layout::instances`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<InstanceRow>>,
}

/// What `jit` found.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum JitSource {
    /// Already in the cache (verified).
    Cache,
    /// Compiled by this call.
    Compiled,
    /// Not in the cache, and `--no-compile` forbade building it.
    Missing,
}

/// `jit`'s answer on stdout.
#[derive(Debug, Clone, Serialize)]
pub struct JitAnswer {
    #[serde(flatten)]
    pub instance: InstanceRow,
    pub source: JitSource,
    /// The arch list as `--arch` spells it (`9.0a`).
    pub arch: String,
    /// Its targets (`sm_90a`).
    pub archs: Vec<String>,
    pub cache_dir: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The cache object itself (absolute).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// abi.h states for C what [`abi`] states for the loader.
    #[test]
    fn abi_h_agrees() {
        let header = include_str!("../include/flashgen/abi.h");
        let a = abi();
        assert!(header.contains(&format!("#define FLASHGEN_ABI_VERSION {}\n", a.version)));
        for (name, code) in &a.status {
            assert!(
                header.contains(&format!("FLASHGEN_{name} = {code},")),
                "abi.h lacks FLASHGEN_{name} = {code}"
            );
        }
        assert_eq!(
            header.matches(" = ").count(),
            a.status.len(),
            "abi.h has other codes"
        );
        for entry in a.entry_points.values() {
            assert!(
                header.contains(&format!(" {entry}(void);")),
                "abi.h lacks {entry}"
            );
        }
        for entry in a.module_entry_points.values() {
            let c = entry.replace("{module}", "<module>");
            assert!(header.contains(&format!("int {c}(")), "abi.h lacks {c}");
        }
    }

    /// What the PEP 517 backend reads (`backend/metadata.json`): it writes an sdist without Rust.
    #[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
    struct BackendData {
        metadata: PackageMetadata,
        tree: TreeRules,
    }

    /// The PEP 517 backend's copy of the metadata and tree rules (it needs no Rust to write an
    /// sdist).
    #[test]
    fn backend_metadata_json_agrees() {
        let shipped: BackendData =
            serde_json::from_str(include_str!("../backend/metadata.json")).unwrap();
        let expected = BackendData {
            metadata: package_metadata(),
            tree: tree_rules(),
        };
        assert_eq!(
            shipped,
            expected,
            "backend/metadata.json is stale; write this into it:\n{}",
            serde_json::to_string_pretty(&expected).unwrap()
        );
    }
}
