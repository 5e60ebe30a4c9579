//! `flashgen list-variants`: the instances as a table or JSON.

use anyhow::Result;

use crate::cli::ListArgs;
use crate::matrix::Matrix;
use crate::records::ListRow;

pub fn run(matrix: &Matrix, args: &ListArgs) -> Result<()> {
    let selected = args.filter.select(matrix)?;
    // "cached" needs the toolchain for the keys; without one the column says so.
    let cached: Vec<Option<bool>> =
        match super::builder(matrix, args.arch.as_deref(), true, None, None) {
            Ok(b) => b
                .prepare(&selected, None)?
                .iter()
                .map(|p| Some(b.cache.lookup(&p.key).hit().is_some()))
                .collect(),
            Err(_) => vec![None; selected.len()],
        };
    if args.json {
        let rows: Vec<_> = selected
            .iter()
            .zip(&cached)
            .map(|(i, c)| ListRow {
                instance: matrix.instance_row(i),
                built: *c,
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let mut rows = vec![[
        "MODULE".to_string(),
        "URI".into(),
        "PARAMS".into(),
        "AOT".into(),
        "CACHED".into(),
    ]];
    for (i, c) in selected.iter().zip(&cached) {
        let params: Vec<String> = matrix
            .params(i)
            .map(|(a, v)| format!("{}={v}", a.name))
            .collect();
        rows.push([
            matrix.module(i).name.clone(),
            i.uri.clone(),
            params.join(" "),
            if i.aot { "yes" } else { "-" }.into(),
            match c {
                Some(true) => "yes",
                Some(false) => "-",
                None => "?",
            }
            .into(),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            // Padded by hand: `{:<w$}` panics for widths above u16::MAX (a 1 MB module name).
            .map(|(cell, &w)| format!("{cell}{}", " ".repeat(w - cell.len())))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let aot = selected.iter().filter(|i| i.aot).count();
    out.push_str(&format!(
        "{} instances, {aot} precompiled\n",
        selected.len()
    ));
    print!("{out}");
    Ok(())
}
