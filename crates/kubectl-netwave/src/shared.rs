//! What every command shares: how the plugin ends, where its output goes, and the clock. The crate
//! root dispatches to the commands and the commands use this module, so imports flow one way
//! (`lib` → commands → `shared`, `output`, `cluster`).

use std::io::Write;

/// How the plugin ends (beyond errors, which exit 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Success,
    /// `status -w --until-done` saw the revision fail.
    RolloutFailed,
    /// `undo`/`abort` showed what they would change and stopped for want of `--yes`.
    NotConfirmed,
    Interrupted,
}

impl Exit {
    pub fn code(self) -> std::process::ExitCode {
        std::process::ExitCode::from(match self {
            Exit::Success => 0,
            Exit::RolloutFailed => 1,
            Exit::NotConfirmed => 2,
            Exit::Interrupted => 130,
        })
    }
}

/// Where output goes and how it is drawn.
pub struct Term<'a> {
    pub out: &'a mut (dyn Write + Send),
    /// A terminal: `status -w` redraws in place instead of printing each new frame below the last.
    pub tty: bool,
}

/// Now, in the core's milliseconds.
pub fn now() -> netwave_core::Timestamp {
    netwave_core::Timestamp(k8s_openapi::jiff::Timestamp::now().as_millisecond())
}
