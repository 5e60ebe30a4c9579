//! The matrix's expansion: every combination of every module's axis values that its
//! `unsupported` declarations leave, as an [`Instance`] with its canonical URI and whether it is
//! in the AOT subset.

use super::{Module, Value, Variant};
use crate::config::AxisKind;
use crate::instance::Instance;

/// Every instance of `modules`: modules in file order, the last axis varying fastest, without
/// the combinations a module declares `unsupported`. An instance is AOT when its module's `aot`
/// selection holds it and it uses no user variant.
pub(super) fn instances(modules: &[Module], variants: &[Variant]) -> Vec<Instance> {
    expand(modules, |m, choice| modules_aot(m, choice, variants))
}

/// Every supported combination of every module, modules in file order, the last axis varying
/// fastest.
fn expand(modules: &[Module], is_aot: impl Fn(&Module, &[usize]) -> bool) -> Vec<Instance> {
    let mut out = Vec::new();
    for (mi, m) in modules.iter().enumerate() {
        let mut choice = vec![0usize; m.axes.len()];
        loop {
            if m.unsupported(&choice).is_none() {
                out.push(Instance {
                    module: mi,
                    uri: uri(m, &choice),
                    aot: is_aot(m, &choice),
                    choice: choice.clone(),
                });
            }
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
