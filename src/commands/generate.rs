//! `flashgen generate`: the generated headers and compile_commands.json, without compiling.

use std::path::PathBuf;

use anyhow::Result;
use serde_json::json;

use crate::arch;
use crate::build;
use crate::cli::GenerateArgs;
use crate::codegen;
use crate::compile::{self, NvccCommand};
use crate::fsutil;
use crate::matrix::Matrix;
use crate::toolchain::Toolchain;
use crate::ui::Ui;

pub fn run(matrix: &Matrix, args: &GenerateArgs) -> Result<()> {
    let ui = Ui::new(false);
    super::check_out_dir(matrix, &args.out, "--out")?;
    let selected = args.filter.select(matrix)?;
    let builder = super::builder(matrix, args.arch.as_deref(), true);
    // Without a toolchain the commands still name `nvcc`, with every flag and folder they need.
    let (toolchain, flags) = match &builder {
        Ok(b) => (b.toolchain.clone(), b.flags.clone()),
        Err(e) => {
            ui.warn(format!("compile_commands.json will say `nvcc`: {e}"));
            let (archs, _) = arch::resolve(args.arch.as_deref(), &matrix.archs)?;
            (
                Toolchain::placeholder(),
                compile::output_flags(&matrix.nvcc_flags, &archs, true),
            )
        }
    };
    let search_dirs = build::search_dirs(matrix);
    let out = std::path::absolute(&args.out)?;
    let mut commands = Vec::new();
    // One entry: the header's folder first on the include path, then the project's.
    let mut entry = |header_dir: PathBuf, source: PathBuf, output: PathBuf| {
        let mut include_dirs = vec![header_dir];
        include_dirs.extend(search_dirs.iter().cloned());
        let argv = NvccCommand::new(&toolchain, &flags, &include_dirs, &source, &output).argv();
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
            write_args_header(&dir, m)?;
            let source = matrix.root.join("csrc").join(&m.source);
            entry(dir, source, out.join(format!("{}.so", m.name)));
        }
    } else {
        for inst in &selected {
            let header = codegen::instance_header(matrix, inst);
            let dir = out.join(&inst.uri);
            fsutil::write_if_changed(&dir.join(codegen::HEADER_NAME), header.as_bytes())?;
            write_args_header(&dir, matrix.module(inst))?;
            let source = matrix.root.join("csrc").join(&matrix.module(inst).source);
            entry(dir, source, out.join(format!("{}.so", inst.uri)));
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

/// `flashgen_args.h`: the module's arguments struct alone, in plain C (the generated header holds
/// the same text), for C tools and FFI layout checks.
fn write_args_header(dir: &std::path::Path, m: &crate::matrix::Module) -> Result<()> {
    if let Some(text) = codegen::args_header(m) {
        fsutil::write_if_changed(&dir.join(codegen::ARGS_HEADER_NAME), text.as_bytes())?;
    }
    Ok(())
}
