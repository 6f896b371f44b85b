//! A log that onepoold rotates (its access and decision logs): the texts
//! of its files, oldest first.

use std::path::PathBuf;

/// The texts of a rotated log's files that exist, oldest first (`files`,
/// from `files_oldest_first`); an error when none does, or one that
/// exists cannot be read.
pub(crate) fn texts(files: &[PathBuf], path: &std::path::Path, what: &str) -> Result<Vec<(PathBuf, String)>, String> {
    let mut out = Vec::new();
    for f in files {
        match std::fs::read_to_string(f) {
            Ok(t) => out.push((f.clone(), t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read the {what} {}: {e}", f.display())),
        }
    }
    if out.is_empty() {
        return Err(format!("the {what} {} does not exist (yet)", path.display()));
    }
    Ok(out)
}
