//! The rules a variants file must meet, each refusal naming the file and the field
//! (`variants.json: modules.x.axes[1].values: ...`): names that are C identifiers the generated
//! header can use, headers inside the tree, typed axis values, a declared C ABI of 8-byte
//! fields, architectures that leave every instance something to build for, AOT, release and
//! `unsupported` selections within their axes (the last leaving each module an instance), a
//! bounded instance count and URI length, and no two instances with one URI.
//! `tests/validation.rs` pins the messages.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::Value as Json;

use super::{
    code_field, expand, Axis, HeaderPath, Matrix, Module, Selection, Unsupported, Value, Variant,
    DTYPES,
};
use crate::arch::{self, Arch};
use crate::c_ident;
use crate::config::{self, AxisKind, ConfigFile, ParamDecl, UniqueMap, VariantDecl, VariantsFile};
use crate::error::UsageError;
use crate::instance::Instance;
use crate::param_types::{self, ParamType};
use crate::release::Release;

/// Checks the parsed config (`file`, and each `--variants-file` in `extra`) and builds the
/// [`Matrix`]: the body of [`Matrix::from_text`].
pub(super) fn matrix(
    config_path: &Path,
    config_text: String,
    file: ConfigFile,
    extra: Vec<(PathBuf, VariantsFile)>,
    max_instances: u64,
) -> Result<Matrix> {
    let root = std::path::absolute(folder_of(config_path))?;
    let at = |field: String| Located {
        file: config_path.to_path_buf(),
        field,
    };

    for (i, inc) in file.includes.iter().enumerate() {
        resolve_inside(&root, "include", inc).map_err(|m| at(format!("includes[{i}]")).err(m))?;
    }
    let core = core_fields(file.modules.iter().map(|(m, decl)| {
        let variants = decl.axes.iter().any(|a| a.kind == AxisKind::Variant);
        (m.as_str(), decl.args.as_ref(), variants)
    }));
    let mut variants = Vec::new();
    let mut params = ParamUnion::default();
    for (name, decl) in file.variants.iter() {
        let loc = at(format!("variants.{name}"));
        let v = check_variant(&root, None, name, decl, &loc)?;
        check_not_core(&v, &core, config_path, &loc)?;
        params.add(&v, &loc)?;
        variants.push(v);
    }
    let mut user_variants = Vec::new();
    for (path, vf) in &extra {
        // A user header must sit beside the variants file that names it (or under include/),
        // so a variants file cannot pull an arbitrary file into the build.
        let dir = std::fs::canonicalize(folder_of(path)).map_err(|e| {
            UsageError::new(format!(
                "{}: cannot resolve its folder: {e}",
                path.display()
            ))
        })?;
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
            let v = check_variant(&root, Some(&dir), name, decl, &loc)?;
            check_not_core(&v, &core, config_path, &loc)?;
            params.add(&v, &loc)?;
            user_variants.push(v);
        }
    }
    let structs: Vec<&str> = variants
        .iter()
        .chain(&user_variants)
        .map(|v| v.struct_name.as_str())
        .collect();

    let mut modules = Vec::new();
    for (name, decl) in file.modules.iter() {
        let loc = at(format!("modules.{name}"));
        check_name(name, &loc)?;
        resolve_inside(&root, "csrc", &decl.source).map_err(|m| loc.field("source").err(m))?;
        if decl.axes.is_empty() {
            return Err(loc
                .field("axes")
                .err("a module needs at least one axis")
                .into());
        }
        let mut axes: Vec<Axis> = Vec::new();
        for (i, a) in decl.axes.iter().enumerate() {
            let aloc = loc.field(&format!("axes[{i}]"));
            check_name(&a.name, &aloc.field("name"))?;
            check_generated(
                &a.name,
                &format!("DISPATCH_{}", a.name),
                &aloc.field("name"),
            )?;
            if axes.iter().any(|b| b.name == a.name) {
                return Err(aloc
                    .err(format!("axis `{}` is declared twice", a.name))
                    .into());
            }
            let mut axis = check_axis(a, &variants, &aloc)?;
            if axis.kind == AxisKind::Variant {
                axis.values
                    .extend(user_variants.iter().map(|v| Value::Name(v.name.clone())));
                axis.arch_limits.resize(axis.values.len(), None);
            }
            check_c_names(&axis, a, &axes, &structs, decl, &aloc)?;
            axes.push(axis);
        }
        if decl.entry_points.is_empty() {
            return Err(loc
                .field("entry_points")
                .err("list the exported symbols")
                .into());
        }
        for (i, e) in decl.entry_points.iter().enumerate() {
            check_name(e, &loc.field(&format!("entry_points[{i}]")))?;
        }
        let args = match &decl.args {
            Some(a) => Some(check_args(a, &axes, &loc.field("args"))?),
            None => None,
        };
        let arch_limit = match &decl.archs {
            Some(list) => Some(check_limit(list, &loc.field("archs"))?),
            None => None,
        };
        check_arch_limits(&axes, arch_limit.as_deref(), &file.archs, &loc)?;
        let sel = |list: &[UniqueMap<Vec<Json>>], key: &str| -> Result<Vec<Selection>> {
            list.iter()
                .enumerate()
                .map(|(i, s)| check_selection(s, &axes, &loc.field(&format!("aot.{key}[{i}]"))))
                .collect()
        };
        let release_exclude = check_exclusions(
            &decl.release.exclude,
            &axes,
            &loc.field("release.exclude"),
            "say why these instances are left out of the release",
        )?;
        let unsupported = check_exclusions(
            &decl.unsupported,
            &axes,
            &loc.field("unsupported"),
            "say why no instance serves these combinations and what to call instead: a caller \
             who asks for one reads it",
        )?;
        for (i, (selection, _)) in unsupported.iter().enumerate() {
            if selection.is_empty() {
                return Err(loc
                    .field(&format!("unsupported[{i}].where"))
                    .err("an empty selection declares every combination of the module unsupported")
                    .with_hint("name the axes and values that no instance serves")
                    .into());
            }
        }
        // An exclusion from the release inside one unsupported declaration excludes nothing.
        for (ri, (release, _)) in release_exclude.iter().enumerate() {
            if let Some(ui) = unsupported
                .iter()
                .position(|(u, _)| within(release, u, &axes))
            {
                return Err(loc
                    .field(&format!("release.exclude[{ri}]"))
                    .err(format!(
                        "it selects only combinations that unsupported[{ui}] declares: they are \
                         no instances, so no release holds them"
                    ))
                    .with_hint("remove this exclusion")
                    .into());
            }
        }
        modules.push(Module {
            name: name.clone(),
            source: decl.source.clone(),
            entry_points: decl.entry_points.clone(),
            args,
            aot_include: sel(&decl.aot.include, "include")?,
            aot_exclude: sel(&decl.aot.exclude, "exclude")?,
            release_exclude,
            unsupported: unsupported
                .into_iter()
                .map(|(selection, reason)| Unsupported { selection, reason })
                .collect(),
            axes,
            arch_limit,
        });
    }
    if modules.is_empty() {
        return Err(at("modules".into())
            .err("declare at least one module")
            .into());
    }
    variants.extend(user_variants);
    check_size(&modules, max_instances, &at)?;

    let instances = expand::instances(&modules, &variants);
    for (mi, m) in modules.iter().enumerate() {
        if !instances.iter().any(|i| i.module == mi) {
            return Err(at(format!("modules.{}.unsupported", m.name))
                .err("it declares every combination of the module unsupported: the module has no instance")
                .with_hint("narrow the selections, or remove the module")
                .into());
        }
    }
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

    let release = Release::from_decl(
        &file.release,
        &file.archs,
        &config_path.display().to_string(),
    )?;
    Ok(Matrix {
        config_path: config_path.to_path_buf(),
        config_text,
        root,
        release,
        archs: file.archs,
        nvcc_flags: file.nvcc_flags,
        includes: file.includes,
        variants,
        modules,
        instances,
    })
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

/// A module's declared arguments: C identifiers, each once; types from the one table (plus
/// `void` pointers, for tensors of any dtype), normalized; the per-call block made of 8-byte
/// fields only (pointers and `int64_t`), so a caller rewrites it as one run of words.
fn check_args(
    decl: &config::ArgsDecl,
    axes: &[Axis],
    loc: &Located,
) -> Result<config::ArgsDecl, UsageError> {
    let mut seen: Vec<String> = Vec::new();
    let mut out = decl.clone();
    for (part, fields) in [("call", &mut out.call), ("shape", &mut out.shape)] {
        for (i, f) in fields.iter_mut().enumerate() {
            let at = loc.field(&format!("{part}[{i}]"));
            check_name(&f.name, &at.field("name"))?;
            if seen.contains(&f.name) {
                return Err(at
                    .field("name")
                    .err(format!("`{}` is declared twice", f.name)));
            }
            seen.push(f.name.clone());
            let spelled = match f
                .c_type
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .as_str()
            {
                "const void*" | "const void *" => "const void*".to_string(),
                "void*" | "void *" => "void*".to_string(),
                _ => crate::param_types::ParamType::parse(&f.c_type)
                    .map(|t| t.spelling())
                    .ok_or_else(|| {
                        at.field("type")
                            .err(format!("unsupported C type `{}`", f.c_type))
                            .with_hint(format!(
                                "use {}, or `const void*` / `void*`",
                                crate::param_types::spellings_hint()
                            ))
                    })?,
            };
            let eight_bytes =
                spelled.ends_with('*') || spelled == "int64_t" || spelled == "uint64_t";
            if part == "call" && !eight_bytes {
                return Err(at.field("type").err(format!(
                    "a per-call field must be 8 bytes wide (a pointer or int64_t), not `{spelled}`"
                )));
            }
            f.c_type = spelled;
        }
    }
    // Every axis's runtime value travels in a shape field, which the generated dispatch reads.
    for a in axes {
        let field = code_field(a);
        if !out.shape.iter().any(|f| f.name == field) {
            return Err(loc.field("shape").err(format!(
                "axis `{}` needs a shape field `{field}` (int64_t) carrying its runtime value",
                a.name
            )));
        }
    }
    Ok(out)
}

/// A name the generated header uses as a C identifier (module, axis, variant, entry point).
fn check_name(name: &str, loc: &Located) -> Result<(), UsageError> {
    c_ident::check(name).map_err(|m| loc.err(m).with_hint(IDENT_HINT))
}

/// A name the generated header declares as is (struct, parameter, constant): also not one of the
/// header's own names.
fn check_declared_name(name: &str, loc: &Located) -> Result<(), UsageError> {
    c_ident::check_not_generated(name).map_err(|m| loc.err(m).with_hint(IDENT_HINT))
}

/// `name` is pasted into `composed` (`DISPATCH_<axis>`, `FlashgenVariant_<name>`, ...), which
/// must still be an identifier the compiler leaves to us (an `_` at the seam makes a `__`).
fn check_generated(name: &str, composed: &str, loc: &Located) -> Result<(), UsageError> {
    c_ident::check(composed).map_err(|_| {
        loc.err(format!(
            "`{name}` makes the generated name `{composed}`, which C++ reserves (`__`)"
        ))
        .with_hint(IDENT_HINT)
    })
}

const IDENT_HINT: &str = "use a plain C identifier: letters, digits and single underscores, \
     not a keyword, not starting with `_`";

/// The folder a file path names, `.` for a bare file name (`variants.json`).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Resolves `given`, relative to `<root>/<sub>`, to a file inside that folder. Both sides are
/// canonicalized, so neither `..` nor a symlink can leave it; absolute paths are refused, since
/// the tree must build the same wherever it is copied (a wheel ships it).
fn resolve_inside(root: &Path, sub: &str, given: &str) -> Result<PathBuf, String> {
    if Path::new(given).is_absolute() {
        return Err(format!(
            "`{given}` is an absolute path; write it relative to {sub}/"
        ));
    }
    check_include_spelling(given)?;
    let base = std::fs::canonicalize(root.join(sub))
        .map_err(|e| format!("{sub}/ under {}: {e}", root.display()))?;
    let missing = || format!("{sub}/{given} does not exist under {}", root.display());
    let path = std::fs::canonicalize(base.join(given)).map_err(|_| missing())?;
    if !path.starts_with(&base) {
        return Err(format!(
            "{sub}/{given} resolves to {}, outside {}",
            path.display(),
            base.display()
        ));
    }
    if !path.is_file() {
        return Err(missing());
    }
    Ok(path)
}

/// A user variant's header: absolute, or relative to its variants file's folder `dir`; it must
/// resolve inside `dir` or `<root>/include`.
fn resolve_user_header(root: &Path, dir: &Path, given: &str) -> Result<PathBuf, String> {
    let path = std::fs::canonicalize(dir.join(given)).map_err(|_| {
        format!(
            "{given} does not exist (relative paths start at {})",
            dir.display()
        )
    })?;
    let include = std::fs::canonicalize(root.join("include")).ok();
    if !(path.starts_with(dir) || include.as_ref().is_some_and(|i| path.starts_with(i))) {
        return Err(format!(
            "{given} resolves to {}, outside the variants file's folder {}",
            path.display(),
            dir.display()
        ));
    }
    if !path.is_file() {
        return Err(format!("{} is not a file", path.display()));
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    check_include_spelling(&name)?;
    Ok(path)
}

/// Header paths are pasted into `#include <...>`: keep them to characters that cannot end the
/// directive or start another one.
fn check_include_spelling(path: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "_-.+/".contains(c);
    if path.is_empty() || !path.chars().all(ok) {
        return Err(format!(
            "`{}` is not a header path flashgen can include (letters, digits, _ - . + /)",
            path.escape_debug()
        ));
    }
    Ok(())
}

fn check_variant(
    root: &Path,
    user_dir: Option<&Path>,
    name: &str,
    decl: &VariantDecl,
    loc: &Located,
) -> Result<Variant, UsageError> {
    // A variant's name never stands alone in C: it only completes `FlashgenVariant_<name>` and
    // `FLASHGEN_CODE_<axis>_<name>`, so keywords are fine (the built-in `default` is one).
    if !c_ident::is_identifier(name) {
        return Err(loc
            .err(format!(
                "`{name}` is not a C identifier (letters, digits and _, not leading digit)"
            ))
            .with_hint(IDENT_HINT));
    }
    check_generated(name, &format!("FlashgenVariant_{name}"), loc)?;
    check_declared_name(&decl.struct_name, &loc.field("struct"))?;
    let hloc = loc.field("header");
    let header = match user_dir {
        Some(dir) => {
            HeaderPath::External(resolve_user_header(root, dir, &decl.header).map_err(|m| {
                hloc.err(m).with_hint(
                    "put the header in the variants file's folder (or under include/) and name \
                     it relative to that file, or by its absolute path",
                )
            })?)
        }
        None => {
            resolve_inside(root, "include", &decl.header).map_err(|m| {
                hloc.err(m).with_hint(
                    "every variant needs a header under include/ that defines its struct",
                )
            })?;
            HeaderPath::Include(decl.header.clone())
        }
    };
    let mut names = HashSet::new();
    let mut params = Vec::new();
    for (i, p) in decl.params.iter().enumerate() {
        let ploc = loc.field(&format!("params[{i}]"));
        check_declared_name(&p.name, &ploc.field("name"))?;
        if !names.insert(&p.name) {
            return Err(ploc.err(format!("parameter `{}` is declared twice", p.name)));
        }
        let Some(ty) = ParamType::parse(&p.c_type) else {
            return Err(ploc
                .field("type")
                .err(format!("unsupported C type `{}`", p.c_type.escape_debug()))
                .with_hint(param_types::spellings_hint()));
        };
        if let Some(len) = &p.len {
            if ty.indirection == param_types::Indirection::Value {
                return Err(ploc
                    .field("len")
                    .err(format!(
                        "`len` is for pointer parameters; `{}` is a value",
                        p.name
                    ))
                    .with_hint("drop `len`, or make the parameter a `const T*`"));
            }
            if !config::PARAM_LENGTHS.contains(&len.as_str()) {
                return Err(ploc
                    .field("len")
                    .err(format!("unknown length `{}`", len.escape_debug()))
                    .with_hint(format!("`len` takes {}", config::PARAM_LENGTHS.join(", "))));
            }
        }
        // The normalized spelling is what the header declares and `describe` exports.
        params.push(ParamDecl {
            name: p.name.clone(),
            c_type: ty.spelling(),
            len: p.len.clone(),
        });
    }
    Ok(Variant {
        name: name.to_string(),
        header,
        struct_name: decl.struct_name.clone(),
        params,
        user: user_dir.is_some(),
    })
}

/// The core fields of the modules' params structs, each with the modules that have it: the
/// names of every module's declared C ABI (`modules.<m>.args`, its `call` and `shape`), which the
/// entry point copies into the params struct a variant reads (include/flashgen/params.cuh; a test
/// holds that header to this list). A variant parameter of the same name would be a member of the
/// struct's base that the core member hides: the kernel would silently read its own value. The
/// one list: `describe` exports it as `reserved_params` for the loader's `Variant`. Each module
/// comes with whether it has a variant axis: one without (merge_state) passes no variant
/// parameters, so its fields reserve nothing.
pub fn core_fields<'a>(
    modules: impl Iterator<Item = (&'a str, Option<&'a config::ArgsDecl>, bool)>,
) -> indexmap::IndexMap<String, Vec<String>> {
    let mut out: indexmap::IndexMap<String, Vec<String>> = indexmap::IndexMap::new();
    for (module, args, _) in modules.filter(|&(_, _, variants)| variants) {
        for arg in args.iter().flat_map(|a| a.call.iter().chain(&a.shape)) {
            let mods = out.entry(arg.name.clone()).or_default();
            if !mods.iter().any(|m| m == module) {
                mods.push(module.to_string());
            }
        }
    }
    out
}

/// A variant parameter must not be named like a core field of a params struct ([`core_fields`]).
fn check_not_core(
    v: &Variant,
    core: &indexmap::IndexMap<String, Vec<String>>,
    config_path: &Path,
    loc: &Located,
) -> Result<(), UsageError> {
    for (i, p) in v.params.iter().enumerate() {
        if let Some(modules) = core.get(&p.name) {
            return Err(loc
                .field(&format!("params[{i}].name"))
                .err(format!(
                    "parameter `{}` is a core field of the params struct of {} ({} \
                     modules.<m>.args): the kernel would read its own `{}`, never this parameter",
                    p.name,
                    modules
                        .iter()
                        .map(|m| format!("`{m}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    config_path.display(),
                    p.name
                ))
                .with_hint(format!(
                    "rename the parameter (e.g. `{}_{}`); `flashgen describe --json` lists \
                     the reserved names under `reserved_params`",
                    v.name, p.name
                )));
        }
    }
    Ok(())
}

/// The parameters of every variant by name: a dispatching header declares the union of its
/// variants' parameters once per name, so one name must have one type everywhere.
#[derive(Default)]
struct ParamUnion(Vec<(String, String, String)>);

impl ParamUnion {
    fn add(&mut self, v: &Variant, loc: &Located) -> Result<(), UsageError> {
        for (i, p) in v.params.iter().enumerate() {
            if let Some((_, ty, other)) = self.0.iter().find(|(n, ..)| *n == p.name) {
                if *ty != p.c_type {
                    return Err(loc
                        .field(&format!("params[{i}].type"))
                        .err(format!(
                            "parameter `{}` is `{}` here but `{ty}` in variant `{other}`",
                            p.name, p.c_type
                        ))
                        .with_hint(
                            "a dispatching header declares each parameter name once: give it \
                             the same type in every variant, or rename it",
                        ));
                }
            } else {
                self.0
                    .push((p.name.clone(), p.c_type.clone(), v.name.clone()));
            }
        }
        Ok(())
    }
}

/// The names an axis declares in the generated header: identifiers, not the header's own names,
/// and unique within the module (one global each in the instance form) and against the variant
/// structs the header's includes define.
fn check_c_names(
    axis: &Axis,
    declared: &config::AxisDecl,
    earlier: &[Axis],
    structs: &[&str],
    module: &config::ModuleDecl,
    loc: &Located,
) -> Result<(), UsageError> {
    for (i, n) in axis.c_names.iter().enumerate() {
        let nloc = if declared.c_names.is_some() {
            loc.field(&format!("c_names[{i}]"))
        } else {
            // The default name: the fix is to choose one, or to rename the axis.
            loc.field("name")
        };
        check_declared_name(n, &nloc)?;
        let clash = if module
            .axes
            .iter()
            .any(|a| *n == format!("DISPATCH_{}", a.name))
        {
            Some(format!("the macro `{n}`"))
        } else if axis.c_names[..i].contains(n) {
            Some("this axis's own c_names".to_string())
        } else if let Some(a) = earlier.iter().find(|a| a.c_names.contains(n)) {
            Some(format!("axis `{}`", a.name))
        } else if structs.contains(&n.as_str()) {
            Some("a variant's struct".to_string())
        } else {
            None
        };
        if let Some(what) = clash {
            return Err(nloc
                .err(format!("the C name `{n}` is already taken by {what}"))
                .with_hint("give each axis distinct `c_names`"));
        }
    }
    Ok(())
}

/// The default instance limit; `FLASHGEN_MAX_INSTANCES` overrides it.
pub const DEFAULT_MAX_INSTANCES: u64 = 1_000_000;

/// Longest URI: it names a folder and a `<uri>.so`, and file names stop at 255 bytes.
pub const MAX_URI_LEN: usize = 200;

/// `FLASHGEN_MAX_INSTANCES`, else [`DEFAULT_MAX_INSTANCES`].
pub fn max_instances_from_env() -> Result<u64, UsageError> {
    const VAR: &str = "FLASHGEN_MAX_INSTANCES";
    let Some(raw) = std::env::var_os(VAR) else {
        return Ok(DEFAULT_MAX_INSTANCES);
    };
    raw.to_str()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            UsageError::new(format!(
                "{VAR}={}: not a positive whole number",
                raw.to_string_lossy()
            ))
            .with_hint(format!(
                "set it to the most instances a matrix may expand to (default {DEFAULT_MAX_INSTANCES}), or unset it"
            ))
        })
}

/// Counts every module's instances (checked, before expanding anything) against `max`, then
/// bounds the URIs' length; a matrix too large to list fails here, fast.
fn check_size(
    modules: &[Module],
    max: u64,
    at: &impl Fn(String) -> Located,
) -> Result<(), UsageError> {
    let count = |m: &Module| {
        m.axes
            .iter()
            .try_fold(1u128, |n, a| n.checked_mul(a.values.len() as u128))
    };
    let spell = |n: Option<u128>| n.map_or("more than 2^128".to_string(), |n| n.to_string());
    let total = modules
        .iter()
        .try_fold(0u128, |t, m| t.checked_add(count(m)?));
    if total.is_none_or(|t| t > u128::from(max)) {
        let lines: Vec<String> = modules
            .iter()
            .map(|m| {
                let sizes: Vec<String> = m
                    .axes
                    .iter()
                    .map(|a| format!("{} {}", a.name, a.values.len()))
                    .collect();
                format!("  {}: {} = {}", m.name, spell(count(m)), sizes.join(" x "))
            })
            .collect();
        let largest = modules
            .iter()
            .max_by_key(|m| count(m).unwrap_or(u128::MAX))
            .map_or("", |m| m.name.as_str());
        return Err(at(format!("modules.{largest}"))
            .err(format!(
                "the matrix has {} instances, more than the limit of {max}:\n{}",
                spell(total),
                lines.join("\n")
            ))
            .with_hint(
                "split an axis or move values to another module; FLASHGEN_MAX_INSTANCES=N raises the limit",
            ));
    }
    for m in modules {
        let longest = m.name.len()
            + m.axes
                .iter()
                .map(|a| {
                    let value = a.values.iter().map(uri_part_len).max().unwrap_or(0);
                    2 + a.name.len() + value
                })
                .sum::<usize>();
        if longest > MAX_URI_LEN {
            return Err(at(format!("modules.{}", m.name))
                .err(format!(
                    "its instance URIs reach {longest} bytes; they name files, so at most {MAX_URI_LEN}"
                ))
                .with_hint("shorten the module, axis or value names"));
        }
    }
    Ok(())
}

/// The length a value takes in a URI (see `expand::uri`).
fn uri_part_len(v: &Value) -> usize {
    match v {
        Value::Int(i) if *i < 0 => 3 + i.unsigned_abs().to_string().len(),
        v => v.to_string().len(),
    }
}

/// The range of an `int` axis: its `min`/`max`, else the default.
const INT_RANGE: (i64, i64) = (1, 65536);

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
    if decl.kind != AxisKind::Backend && decl.archs.is_some() {
        return Err(loc
            .field("archs")
            .err("only `backend` axes take `archs`")
            .with_hint(
                "declare the implementations as a `backend` axis, or limit the whole module \
                 with modules.<name>.archs",
            ));
    }
    if decl.kind != AxisKind::Int {
        for (key, given) in [("min", decl.min), ("max", decl.max)] {
            if given.is_some() {
                return Err(loc
                    .field(key)
                    .err("only `int` axes take a range")
                    .with_hint(format!("remove `{key}`")));
            }
        }
    }
    let (min, max) = (
        decl.min.unwrap_or(INT_RANGE.0),
        decl.max.unwrap_or(INT_RANGE.1),
    );
    if min > max {
        return Err(loc
            .field("min")
            .err(format!("min {min} is above max {max}")));
    }
    let mut values = Vec::new();
    for (i, raw) in decl.values.iter().enumerate() {
        let vloc = loc.field(&format!("values[{i}]"));
        let value = parse_value(decl.kind, raw).map_err(|m| vloc.err(m))?;
        match (&decl.kind, &value) {
            (AxisKind::Int, Value::Int(v)) if !(min..=max).contains(v) => {
                return Err(vloc
                    .err(format!(
                        "{v} is outside the range {min}..={max} of axis `{}`",
                        decl.name
                    ))
                    .with_hint(
                        "fix the value, or declare the axis's range with \"min\" and \"max\"",
                    ));
            }
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
            (AxisKind::Enum | AxisKind::Backend, Value::Name(n)) => {
                if !c_ident::is_identifier(n) {
                    return Err(vloc.err(format!(
                        "`{n}` is not a C identifier (letters, digits and _, not leading digit)"
                    )));
                }
                check_generated(n, &format!("FLASHGEN_CODE_{}_{n}", decl.name), &vloc)?;
                if decl.kind == AxisKind::Backend {
                    check_generated(n, &format!("FLASHGEN_BACKEND_{n}"), &vloc)?;
                }
            }
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
        Some(names) => names.clone(),
        None => vec![decl.name.to_uppercase()],
    };
    let mut arch_limits = vec![None; values.len()];
    for (value, list) in decl.archs.iter().flat_map(UniqueMap::iter) {
        let lloc = loc.field(&format!("archs.{value}"));
        let Some(i) = values.iter().position(|v| v.to_string() == *value) else {
            let names: Vec<String> = values.iter().map(ToString::to_string).collect();
            return Err(lloc.err(format!(
                "`{value}` is not a value of axis `{}` (values: {})",
                decl.name,
                names.join(", ")
            )));
        };
        arch_limits[i] = Some(check_limit(list, &lloc)?);
    }
    Ok(Axis {
        name: decl.name.clone(),
        kind: decl.kind,
        values,
        c_names,
        arch_limits,
    })
}

/// An arch limit as declared: compile targets (`9.0a`), at least one, each once.
fn check_limit(list: &[String], loc: &Located) -> Result<Vec<Arch>, UsageError> {
    if list.is_empty() {
        return Err(loc
            .err("an empty list of architectures builds nothing")
            .with_hint(
            "list the architectures it is built for, or leave the limit out (every architecture)",
        ));
    }
    let mut out: Vec<Arch> = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let arch = arch::parse_limit_item(item).map_err(|m| loc.field(&format!("[{i}]")).err(m))?;
        if !out.iter().any(|a| a.same_target(&arch)) {
            out.push(arch);
        }
    }
    Ok(out)
}

/// A module has at most one `backend` axis, and every instance keeps an architecture: its
/// module's limit and its backend value's limit overlap, and meet variants.json's `archs` (the
/// default build) when the file names any. Refused at the field that makes the set empty.
fn check_arch_limits(
    axes: &[Axis],
    module_limit: Option<&[Arch]>,
    default_archs: &[String],
    loc: &Located,
) -> Result<(), UsageError> {
    let backends: Vec<usize> = (0..axes.len())
        .filter(|&i| axes[i].kind == AxisKind::Backend)
        .collect();
    if let [first, second, ..] = backends[..] {
        return Err(loc
            .field(&format!("axes[{second}]"))
            .err(format!(
                "a module has one backend axis, and `{}` is already one",
                axes[first].name
            ))
            .with_hint("list every implementation as a value of that one axis"));
    }
    let any_limit = module_limit.is_some()
        || axes
            .iter()
            .any(|a| a.arch_limits.iter().any(Option::is_some));
    if !any_limit {
        return Ok(());
    }
    let defaults = if default_archs.is_empty() {
        None
    } else {
        let list = default_archs.join(" ");
        let parsed = arch::parse_list(&list, "variants.json archs").map_err(|e| {
            Located {
                file: loc.file.clone(),
                field: "archs".into(),
            }
            .err(e)
        })?;
        Some(parsed)
    };
    // Every limit an instance can have: the module's alone, or with one backend value's.
    let mut cases: Vec<(Located, String, Option<Vec<Arch>>)> = Vec::new();
    match backends.first() {
        Some(&bi) => {
            let axis = &axes[bi];
            for (vi, value) in axis.values.iter().enumerate() {
                let (field, what) = match &axis.arch_limits[vi] {
                    Some(_) => (
                        loc.field(&format!("axes[{bi}].archs.{value}")),
                        format!("backend `{value}`"),
                    ),
                    None => (loc.field("archs"), "the module".to_string()),
                };
                let limit = arch::intersect(module_limit, axis.arch_limits[vi].as_deref());
                if limit.as_ref().is_some_and(Vec::is_empty) {
                    return Err(field
                        .err(format!(
                            "{what} is built only for {}, but the module only for {}: its \
                             instances would be built for no architecture",
                            arch::spell(axis.arch_limits[vi].as_deref().unwrap_or(&[])),
                            arch::spell(module_limit.unwrap_or(&[]))
                        ))
                        .with_hint("make the two lists overlap"));
                }
                cases.push((field, what, limit));
            }
        }
        None => cases.push((
            loc.field("archs"),
            "the module".into(),
            module_limit.map(<[Arch]>::to_vec),
        )),
    }
    let Some(defaults) = defaults else {
        return Ok(());
    };
    for (field, what, limit) in cases {
        let Some(limit) = limit else { continue };
        if arch::restrict(&defaults, Some(&limit)).is_empty() {
            return Err(field
                .err(format!(
                    "{what} is built only for {}, none of which is in variants.json `archs` ({}): \
                     its instances would be built for no architecture",
                    arch::spell(&limit),
                    arch::spell(&defaults)
                ))
                .with_hint(format!(
                    "add {} to `archs`, or correct the limit",
                    arch::spell(&limit)
                )));
        }
    }
    Ok(())
}

fn parse_value(kind: AxisKind, raw: &Json) -> Result<Value, String> {
    match (kind, raw) {
        (AxisKind::Int, Json::Number(n)) => n
            .as_i64()
            .map(Value::Int)
            .ok_or_else(|| format!("`{n}` is not an integer")),
        (AxisKind::Bool, Json::Bool(b)) => Ok(Value::Bool(*b)),
        (
            AxisKind::Dtype | AxisKind::Enum | AxisKind::Variant | AxisKind::Backend,
            Json::String(s),
        ) => {
            if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                Err(format!("`{s}` must be made of letters, digits and _"))
            } else {
                Ok(Value::Name(s.clone()))
            }
        }
        (kind, other) => Err(format!("`{other}` is not a valid {kind:?} value").to_lowercase()),
    }
}

/// Whether every combination `inner` selects is one `outer` selects: each axis `outer` limits,
/// `inner` limits to some of the same values.
fn within(inner: &Selection, outer: &Selection, axes: &[Axis]) -> bool {
    outer.iter().all(|(axis, allowed)| {
        let covers_axis = (0..axes[*axis].values.len()).all(|v| allowed.contains(&v));
        covers_axis
            || inner
                .iter()
                .any(|(a, values)| a == axis && values.is_subset(allowed))
    })
}

/// A list of exclusions (`release.exclude`, `unsupported`) at `loc`: each `where` a selection
/// of `axes`, each `reason` said (trimmed); `say` is the hint of an empty one.
fn check_exclusions(
    list: &[config::ExclusionDecl],
    axes: &[Axis],
    loc: &Located,
    say: &str,
) -> Result<Vec<(Selection, String)>> {
    list.iter()
        .enumerate()
        .map(|(i, e)| {
            let eloc = loc.field(&format!("[{i}]"));
            let selection = check_selection(&e.selection, axes, &eloc.field("where"))?;
            if e.reason.trim().is_empty() {
                return Err(eloc.field("reason").err(say).into());
            }
            Ok((selection, e.reason.trim().to_string()))
        })
        .collect()
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
