//! The lock's database password, from a file only onepoold's user may
//! read (never in onepoold.toml, which admins copy around and show).

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("[ha] password_file {path}: {what}")]
    Unsafe { path: PathBuf, what: String },
    #[error("[ha] password_file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The first line of `path`, refused when another user could read or
/// write the file (the replica key's rule, [`crate::replica_key`]).
pub fn read_password(path: &Path) -> Result<String, PasswordError> {
    read_password_as(path, onepool_os::geteuid())
}

/// [`read_password`] as onepoold's user `owner` would at start.
pub fn read_password_as(path: &Path, owner: u32) -> Result<String, PasswordError> {
    let unsafe_file = |what: String| PasswordError::Unsafe { path: path.to_path_buf(), what };
    let meta =
        std::fs::symlink_metadata(path).map_err(|source| PasswordError::Io { path: path.to_path_buf(), source })?;
    crate::private_file::check_as(path, &meta, "the password", owner).map_err(unsafe_file)?;
    let text =
        std::fs::read_to_string(path).map_err(|source| PasswordError::Io { path: path.to_path_buf(), source })?;
    let password = text.lines().next().unwrap_or("").trim_end_matches('\r');
    if password.is_empty() {
        return Err(unsafe_file("is empty; its first line is the database password".into()));
    }
    Ok(password.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn the_first_line_of_a_private_file_is_the_password_and_anything_else_is_refused_with_the_fix() {
        let dir = std::env::temp_dir().join(format!("onepool-ha-password-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_password(&file(&dir, "ok", "s3cret\nignored\n", 0o600)).unwrap(), "s3cret");
        let open = read_password(&file(&dir, "open", "s3cret\n", 0o640)).unwrap_err().to_string();
        assert!(open.contains("mode 0640") && open.contains("chmod 600"), "{open}");
        let empty = read_password(&file(&dir, "empty", "\n", 0o600)).unwrap_err().to_string();
        assert!(empty.contains("is empty"), "{empty}");
        let missing = read_password(&dir.join("missing")).unwrap_err().to_string();
        assert!(missing.contains("password_file") && missing.contains("missing"), "{missing}");
        std::os::unix::fs::symlink(dir.join("ok"), dir.join("link")).unwrap();
        let link = read_password(&dir.join("link")).unwrap_err().to_string();
        assert!(link.contains("symbolic link"), "{link}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
