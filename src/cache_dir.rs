//! Where wgmoe keeps what it measures and compiles between runs: `$XDG_CACHE_HOME/wgmoe`,
//! else `$HOME/.cache/wgmoe`, else (Windows) `%LOCALAPPDATA%\wgmoe`.

use std::path::PathBuf;

/// The cache directory (None when no variable names one).
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = var("XDG_CACHE_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".cache")))
        .or_else(|| var("LOCALAPPDATA"))?;
    Some(base.join("wgmoe"))
}
