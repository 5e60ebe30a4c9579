//! `flashgen describe`: the matrix as one JSON object, which the wheel ships for the loader.

use crate::arch::Arch;
use crate::c_ident;
use crate::config::AxisKind;
use crate::matrix::Matrix;
use crate::param_types;
use crate::records::{
    AxisRow, CapabilityRange, Describe, ModuleRow, UnsupportedRow, VariantRow, WheelData, LAYOUT,
};
use anyhow::Result;

pub fn describe(matrix: &Matrix) -> Describe {
    Describe {
        flashgen_version: env!("CARGO_PKG_VERSION").into(),
        abi: crate::records::abi(),
        wheel: WheelData {
            layout: LAYOUT,
            metadata: crate::records::package_metadata(),
            runtime_requirements: crate::cuda_packages::runtime_requirements(),
            tree: crate::records::tree_rules(),
        },
        capabilities: {
            let all: Vec<_> = super::choice::capabilities().collect();
            let (first, last) = (all[0], all[all.len() - 1]);
            CapabilityRange {
                min: [first.major, first.minor],
                max: [last.major, last.minor],
            }
        },
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
        reserved_params: crate::matrix::core_fields(matrix.modules.iter().map(|m| {
            let variants = m.axes.iter().any(|a| a.kind == AxisKind::Variant);
            (m.name.as_str(), m.args.as_ref(), variants)
        })),
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
                    args_struct: crate::codegen::args_struct_name(&m.name),
                    args: m.args.clone(),
                    axes,
                    arch_limit: m.arch_limit.as_deref().map(spelled),
                    backends: super::choice::table(m),
                    unsupported: m
                        .unsupported
                        .iter()
                        .map(|u| UnsupportedRow {
                            selection: u
                                .selection(&m.axes)
                                .into_iter()
                                .map(|(a, values)| {
                                    (a.name.clone(), values.iter().map(|v| v.to_json()).collect())
                                })
                                .collect(),
                            reason: u.reason.clone(),
                        })
                        .collect(),
                };
                (m.name.clone(), row)
            })
            .collect(),
        instances: Some(
            matrix
                .instances
                .iter()
                .map(|i| matrix.instance_row(i))
                .collect(),
        ),
    }
}

fn spelled(archs: &[Arch]) -> Vec<String> {
    archs.iter().map(ToString::to_string).collect()
}

pub fn run(matrix: &Matrix) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(&describe(matrix))?);
    Ok(())
}
