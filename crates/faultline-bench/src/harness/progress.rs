//! A step counter on stderr: a bar on a terminal, a line per step otherwise
//! (so piped or logged runs still show where they are). Thin wrapper over
//! `indicatif`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Progress over a known number of steps.
pub struct Progress {
    bar: ProgressBar,
    started: bool,
}

impl Progress {
    /// A bar of `total_steps` steps titled `msg`; drawn only if stderr is a TTY.
    pub fn new(total_steps: u64, msg: &str) -> Progress {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        let bar = ProgressBar::with_draw_target(Some(total_steps), target);
        if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(msg.to_string());
        Progress {
            bar,
            started: false,
        }
    }

    /// Begin step `label`; the step begun before it counts as done.
    pub fn step(&mut self, label: &str) {
        if self.started {
            self.bar.inc(1);
        }
        self.started = true;
        self.bar.set_message(label.to_string());
        if self.bar.is_hidden() {
            let (pos, len) = (self.bar.position() + 1, self.bar.length().unwrap_or(0));
            faultline_cli_support::step(&self.bar.prefix(), &format!("[{pos}/{len}] {label}"));
        }
    }

    /// Run `f` with the bar cleared (for printing while it is shown).
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Complete every step and erase the bar.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
