//! Errors the user can fix, kept apart from failures so that `main` picks the exit code.
//!
//! A [`UsageError`] (bad config, bad flag, unknown axis) exits with 2; a [`NoMatch`] (a filter
//! that selects nothing) exits with 1, as grep does; anything else exits with 1.

use std::fmt;

/// Bad input: the message names the file, field or parameter; the hint says how to fix it.
#[derive(Debug)]
pub struct UsageError {
    pub message: String,
    pub hint: Option<String>,
}

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            hint: None,
        }
    }
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n\nhint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UsageError {}

/// A filter that matched no instance; carries the values that do exist.
#[derive(Debug)]
pub struct NoMatch(pub String);

impl fmt::Display for NoMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoMatch {}

/// Exit code for an error chain: 2 for bad input, 1 otherwise.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if err.chain().any(|e| e.is::<UsageError>()) {
        2
    } else {
        1
    }
}
