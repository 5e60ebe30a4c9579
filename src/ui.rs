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
        eprintln!("warning: {}", msg.as_ref());
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
