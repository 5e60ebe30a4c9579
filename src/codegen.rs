//! The generated C macro header: one per instance, or one dispatching header per module.
//!
//! This is the only text that differs between instances; the shared `.cu` includes it as
//! `<flashgen_instance.cuh>`. DEVELOPERS.md documents the format. The output is a pure function
//! of the matrix and the selection: no paths, no times, so that it can key the build cache.

use std::fmt::Write as _;

use crate::config::{AxisKind, ParamDecl};
use crate::instance::Instance;
use crate::matrix::{Axis, Matrix, Module, Value, Variant, DTYPES};

/// The name the kernels include; nvcc finds it through `-I <generated folder>`.
pub const HEADER_NAME: &str = "flashgen_instance.cuh";

/// The plain-C arguments struct `generate` writes beside it (the same text is inside it).
pub const ARGS_HEADER_NAME: &str = "flashgen_args.h";

/// Runs a dispatch body and reports whether every dispatch nested in it hit too: a miss anywhere
/// bumps a thread-local count, so `DISPATCH_a(.., { DISPATCH_b(.., {..}); })` is false when
/// either value is one this binary does not hold, without the body having to pass results up.
const BODY: &str = "const unsigned flashgen_misses_before = flashgen_dispatch_misses(); __VA_ARGS__ return flashgen_dispatch_misses() == flashgen_misses_before;";

const MISS_COUNTER: &str = "// Dispatch misses on this thread (see DISPATCH_*): lets nested dispatches report a miss.\ninline unsigned& flashgen_dispatch_misses() {\n  static thread_local unsigned misses = 0;\n  return misses;\n}\n";

/// The one-instance header for `inst`.
pub fn instance_header(matrix: &Matrix, inst: &Instance) -> String {
    let m = matrix.module(inst);
    let regenerate = {
        let wheres: String = matrix
            .params(inst)
            .map(|(a, v)| format!(" --where {}={v}", a.name))
            .collect();
        format!("flashgen generate --out <DIR> --module {}{wheres}", m.name)
    };
    let variants: Vec<_> = matrix.instance_variants(inst).collect();
    let mut h = prologue(matrix, &regenerate, m, &variants);
    writeln!(h, "#define FLASHGEN_INSTANCE_URI \"{}\"", inst.uri).unwrap();
    writeln!(h, "#define FLASHGEN_DISPATCHING 0\n").unwrap();
    h.push_str(&no_variant_params(m));
    for v in &variants {
        h.push_str(&variant_tag(&v.name, &v.struct_name));
    }
    for (axis, &index) in m.axes.iter().zip(&inst.choice) {
        let value = &axis.values[index];
        writeln!(
            h,
            "// axis {} ({}): {value}",
            axis.name,
            kind_name(axis.kind)
        )
        .unwrap();
        h.push_str(&code_defines(axis));
        h.push_str(&backend_defines(axis, &[index]));
        match (axis.kind, value) {
            (AxisKind::Int, Value::Int(v)) => {
                writeln!(h, "constexpr int {} = {v};", axis.c_names[0]).unwrap()
            }
            (AxisKind::Bool, Value::Bool(v)) => {
                writeln!(h, "constexpr bool {} = {v};", axis.c_names[0]).unwrap()
            }
            (AxisKind::Enum | AxisKind::Backend, _) => writeln!(
                h,
                "constexpr int {} = {};",
                axis.c_names[0],
                axis.code(index)
            )
            .unwrap(),
            (AxisKind::Dtype, Value::Name(d)) => {
                for alias in &axis.c_names {
                    writeln!(h, "using {alias} = {};", cuda_type(d)).unwrap();
                }
            }
            (AxisKind::Variant, Value::Name(name)) => {
                let v = matrix.variant(name).expect("validated variant");
                writeln!(h, "#define ATTENTION_VARIANT {}", v.struct_name).unwrap();
                writeln!(
                    h,
                    "#define ADDITIONAL_PARAMS_DECL {}",
                    params_decl(&v.params)
                )
                .unwrap();
            }
            _ => unreachable!("values are validated against their axis kind"),
        }
        writeln!(h, "#define DISPATCH_{}(value, NAME, ...) \\", axis.name).unwrap();
        writeln!(h, "  [&]() -> bool {{ \\").unwrap();
        writeln!(
            h,
            "    if ((value) != {}) {{ ++flashgen_dispatch_misses(); return false; }} \\",
            axis.code(index)
        )
        .unwrap();
        writeln!(
            h,
            "    {} \\\n    {BODY} \\\n  }}()\n",
            binding(axis, index)
        )
        .unwrap();
    }
    // An instance is never an unsupported combination (the expansion skips those): no guard.
    h.push_str(&abi_section(m, &[]));
    h
}

/// The dispatching header for module `m`: each `DISPATCH_<axis>` switches over the values the
/// selected instances use, so one binary holds all of their combinations.
pub fn dispatch_header(
    matrix: &Matrix,
    m: &Module,
    selected: &[&Instance],
    regenerate: &str,
) -> String {
    // The values each axis takes among the selection, in axis order.
    let mut used: Vec<Vec<usize>> = vec![Vec::new(); m.axes.len()];
    for inst in selected {
        for (ai, &vi) in inst.choice.iter().enumerate() {
            if !used[ai].contains(&vi) {
                used[ai].push(vi);
            }
        }
    }
    for u in &mut used {
        u.sort_unstable();
    }
    let variants: Vec<_> = m
        .axes
        .iter()
        .zip(&used)
        .filter(|(a, _)| a.kind == AxisKind::Variant)
        .flat_map(|(a, u)| u.iter().map(move |&i| a.values[i].to_string()))
        .filter_map(|n| matrix.variant(&n))
        .collect();
    let mut h = prologue(matrix, regenerate, m, &variants);
    writeln!(h, "#define FLASHGEN_DISPATCHING 1\n").unwrap();
    for v in &variants {
        h.push_str(&variant_tag(&v.name, &v.struct_name));
    }
    // The union of the listed variants' parameters: each name once.
    let mut params: Vec<ParamDecl> = Vec::new();
    for v in &variants {
        for p in &v.params {
            if !params.iter().any(|q| q.name == p.name) {
                params.push(p.clone());
            }
        }
    }
    if m.axes.iter().any(|a| a.kind == AxisKind::Variant) {
        writeln!(
            h,
            "#define ADDITIONAL_PARAMS_DECL {}\n",
            params_decl(&params)
        )
        .unwrap();
    }
    h.push_str(&no_variant_params(m));
    for (axis, values) in m.axes.iter().zip(&used) {
        let listed: Vec<String> = values.iter().map(|&i| axis.values[i].to_string()).collect();
        writeln!(
            h,
            "// axis {} ({}): {}",
            axis.name,
            kind_name(axis.kind),
            listed.join(", ")
        )
        .unwrap();
        h.push_str(&code_defines(axis));
        h.push_str(&backend_defines(axis, values));
        writeln!(h, "#define DISPATCH_{}(value, NAME, ...) \\", axis.name).unwrap();
        writeln!(h, "  [&]() -> bool {{ \\").unwrap();
        writeln!(h, "    switch (static_cast<long long>(value)) {{ \\").unwrap();
        for &i in values {
            writeln!(
                h,
                "      case {}: {{ {} {BODY} }} \\",
                axis.code(i),
                binding(axis, i)
            )
            .unwrap();
        }
        writeln!(
            h,
            "      default: ++flashgen_dispatch_misses(); return false; \\"
        )
        .unwrap();
        writeln!(h, "    }} \\\n  }}()\n").unwrap();
    }
    // The DISPATCH_ nest reaches every combination of the listed values, unsupported ones too:
    // the generated dispatches over the declared args (`abi_section`) skip those.
    let unsupported = unsupported_among(m, &used);
    if m.args.is_some() && !unsupported.is_empty() {
        h.push_str("#include <type_traits>  // the guard of unsupported combinations\n\n");
    }
    h.push_str(&abi_section(m, &unsupported));
    h
}

/// The `unsupported` declarations of `m` that hold some combination of the `used` values (axis
/// -> value indices), each as the value indices it names among them per axis (None: every one).
fn unsupported_among(m: &Module, used: &[Vec<usize>]) -> Vec<Vec<Option<Vec<usize>>>> {
    m.unsupported
        .iter()
        .map(|u| {
            let named = u.selection(&m.axes);
            m.axes
                .iter()
                .enumerate()
                .zip(used)
                .map(|((ai, axis), values)| {
                    named.iter().any(|(a, _)| a.name == axis.name).then(|| {
                        values
                            .iter()
                            .copied()
                            .filter(|&vi| u.allows(ai, vi))
                            .collect()
                    })
                })
                .collect::<Vec<Option<Vec<usize>>>>()
        })
        .filter(|axes| {
            axes.iter()
                .all(|v| v.as_ref().is_none_or(|v| !v.is_empty()))
        })
        .collect()
}

/// `body` (one statement) run only for combinations no `unsupported` declaration holds, the
/// others counted as a dispatch miss; `name(i)` is the name axis `i` is bound to. The body is
/// instantiated inside a generic lambda, whose discarded branch is never instantiated: an
/// unsupported combination's templates (which may `static_assert` against it) stay unused.
fn guarded(
    m: &Module,
    unsupported: &[Vec<Option<Vec<usize>>>],
    name: impl Fn(usize) -> String,
    body: &str,
) -> String {
    if unsupported.is_empty() {
        return body.to_string();
    }
    let holds: Vec<String> = unsupported
        .iter()
        .map(|axes| {
            let terms: Vec<String> = axes
                .iter()
                .enumerate()
                .filter_map(|(ai, values)| {
                    let axis = &m.axes[ai];
                    let eq: Vec<String> = values
                        .as_ref()?
                        .iter()
                        .map(|&vi| match (&axis.kind, &axis.values[vi]) {
                            (AxisKind::Dtype, Value::Name(d)) => {
                                format!("std::is_same_v<{}, {}>", name(ai), cuda_type(d))
                            }
                            (AxisKind::Variant, Value::Name(n)) => {
                                format!("std::is_same_v<{}, FlashgenVariant_{n}>", name(ai))
                            }
                            (AxisKind::Bool, Value::Bool(b)) => format!("{} == {b}", name(ai)),
                            _ => format!("{} == {}", name(ai), axis.code(vi)),
                        })
                        .collect();
                    Some(format!("({})", eq.join(" || ")))
                })
                .collect();
            format!("({})", terms.join(" && "))
        })
        .collect();
    let statement = body.trim_end_matches(';');
    format!(
        "[&](auto flashgen_serves) {{ if constexpr (decltype(flashgen_serves)::value) {{ {statement}; }} \
         else {{ ++flashgen_dispatch_misses(); }} }}(std::bool_constant<!({})>{{}}){}",
        holds.join(" || "),
        &body[statement.len()..]
    )
}

/// Banner, CUDA type headers, the configured `includes`, then each variant's header.
fn prologue(matrix: &Matrix, regenerate: &str, m: &Module, variants: &[&Variant]) -> String {
    let mut h = String::new();
    writeln!(
        h,
        "// @generated by flashgen {}: do not edit.",
        env!("CARGO_PKG_VERSION")
    )
    .unwrap();
    writeln!(h, "// Regenerate with: {regenerate}").unwrap();
    h.push_str("#pragma once\n#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n");
    if uses_fp8(m) {
        h.push_str("#include <cuda_fp8.h>\n");
    }
    for inc in &matrix.includes {
        writeln!(h, "#include <{inc}>").unwrap();
    }
    for v in variants {
        writeln!(h, "#include <{}>", v.include_name()).unwrap();
    }
    writeln!(h, "\n#define FLASHGEN_MODULE \"{}\"", m.name).unwrap();
    h.push_str(MISS_COUNTER);
    h.push('\n');
    h
}

/// A module without a variant axis still gets `ADDITIONAL_PARAMS_DECL`, empty: its kernels share
/// flashgen/params.cuh, which needs the generated header first but no variant.
fn no_variant_params(m: &Module) -> String {
    if m.axes.iter().any(|a| a.kind == AxisKind::Variant) {
        String::new()
    } else {
        "// no variant axis: no additional parameters\n#define ADDITIONAL_PARAMS_DECL\n\n".into()
    }
}

fn uses_fp8(m: &Module) -> bool {
    m.axes.iter().any(|a| {
        a.kind == AxisKind::Dtype && a.values.iter().any(|v| v.to_string().starts_with("fp8"))
    })
}

fn kind_name(kind: AxisKind) -> &'static str {
    match kind {
        AxisKind::Dtype => "dtype",
        AxisKind::Int => "int",
        AxisKind::Bool => "bool",
        AxisKind::Enum => "enum",
        AxisKind::Variant => "variant",
        AxisKind::Backend => "backend",
    }
}

/// For a `backend` axis, `#define FLASHGEN_BACKEND_<value> 1` for each value this header's
/// binary holds (`held`, value indices) and `0` for the others, so a `.cu` can include an
/// implementation's headers only where it is compiled (`#if FLASHGEN_BACKEND_sm90`): an
/// instance limited to 9.0a is the only one whose compile sees Hopper code.
fn backend_defines(axis: &Axis, held: &[usize]) -> String {
    if axis.kind != AxisKind::Backend {
        return String::new();
    }
    (0..axis.values.len())
        .map(|i| {
            format!(
                "#define FLASHGEN_BACKEND_{} {}\n",
                axis.values[i],
                u8::from(held.contains(&i))
            )
        })
        .collect()
}

/// `#define FLASHGEN_CODE_<axis>_<value> <code>` for name-valued axes, so C code can spell codes.
fn code_defines(axis: &Axis) -> String {
    match axis.kind {
        AxisKind::Dtype | AxisKind::Enum | AxisKind::Variant | AxisKind::Backend => {
            (0..axis.values.len())
                .map(|i| {
                    format!(
                        "#define FLASHGEN_CODE_{}_{} {}\n",
                        axis.name,
                        axis.values[i],
                        axis.code(i)
                    )
                })
                .collect()
        }
        _ => String::new(),
    }
}

/// The declaration that binds `NAME` to value `index` inside a dispatch case. The constants are
/// `[[maybe_unused]]`: a body that dispatches over every axis (`FLASHGEN_DISPATCH_ARGS`) need not
/// use each one (a workspace size does not depend on the mask), and nvcc would warn (#177).
fn binding(axis: &Axis, index: usize) -> String {
    match (&axis.kind, &axis.values[index]) {
        (AxisKind::Int, Value::Int(v)) => format!("[[maybe_unused]] constexpr int NAME = {v};"),
        (AxisKind::Bool, Value::Bool(v)) => {
            format!("[[maybe_unused]] constexpr bool NAME = {v};")
        }
        (AxisKind::Enum | AxisKind::Backend, _) => {
            format!(
                "[[maybe_unused]] constexpr int NAME = {};",
                axis.code(index)
            )
        }
        (AxisKind::Dtype, Value::Name(d)) => format!("using NAME = {};", cuda_type(d)),
        (AxisKind::Variant, Value::Name(n)) => format!("using NAME = FlashgenVariant_{n};"),
        _ => unreachable!("values are validated against their axis kind"),
    }
}

fn variant_tag(name: &str, struct_name: &str) -> String {
    format!(
        "struct FlashgenVariant_{name} {{\n  template <typename Params> using type = {struct_name}<Params>;\n  static constexpr const char* name = \"{name}\";\n}};\n\n"
    )
}

fn params_decl(params: &[ParamDecl]) -> String {
    params
        .iter()
        .map(|p| format!("{} {};", p.c_type, p.name))
        .collect::<Vec<_>>()
        .join(" ")
}

fn cuda_type(dtype: &str) -> &'static str {
    DTYPES
        .iter()
        .find(|(d, _)| *d == dtype)
        .map(|(_, c)| *c)
        .expect("validated dtype")
}

/// The name of a module's arguments struct: `single_decode` -> `FlashgenSingleDecodeArgs`.
pub fn args_struct_name(module: &str) -> String {
    let camel: String = module
        .split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    format!("Flashgen{camel}Args")
}

/// The module's arguments struct in plain C, from its `args` declaration (`generate` also writes
/// it alone as `flashgen_args.h`, which C tools and the layout test compile).
pub fn args_header(m: &Module) -> Option<String> {
    let args = m.args.as_ref()?;
    let name = args_struct_name(&m.name);
    let mut h = String::new();
    writeln!(
        h,
        "/* @generated by flashgen {}: the arguments of flashgen_{} (variants.json modules.{}.args). */",
        env!("CARGO_PKG_VERSION"),
        m.name,
        m.name
    )
    .unwrap();
    writeln!(
        h,
        "#ifndef FLASHGEN_ARGS_{0}\n#define FLASHGEN_ARGS_{0}\n#include <stdint.h>",
        m.name
    )
    .unwrap();
    writeln!(h, "typedef struct {name} {{").unwrap();
    writeln!(h, "  /* per call: 8 bytes each, one block */").unwrap();
    let field = |h: &mut String, f: &crate::config::ArgDecl| {
        let doc = f
            .doc
            .as_deref()
            .map(|d| format!(" /* {} */", d.replace("*/", "* /")))
            .unwrap_or_default();
        writeln!(h, "  {} {};{doc}", f.c_type, f.name).unwrap();
    };
    for f in &args.call {
        field(&mut h, f);
    }
    writeln!(h, "  /* per shape */").unwrap();
    for f in &args.shape {
        field(&mut h, f);
    }
    writeln!(h, "}} {name};\n#endif").unwrap();
    Some(h)
}

/// The module's C ABI in the generated header: the arguments struct, `FLASHGEN_ARGS` naming it,
/// and `FLASHGEN_DEFINE_QUERY_ENTRY_POINT()`, which defines `flashgen_<module>_query`: it
/// dispatches over the codes (axis order) and writes `axis=value ...` as the instantiation it
/// reached sees them. The `.cu` invokes the macro once, after including flashgen/status.cuh.
/// `unsupported`: the declarations the dispatch may reach (`unsupported_among`), which it skips.
fn abi_section(m: &Module, unsupported: &[Vec<Option<Vec<usize>>>]) -> String {
    let Some(args) = args_header(m) else {
        return String::new();
    };
    let mut h = String::from("// The module's C ABI, declared in variants.json.\n");
    h.push_str(&args);
    writeln!(h, "#define FLASHGEN_ARGS {}\n", args_struct_name(&m.name)).unwrap();
    let n = m.axes.len();
    let names: Vec<&str> = m.axes.iter().map(|a| a.name.as_str()).collect();
    writeln!(h, "#define FLASHGEN_DEFINE_QUERY_ENTRY_POINT() \\").unwrap();
    writeln!(
        h,
        "  extern \"C\" FLASHGEN_API int flashgen_{}_query(const int64_t* codes, int64_t ncodes, char* buf, int64_t buflen) {{ \\",
        m.name
    )
    .unwrap();
    writeln!(
        h,
        "    if (codes == nullptr || ncodes != {n}) return ::flashgen::fail(FLASHGEN_INVALID_ARGUMENT, \"{}_query: expected {n} codes ({}), got %lld\", static_cast<long long>(ncodes)); \\",
        m.name,
        names.join(", ")
    )
    .unwrap();
    for a in m
        .axes
        .iter()
        .filter(|a| matches!(a.kind, AxisKind::Enum | AxisKind::Backend))
    {
        let values: Vec<String> = a.values.iter().map(|v| format!("\"{v}\"")).collect();
        writeln!(
            h,
            "    static const char* const flashgen_names_{}[] = {{{}}}; \\",
            a.name,
            values.join(", ")
        )
        .unwrap();
    }
    writeln!(h, "    int status = -1; \\").unwrap();
    let mut fmt = Vec::new();
    let mut vals = Vec::new();
    for (i, a) in m.axes.iter().enumerate() {
        let (f, v) = match a.kind {
            AxisKind::Dtype => ("%s", format!("::flashgen::dtype_name<A{i}>()")),
            AxisKind::Int => ("%d", format!("static_cast<int>(A{i})")),
            AxisKind::Bool => ("%s", format!("A{i} ? \"true\" : \"false\"")),
            AxisKind::Enum | AxisKind::Backend => {
                ("%s", format!("flashgen_names_{}[A{i}]", a.name))
            }
            AxisKind::Variant => ("%s", format!("A{i}::name")),
        };
        fmt.push(format!("{}={f}", a.name));
        vals.push(v);
    }
    let mut body = guarded(
        m,
        unsupported,
        |i| format!("A{i}"),
        &format!(
            "char text[512]; std::snprintf(text, sizeof(text), \"{}\", {}); status = ::flashgen::write_query(buf, buflen, text);",
            fmt.join(" "),
            vals.join(", ")
        ),
    );
    for (i, a) in m.axes.iter().enumerate().rev() {
        body = format!("DISPATCH_{}(codes[{i}], A{i}, {{ {body} }});", a.name);
    }
    writeln!(h, "    {body} \\").unwrap();
    writeln!(
        h,
        "    if (status < 0) return ::flashgen::fail(FLASHGEN_NO_INSTANCE, \"{}_query: this binary holds no instance for these codes\"); \\",
        m.name
    )
    .unwrap();
    writeln!(h, "    return status; \\\n  }}\n").unwrap();
    h.push_str(&dispatch_args(m, unsupported));
    h
}

/// `FLASHGEN_DISPATCH_ARGS(a, BODY)`: dispatches over every axis with the runtime values the
/// arguments struct `a` carries (`<axis>_code`, or an int axis's own field), binding each axis's
/// compile-time value as `FG_<axis>` in BODY; a bool expression, true when this binary holds the
/// combination. `FLASHGEN_FAIL_NO_INSTANCE(a)` returns the status with a message naming the
/// values asked for. Entry points thus need no hand-written dispatch nest per module.
fn dispatch_args(m: &Module, unsupported: &[Vec<Option<Vec<usize>>>]) -> String {
    let mut body = guarded(
        m,
        unsupported,
        |i| format!("FG_{}", m.axes[i].name),
        "__VA_ARGS__",
    );
    for a in m.axes.iter().rev() {
        body = format!(
            "DISPATCH_{}((a).{}, FG_{}, {{ {body}; }})",
            a.name,
            crate::matrix::code_field(a),
            a.name
        );
    }
    let what: Vec<String> = m
        .axes
        .iter()
        .map(|a| format!("{} %lld", crate::matrix::code_field(a)))
        .collect();
    let vals: Vec<String> = m
        .axes
        .iter()
        .map(|a| {
            format!(
                "static_cast<long long>((a).{})",
                crate::matrix::code_field(a)
            )
        })
        .collect();
    format!(
        "#define FLASHGEN_DISPATCH_ARGS(a, ...) ({body})\n\n#define FLASHGEN_FAIL_NO_INSTANCE(a) \\\n  ::flashgen::fail(FLASHGEN_NO_INSTANCE, \"{}: this binary holds no instance for {}\", {})\n\n",
        m.name,
        what.join(", "),
        vals.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Toy;

    fn find<'m>(m: &'m Matrix, uri: &str) -> &'m Instance {
        m.instances.iter().find(|i| i.uri == uri).unwrap()
    }

    #[test]
    fn an_instance_header_binds_each_axis_to_its_one_value() {
        let toy = Toy::new();
        let m = toy.matrix();
        let uri = "toy_dtype_bf16_width_64_fast_true_mode_max_variant_scaled";
        let h = instance_header(&m, find(&m, uri));
        for line in [
            "// Regenerate with: flashgen generate --out <DIR> --module toy --where dtype=bf16 \
             --where width=64 --where fast=true --where mode=max --where variant=scaled",
            "#pragma once",
            "#include <toy/variants/scaled.cuh>",
            "#define FLASHGEN_MODULE \"toy\"",
            &format!("#define FLASHGEN_INSTANCE_URI \"{uri}\""),
            "#define FLASHGEN_DISPATCHING 0",
            "struct FlashgenVariant_scaled {",
            "  template <typename Params> using type = Scaled<Params>;",
            // dtype: the declared c_name, the CUDA type, code = position.
            "#define FLASHGEN_CODE_dtype_bf16 1",
            "using DType = __nv_bfloat16;",
            "    if ((value) != 1) { ++flashgen_dispatch_misses(); return false; } \\",
            "    using NAME = __nv_bfloat16; \\",
            // int: the value itself; bool: 0/1; enum: its position.
            "constexpr int WIDTH = 64;",
            "    if ((value) != 64) { ++flashgen_dispatch_misses(); return false; } \\",
            "constexpr bool FAST = true;",
            "#define FLASHGEN_CODE_mode_max 1",
            "constexpr int MODE = 1;",
            "#define ATTENTION_VARIANT Scaled",
            "#define ADDITIONAL_PARAMS_DECL float scale;",
            "    using NAME = FlashgenVariant_scaled; \\",
        ] {
            assert!(h.lines().any(|l| l == line), "no line {line:?} in:\n{h}");
        }
        // Only the instance's own variant header, and nothing of where the tree lies.
        assert!(!h.contains("plain.cuh"), "{h}");
        assert!(!h.contains(&toy.dir.path().display().to_string()), "{h}");
    }

    #[test]
    fn headers_are_a_pure_function_of_the_matrix() {
        let (a, b) = (Toy::new(), Toy::new());
        let (ma, mb) = (a.matrix(), b.matrix());
        let headers = |m: &Matrix| -> Vec<String> {
            m.instances.iter().map(|i| instance_header(m, i)).collect()
        };
        let ha = headers(&ma);
        assert_eq!(ha, headers(&mb), "same matrix in another folder, same text");
        let distinct: std::collections::HashSet<&String> = ha.iter().collect();
        assert_eq!(distinct.len(), ma.instances.len(), "one text per instance");
        let plain = instance_header(
            &ma,
            find(
                &ma,
                "toy_dtype_f16_width_32_fast_false_mode_sum_variant_plain",
            ),
        );
        assert!(plain
            .lines()
            .any(|l| l == "#define ADDITIONAL_PARAMS_DECL "));
        assert!(plain.lines().any(|l| l == "using DType = half;"));
        assert!(plain.lines().any(|l| l == "constexpr bool FAST = false;"));
    }

    #[test]
    fn a_dispatch_header_switches_over_the_selected_values() {
        let m = Toy::new().matrix();
        let module = &m.modules[0];
        let selected: Vec<&Instance> = m
            .instances
            .iter()
            .filter(|i| i.uri.contains("_width_64_") || i.uri.contains("_width_128_"))
            .collect();
        let h = dispatch_header(&m, module, &selected, "flashgen generate --dispatch");
        for line in [
            "// Regenerate with: flashgen generate --dispatch",
            "#define FLASHGEN_DISPATCHING 1",
            "#include <toy/variants/plain.cuh>",
            "#include <toy/variants/scaled.cuh>",
            "struct FlashgenVariant_plain {",
            "struct FlashgenVariant_scaled {",
            // The union of the variants' parameters.
            "#define ADDITIONAL_PARAMS_DECL float scale;",
            "// axis width (int): 64, 128",
            "      case 64: { [[maybe_unused]] constexpr int NAME = 64; const unsigned \
             flashgen_misses_before = flashgen_dispatch_misses(); __VA_ARGS__ return \
             flashgen_dispatch_misses() == flashgen_misses_before; } \\",
            "      default: ++flashgen_dispatch_misses(); return false; \\",
        ] {
            assert!(h.lines().any(|l| l == line), "no line {line:?} in:\n{h}");
        }
        assert!(!h.contains("case 32:"), "{h}");
        assert!(!h.contains("FLASHGEN_INSTANCE_URI"), "{h}");
    }
}
