//! What the commands print for a reader. A reader that stops reading (`cycles admin … |
//! head`) has what it wanted: the rest is not printed, and the command goes on to its own
//! end and exit status (a `cycles verify` that found violations still fails), where
//! `println!` would panic.

use std::fmt;
use std::io::{ErrorKind, Write};

/// Prints a line on stdout, like `println!`, answering a failed write instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use say;

pub fn line(args: fmt::Arguments<'_>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        written => written,
    }
}
