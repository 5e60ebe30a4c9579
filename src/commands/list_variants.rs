//! `flashgen list-variants`: the instances as a table or JSON.

use anyhow::Result;

use crate::arch;
use crate::cli::ListArgs;
use crate::matrix::Matrix;
use crate::records::ListRow;

pub fn run(matrix: &Matrix, args: &ListArgs) -> Result<()> {
    let selected = args.filter.select(matrix)?;
    // The archs each instance is built for under the resolved list (none: a build skips it).
    // A list given but unreadable is refused, as `build` refuses it; with none given at all the
    // column says `?`.
    let archs: Vec<Option<Vec<arch::Arch>>> =
        match arch::resolve_given(args.arch.as_deref(), &matrix.archs)? {
            Some((list, _)) => selected
                .iter()
                .map(|i| Some(matrix.instance_archs(i, &list)))
                .collect(),
            None => vec![None; selected.len()],
        };
    // "cached" needs the toolchain for the keys; without one the column says so.
    let cached: Vec<Option<bool>> =
        match super::builder(matrix, args.arch.as_deref(), true, None, None) {
            Ok(b) => {
                let (buildable, _) = b.buildable(&selected);
                let hits: std::collections::HashMap<&str, bool> = b
                    .prepare(&buildable, None)?
                    .iter()
                    .map(|p| {
                        (
                            p.inst.uri.as_str(),
                            b.cache.lookup(&p.key, &p.inst.uri).hit().is_some(),
                        )
                    })
                    .collect();
                selected
                    .iter()
                    .map(|i| Some(hits.get(i.uri.as_str()).copied().unwrap_or(false)))
                    .collect()
            }
            Err(_) => vec![None; selected.len()],
        };
    if args.json {
        let rows: Vec<_> = selected
            .iter()
            .zip(&cached)
            .zip(&archs)
            .map(|((i, c), a)| ListRow {
                instance: matrix.instance_row(i),
                built: *c,
                archs: a
                    .as_ref()
                    .map(|a| a.iter().map(ToString::to_string).collect()),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let mut rows = vec![[
        "MODULE".to_string(),
        "URI".into(),
        "PARAMS".into(),
        "ARCHS".into(),
        "AOT".into(),
        "CACHED".into(),
    ]];
    for ((i, c), a) in selected.iter().zip(&cached).zip(&archs) {
        let params: Vec<String> = matrix
            .params(i)
            .map(|(a, v)| format!("{}={v}", a.name))
            .collect();
        rows.push([
            matrix.module(i).name.clone(),
            i.uri.clone(),
            params.join(" "),
            match a {
                Some(a) if a.is_empty() => "-".into(),
                Some(a) => arch::spell(a).replace(' ', ","),
                None => "?".into(),
            },
            if i.aot { "yes" } else { "-" }.into(),
            match c {
                Some(true) => "yes",
                Some(false) => "-",
                None => "?",
            }
            .into(),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
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
    let skipped = archs
        .iter()
        .filter(|a| a.as_ref().is_some_and(Vec::is_empty))
        .count();
    out.push_str(&format!(
        "{} instances, {aot} precompiled{}\n",
        selected.len(),
        if skipped > 0 {
            format!(", {skipped} built for none of these archs (ARCHS -)")
        } else {
            String::new()
        }
    ));
    print!("{out}");
    Ok(())
}
