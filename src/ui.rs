//! The one seam for terminal output: status lines, warnings and build progress.
//!
//! Data goes to stdout (tables, JSON); chatter goes to stderr. `--quiet`, `--json` and whether
//! stderr is a terminal are decided here and nowhere else.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Debug, Clone, Copy)]
pub struct Ui {
    pub quiet: bool,
    tty: bool,
}

impl Ui {
    pub fn new(quiet: bool) -> Ui {
        Ui {
            quiet,
            tty: std::io::stderr().is_terminal(),
        }
    }

    pub fn status(&self, msg: impl AsRef<str>) {
        if !self.quiet {
            eprintln!("{}", msg.as_ref());
        }
    }

    /// Something the user asked for was adjusted; shown even with --quiet or --json.
    pub fn note(&self, msg: impl AsRef<str>) {
        eprintln!("note: {}", msg.as_ref());
    }

    pub fn warn(&self, msg: impl AsRef<str>) {
        warning(msg);
    }

    /// Progress over `total` compiles: a bar on a terminal, plain lines elsewhere.
    pub fn progress(&self, total: usize) -> Progress {
        let bar = (self.tty && !self.quiet).then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}",
                )
                .expect("valid template"),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            ui: *self,
            bar,
            total,
            state: Mutex::new((0, Vec::new())),
        }
    }
}

pub struct Progress {
    ui: Ui,
    bar: Option<ProgressBar>,
    total: usize,
    /// Finished count and the URIs in flight.
    state: Mutex<(usize, Vec<String>)>,
}

impl Progress {
    pub fn start(&self, uri: &str) {
        let mut s = self.state.lock().unwrap();
        s.1.push(uri.to_string());
        if let Some(bar) = &self.bar {
            bar.set_message(s.1.join(", "));
        }
    }

    /// Records a finished compile; `outcome` is e.g. "built in 12.3 s" or "FAILED".
    pub fn finish(&self, uri: &str, outcome: &str) {
        let mut s = self.state.lock().unwrap();
        s.0 += 1;
        s.1.retain(|u| u != uri);
        match &self.bar {
            Some(bar) => {
                bar.inc(1);
                bar.set_message(s.1.join(", "));
                bar.println(format!("{outcome:>8} {uri}"));
            }
            None if !self.ui.quiet => {
                let width = self.total.to_string().len();
                eprintln!("[{:>width$}/{}] {outcome} {uri}", s.0, self.total);
            }
            None => {}
        }
    }

    pub fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

// ---- `--verbose`: the commands flashgen runs -------------------------------------------------
//
// The build starts every nvcc step itself (in the guard's process group, see `compile.rs`), so
// `-v` echoes each command on the build's stderr just before it starts, one line per
// `eprintln!` (which holds the stderr lock), so lines of parallel compiles do not interleave.

static VERBOSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns `-v` on or off for this process.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, std::sync::atomic::Ordering::Relaxed);
}

pub fn verbose() -> bool {
    VERBOSE.load(std::sync::atomic::Ordering::Relaxed)
}

/// What the user should know even without `-v`, from code that holds no [`Ui`] (the build goes
/// on): a `warning:` line on stderr.
pub fn warning(msg: impl AsRef<str>) {
    eprintln!("warning: {}", msg.as_ref());
}

/// `-v` in this process: why the build took a path it took (a line on stderr).
pub fn detail(msg: impl AsRef<str>) {
    if verbose() {
        eprintln!("note: {}", msg.as_ref());
    }
}

/// `-v` in this process: `+ <command>` on stderr.
pub fn trace(argv: &[String]) {
    if verbose() {
        eprintln!("+ {}", shell_words(argv));
    }
}

/// A command as one line a shell reads back as the same argv.
pub fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One word as a shell reads it back: as is when it holds only safe characters, else in single
/// quotes.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=/.,:+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_words;

    #[test]
    fn shell_words_quotes_only_what_needs_it() {
        let argv = [
            "nvcc",
            "-I/a b",
            "it's",
            "",
            "-gencode=arch=compute_90a,code=sm_90a",
        ];
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            shell_words(&argv),
            r"nvcc '-I/a b' 'it'\''s' '' -gencode=arch=compute_90a,code=sm_90a"
        );
    }
}
