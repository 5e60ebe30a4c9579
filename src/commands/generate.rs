//! `flashgen generate`: the generated headers, compile_commands.json and (`--ninja`)
//! build.ninja, without compiling.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::json;

use crate::arch;
use crate::build;
use crate::cli::GenerateArgs;
use crate::codegen;
use crate::compile::{self, CompileInputs, Launcher, NvccCommand};
use crate::fsutil;
use crate::matrix::Matrix;
use crate::toolchain::Toolchain;
use crate::ui::Ui;

pub fn run(matrix: &Matrix, args: &GenerateArgs) -> Result<()> {
    let ui = Ui::new(false);
    super::check_out_dir(matrix, &args.out, "--out")?;
    let selected = args.filter.select(matrix)?;
    let launcher = Launcher::resolve(args.launcher.as_deref())?;
    let builder = super::builder(matrix, args.arch.as_deref(), true, None, None);
    let (archs, _) = arch::resolve(args.arch.as_deref(), &matrix.archs)?;
    // Without a toolchain the commands still name `nvcc`, with every flag and folder they need.
    let toolchain = match &builder {
        Ok(b) => b.toolchain.clone(),
        Err(e) => {
            ui.warn(format!("compile_commands.json will say `nvcc`: {e}"));
            Toolchain::placeholder()
        }
    };
    // An instance's flags name only the archs its arch limit allows.
    let flags_for = |a: &[arch::Arch]| match &builder {
        Ok(b) => b.flags_for(a),
        Err(_) => compile::output_flags(
            &matrix.nvcc_flags,
            a,
            true,
            false,
            crate::toolchain::DEFAULT_CUDA_MAJOR,
        ),
    };
    let (selected, skipped): (Vec<_>, Vec<_>) = selected
        .into_iter()
        .partition(|i| !matrix.instance_archs(i, &archs).is_empty());
    if !skipped.is_empty() {
        ui.note(format!(
            "leaving out {} instances built for none of {}\n{}",
            skipped.len(),
            arch::spell(&archs),
            super::skipped_summary(matrix, &skipped)
        ));
    }
    let search_dirs = build::search_dirs(matrix);
    let out = std::path::absolute(&args.out)?;
    // The link steps reach nvcc through `out/.cuda` (see compile.rs), as flashgen's own do.
    if let Some(root) = &toolchain.root {
        std::fs::create_dir_all(&out)?;
        compile::link_toolchain(&out, root)?;
    }
    let mut commands = Vec::new();
    let mut ninja = Ninja::new(&launcher);
    // One instance (or dispatching module) `name`, whose header is in `out/name/`: the compile
    // and link steps flashgen runs, here with `out` as the working folder and the object and
    // `.so` beside the headers (`out/name.o`, `out/name.so`).
    let mut entry = |name: &str, source: PathBuf, flags: &[String]| {
        let object = PathBuf::from(format!("{name}.o"));
        let output = PathBuf::from(format!("{name}.so"));
        let header_dir = Path::new(name);
        let inputs = CompileInputs {
            cwd: &out,
            header_dir,
            search_dirs: &search_dirs,
            source: &source,
        };
        let compile = NvccCommand::compile(&toolchain, flags, &inputs, &object, &launcher);
        let link = NvccCommand::link(&toolchain, flags, &object, &output, &out);
        commands.push(json!({
            "directory": out,
            "arguments": compile.argv(),
            "file": source,
            "output": out.join(&object),
        }));
        ninja.edges(
            &compile,
            &link,
            &source,
            &header_dir.join(codegen::HEADER_NAME),
        );
    };
    if args.dispatch {
        for (mi, m) in matrix.modules.iter().enumerate() {
            // One binary is compiled for every arch of the build, so it holds only the instances
            // built for all of them; the others need a build (or generate) of their own archs.
            let (insts, apart): (Vec<_>, Vec<_>) = selected
                .iter()
                .copied()
                .filter(|i| i.module == mi)
                .partition(|i| matrix.instance_archs(i, &archs) == archs);
            if !apart.is_empty() {
                ui.note(format!(
                    "--dispatch: {} instances of {} are left out of its header: they are built \
                     for only some of {} (generate them with --arch set to their archs)\n{}",
                    apart.len(),
                    m.name,
                    arch::spell(&archs),
                    super::skipped_summary(matrix, &apart)
                ));
            }
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
            entry(
                &m.name,
                matrix.root.join("csrc").join(&m.source),
                &flags_for(&archs),
            );
        }
    } else {
        for inst in &selected {
            let header = codegen::instance_header(matrix, inst);
            let dir = out.join(&inst.uri);
            fsutil::write_if_changed(&dir.join(codegen::HEADER_NAME), header.as_bytes())?;
            write_args_header(&dir, matrix.module(inst))?;
            entry(
                &inst.uri,
                matrix.root.join("csrc").join(&matrix.module(inst).source),
                &flags_for(&matrix.instance_archs(inst, &archs)),
            );
        }
    }
    fsutil::write_if_changed(
        &out.join("compile_commands.json"),
        serde_json::to_string_pretty(&commands)?.as_bytes(),
    )?;
    if args.ninja {
        fsutil::write_if_changed(&out.join("build.ninja"), ninja.text.as_bytes())?;
    }
    let what = if args.dispatch {
        "dispatching headers for the selected modules"
    } else {
        "instance headers"
    };
    ui.status(format!(
        "generated {what} in {} ({} instances; unchanged files left as they were){}",
        out.display(),
        selected.len(),
        if args.ninja {
            format!(
                "; build with: ninja -C {}",
                crate::ui::shell_quote(&out.display().to_string())
            )
        } else {
            String::new()
        }
    ));
    Ok(())
}

/// `build.ninja`: flashgen's plan for any executor. Two rules whose command is the edge's `cmd`
/// (the exact nvcc command flashgen runs, so the bytes are flashgen's), the compile one behind
/// `$launcher`; ninja runs both in the file's folder, which is the compile's working folder.
/// The compile edge depends on the source and the generated header only: the project headers
/// are not tracked (run `flashgen generate` again, or clean, after editing them).
struct Ninja {
    text: String,
}

impl Ninja {
    fn new(launcher: &Launcher) -> Ninja {
        let text = format!(
            "# @generated by flashgen {}: do not edit. Build with: ninja -C <this folder>\n\
             ninja_required_version = 1.3\n\
             launcher = {}\n\n\
             rule compile\n  command = $launcher $cmd\n  description = nvcc -c $out\n\n\
             rule link\n  command = $cmd\n  description = nvcc -shared $out\n",
            env!("CARGO_PKG_VERSION"),
            ninja_value(&launcher.shell_line()),
        );
        Ninja { text }
    }

    fn edges(&mut self, compile: &NvccCommand, link: &NvccCommand, source: &Path, header: &Path) {
        let line = |c: &NvccCommand| {
            let words: Vec<String> = c.argv().iter().map(|w| crate::ui::shell_quote(w)).collect();
            ninja_value(&words.join(" "))
        };
        let object = ninja_path(compile.args.last().map_or("", String::as_str));
        let output = ninja_path(link.args.last().map_or("", String::as_str));
        self.text.push_str(&format!(
            "\nbuild {object}: compile {} | {}\n  cmd = {}\nbuild {output}: link {object}\n  cmd = {}\n",
            ninja_path(&source.display().to_string()),
            ninja_path(&header.display().to_string()),
            line(compile),
            line(link),
        ));
    }
}

/// A variable's value in a ninja file: only `$` is special there.
fn ninja_value(s: &str) -> String {
    s.replace('$', "$$")
}

/// A path in a ninja `build` line, where `$`, blanks and `:` are special.
fn ninja_path(s: &str) -> String {
    s.replace('$', "$$").replace(' ', "$ ").replace(':', "$:")
}

/// `flashgen_args.h`: the module's arguments struct alone, in plain C (the generated header holds
/// the same text), for C tools and FFI layout checks.
fn write_args_header(dir: &std::path::Path, m: &crate::matrix::Module) -> Result<()> {
    if let Some(text) = codegen::args_header(m) {
        fsutil::write_if_changed(&dir.join(codegen::ARGS_HEADER_NAME), text.as_bytes())?;
    }
    Ok(())
}
