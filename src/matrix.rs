//! The validated variant matrix: modules, typed axes, variants and the AOT subset, checked once.
//!
//! [`Matrix::load`] turns the plain [`config`](crate::config) mirror into ready-to-use data and
//! refuses anything a later stage would trip on: empty or duplicated axes, values of the wrong
//! type, variants without a header, AOT selections outside their axes, colliding URIs.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::Value as Json;

use crate::config::{self, AxisKind, ConfigFile, ParamDecl, UniqueMap, VariantDecl, VariantsFile};
use crate::error::UsageError;
use crate::instance::{self, Instance};

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

/// C types an additional variant parameter may have (optionally `const T*` or `T*`).
const PARAM_BASE_TYPES: &[&str] = &[
    "float", "double", "bool", "int32_t", "int64_t", "uint32_t", "uint64_t",
];

#[derive(Debug, Clone)]
pub struct Axis {
    pub name: String,
    pub kind: AxisKind,
    pub values: Vec<Value>,
    /// The constant (or, for dtype axes, the type aliases) the generated header defines.
    pub c_names: Vec<String>,
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
    pub axes: Vec<Axis>,
    aot_include: Vec<Selection>,
    aot_exclude: Vec<Selection>,
}

impl Module {
    pub fn axis(&self, name: &str) -> Option<&Axis> {
        self.axes.iter().find(|a| a.name == name)
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
}

impl Matrix {
    /// Reads, validates and expands `variants.json` plus any `--variants-file`s.
    pub fn load(config_path: &Path, variants_files: &[PathBuf]) -> Result<Matrix> {
        let text = config::read_text(config_path)?;
        let file: ConfigFile = config::parse_json(config_path, &text)?;
        let mut extra = Vec::new();
        for path in variants_files {
            let vf: VariantsFile = config::read_json(path)?;
            extra.push((path.clone(), vf));
        }
        Self::from_config(config_path, text, file, extra)
    }

    fn from_config(
        config_path: &Path,
        config_text: String,
        file: ConfigFile,
        extra: Vec<(PathBuf, VariantsFile)>,
    ) -> Result<Matrix> {
        let root = config_path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .unwrap_or(Path::new("."));
        let root = std::path::absolute(root)?;
        let at = |field: String| Located {
            file: config_path.to_path_buf(),
            field,
        };

        for (i, inc) in file.includes.iter().enumerate() {
            if !root.join("include").join(inc).is_file() {
                return Err(at(format!("includes[{i}]"))
                    .err(format!(
                        "include/{inc} does not exist under {}",
                        root.display()
                    ))
                    .into());
            }
        }
        let mut variants = Vec::new();
        for (name, decl) in file.variants.iter() {
            variants.push(check_variant(
                &root,
                name,
                decl,
                false,
                &at(format!("variants.{name}")),
            )?);
        }
        let mut user_variants = Vec::new();
        for (path, vf) in &extra {
            for (name, decl) in vf.variants.iter() {
                let loc = Located {
                    file: path.clone(),
                    field: format!("variants.{name}"),
                };
                if variants
                    .iter()
                    .chain(&user_variants)
                    .any(|v: &Variant| &v.name == name)
                {
                    return Err(loc
                        .err(format!("variant `{name}` is already declared"))
                        .into());
                }
                user_variants.push(check_variant(&root, name, decl, true, &loc)?);
            }
        }

        let mut modules = Vec::new();
        for (name, decl) in file.modules.iter() {
            let loc = at(format!("modules.{name}"));
            check_identifier(name, &loc)?;
            if !root.join("csrc").join(&decl.source).is_file() {
                return Err(loc
                    .field("source")
                    .err(format!(
                        "csrc/{} does not exist under {}",
                        decl.source,
                        root.display()
                    ))
                    .into());
            }
            if decl.axes.is_empty() {
                return Err(loc
                    .field("axes")
                    .err("a module needs at least one axis")
                    .into());
            }
            let mut axes: Vec<Axis> = Vec::new();
            for (i, a) in decl.axes.iter().enumerate() {
                let aloc = loc.field(&format!("axes[{i}]"));
                check_identifier(&a.name, &aloc.field("name"))?;
                if axes.iter().any(|b| b.name == a.name) {
                    return Err(aloc
                        .err(format!("axis `{}` is declared twice", a.name))
                        .into());
                }
                let mut axis = check_axis(a, &variants, &aloc)?;
                if axis.kind == AxisKind::Variant {
                    axis.values
                        .extend(user_variants.iter().map(|v| Value::Name(v.name.clone())));
                }
                axes.push(axis);
            }
            if decl.entry_points.is_empty() {
                return Err(loc
                    .field("entry_points")
                    .err("list the exported symbols")
                    .into());
            }
            let sel = |list: &[UniqueMap<Vec<Json>>], key: &str| -> Result<Vec<Selection>> {
                list.iter()
                    .enumerate()
                    .map(|(i, s)| check_selection(s, &axes, &loc.field(&format!("aot.{key}[{i}]"))))
                    .collect()
            };
            modules.push(Module {
                name: name.clone(),
                source: decl.source.clone(),
                entry_points: decl.entry_points.clone(),
                aot_include: sel(&decl.aot.include, "include")?,
                aot_exclude: sel(&decl.aot.exclude, "exclude")?,
                axes,
            });
        }
        if modules.is_empty() {
            return Err(at("modules".into())
                .err("declare at least one module")
                .into());
        }
        variants.extend(user_variants);

        let instances = instance::expand(&modules, |m, choice| modules_aot(m, choice, &variants));
        let mut seen = std::collections::HashMap::new();
        for inst in &instances {
            if let Some(other) = seen.insert(inst.uri.as_str(), inst) {
                let module = |i: &Instance| modules[i.module].name.clone();
                return Err(at("modules".into())
                    .err(format!(
                        "two instances map to the URI `{}` (in modules `{}` and `{}`)",
                        inst.uri,
                        module(other),
                        module(inst)
                    ))
                    .with_hint("rename a module or an axis so that their URIs differ")
                    .into());
            }
        }

        Ok(Matrix {
            config_path: config_path.to_path_buf(),
            config_text,
            root,
            archs: file.archs,
            nvcc_flags: file.nvcc_flags,
            includes: file.includes,
            variants,
            modules,
            instances,
        })
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
    pub fn instance_json(&self, inst: &Instance) -> serde_json::Map<String, Json> {
        let mut m = serde_json::Map::new();
        m.insert("uri".into(), Json::from(inst.uri.as_str()));
        m.insert("module".into(), Json::from(self.module(inst).name.as_str()));
        m.insert("params".into(), self.params_json(inst));
        m.insert("codes".into(), self.codes_json(inst));
        m.insert("aot".into(), Json::from(inst.aot));
        m
    }

    pub fn params_json(&self, inst: &Instance) -> Json {
        Json::Object(
            self.params(inst)
                .map(|(a, v)| (a.name.clone(), v.to_json()))
                .collect(),
        )
    }

    pub fn codes_json(&self, inst: &Instance) -> Json {
        let m = self.module(inst);
        Json::Object(
            m.axes
                .iter()
                .zip(&inst.choice)
                .map(|(a, &i)| (a.name.clone(), Json::from(a.code(i))))
                .collect(),
        )
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

fn modules_aot(m: &Module, choice: &[usize], variants: &[Variant]) -> bool {
    let user = m
        .axes
        .iter()
        .zip(choice)
        .any(|(a, &i)| match (&a.kind, &a.values[i]) {
            (AxisKind::Variant, Value::Name(n)) => variants.iter().any(|v| &v.name == n && v.user),
            _ => false,
        });
    !user && m.is_aot(choice)
}

/// A place in a config file, for error messages: `variants.json: modules.x.axes[1]: ...`.
struct Located {
    file: PathBuf,
    field: String,
}

impl Located {
    fn field(&self, sub: &str) -> Located {
        let sep = if sub.starts_with('[') { "" } else { "." };
        Located {
            file: self.file.clone(),
            field: format!("{}{sep}{sub}", self.field),
        }
    }
    fn err(&self, msg: impl fmt::Display) -> UsageError {
        UsageError::new(format!("{}: {}: {msg}", self.file.display(), self.field))
    }
}

fn check_identifier(name: &str, loc: &Located) -> Result<(), UsageError> {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(loc.err(format!(
            "`{name}` is not a C identifier (letters, digits and _, not leading digit)"
        )))
    }
}

fn check_variant(
    root: &Path,
    name: &str,
    decl: &VariantDecl,
    user: bool,
    loc: &Located,
) -> Result<Variant, UsageError> {
    check_identifier(name, loc)?;
    check_identifier(&decl.struct_name, &loc.field("struct"))?;
    let given = Path::new(&decl.header);
    let header = if given.is_absolute() {
        if !given.is_file() {
            return Err(loc
                .field("header")
                .err(format!("{} does not exist", given.display())));
        }
        HeaderPath::External(given.to_path_buf())
    } else {
        if user {
            return Err(loc
                .field("header")
                .err("a user variant's header must be an absolute path"));
        }
        if !root.join("include").join(given).is_file() {
            return Err(loc
                .field("header")
                .err(format!(
                    "include/{} does not exist under {}",
                    decl.header,
                    root.display()
                ))
                .with_hint("every variant needs a header under include/ that defines its struct"));
        }
        HeaderPath::Include(decl.header.clone())
    };
    let mut names = HashSet::new();
    for (i, p) in decl.params.iter().enumerate() {
        let ploc = loc.field(&format!("params[{i}]"));
        check_identifier(&p.name, &ploc.field("name"))?;
        if !names.insert(&p.name) {
            return Err(ploc.err(format!("parameter `{}` is declared twice", p.name)));
        }
        let base = p
            .c_type
            .trim_start_matches("const ")
            .trim_end_matches('*')
            .trim();
        if !PARAM_BASE_TYPES.contains(&base) {
            return Err(ploc.field("type").err(format!(
                "unsupported C type `{}` (use one of {}, optionally as `const T*` or `T*`)",
                p.c_type,
                PARAM_BASE_TYPES.join(", ")
            )));
        }
    }
    Ok(Variant {
        name: name.to_string(),
        header,
        struct_name: decl.struct_name.clone(),
        params: decl.params.clone(),
        user,
    })
}

fn check_axis(
    decl: &config::AxisDecl,
    variants: &[Variant],
    loc: &Located,
) -> Result<Axis, UsageError> {
    if decl.values.is_empty() {
        return Err(loc
            .field("values")
            .err(format!("axis `{}` has no values", decl.name)));
    }
    let mut values = Vec::new();
    for (i, raw) in decl.values.iter().enumerate() {
        let vloc = loc.field(&format!("values[{i}]"));
        let value = parse_value(decl.kind, raw).map_err(|m| vloc.err(m))?;
        match (&decl.kind, &value) {
            (AxisKind::Variant, Value::Name(n)) if !variants.iter().any(|v| &v.name == n) => {
                return Err(vloc
                    .err(format!("variant `{n}` is not declared"))
                    .with_hint(
                        "add it under `variants` with its header, or remove it from the axis",
                    ));
            }
            (AxisKind::Dtype, Value::Name(n)) if !DTYPES.iter().any(|(d, _)| d == n) => {
                let known: Vec<_> = DTYPES.iter().map(|(d, _)| *d).collect();
                return Err(vloc.err(format!("unknown dtype `{n}` (known: {})", known.join(", "))));
            }
            (AxisKind::Enum, Value::Name(n)) => check_identifier(n, &vloc)?,
            _ => {}
        }
        if values.contains(&value) {
            return Err(vloc.err(format!(
                "value `{value}` appears twice on axis `{}`",
                decl.name
            )));
        }
        values.push(value);
    }
    let c_names = match &decl.c_names {
        Some(names) if names.is_empty() => {
            return Err(loc
                .field("c_names")
                .err("give at least one name, or leave c_names out"))
        }
        Some(names) => {
            for (i, n) in names.iter().enumerate() {
                check_identifier(n, &loc.field(&format!("c_names[{i}]")))?;
            }
            names.clone()
        }
        None => vec![decl.name.to_uppercase()],
    };
    Ok(Axis {
        name: decl.name.clone(),
        kind: decl.kind,
        values,
        c_names,
    })
}

fn parse_value(kind: AxisKind, raw: &Json) -> Result<Value, String> {
    match (kind, raw) {
        (AxisKind::Int, Json::Number(n)) => n
            .as_i64()
            .map(Value::Int)
            .ok_or_else(|| format!("`{n}` is not an integer")),
        (AxisKind::Bool, Json::Bool(b)) => Ok(Value::Bool(*b)),
        (AxisKind::Dtype | AxisKind::Enum | AxisKind::Variant, Json::String(s)) => {
            if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                Err(format!("`{s}` must be made of letters, digits and _"))
            } else {
                Ok(Value::Name(s.clone()))
            }
        }
        (kind, other) => Err(format!("`{other}` is not a valid {kind:?} value").to_lowercase()),
    }
}

fn check_selection(sel: &UniqueMap<Vec<Json>>, axes: &[Axis], loc: &Located) -> Result<Selection> {
    let mut out = Vec::new();
    for (name, raw_values) in sel.iter() {
        let aloc = loc.field(name);
        let Some(axis_index) = axes.iter().position(|a| &a.name == name) else {
            let names: Vec<_> = axes.iter().map(|a| a.name.as_str()).collect();
            return Err(aloc
                .err(format!(
                    "no axis `{name}` in this module (axes: {})",
                    names.join(", ")
                ))
                .into());
        };
        let axis = &axes[axis_index];
        let mut allowed = HashSet::new();
        for raw in raw_values {
            let value = parse_value(axis.kind, raw).map_err(|m| aloc.err(m))?;
            let Some(pos) = axis.position(&value) else {
                return Err(aloc
                    .err(format!(
                        "value `{value}` is not on axis `{name}` (values: {})",
                        axis.values_list()
                    ))
                    .into());
            };
            allowed.insert(pos);
        }
        out.push((axis_index, allowed));
    }
    Ok(out)
}
