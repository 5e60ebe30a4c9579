//! The `flashgen` command: parse arguments, run, print the error chain, set the exit code.

use clap::Parser;

fn main() {
    let cli = flashgen::cli::Cli::parse();
    if let Err(err) = flashgen::commands::run(cli) {
        eprintln!("error: {err}");
        for cause in err.chain().skip(1) {
            eprintln!("\nCaused by:\n    {cause}");
        }
        std::process::exit(flashgen::error::exit_code(&err));
    }
}
