//! The rule for a secret onepoold reads from a file (the replica key, the
//! HA lock's database password): a regular file, owned by onepoold's user,
//! that no other user may read or write. A file that breaks it is refused
//! with the command that fixes it, before a byte of it is read.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Why `path` (whose metadata is `meta`, read without following a link)
/// may not hold `secret` ("the key", "the password") for this process's
/// user, or `Ok`.
pub fn check(path: &Path, meta: &std::fs::Metadata, secret: &str) -> Result<(), String> {
    check_as(path, meta, secret, onepool_os::geteuid())
}

/// [`check`] for onepoold's user `me` (`onepoold --check`, run by root for
/// the service user, applies the rule the start will).
pub fn check_as(path: &Path, meta: &std::fs::Metadata, secret: &str, me: u32) -> Result<(), String> {
    if !meta.file_type().is_file() {
        return Err("not a regular file (a symbolic link is not followed)".into());
    }
    if meta.uid() != me {
        return Err(format!(
            "owned by uid {}, not by onepoold's user (uid {me}); fix: chown {me} {}",
            meta.uid(),
            path.display()
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "mode {mode:04o} lets other users read or write {secret}; fix: chmod 600 {}",
            path.display()
        ));
    }
    Ok(())
}
