//! One point of the matrix: a module with one value per axis, and its canonical URI.
//!
//! The URI (`single_decode_dtype_bf16_head_dim_128_variant_soft_cap`) names the instance
//! everywhere: the generated folder, the `.so`, the manifest, the loader's cache.

use crate::matrix::{Module, Value};

#[derive(Debug, Clone)]
pub struct Instance {
    /// Index into `Matrix::modules`.
    pub module: usize,
    /// One value index per axis of the module, in axis order.
    pub choice: Vec<usize>,
    pub uri: String,
    /// In the precompiled (AOT) subset.
    pub aot: bool,
}

/// Every combination of every module, modules in file order, the last axis varying fastest.
pub fn expand(modules: &[Module], is_aot: impl Fn(&Module, &[usize]) -> bool) -> Vec<Instance> {
    let mut out = Vec::new();
    for (mi, m) in modules.iter().enumerate() {
        let mut choice = vec![0usize; m.axes.len()];
        loop {
            out.push(Instance {
                module: mi,
                uri: uri(m, &choice),
                aot: is_aot(m, &choice),
                choice: choice.clone(),
            });
            // Odometer step: bump the last axis, carrying leftwards.
            let mut axis = m.axes.len();
            loop {
                if axis == 0 {
                    break;
                }
                axis -= 1;
                choice[axis] += 1;
                if choice[axis] < m.axes[axis].values.len() {
                    break;
                }
                choice[axis] = 0;
            }
            if choice.iter().all(|&c| c == 0) {
                break;
            }
        }
    }
    out
}

/// `<module>_<axis>_<value>...`: readable, and safe as a file name and a C string.
pub fn uri(m: &Module, choice: &[usize]) -> String {
    let mut s = m.name.clone();
    for (axis, &i) in m.axes.iter().zip(choice) {
        s.push('_');
        s.push_str(&axis.name);
        s.push('_');
        match &axis.values[i] {
            Value::Int(v) if *v < 0 => s.push_str(&format!("neg{}", v.unsigned_abs())),
            v => s.push_str(&v.to_string()),
        }
    }
    s
}
