//! `flashgen generate`: the generated headers and compile_commands.json, without compiling.

use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use crate::build::Prepared;
use crate::cli::GenerateArgs;
use crate::codegen;
use crate::fsutil;
use crate::matrix::Matrix;
use crate::ui::Ui;

pub fn run(matrix: &Matrix, args: &GenerateArgs) -> Result<()> {
    let ui = Ui::new(false);
    super::check_out_dir(matrix, &args.out, "--out")?;
    let selected = args.filter.select(matrix)?;
    let builder = super::builder(matrix, args.arch.as_deref(), true);
    if let Err(e) = &builder {
        ui.warn(format!("compile_commands.json will say `nvcc`: {e}"));
    }
    let out = std::path::absolute(&args.out)?;
    let mut commands = Vec::new();
    let mut entry = |argv: Vec<String>, source: PathBuf, output: PathBuf| {
        commands.push(json!({
            "directory": matrix.root,
            "arguments": argv,
            "file": source,
            "output": output,
        }));
    };
    if args.dispatch {
        for (mi, m) in matrix.modules.iter().enumerate() {
            let insts: Vec<_> = selected
                .iter()
                .copied()
                .filter(|i| i.module == mi)
                .collect();
            if insts.is_empty() {
                continue;
            }
            let mut regenerate = format!(
                "flashgen generate --dispatch --out <DIR> --module {}",
                m.name
            );
            for w in &args.filter.wheres {
                regenerate.push_str(&format!(" --where {w}"));
            }
            if args.filter.aot {
                regenerate.push_str(" --aot");
            }
            let header = codegen::dispatch_header(matrix, m, &insts, &regenerate);
            let dir = out.join(&m.name);
            fsutil::write_if_changed(&dir.join(codegen::HEADER_NAME), header.as_bytes())?;
            let source = matrix.root.join("csrc").join(&m.source);
            let output = out.join(format!("{}.so", m.name));
            if let Ok(b) = &builder {
                let mut include_dirs = vec![dir];
                include_dirs.extend(b.search_dirs.iter().cloned());
                let p = Prepared {
                    inst: insts[0],
                    header,
                    include_dirs,
                    source: source.clone(),
                    key: String::new(),
                };
                entry(b.command(&p, &output).argv(), source, output);
            }
        }
    } else {
        match &builder {
            Ok(b) => {
                for p in b.prepare(&selected, Some(&out))? {
                    let output = out.join(format!("{}.so", p.inst.uri));
                    entry(b.command(&p, &output).argv(), p.source.clone(), output);
                }
            }
            Err(_) => {
                for inst in &selected {
                    let header = codegen::instance_header(matrix, inst);
                    fsutil::write_if_changed(
                        &out.join(&inst.uri).join(codegen::HEADER_NAME),
                        header.as_bytes(),
                    )?;
                }
            }
        }
    }
    fsutil::write_if_changed(
        &out.join("compile_commands.json"),
        serde_json::to_string_pretty(&commands)?.as_bytes(),
    )?;
    let what = if args.dispatch {
        "dispatching headers for the selected modules"
    } else {
        "instance headers"
    };
    ui.status(format!(
        "generated {what} in {} ({} instances; unchanged files left as they were)",
        out.display(),
        selected.len()
    ));
    Ok(())
}
