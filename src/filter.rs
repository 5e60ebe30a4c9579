//! Selecting instances: `--module`, `--where AXIS=GLOB` (repeatable, ANDed) and `--aot`.

use anyhow::Result;
use clap::Args;
use globset::{Glob, GlobMatcher};

use crate::error::{NoMatch, UsageError};
use crate::instance::Instance;
use crate::matrix::Matrix;

/// The filters shared by every command that acts on instances.
#[derive(Debug, Clone, Default, Args)]
pub struct FilterArgs {
    /// Only instances of this module (a name, or a shell-style glob such as `*_decode`).
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,
    /// Only instances whose AXIS value matches VALUE, a shell-style glob (`head_dim=*6*`).
    /// Repeat to AND several terms.
    #[arg(long = "where", value_name = "AXIS=VALUE")]
    pub wheres: Vec<String>,
    /// Only the precompiled (AOT) subset.
    #[arg(long)]
    pub aot: bool,
}

/// The longest `--where` glob accepted.
const MAX_PATTERN_LEN: usize = 256;

struct Term {
    axis: String,
    pattern: String,
    glob: GlobMatcher,
}

impl FilterArgs {
    /// The instances the filters select, in matrix order. A filter that names an unknown module
    /// or axis is a usage error; one that matches nothing is a [`NoMatch`].
    pub fn select<'m>(&self, matrix: &'m Matrix) -> Result<Vec<&'m Instance>> {
        // `--module` is a name or a shell-style glob (`--module '*_decode'`).
        let module: Option<Vec<usize>> = match &self.module {
            None => None,
            Some(name) => {
                let glob = Glob::new(name)
                    .map_err(|e| UsageError::new(format!("--module `{name}`: bad glob: {e}")))?
                    .compile_matcher();
                let hits: Vec<usize> = (0..matrix.modules.len())
                    .filter(|&i| glob.is_match(&matrix.modules[i].name))
                    .collect();
                if hits.is_empty() {
                    let names: Vec<_> = matrix.modules.iter().map(|m| m.name.as_str()).collect();
                    return Err(UsageError::new(format!(
                        "--module: no module `{name}` in {}",
                        matrix.config_path.display()
                    ))
                    .with_hint(format!("modules: {}", names.join(", ")))
                    .into());
                }
                Some(hits)
            }
        };
        let scoped = |i: usize| module.as_ref().is_none_or(|ms| ms.contains(&i));
        let in_scope = |i: &Instance| scoped(i.module);
        let terms = self.terms()?;
        for t in &terms {
            let known = matrix
                .modules
                .iter()
                .enumerate()
                .filter(|(i, _)| scoped(*i))
                .any(|(_, m)| m.axis(&t.axis).is_some());
            if !known {
                let mut axes: Vec<&str> = matrix
                    .modules
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| scoped(*i))
                    .flat_map(|(_, m)| m.axes.iter().map(|a| a.name.as_str()))
                    .collect();
                axes.sort();
                axes.dedup();
                return Err(
                    UsageError::new(format!("--where: unknown axis `{}`", t.axis))
                        .with_hint(format!("valid axes: {}", axes.join(", ")))
                        .into(),
                );
            }
        }
        let matches = |inst: &Instance, t: &Term| {
            let m = matrix.module(inst);
            m.axes
                .iter()
                .position(|a| a.name == t.axis)
                .is_some_and(|ai| {
                    t.glob
                        .is_match(m.axes[ai].values[inst.choice[ai]].to_string())
                })
        };
        let selected: Vec<&Instance> = matrix
            .instances
            .iter()
            .filter(|i| in_scope(i) && (!self.aot || i.aot) && terms.iter().all(|t| matches(i, t)))
            .collect();
        if selected.is_empty() && (self.aot || !terms.is_empty()) {
            return Err(self.explain_no_match(matrix, &scoped, &terms).into());
        }
        Ok(selected)
    }

    fn terms(&self) -> Result<Vec<Term>> {
        self.wheres
            .iter()
            .map(|w| {
                let (axis, pattern) = w.split_once('=').ok_or_else(|| {
                    UsageError::new(format!("--where `{w}`: expected AXIS=VALUE"))
                        .with_hint("for example --where head_dim=128 or --where 'dtype=*16'")
                })?;
                // globset panics when a pattern's regex outgrows its size limit (100k `*`);
                // no axis value comes near this length, so longer patterns cannot match anyway.
                if pattern.len() > MAX_PATTERN_LEN {
                    return Err(UsageError::new(format!(
                        "--where {axis}=...: the pattern is {} bytes long, more than {MAX_PATTERN_LEN}",
                        pattern.len()
                    ))
                    .with_hint("axis values are short: match them with a short glob")
                    .into());
                }
                let glob = Glob::new(pattern)
                    .map_err(|e| UsageError::new(format!("--where `{w}`: bad glob: {e}")))?
                    .compile_matcher();
                Ok(Term {
                    axis: axis.to_string(),
                    pattern: pattern.to_string(),
                    glob,
                })
            })
            .collect()
    }

    fn explain_no_match(
        &self,
        matrix: &Matrix,
        scoped: &dyn Fn(usize) -> bool,
        terms: &[Term],
    ) -> NoMatch {
        let mut lines = vec!["no instance matches the filters".to_string()];
        let unsupported = if self.aot {
            Vec::new()
        } else {
            unsupported_matches(matrix, scoped, terms)
        };
        if !unsupported.is_empty() {
            lines[0] = format!(
                "no instance matches the filters: they select combinations that {} declares \
                 unsupported",
                matrix.config_path.display()
            );
            lines.extend(unsupported);
        }
        for t in terms {
            let mut values: Vec<String> = Vec::new();
            for (i, m) in matrix.modules.iter().enumerate() {
                if !scoped(i) {
                    continue;
                }
                if let Some(a) = m.axis(&t.axis) {
                    for v in &a.values {
                        let s = v.to_string();
                        if !values.contains(&s) {
                            values.push(s);
                        }
                    }
                }
            }
            let hit = values.iter().any(|v| t.glob.is_match(v));
            let mark = if hit { "" } else { " (matches none)" };
            lines.push(format!(
                "  --where {}={}{mark}: values on axis `{}`: {}",
                t.axis,
                t.pattern,
                t.axis,
                values.join(", ")
            ));
        }
        if self.aot {
            lines.push("  --aot: only the precompiled subset was searched".into());
        }
        NoMatch(lines.join("\n"))
    }
}

/// The `unsupported` declarations of the modules in scope that hold a combination every term
/// matches: what the filters asked for, and why no instance serves it.
fn unsupported_matches(
    matrix: &Matrix,
    scoped: &dyn Fn(usize) -> bool,
    terms: &[Term],
) -> Vec<String> {
    let mut lines = Vec::new();
    for (mi, m) in matrix.modules.iter().enumerate() {
        if !scoped(mi) || terms.iter().any(|t| m.axis(&t.axis).is_none()) {
            continue;
        }
        for (di, u) in m.unsupported.iter().enumerate() {
            // The declaration is a product of per-axis value sets, so it holds a match when each
            // axis has one value it allows that every term on that axis matches.
            let held = m.axes.iter().enumerate().all(|(ai, axis)| {
                (0..axis.values.len()).any(|vi| {
                    let spelled = axis.values[vi].to_string();
                    u.allows(ai, vi)
                        && terms
                            .iter()
                            .filter(|t| t.axis == axis.name)
                            .all(|t| t.glob.is_match(&spelled))
                })
            });
            if held {
                lines.push(format!(
                    "  {} {} (modules.{}.unsupported[{di}]): {}",
                    m.name,
                    u.spell(&m.axes),
                    m.name,
                    u.reason
                ));
            }
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Toy;

    #[test]
    fn filters_select_in_matrix_order() {
        let m = Toy::new().matrix();
        let select = |module: Option<&str>, wheres: &[&str], aot: bool| {
            FilterArgs {
                module: module.map(str::to_string),
                wheres: wheres.iter().map(|s| s.to_string()).collect(),
                aot,
            }
            .select(&m)
        };
        assert_eq!(select(None, &[], false).unwrap().len(), 48);
        assert_eq!(select(Some("t*"), &[], false).unwrap().len(), 48);
        let bf16_wide = select(None, &["dtype=bf16", "width=*28"], false).unwrap();
        assert_eq!(bf16_wide.len(), 8);
        assert!(bf16_wide
            .iter()
            .all(|i| i.uri.starts_with("toy_dtype_bf16_width_128_")));
        let at = |i: &Instance| m.instances.iter().position(|x| x.uri == i.uri).unwrap();
        assert!(bf16_wide.windows(2).all(|w| at(w[0]) < at(w[1])));
        assert_eq!(select(None, &["mode=sum"], true).unwrap().len(), 4);
        let none = select(None, &["width=7"], false).unwrap_err();
        assert_eq!(crate::error::exit_code(&none), 1, "{none:#}");
        let unknown = select(None, &["depth=1"], false).unwrap_err();
        assert_eq!(crate::error::exit_code(&unknown), 2, "{unknown:#}");
        let module = select(Some("other"), &[], false).unwrap_err();
        assert_eq!(crate::error::exit_code(&module), 2, "{module:#}");
    }
}
