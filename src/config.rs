//! The plain mirror of `variants.json`: serde types that accept exactly what the file may say.
//!
//! Nothing here checks meaning (that is `matrix`'s job); this module only reads the file, refuses
//! unknown keys and duplicated names, and reports syntax errors with `file:line:column`.

use std::path::Path;

use anyhow::Result;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::error::UsageError;

/// A JSON object whose keys must be unique; keeps the order the file gives.
#[derive(Debug, Clone)]
pub struct UniqueMap<V>(pub Vec<(String, V)>);

impl<V> Default for UniqueMap<V> {
    fn default() -> Self {
        UniqueMap(Vec::new())
    }
}

impl<V> UniqueMap<V> {
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UniqueVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for UniqueVisitor<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object with unique keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries: Vec<(String, V)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if entries.iter().any(|(k, _)| *k == key) {
                        return Err(de::Error::custom(format!("duplicate key `{key}`")));
                    }
                    let value = map.next_value()?;
                    entries.push((key, value));
                }
                Ok(UniqueMap(entries))
            }
        }
        deserializer.deserialize_map(UniqueVisitor(std::marker::PhantomData))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Default GPU architectures, as PyTorch users write them ("8.0", "9.0a", "90+PTX").
    #[serde(default)]
    pub archs: Vec<String>,
    /// Extra nvcc flags for every instance.
    #[serde(default)]
    pub nvcc_flags: Vec<String>,
    /// Headers under `include/` that every generated header includes before the variant headers
    /// (the variant interface), so a user variant's header needs no includes of its own.
    #[serde(default)]
    pub includes: Vec<String>,
    #[serde(default)]
    pub variants: UniqueMap<VariantDecl>,
    pub modules: UniqueMap<ModuleDecl>,
    /// What a release precompiles and the size each wheel must fit (`release.rs`).
    #[serde(default)]
    pub release: crate::release::ReleaseDecl,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantDecl {
    /// Header path under `include/` (or absolute, for user variants given by `--variants-file`).
    pub header: String,
    /// The struct template the kernels instantiate as `ATTENTION_VARIANT<Params>`.
    #[serde(rename = "struct")]
    pub struct_name: String,
    #[serde(default)]
    pub params: Vec<ParamDecl>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ParamDecl {
    pub name: String,
    #[serde(rename = "type")]
    pub c_type: String,
    /// A pointer parameter's element count, named as a `shape` field of the module's args
    /// (`PARAM_LENGTHS`): the loader checks that the tensor passed is 1-D of that field's value
    /// in the call (where the module has the field). Absent: any size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<String>,
}

/// The sizes a pointer parameter's `len` may name: shape fields of every built-in module's args.
pub const PARAM_LENGTHS: &[&str] = &["num_qo_heads"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleDecl {
    /// The translation unit, relative to `csrc/`.
    pub source: String,
    /// The `extern "C"` symbols the module exports.
    pub entry_points: Vec<String>,
    /// The module's C ABI, declared once: codegen writes the arguments struct and the query
    /// entry point from it, and the loader builds its ctypes mirror from it (via describe).
    #[serde(default)]
    pub args: Option<ArgsDecl>,
    pub axes: Vec<AxisDecl>,
    #[serde(default)]
    pub aot: AotDecl,
    /// Combinations of axis values that no instance serves, each with the message a caller
    /// gets: the expansion skips them, and a call asking for one is refused with its reason.
    #[serde(default)]
    pub unsupported: Vec<ExclusionDecl>,
    /// What a release leaves out of the whole matrix (absent: nothing).
    #[serde(default)]
    pub release: ReleaseSetDecl,
    /// The only architectures the module is built for ("9.0a"), as compile targets; absent:
    /// every architecture of the build.
    #[serde(default)]
    pub archs: Option<Vec<String>>,
}

/// The fields of a module's arguments struct, in order: first those that change on every call
/// (tensor addresses, stream, workspace: 8 bytes each, one contiguous block a caller rewrites),
/// then those fixed for a shape.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ArgsDecl {
    pub call: Vec<ArgDecl>,
    pub shape: Vec<ArgDecl>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ArgDecl {
    pub name: String,
    #[serde(rename = "type")]
    pub c_type: String,
    /// One line for the generated struct's comment (shape, units, what NULL means).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AxisKind {
    Dtype,
    Int,
    Bool,
    Enum,
    Variant,
    /// Implementations of one module, in order of preference: the loader picks the first whose
    /// architectures run on the device. Values may be limited to some architectures (`archs`).
    Backend,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AxisDecl {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: AxisKind,
    pub values: Vec<Value>,
    /// C names the axis defines: the constant's name (default: the axis name upper-cased), or
    /// for a dtype axis one type alias per name.
    #[serde(default)]
    pub c_names: Option<Vec<String>>,
    /// The range an `int` axis's values must lie in (inclusive); by default 1..=65536, which
    /// covers sizes and counts and refuses a stray 0 or negative.
    #[serde(default)]
    pub min: Option<i64>,
    #[serde(default)]
    pub max: Option<i64>,
    /// `backend` axes only: value -> the only architectures its instances are built for
    /// (`{"sm90": ["9.0a"]}`); a value left out is built for every architecture.
    #[serde(default)]
    pub archs: Option<UniqueMap<Vec<String>>>,
}

/// The precompiled subset: the union of `include` selections minus every `exclude` selection.
/// A selection maps axis names to the values it allows; an axis it leaves out allows all.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AotDecl {
    #[serde(default)]
    pub include: Vec<UniqueMap<Vec<Value>>>,
    #[serde(default)]
    pub exclude: Vec<UniqueMap<Vec<Value>>>,
}

/// `modules.<m>.release`: the module's instances a release does not precompile.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseSetDecl {
    #[serde(default)]
    pub exclude: Vec<ExclusionDecl>,
}

/// Combinations left out, and why: the axis values `where` selects (as an `aot` selection does)
/// and the reason a user reads. Out of the release (`release.exclude`: their first use compiles
/// them, and says so), or out of the matrix (`unsupported`: a call asking for one is refused).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExclusionDecl {
    #[serde(rename = "where")]
    pub selection: UniqueMap<Vec<Value>>,
    pub reason: String,
}

/// User variants added for one run (`--variants-file`), as the JIT loader writes them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantsFile {
    pub variants: UniqueMap<VariantDecl>,
}

pub fn read_text(path: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            // read_to_string's own message ("stream did not contain valid UTF-8") names no file.
            UsageError::new(format!("{}: not UTF-8 text", path.display()))
                .with_hint("JSON files must be UTF-8; re-save the file as UTF-8")
        } else {
            UsageError::new(format!("cannot read {}: {e}", path.display())).with_hint(
                "run flashgen in the folder that holds variants.json, or pass --config PATH",
            )
        }
    })?)
}

/// Parses `text`, read from `path`, reporting errors as `path:line:column: message`.
pub fn parse_json<T: for<'de> Deserialize<'de>>(path: &Path, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| {
        UsageError::new(format!(
            "{}:{}:{}: {}",
            path.display(),
            e.line(),
            e.column(),
            strip_position(&e.to_string())
        ))
        .into()
    })
}

/// serde_json appends " at line L column C"; the message leads with the position already.
fn strip_position(msg: &str) -> &str {
    msg.rfind(" at line ").map_or(msg, |i| &msg[..i])
}
