//! What the commands print for a reader. A reader that stops reading (`cycles admin … |
//! head`) has what it wanted: the command ends quietly (`main`) instead of failing, as
//! `println!` would, with a panic.

use std::fmt;
use std::io::{ErrorKind, Write};

/// Prints a line on stdout, like `println!`, answering a failed write instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use say;

/// The reader of stdout went away.
#[derive(Debug)]
pub struct ReaderGone;

impl fmt::Display for ReaderGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for ReaderGone {}

pub fn line(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Err(ReaderGone.into()),
        written => Ok(written?),
    }
}
