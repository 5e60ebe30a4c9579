//! Names that land in C++ source: the generated header pastes module, axis, variant, struct,
//! parameter and constant names into declarations and macro names, so each must be a plain
//! identifier that nvcc reads as the name it is meant to be.

/// C++17 keywords, C11 keywords and the C++ alternative tokens: one list, since the generated
/// header is C++ and the kernels' C ABI header is also read as C.
pub const KEYWORDS: &[&str] = &[
    // C++17
    "alignas",
    "alignof",
    "asm",
    "auto",
    "bool",
    "break",
    "case",
    "catch",
    "char",
    "char16_t",
    "char32_t",
    "class",
    "const",
    "constexpr",
    "const_cast",
    "continue",
    "decltype",
    "default",
    "delete",
    "do",
    "double",
    "dynamic_cast",
    "else",
    "enum",
    "explicit",
    "export",
    "extern",
    "false",
    "float",
    "for",
    "friend",
    "goto",
    "if",
    "inline",
    "int",
    "long",
    "mutable",
    "namespace",
    "new",
    "noexcept",
    "nullptr",
    "operator",
    "private",
    "protected",
    "public",
    "register",
    "reinterpret_cast",
    "return",
    "short",
    "signed",
    "sizeof",
    "static",
    "static_assert",
    "static_cast",
    "struct",
    "switch",
    "template",
    "this",
    "thread_local",
    "throw",
    "true",
    "try",
    "typedef",
    "typeid",
    "typename",
    "union",
    "unsigned",
    "using",
    "virtual",
    "void",
    "volatile",
    "wchar_t",
    "while",
    // C11 (those not above)
    "restrict",
    "_Alignas",
    "_Alignof",
    "_Atomic",
    "_Bool",
    "_Complex",
    "_Generic",
    "_Imaginary",
    "_Noreturn",
    "_Static_assert",
    "_Thread_local",
    // alternative tokens
    "and",
    "and_eq",
    "bitand",
    "bitor",
    "compl",
    "not",
    "not_eq",
    "or",
    "or_eq",
    "xor",
    "xor_eq",
];

/// Names and prefixes the generated header defines itself (codegen.rs): a user name equal to one
/// would be redefined or, for the macros, silently replaced by the preprocessor.
const GENERATED_NAMES: &[&str] = &["ATTENTION_VARIANT", "ADDITIONAL_PARAMS_DECL"];
/// (`DISPATCH_<axis>` is checked per module, against its axes: see `matrix`.)
const GENERATED_PREFIXES: &[&str] = &["FLASHGEN_", "flashgen_", "FlashgenVariant_"];

/// Letters, digits and `_`, not starting with a digit.
pub fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// Why `name` cannot be a C/C++ identifier of ours, if it cannot: not an identifier, a keyword,
/// or reserved to the implementation (leading `__` or `_` + uppercase, or `__` anywhere, which
/// C++ reserves too).
pub fn check(name: &str) -> Result<(), String> {
    if !is_identifier(name) {
        return Err(format!(
            "`{name}` is not a C identifier (letters, digits and _, not leading digit)"
        ));
    }
    if KEYWORDS.contains(&name) {
        return Err(format!("`{name}` is a C/C++ keyword"));
    }
    let b = name.as_bytes();
    if name.contains("__") || (b[0] == b'_' && b.get(1).is_some_and(u8::is_ascii_uppercase)) {
        return Err(format!(
            "`{name}` is reserved to the compiler (leading `_` + uppercase, or `__`)"
        ));
    }
    Ok(())
}

/// `check`, plus: not a name the generated header defines.
pub fn check_not_generated(name: &str) -> Result<(), String> {
    check(name)?;
    if GENERATED_NAMES.contains(&name) || GENERATED_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(format!(
            "`{name}` collides with the names the generated header defines ({}, {}*)",
            GENERATED_NAMES.join(", "),
            GENERATED_PREFIXES.join("*, ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass_and_the_rest_is_refused() {
        for ok in [
            "head_dim",
            "DTypeQ",
            "x",
            "_lower",
            "HEAD_DIM",
            "flashgen_single_decode",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "1x", "a-b", "int", "and", "_Bool", "restrict", "__x", "_X", "a__b", "é",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
        for bad in [
            "FLASHGEN_MODULE",
            "flashgen_dispatch_misses",
            "FlashgenVariant_x",
            "ATTENTION_VARIANT",
        ] {
            assert!(check_not_generated(bad).is_err(), "{bad}");
        }
    }
}
