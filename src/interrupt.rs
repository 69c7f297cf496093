//! Ctrl-C: the first one asks the running command to stop at the next safe point (`run`
//! stops generating and prints what it has; `quantize` and `synth` remove their
//! temporaries); a second one exits at once with status 130. `chat` clears the request
//! after stopping an answer (the session goes on), and while it waits at its prompt a
//! Ctrl-C ends it cleanly: a newline, status 0. SIGTERM and SIGHUP count as Ctrl-C (ctrlc's
//! `termination` feature: one handler for the three). `serve` installs its own first step
//! instead (`install_shutdown`: a graceful drain), with the same second one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use crate::error::{Error, Result};

static REQUESTED: AtomicBool = AtomicBool::new(false);
static AT_PROMPT: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// The exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_CODE: u8 = 130;

/// Install the handler (once per process; later calls do nothing). Until it is installed,
/// Ctrl-C ends the process as usual.
pub fn install() -> Result<()> {
    let mut res = Ok(());
    INSTALL.call_once(|| {
        res = ctrlc::set_handler(|| {
            if AT_PROMPT.load(Ordering::SeqCst) {
                // Nothing to stop: leave as the user asked, the shell prompt on a new line.
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(b"\n").and_then(|_| out.flush());
                std::process::exit(0);
            }
            if REQUESTED.swap(true, Ordering::SeqCst) {
                std::process::exit(i32::from(EXIT_CODE));
            }
        })
        .map_err(|e| Error::Other(format!("cannot install the Ctrl-C handler: {e}")));
    });
    res
}

/// For `serve`: the first Ctrl-C, SIGTERM or SIGHUP calls `first` (the server drains) and
/// sets nothing `requested` reads, so generation goes on; a second one exits at once with
/// status 130 (whichever signal it is: the handler cannot tell them apart). Installed
/// once per process, like `install` (a later call of either does nothing).
pub fn install_shutdown(first: impl Fn() + Send + 'static) -> Result<()> {
    let mut res = Ok(());
    INSTALL.call_once(|| {
        let seen = AtomicBool::new(false);
        res = ctrlc::set_handler(move || {
            if seen.swap(true, Ordering::SeqCst) {
                eprintln!("second signal: exiting at once");
                std::process::exit(i32::from(EXIT_CODE));
            }
            first();
        })
        .map_err(|e| Error::Other(format!("cannot install the signal handler: {e}")));
    });
    res
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// `Err(Error::Interrupted)` once Ctrl-C was pressed.
pub fn check() -> Result<()> {
    if requested() {
        Err(Error::Interrupted)
    } else {
        Ok(())
    }
}

/// Forget an earlier Ctrl-C (the command handled it and goes on).
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
}

/// While `true`, Ctrl-C exits at once with status 0 after a newline (the command waits
/// for input and has nothing to stop). A Ctrl-C that came just before counts too.
pub fn set_at_prompt(on: bool) {
    AT_PROMPT.store(on, Ordering::SeqCst);
    if on && REQUESTED.swap(false, Ordering::SeqCst) {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(b"\n").and_then(|_| out.flush());
        std::process::exit(0);
    }
}
