//! Which policy file a command reads, and reading it.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::Context;
use onepool_decisions::policy::{DEFAULT_PATH, PATH_ENV};

/// The policy text and the name diagnostics call it by.
pub struct Source {
    pub name: String,
    pub text: String,
}

/// The file argument, else `$ONEPOOL_POLICY` (when set and not empty), else
/// the installed default.
pub fn path(arg: Option<PathBuf>, env: Option<OsString>) -> PathBuf {
    arg.or_else(|| env.filter(|v| !v.is_empty()).map(PathBuf::from)).unwrap_or_else(|| PathBuf::from(DEFAULT_PATH))
}

pub fn read(arg: Option<PathBuf>) -> anyhow::Result<Source> {
    let given = arg.is_some();
    let path = path(arg, std::env::var_os(PATH_ENV));
    let name = path.display().to_string();
    let text = std::fs::read_to_string(&path).with_context(|| {
        let how = if given { "check the path" } else { "pass the policy file as an argument or set ONEPOOL_POLICY" };
        format!("cannot read policy file {name} ({how})")
    })?;
    Ok(Source { name, text })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_wins_then_the_environment_then_the_default() {
        let env = || Some(OsString::from("/env.toml"));
        assert_eq!(path(Some("a.toml".into()), env()), PathBuf::from("a.toml"));
        assert_eq!(path(None, env()), PathBuf::from("/env.toml"));
        assert_eq!(path(None, Some(OsString::new())), PathBuf::from(DEFAULT_PATH));
        assert_eq!(path(None, None), PathBuf::from(DEFAULT_PATH));
    }
}
