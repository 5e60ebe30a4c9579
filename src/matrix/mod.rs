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

/// `modules.<m>.unsupported[i]`: combinations no instance serves, and the reason a caller who
/// asks for one reads. The expansion skips them.
#[derive(Debug)]
pub struct Unsupported {
    selection: Selection,
    pub reason: String,
}

impl Unsupported {
    /// Whether it holds the combination `choice` (one value index per axis).
    pub fn holds(&self, choice: &[usize]) -> bool {
        sel_holds(&self.selection, choice)
    }

    /// Whether it allows value `value` of axis `axis` (every value of an axis it does not name).
    pub fn allows(&self, axis: usize, value: usize) -> bool {
        self.selection
            .iter()
            .filter(|(a, _)| *a == axis)
            .all(|(_, allowed)| allowed.contains(&value))
    }

    /// Its `where`, in axis order with each axis's values in axis order: `(axis, values)`.
    pub fn selection<'a>(&self, axes: &'a [Axis]) -> Vec<(&'a Axis, Vec<&'a Value>)> {
        axes.iter()
            .enumerate()
            .filter(|(ai, _)| self.selection.iter().any(|(a, _)| a == ai))
            .map(|(ai, axis)| {
                let values = (0..axis.values.len())
                    .filter(|&vi| self.allows(ai, vi))
                    .map(|vi| &axis.values[vi])
                    .collect();
                (axis, values)
            })
            .collect()
    }

    /// `pos_encoding=rope_llama kv_dtype=fp8_e4m3|fp8_e5m2`, as `--where` terms spell values.
    pub fn spell(&self, axes: &[Axis]) -> String {
        self.selection(axes)
            .iter()
            .map(|(axis, values)| {
                let values: Vec<String> = values.iter().map(ToString::to_string).collect();
                format!("{}={}", axis.name, values.join("|"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

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
    /// `modules.<m>.release.exclude`: what a release leaves out, each with its reason.
    release_exclude: Vec<(Selection, String)>,
    /// `modules.<m>.unsupported`: combinations that are not instances.
    pub unsupported: Vec<Unsupported>,
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

    /// The first `unsupported` declaration that holds the combination `choice`, and its index;
    /// None: an instance serves it.
    pub fn unsupported(&self, choice: &[usize]) -> Option<(usize, &Unsupported)> {
        self.unsupported
            .iter()
            .enumerate()
            .find(|(_, u)| u.holds(choice))
    }

    /// Whether the combination `choice` (one value index per axis) is in the AOT subset.
    fn is_aot(&self, choice: &[usize]) -> bool {
        let hit = |sel: &Selection| sel_holds(sel, choice);
        self.aot_include.iter().any(hit) && !self.aot_exclude.iter().any(hit)
    }

    /// Why the combination `choice` is left out of the release (the first exclusion that holds
    /// it), or None: it is in the release.
    fn outside_release(&self, choice: &[usize]) -> Option<&str> {
        self.release_exclude
            .iter()
            .find(|(sel, _)| sel_holds(sel, choice))
            .map(|(_, reason)| reason.as_str())
    }
}

/// Whether `sel` (axis -> allowed value indices) holds the combination `choice`.
fn sel_holds(sel: &Selection, choice: &[usize]) -> bool {
    sel.iter()
        .all(|(axis, allowed)| allowed.contains(&choice[*axis]))
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
            outside_release: self.outside_release(inst).map(str::to_string),
        }
    }

    /// Why `inst` is left out of the release (`modules.<m>.release.exclude`), or None: a release
    /// precompiles it.
    pub fn outside_release(&self, inst: &Instance) -> Option<&str> {
        self.module(inst).outside_release(&inst.choice)
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::Toy;

    fn value<'m>(m: &'m Matrix, inst: &Instance, axis: &str) -> &'m Value {
        let module = m.module(inst);
        let i = module.axes.iter().position(|a| a.name == axis).unwrap();
        &module.axes[i].values[inst.choice[i]]
    }

    #[test]
    fn expansion_is_every_combination_last_axis_fastest() {
        let m = Toy::new().matrix();
        // dtype 2 x width 3 x fast 2 x mode 2 x variant 2
        assert_eq!(m.instances.len(), 48);
        let uris: Vec<&str> = m.instances.iter().map(|i| i.uri.as_str()).collect();
        assert_eq!(
            uris[0],
            "toy_dtype_f16_width_32_fast_false_mode_sum_variant_plain"
        );
        assert_eq!(
            uris[1],
            "toy_dtype_f16_width_32_fast_false_mode_sum_variant_scaled"
        );
        assert_eq!(
            uris[2],
            "toy_dtype_f16_width_32_fast_false_mode_max_variant_plain"
        );
        assert_eq!(
            uris[47],
            "toy_dtype_bf16_width_128_fast_true_mode_max_variant_scaled"
        );
        let unique: HashSet<&str> = uris.iter().copied().collect();
        assert_eq!(unique.len(), 48);
        for inst in &m.instances {
            assert_eq!(expand::uri(m.module(inst), &inst.choice), inst.uri);
        }
    }

    #[test]
    fn runtime_codes_are_ints_bools_and_positions() {
        let m = Toy::new().matrix();
        let last = &m.instances[47];
        let codes = m.codes_json(last);
        assert_eq!(
            Json::Object(codes),
            json!({"dtype": 1, "width": 128, "fast": 1, "mode": 1, "variant": 1})
        );
        assert_eq!(
            m.instance_variants(last)
                .map(|v| v.struct_name.as_str())
                .collect::<Vec<_>>(),
            ["Scaled"]
        );
    }

    #[test]
    fn aot_subset_is_include_minus_exclude() {
        let m = Toy::new().matrix();
        let aot: Vec<&Instance> = m.instances.iter().filter(|i| i.aot).collect();
        // include width=64, fast=true: 2 dtypes x 2 modes x 2 variants; exclude scaled with max.
        assert_eq!(aot.len(), 6);
        for inst in aot {
            assert_eq!(value(&m, inst, "width"), &Value::Int(64));
            assert_eq!(value(&m, inst, "fast"), &Value::Bool(true));
            assert!(
                !(value(&m, inst, "variant") == &Value::Name("scaled".into())
                    && value(&m, inst, "mode") == &Value::Name("max".into()))
            );
        }
    }

    #[test]
    fn a_user_variant_extends_the_variant_axis_and_is_never_aot() {
        let toy = Toy::new();
        toy.write(
            "mine/mine.cuh",
            "#pragma once\ntemplate <typename P> struct Mine {};\n",
        );
        toy.write(
            "mine/variants.json",
            r#"{"variants": {"mine": {"header": "mine.cuh", "struct": "Mine", "params": []}}}"#,
        );
        let m = toy.matrix_with(&["mine/variants.json"]).unwrap();
        assert_eq!(m.instances.len(), 72);
        let mine: Vec<&Instance> = m
            .instances
            .iter()
            .filter(|i| value(&m, i, "variant") == &Value::Name("mine".into()))
            .collect();
        assert_eq!(mine.len(), 24);
        assert!(mine.iter().all(|i| !i.aot));
        assert!(mine[0].uri.ends_with("_variant_mine"));
        assert!(m.variant("mine").unwrap().user);
        // The built-in subset is unchanged.
        assert_eq!(m.instances.iter().filter(|i| i.aot).count(), 6);
    }

    #[test]
    fn a_negative_int_value_is_spelled_neg_in_the_uri() {
        let toy = Toy::new();
        let mut c = toy.config();
        c["modules"]["toy"]["axes"][1] =
            json!({"name": "width", "type": "int", "values": [-8, 8], "min": -8});
        c["modules"]["toy"]["aot"]["include"][0]["width"] = json!([8]);
        toy.set_config(&c);
        let m = toy.matrix();
        assert!(m.instances[0].uri.contains("_width_neg8_"));
        assert!(m.instances[8].uri.contains("_width_8_"));
        assert_eq!(m.codes_json(&m.instances[0])["width"], json!(-8));
    }

    #[test]
    fn the_release_defaults_to_archs_and_reads_its_own_list() {
        let toy = Toy::new();
        let m = toy.matrix();
        assert_eq!(m.release.archs, ["8.0"]);
        assert_eq!(m.release.max_wheel_bytes, 100 << 20);
        let mut c = toy.config();
        c["release"] = json!({"archs": ["8.0+PTX", "9.0a"], "max_wheel_mib": 7});
        toy.set_config(&c);
        let m = toy.matrix();
        assert_eq!(m.release.archs, ["8.0+PTX", "9.0a"]);
        assert_eq!(m.release.max_wheel_bytes, 7 << 20);
        // The release builds every instance, AOT subset or not: it names archs, not instances.
        assert_eq!(m.instances.len(), 48);
    }

    #[test]
    fn an_instance_limit_is_checked_before_expanding() {
        let toy = Toy::new();
        let config = toy.path("variants.json");
        let text = std::fs::read_to_string(&config).unwrap();
        let err = Matrix::from_text(&config, text.clone(), &[], 47).unwrap_err();
        assert!(
            format!("{err:#}").contains("the matrix has 48 instances, more than the limit of 47"),
            "{err:#}"
        );
        assert_eq!(
            Matrix::from_text(&config, text, &[], 48)
                .unwrap()
                .instances
                .len(),
            48
        );
    }
}
