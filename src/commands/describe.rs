//! `flashgen describe`: the matrix as one JSON object, which the wheel ships for the loader.

use anyhow::Result;
use serde_json::{json, Map, Value};

use crate::matrix::Matrix;
use crate::param_types;

pub fn describe_json(matrix: &Matrix) -> Value {
    let variants: Map<String, Value> = matrix
        .variants
        .iter()
        .map(|v| {
            (
                v.name.clone(),
                json!({"struct": v.struct_name, "params": v.params, "user": v.user}),
            )
        })
        .collect();
    let modules: Map<String, Value> = matrix
        .modules
        .iter()
        .map(|m| {
            let axes: Vec<Value> = m
                .axes
                .iter()
                .map(|a| json!({"name": a.name, "type": a.kind, "values": a.values.iter().map(|v| v.to_json()).collect::<Vec<_>>()}))
                .collect();
            (m.name.clone(), json!({"source": m.source, "entry_points": m.entry_points, "axes": axes}))
        })
        .collect();
    let instances: Vec<Value> = matrix
        .instances
        .iter()
        .map(|i| Value::Object(matrix.instance_json(i)))
        .collect();
    json!({
        "flashgen_version": env!("CARGO_PKG_VERSION"),
        "archs": matrix.archs,
        "variants": variants,
        // The loader builds its ctypes structs and checks Variant params from this table only.
        "param_types": param_types::describe_json(),
        "modules": modules,
        "instances": instances,
    })
}

pub fn run(matrix: &Matrix) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(&describe_json(matrix))?);
    Ok(())
}
