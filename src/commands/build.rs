//! `flashgen build`: compile the selected instances into `--out`.

use anyhow::{bail, Result};
use serde_json::json;

use crate::build::{default_jobs, BuildOptions, BuildReport, Builder, Failure, FailureKind};
use crate::cli::{BuildArgs, CompileArgs};
use crate::matrix::Matrix;
use crate::ui::Ui;

pub fn run(matrix: &Matrix, args: &BuildArgs) -> Result<()> {
    let ui = Ui::new(args.compile.quiet || args.json);
    super::check_out_dir(matrix, &args.out, "--out")?;
    crate::build::check_out_claimable(&args.out, "--out")?;
    let selected = args.compile.filter.select(matrix)?;
    let builder = super::builder(
        matrix,
        args.compile.arch.as_deref(),
        !args.compile.no_compress,
        args.compile.launcher.as_deref(),
        args.compile.manylinux.as_deref(),
    )?;
    let selected = super::buildable(&builder, &selected, &ui)?;
    let report = builder.build(
        &selected,
        &options(&args.compile, args.out.clone(), &ui)?,
        &ui,
    )?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary_json(&builder, &report, &args.out))?
        );
    }
    finish(&report, &ui, &args.out)
}

pub(crate) fn options(
    c: &CompileArgs,
    out_dir: std::path::PathBuf,
    ui: &Ui,
) -> Result<BuildOptions> {
    Ok(BuildOptions {
        out_dir,
        jobs: default_jobs(c.jobs, ui)?,
        keep_going: c.keep_going,
        use_stamp: true,
    })
}

pub(crate) fn summary_json(
    builder: &Builder,
    r: &BuildReport,
    out: &std::path::Path,
) -> serde_json::Value {
    let compiled = r.built.iter().filter(|b| !b.cached).count();
    json!({
        "built": compiled,
        "cached": r.built.len() - compiled,
        "failed": r.failures.iter().map(|f| json!({"uri": f.uri, "kind": f.kind.as_str(), "command": f.command, "status": f.status, "stderr": f.stderr})).collect::<Vec<_>>(),
        "not_started": r.not_started,
        "wall_s": r.wall.as_secs_f64(),
        "out": std::path::absolute(out).unwrap_or_else(|_| out.to_path_buf()),
        "jobs": r.jobs,
        "compile_s": r.built.iter().filter_map(|b| b.compile_time).map(|t| t.as_secs_f64()).sum::<f64>(),
        "toolchain": {"nvcc": builder.toolchain.nvcc, "nvcc_version": builder.toolchain.nvcc_version},
        "instances": r.built.iter().map(|b| builder.built_row(b, true)).collect::<Vec<_>>(),
    })
}

/// Prints failures in full and the one-line summary; an error when anything failed.
pub(crate) fn finish(r: &BuildReport, ui: &Ui, out: &std::path::Path) -> Result<()> {
    for f in &r.failures {
        print_failure(f);
    }
    let compiled = r.built.iter().filter(|b| !b.cached).count();
    ui.status(format!(
        "{} instances in {}: {compiled} compiled, {} cached, {} failed{} ({:.2}s, {} jobs)",
        r.built.len() + r.failures.len() + r.not_started.len(),
        out.display(),
        r.built.len() - compiled,
        r.failures.len(),
        if r.not_started.is_empty() {
            String::new()
        } else {
            format!(", {} not started", r.not_started.len())
        },
        r.wall.as_secs_f64(),
        r.jobs,
    ));
    if !r.failures.is_empty() {
        let uris: Vec<&str> = r.failures.iter().map(|f| f.uri.as_str()).collect();
        let hint = if r.not_started.is_empty() {
            ""
        } else {
            " (stopped early; --keep-going builds the rest)"
        };
        bail!(
            "{} instance(s) failed to build: {}{hint}",
            uris.len(),
            uris.join(", ")
        );
    }
    Ok(())
}

/// One failure in full: what failed, and the command that reproduces it.
pub(crate) fn print_failure(f: &Failure) {
    match f.kind {
        FailureKind::Compile => {
            eprintln!("error: nvcc failed for {} ({})", f.uri, f.status);
            eprintln!("command (reproduces this step alone):\n  {}", f.command);
            eprintln!("--- stderr ---");
            let text = f.stderr.trim_end();
            eprintln!(
                "{}",
                if text.is_empty() {
                    "<stderr is empty>"
                } else {
                    text
                }
            );
            eprintln!("--------------");
        }
        FailureKind::Store => {
            eprintln!(
                "error: {}: nvcc succeeded but the result could not be stored: {}",
                f.uri, f.status
            );
        }
        FailureKind::EntryPoint => {
            eprintln!("error: {}: {} (nothing was cached)", f.uri, f.status);
            eprintln!("command:\n  {}", f.command);
        }
        FailureKind::SourceChanged => {
            eprintln!("error: {}: {} (nothing was cached)", f.uri, f.status);
        }
    }
}
