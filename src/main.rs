//! The `flashgen` command: parse arguments, run, print the error chain, set the exit code.

use clap::Parser;

fn main() {
    // Before anything is looked up or started: no program is found in the working folder.
    flashgen::drop_relative_search_paths();
    // Hidden mode: this binary re-executed as a build's nvcc guard (see compile.rs).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == flashgen::GUARD_ARG)
    {
        flashgen::guard_main();
    }
    let cli = flashgen::cli::Cli::parse();
    flashgen::set_verbose(cli.verbose);
    if let Err(err) = flashgen::commands::run(cli) {
        eprintln!("error: {err}");
        for cause in err.chain().skip(1) {
            eprintln!("\nCaused by:\n    {cause}");
        }
        std::process::exit(flashgen::error::exit_code(&err));
    }
}
