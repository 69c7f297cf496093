//! Ctrl-C: the first one asks the running command to stop at the next safe point (`run`
//! stops generating and prints what it has; `quantize` and `synth` remove their
//! temporaries); a second one exits at once with status 130.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

use crate::error::{Error, Result};

static REQUESTED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// The exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_CODE: u8 = 130;

/// Install the handler (once per process; later calls do nothing). Until it is installed,
/// Ctrl-C ends the process as usual.
pub fn install() -> Result<()> {
    let mut res = Ok(());
    INSTALL.call_once(|| {
        res = ctrlc::set_handler(|| {
            if REQUESTED.swap(true, Ordering::SeqCst) {
                std::process::exit(i32::from(EXIT_CODE));
            }
        })
        .map_err(|e| Error::Other(format!("cannot install the Ctrl-C handler: {e}")));
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
