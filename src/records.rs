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
    pub instances: Vec<BuiltRow>,
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

/// `describe --json`: what the loader needs about the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct Describe {
    pub flashgen_version: String,
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
    pub instances: Vec<InstanceRow>,
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
