//! The `flashgen` command: parse arguments, run, print the error chain, set the exit code.

use clap::Parser;

fn main() {
    // Hidden mode: this binary re-executed to guard one nvcc process group (see compile.rs).
    let mut args = std::env::args_os().skip(1);
    if args
        .next()
        .is_some_and(|a| a == flashgen::compile::GUARD_ARG)
    {
        let args: Vec<_> = args.collect();
        // `-v`: announce the command on the build's stderr (see ui.rs) before running it.
        flashgen::ui::trace_to_inherited_fd(&args);
        flashgen::compile::guard_main(args);
    }
    let cli = flashgen::cli::Cli::parse();
    // Before any thread starts: this may change the environment the children inherit.
    flashgen::ui::set_verbose(cli.verbose);
    if let Err(err) = flashgen::commands::run(cli) {
        eprintln!("error: {err}");
        for cause in err.chain().skip(1) {
            eprintln!("\nCaused by:\n    {cause}");
        }
        std::process::exit(flashgen::error::exit_code(&err));
    }
}
