//! The libc calls onepool makes besides Slurm's, behind safe functions:
//! every unsafe block of the workspace outside the Slurm bindings and the
//! plugins' entry points is here, each with the reason it holds, so every
//! other crate can forbid unsafe code (issue #27).

mod buffer;
mod fds;
mod files;
mod process;
mod signals;
mod users;

pub use buffer::{grow, Grow};
pub use fds::{take_listen_fds, Handed};
pub use files::{make_char_device, Locked};
pub use process::{close_inherited_on_exec, new_session_on_exec, pass_as_first_listen_fd, with_umask, FIRST_LISTEN_FD};
pub use signals::{pidfd_open, pidfd_send_signal, raise, signal, signal_group, SIGKILL, SIGTERM, SIGUSR1};
pub use users::{geteuid, getuid, group, user, user_id, Group, NSS_FIRST, NSS_MAX};
