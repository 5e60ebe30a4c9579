//! `flashgen describe`: the matrix as one JSON object, which the wheel ships for the loader.

use crate::arch::{self, Arch};
use crate::c_ident;
use crate::matrix::{Matrix, Module};
use crate::param_types;
use crate::records::{AxisRow, BackendRow, BackendTable, Describe, ModuleRow, VariantRow};
use anyhow::Result;

pub fn describe(matrix: &Matrix) -> Describe {
    Describe {
        flashgen_version: env!("CARGO_PKG_VERSION").into(),
        archs: matrix.archs.clone(),
        variants: matrix
            .variants
            .iter()
            .map(|v| {
                let row = VariantRow {
                    struct_name: v.struct_name.clone(),
                    params: v.params.clone(),
                    user: v.user,
                };
                (v.name.clone(), row)
            })
            .collect(),
        param_types: param_types::rows(),
        reserved_words: c_ident::KEYWORDS.to_vec(),
        reserved_params: crate::matrix::core_fields(
            matrix
                .modules
                .iter()
                .map(|m| (m.name.as_str(), m.args.as_ref())),
        ),
        max_uri_bytes: crate::matrix::MAX_URI_LEN,
        modules: matrix
            .modules
            .iter()
            .map(|m| {
                let axes = m
                    .axes
                    .iter()
                    .map(|a| AxisRow {
                        name: a.name.clone(),
                        kind: a.kind,
                        values: a.values.iter().map(|v| v.to_json()).collect(),
                    })
                    .collect();
                let row = ModuleRow {
                    source: m.source.clone(),
                    entry_points: m.entry_points.clone(),
                    args: m.args.clone(),
                    axes,
                    arch_limit: m.arch_limit.as_deref().map(spelled),
                    backends: backends(m),
                };
                (m.name.clone(), row)
            })
            .collect(),
        instances: matrix
            .instances
            .iter()
            .map(|i| matrix.instance_row(i))
            .collect(),
    }
}

fn spelled(archs: &[Arch]) -> Vec<String> {
    archs.iter().map(ToString::to_string).collect()
}

/// The module's implementations in order of preference, each with its arch limit and the
/// compute capabilities that limit runs on: the data the loader chooses a backend from.
fn backends(m: &Module) -> Option<BackendTable> {
    let (bi, axis) = m.backend_axis()?;
    let order = (0..axis.values.len())
        .map(|vi| {
            let mut choice = vec![0; m.axes.len()];
            choice[bi] = vi;
            let limit = m.arch_limit(&choice);
            BackendRow {
                name: axis.values[vi].to_string(),
                arch_limit: limit.as_deref().map(spelled),
                runs_on: limit.as_deref().map(arch::runs_on_all),
            }
        })
        .collect();
    Some(BackendTable {
        axis: axis.name.clone(),
        order,
    })
}

pub fn run(matrix: &Matrix) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(&describe(matrix))?);
    Ok(())
}
