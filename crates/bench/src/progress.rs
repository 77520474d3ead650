//! Progress while the suite runs: a bar per phase on a terminal, plain lines otherwise.
//! Progress goes to stderr; result lines go to stdout.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

#[derive(Clone)]
pub struct Progress {
    multi: Option<MultiProgress>,
}

impl Progress {
    pub fn new() -> Progress {
        let multi = std::io::stderr()
            .is_terminal()
            .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()));
        Progress { multi }
    }

    /// A result line on stdout (above the bars on a terminal).
    pub fn line(&self, text: &str) {
        match &self.multi {
            Some(m) => m.suspend(|| say(text)),
            None => say(text),
        }
    }

    /// A progress note on stderr.
    pub fn note(&self, text: &str) {
        match &self.multi {
            Some(m) => m.suspend(|| eprintln!("[bench] {text}")),
            None => eprintln!("[bench] {text}"),
        }
    }

    /// A phase of `len` steps.
    pub fn phase(&self, name: &str, len: u64) -> Phase {
        let bar = match &self.multi {
            Some(m) => {
                let bar = m.add(ProgressBar::new(len));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix:>28} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta}",
                    )
                    .expect("constant progress template is valid")
                    .progress_chars("=> "),
                );
                bar.set_prefix(name.to_string());
                bar
            }
            None => {
                eprintln!("[bench] {name} …");
                {
                    let bar = ProgressBar::hidden();
                    bar.set_length(len);
                    bar
                }
            }
        };
        Phase {
            bar,
            name: name.to_string(),
            tty: self.multi.is_some(),
            started: Instant::now(),
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// One phase's bar. Cloneable so concurrent clients can advance it.
#[derive(Clone)]
pub struct Phase {
    bar: ProgressBar,
    name: String,
    tty: bool,
    started: Instant,
}

impl Phase {
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
        if self.tty {
            return;
        }
        let (pos, len) = (self.bar.position(), self.bar.length().unwrap_or(0));
        if len >= 100_000 && pos.saturating_sub(n) * 10 / len != pos * 10 / len {
            eprintln!("[bench] {}: {pos}/{len}", self.name);
        }
    }

    pub fn finish(self) -> Duration {
        let took = self.started.elapsed();
        if self.tty {
            self.bar.finish_and_clear();
        } else {
            eprintln!("[bench] {} done in {:.1} s", self.name, took.as_secs_f64());
        }
        took
    }
}

/// A line on stdout, if anyone still reads it: a reader that stopped (`cycles bench … |
/// head`) does not stop the run, whose report goes to its files all the same.
pub fn say(text: &str) {
    let _ = writeln!(std::io::stdout(), "{text}");
}
