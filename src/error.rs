//! One error type for the whole crate. Every variant names the file, tensor, field or
//! option at fault, so the CLI can print a single line that tells the user what to fix.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file exists but its content is not what it must be (bad JSON, corrupt header...).
    #[error("{path}: {msg}")]
    BadFile { path: PathBuf, msg: String },
    /// A config field is missing or has an invalid value.
    #[error("{path}: field `{field}`: {msg}")]
    ConfigField {
        path: PathBuf,
        field: String,
        msg: String,
    },
    #[error("tensor `{name}` not found in checkpoint {dir}")]
    MissingTensor { dir: PathBuf, name: String },
    #[error("tensor `{name}` in {path}: {msg}")]
    BadTensor {
        path: PathBuf,
        name: String,
        msg: String,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template refused a conversation (its `raise_exception`): `msg` says why in
    /// wgmoe's words where it can tell, `said` is the template's own text, `message` the
    /// index of the message at fault (when known), `template` where the template came from.
    #[error("{msg}")]
    ChatTemplate {
        message: Option<usize>,
        msg: String,
        said: String,
        template: String,
    },
    /// A command-line option (or its combination with the model) is invalid.
    #[error("option {option}: {msg}")]
    Option { option: String, msg: String },
    /// No usable GPU adapter, device creation failure, or a GPU-side error.
    #[error("gpu: {0}")]
    Gpu(String),
    /// The configuration can never fit the adapter's limits or the declared budget.
    #[error("does not fit: {0}")]
    DoesNotFit(String),
    #[error("{0}")]
    Other(String),
    /// Ctrl-C stopped the command.
    #[error("interrupted (Ctrl-C)")]
    Interrupted,
    /// stdout was closed by the reader (e.g. `| head`): not a failure of the command.
    #[error("stdout closed")]
    StdoutClosed,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    pub fn bad_file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::BadFile {
            path: path.into(),
            msg: msg.into(),
        }
    }
    pub fn field(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        msg: impl Into<String>,
    ) -> Self {
        Error::ConfigField {
            path: path.into(),
            field: field.into(),
            msg: msg.into(),
        }
    }
    pub fn option(option: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Option {
            option: option.into(),
            msg: msg.into(),
        }
    }
}
