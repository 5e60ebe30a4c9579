//! The C types a variant parameter may have: the one table the generator, `describe` and the
//! Python loader share.
//!
//! A parameter becomes a struct member in `ADDITIONAL_PARAMS_DECL`, and the loader lays out the
//! same struct with `ctypes` and checks the tensors passed for pointer parameters. Both sides
//! must agree on every type, so the table lives here, in the binary, and `flashgen describe`
//! exports it whole (`param_types`); the loader keeps no copy of its own.

/// One base type: its C spelling, its Python `ctypes` name, and the tensor dtype a pointer to it
/// points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseType {
    pub c: &'static str,
    pub ctypes: &'static str,
    pub dtype: &'static str,
}

/// Every base type a parameter may use, by value or as `const T*` / `T*`.
pub const BASE_TYPES: &[BaseType] = &[
    base("float", "c_float", "f32"),
    base("double", "c_double", "f64"),
    base("bool", "c_bool", "bool"),
    base("int32_t", "c_int32", "i32"),
    base("int64_t", "c_int64", "i64"),
    base("uint32_t", "c_uint32", "u32"),
    base("uint64_t", "c_uint64", "u64"),
];

const fn base(c: &'static str, ctypes: &'static str, dtype: &'static str) -> BaseType {
    BaseType { c, ctypes, dtype }
}

/// How a parameter holds its base type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Indirection {
    Value,
    /// `const T*`: the kernel reads a tensor.
    ConstPointer,
    /// `T*`: the kernel may write a tensor.
    Pointer,
}

const INDIRECTIONS: [Indirection; 3] = [
    Indirection::Value,
    Indirection::ConstPointer,
    Indirection::Pointer,
];

/// A parameter type from the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamType {
    pub base: BaseType,
    pub indirection: Indirection,
}

impl ParamType {
    /// Reads a spelling such as `float`, `const float*` or `const  float *`. Spaces and tabs
    /// between the parts are free; anything else (a newline, `;`, `**`, `float const*`,
    /// `const float`) is refused, since the text is pasted into the generated header.
    pub fn parse(text: &str) -> Option<ParamType> {
        if !text
            .chars()
            .all(|c| c == ' ' || c == '\t' || c.is_ascii_alphanumeric() || c == '_' || c == '*')
        {
            return None;
        }
        let text = text.trim_matches([' ', '\t']);
        let (text, pointer) = match text.strip_suffix('*') {
            Some(t) => (t.trim_end_matches([' ', '\t']), true),
            None => (text, false),
        };
        let mut words = text.split([' ', '\t']).filter(|w| !w.is_empty());
        let (first, second, rest) = (words.next(), words.next(), words.next());
        let (konst, name) = match (first, second, rest) {
            (Some("const"), Some(name), None) => (true, name),
            (Some(name), None, None) => (false, name),
            _ => return None,
        };
        let indirection = match (konst, pointer) {
            (false, false) => Indirection::Value,
            (true, true) => Indirection::ConstPointer,
            (false, true) => Indirection::Pointer,
            // A const member would make the params struct unassignable.
            (true, false) => return None,
        };
        let base = *BASE_TYPES.iter().find(|b| b.c == name)?;
        Some(ParamType { base, indirection })
    }

    /// The normalized spelling: `float`, `const float*`, `float*`.
    pub fn spelling(&self) -> String {
        match self.indirection {
            Indirection::Value => self.base.c.to_string(),
            Indirection::ConstPointer => format!("const {}*", self.base.c),
            Indirection::Pointer => format!("{}*", self.base.c),
        }
    }

    /// The `ctypes` name of the struct member: a pointer is an address (`c_void_p`).
    pub fn ctypes(&self) -> &'static str {
        match self.indirection {
            Indirection::Value => self.base.ctypes,
            Indirection::ConstPointer | Indirection::Pointer => "c_void_p",
        }
    }
}

/// Every accepted type, in table order, each base by value, `const T*` and `T*`.
pub fn all() -> impl Iterator<Item = ParamType> {
    BASE_TYPES.iter().flat_map(|&base| {
        INDIRECTIONS
            .iter()
            .map(move |&indirection| ParamType { base, indirection })
    })
}

/// The accepted spellings, for error messages.
pub fn spellings_hint() -> String {
    let names: Vec<&str> = BASE_TYPES.iter().map(|b| b.c).collect();
    format!(
        "use one of {}, or `const T*` / `T*` of these",
        names.join(", ")
    )
}

/// The table as `flashgen describe` exports it: `[{"c": "float", "ctypes": "c_float", "dtype":
/// "f32"}, {"c": "const float*", "ctypes": "c_void_p", "dtype": "f32"}, ...]`, one entry per
/// accepted normalized spelling. For a pointer, `dtype` is what the tensor passed must hold.
/// The table as `describe --json` ships it to the loader (`param_types`).
pub fn rows() -> Vec<crate::records::ParamTypeRow> {
    all()
        .map(|t| crate::records::ParamTypeRow {
            c: t.spelling(),
            ctypes: t.ctypes(),
            dtype: t.base.dtype,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_normalize() {
        for (given, normal) in [
            ("float", "float"),
            (" float\t", "float"),
            ("const float*", "const float*"),
            ("const  float *", "const float*"),
            ("int64_t*", "int64_t*"),
            ("uint32_t  *", "uint32_t*"),
        ] {
            assert_eq!(
                ParamType::parse(given).unwrap().spelling(),
                normal,
                "{given:?}"
            );
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "float\n; evil",
            "float;",
            "const float",
            "float const*",
            "float**",
            "const const float*",
            "int",
            "void*",
            "constfloat*",
            "float\r",
            "flöat",
        ] {
            assert!(ParamType::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn every_spelling_reads_back() {
        let all: Vec<_> = all().collect();
        assert_eq!(all.len(), BASE_TYPES.len() * 3);
        for t in all {
            assert_eq!(ParamType::parse(&t.spelling()), Some(t));
        }
    }
}
