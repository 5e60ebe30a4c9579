//! The variant matrix as data: modules, typed axes, variants, the AOT subset and the release,
//! and their expansion into [`Instance`]s.
//!
//! [`Matrix::load`] reads `variants.json` (and any `--variants-file`) through the plain
//! [`config`] mirror; [`validate`] holds every rule that refuses a config (each
//! error names the file and field), and [`expand`] walks each module's axes into instances and
//! their URIs. Everything after this module reads a `Matrix` that is already known to be good.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::Value as Json;

use crate::arch::{self, Arch};
use crate::config::{self, AxisKind, ConfigFile, ParamDecl, VariantsFile};
use crate::instance::Instance;
use crate::release::Release;

mod expand;
mod validate;

pub use validate::{core_fields, max_instances_from_env, DEFAULT_MAX_INSTANCES, MAX_URI_LEN};

/// One value on an axis.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Value {
    Int(i64),
    Bool(bool),
    /// A dtype, enum or variant name.
    Name(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Name(v) => f.write_str(v),
        }
    }
}

impl Value {
    pub fn to_json(&self) -> Json {
        match self {
            Value::Int(v) => Json::from(*v),
            Value::Bool(v) => Json::from(*v),
            Value::Name(v) => Json::from(v.as_str()),
        }
    }
}

/// The element types a dtype axis may name, with their CUDA spelling.
pub const DTYPES: &[(&str, &str)] = &[
    ("f16", "half"),
    ("bf16", "__nv_bfloat16"),
    ("f32", "float"),
    ("fp8_e4m3", "__nv_fp8_e4m3"),
    ("fp8_e5m2", "__nv_fp8_e5m2"),
];

#[derive(Debug, Clone)]
pub struct Axis {
    pub name: String,
    pub kind: AxisKind,
    pub values: Vec<Value>,
    /// The constant (or, for dtype axes, the type aliases) the generated header defines.
    pub c_names: Vec<String>,
    /// Per value: the only architectures its instances are built for (`backend` axes' `archs`);
    /// `None` for every architecture.
    pub arch_limits: Vec<Option<Vec<Arch>>>,
}

impl Axis {
    /// The integer an entry point receives at run time for `values[index]`.
    pub fn code(&self, index: usize) -> i64 {
        match &self.values[index] {
            Value::Int(v) => *v,
            Value::Bool(v) => i64::from(*v),
            Value::Name(_) => index as i64,
        }
    }

    pub fn position(&self, value: &Value) -> Option<usize> {
        self.values.iter().position(|v| v == value)
    }

    fn values_list(&self) -> String {
        self.values
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where a variant's header comes from.
#[derive(Debug, Clone)]
pub enum HeaderPath {
    /// Relative to `include/`, found through `-I include`.
    Include(String),
    /// A user variant's header outside the tree; its folder is added with `-I`.
    External(PathBuf),
}

#[derive(Debug, Clone)]
pub struct Variant {
    pub name: String,
    pub header: HeaderPath,
    pub struct_name: String,
    pub params: Vec<ParamDecl>,
    /// Added by `--variants-file` for this run (JIT), never precompiled.
    pub user: bool,
}

impl Variant {
    /// The spelling the generated header uses in its `#include <...>`.
    pub fn include_name(&self) -> String {
        match &self.header {
            HeaderPath::Include(rel) => rel.clone(),
            HeaderPath::External(path) => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

type Selection = Vec<(usize, HashSet<usize>)>;

#[derive(Debug)]
pub struct Module {
    pub name: String,
    /// Relative to `csrc/`.
    pub source: String,
    pub entry_points: Vec<String>,
    /// The declared C ABI (types normalized), if the module declares one.
    pub args: Option<config::ArgsDecl>,
    pub axes: Vec<Axis>,
    aot_include: Vec<Selection>,
    aot_exclude: Vec<Selection>,
    /// The only architectures the whole module is built for (`modules.<m>.archs`).
    pub arch_limit: Option<Vec<Arch>>,
}

impl Module {
    pub fn axis(&self, name: &str) -> Option<&Axis> {
        self.axes.iter().find(|a| a.name == name)
    }

    /// The module's `backend` axis (at most one) and its position.
    pub fn backend_axis(&self) -> Option<(usize, &Axis)> {
        self.axes
            .iter()
            .enumerate()
            .find(|(_, a)| a.kind == AxisKind::Backend)
    }

    /// The only architectures an instance choosing `choice` is built for: the module's limit and
    /// its backend value's, both; `None` for every architecture.
    pub fn arch_limit(&self, choice: &[usize]) -> Option<Vec<Arch>> {
        self.axes
            .iter()
            .zip(choice)
            .fold(self.arch_limit.clone(), |acc, (a, &i)| {
                arch::intersect(
                    acc.as_deref(),
                    a.arch_limits.get(i).and_then(Option::as_deref),
                )
            })
    }

    /// Whether the combination `choice` (one value index per axis) is in the AOT subset.
    fn is_aot(&self, choice: &[usize]) -> bool {
        let hit = |sel: &Selection| {
            sel.iter()
                .all(|(axis, allowed)| allowed.contains(&choice[*axis]))
        };
        self.aot_include.iter().any(hit) && !self.aot_exclude.iter().any(hit)
    }
}

/// The whole validated matrix and its expansion into instances.
#[derive(Debug)]
pub struct Matrix {
    /// The config file as given, and the exact text that was parsed (what a wheel ships).
    pub config_path: PathBuf,
    pub config_text: String,
    /// The folder holding `variants.json`, `csrc/` and `include/`.
    pub root: PathBuf,
    pub archs: Vec<String>,
    pub nvcc_flags: Vec<String>,
    /// Included by every generated header ahead of the variant headers.
    pub includes: Vec<String>,
    pub variants: Vec<Variant>,
    pub modules: Vec<Module>,
    pub instances: Vec<Instance>,
    /// What `build-wheel --release` builds, and every wheel's size budget.
    pub release: Release,
}

impl Matrix {
    /// Reads, validates and expands `variants.json` plus any `--variants-file`s, under the
    /// instance limit of [`max_instances_from_env`].
    pub fn load(config_path: &Path, variants_files: &[PathBuf]) -> Result<Matrix> {
        let max_instances = max_instances_from_env()?;
        let text = config::read_text(config_path)?;
        let mut extra = Vec::new();
        for path in variants_files {
            extra.push((path.clone(), config::read_text(path)?));
        }
        Self::from_text(config_path, text, &extra, max_instances)
    }

    /// [`load`](Matrix::load) over texts already read: `config_text` as if read from
    /// `config_path` (whose folder holds `csrc/` and `include/`), and each `--variants-file` as
    /// `(path, text)`. Every refusal is a [`UsageError`](crate::error::UsageError); no input
    /// makes it panic.
    pub fn from_text(
        config_path: &Path,
        config_text: String,
        variants_files: &[(PathBuf, String)],
        max_instances: u64,
    ) -> Result<Matrix> {
        let file: ConfigFile = config::parse_json(config_path, &config_text)?;
        let mut extra = Vec::new();
        for (path, text) in variants_files {
            let vf: VariantsFile = config::parse_json(path, text)?;
            extra.push((path.clone(), vf));
        }
        validate::matrix(config_path, config_text, file, extra, max_instances)
    }

    pub fn module(&self, inst: &Instance) -> &Module {
        &self.modules[inst.module]
    }

    pub fn variant(&self, name: &str) -> Option<&Variant> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// `(axis, value)` pairs of an instance, in axis order.
    pub fn params<'a>(&'a self, inst: &'a Instance) -> impl Iterator<Item = (&'a Axis, &'a Value)> {
        self.module(inst)
            .axes
            .iter()
            .zip(&inst.choice)
            .map(|(a, &i)| (a, &a.values[i]))
    }

    /// The fields every JSON view of an instance shares: `uri`, `module`, `params`, `codes`, `aot`.
    pub fn instance_row(&self, inst: &Instance) -> crate::records::InstanceRow {
        crate::records::InstanceRow {
            uri: inst.uri.clone(),
            module: self.module(inst).name.clone(),
            params: self
                .params(inst)
                .map(|(a, v)| (a.name.clone(), v.to_json()))
                .collect(),
            codes: self.codes_json(inst),
            aot: inst.aot,
            arch_limit: self
                .arch_limit(inst)
                .map(|l| l.iter().map(ToString::to_string).collect()),
        }
    }

    /// The only architectures `inst` is built for (its module's and backend's limits); `None`
    /// for every architecture of the build.
    pub fn arch_limit(&self, inst: &Instance) -> Option<Vec<Arch>> {
        self.module(inst).arch_limit(&inst.choice)
    }

    /// The archs of a build for `requested` that `inst` is compiled for; empty when it is built
    /// for none of them (a build for 8.0 skips an instance limited to 9.0a).
    pub fn instance_archs(&self, inst: &Instance, requested: &[Arch]) -> Vec<Arch> {
        arch::restrict(requested, self.arch_limit(inst).as_deref())
    }

    pub fn codes_json(&self, inst: &Instance) -> serde_json::Map<String, Json> {
        let m = self.module(inst);
        m.axes
            .iter()
            .zip(&inst.choice)
            .map(|(a, &i)| (a.name.clone(), Json::from(a.code(i))))
            .collect()
    }

    /// The variants an instance uses (its variant-typed axes).
    pub fn instance_variants<'a>(
        &'a self,
        inst: &'a Instance,
    ) -> impl Iterator<Item = &'a Variant> {
        self.params(inst).filter_map(|(a, v)| match (a.kind, v) {
            (AxisKind::Variant, Value::Name(n)) => self.variant(n),
            _ => None,
        })
    }
}

/// The args field that carries an axis's runtime value: an `int` axis's own name (`head_dim`),
/// else `<axis>_code`.
pub fn code_field(axis: &Axis) -> String {
    if axis.kind == AxisKind::Int {
        axis.name.clone()
    } else {
        format!("{}_code", axis.name)
    }
}
