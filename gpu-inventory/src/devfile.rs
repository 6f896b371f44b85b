//! GPU device files as Slurm names them (gres.conf `File=`), turned into the
//! device minor numbers the GPU sources report.
//!
//! The minor is read from the file itself, not from its name: a dev
//! cluster's `DIR/nvidia4` made with `mknod DIR/nvidia4 c 195 4` is GPU 4,
//! and so is a `/dev/nvidia4` symlink in a container.

use std::fs::FileType;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The character-device major number of NVIDIA's GPU device nodes.
pub const NVIDIA_MAJOR: u32 = 195;

/// Each message is whole (it carries its cause's text), as in [`crate::GpuError`].
#[derive(Debug, thiserror::Error)]
pub enum DeviceFileError {
    #[error("cannot read GPU device file {}: {error}; check the gres.conf File= entry", path.display())]
    Unreadable { path: PathBuf, error: std::io::Error },
    #[error(
        "{} is a {kind}, not a character device; gres.conf File= must name GPU device nodes such as /dev/nvidia0",
        path.display()
    )]
    NotCharDevice { path: PathBuf, kind: &'static str },
    #[error(
        "{} is device {major}:{minor}, not an NVIDIA GPU (their major number is {NVIDIA_MAJOR}); gres.conf File= \
         must name /dev/nvidiaN nodes",
        path.display()
    )]
    NotNvidia { path: PathBuf, major: u32, minor: u32 },
}

/// The minor number of the NVIDIA device node at `path` (symlinks
/// followed); a file that is not one is an error naming it.
pub fn minor_of(path: &Path) -> Result<u32, DeviceFileError> {
    let meta =
        std::fs::metadata(path).map_err(|error| DeviceFileError::Unreadable { path: path.to_path_buf(), error })?;
    if !meta.file_type().is_char_device() {
        return Err(DeviceFileError::NotCharDevice { path: path.to_path_buf(), kind: kind(meta.file_type()) });
    }
    let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
    if major != NVIDIA_MAJOR {
        return Err(DeviceFileError::NotNvidia { path: path.to_path_buf(), major, minor });
    }
    Ok(minor)
}

fn kind(t: FileType) -> &'static str {
    if t.is_file() {
        "regular file"
    } else if t.is_dir() {
        "directory"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mknod(path: &Path, major: u32, minor: u32) {
        onepool_os::make_char_device(path, 0o600, major, minor)
            .unwrap_or_else(|e| panic!("mknod {} c {major} {minor}: {e}", path.display()));
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("onepool-gpu-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_mknod_made_device_node_gives_its_minor_whatever_its_name() {
        if onepool_os::geteuid() != 0 {
            eprintln!("skipped: making device nodes needs root");
            return;
        }
        let dir = scratch_dir("devfile");
        mknod(&dir.join("nvidia4"), NVIDIA_MAJOR, 4);
        mknod(&dir.join("nvidia5"), NVIDIA_MAJOR, 9);
        mknod(&dir.join("other"), 10, 4);
        std::os::unix::fs::symlink(dir.join("nvidia4"), dir.join("link")).unwrap();
        std::fs::write(dir.join("plain"), "").unwrap();

        let minors: Vec<u32> = ["nvidia4", "nvidia5"].iter().map(|f| minor_of(&dir.join(f)).unwrap()).collect();
        assert_eq!(minors, [4, 9]);
        assert_eq!(minor_of(&dir.join("link")).unwrap(), 4);

        let other = dir.join("other");
        assert_eq!(
            minor_of(&other).unwrap_err().to_string(),
            format!(
                "{} is device 10:4, not an NVIDIA GPU (their major number is 195); gres.conf File= must name \
                 /dev/nvidiaN nodes",
                other.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_that_are_not_gpu_nodes_are_named_in_the_error() {
        let dir = scratch_dir("notdev");
        let plain = dir.join("nvidia0");
        std::fs::write(&plain, "").unwrap();
        assert_eq!(
            minor_of(&plain).unwrap_err().to_string(),
            format!(
                "{} is a regular file, not a character device; gres.conf File= must name GPU device nodes such as \
                 /dev/nvidia0",
                plain.display()
            )
        );
        assert!(minor_of(&dir).unwrap_err().to_string().contains("is a directory, not a character device"));
        let missing = dir.join("nvidia1");
        assert_eq!(
            minor_of(&missing).unwrap_err().to_string(),
            format!(
                "cannot read GPU device file {}: No such file or directory (os error 2); check the gres.conf File= \
                 entry",
                missing.display()
            )
        );
        assert!(matches!(minor_of(Path::new("/dev/null")), Err(DeviceFileError::NotNvidia { major: 1, minor: 3, .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
