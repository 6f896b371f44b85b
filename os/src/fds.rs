//! Listening sockets handed over at start (socket activation): taken into
//! this process's ownership once, whatever asks twice.

use std::net::TcpListener;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first [`take_listen_fds`]: descriptors are owned once.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// What became of one handed-over descriptor.
#[derive(Debug)]
pub enum Handed {
    /// Open: now owned here, close-on-exec (a program this process starts
    /// does not inherit it).
    Listener(TcpListener),
    /// The protocol counted it, but it is not open (a starter that left it
    /// close-on-exec): owning it would abort the process at its first use.
    NotOpen,
}

/// The `count` descriptors from [`crate::FIRST_LISTEN_FD`] on that the
/// socket activation protocol handed this process (the caller checked
/// `LISTEN_PID` is this process's), each with what it turned out to be.
/// Only the first call takes them; later calls get nothing, so no
/// descriptor is ever owned twice.
pub fn take_listen_fds(count: u32) -> Vec<(RawFd, Handed)> {
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Vec::new();
    }
    let first = crate::FIRST_LISTEN_FD;
    let count = RawFd::try_from(count).unwrap_or(0);
    (first..first.saturating_add(count))
        .map(|fd| {
            // SAFETY: F_GETFD only reads the descriptor's flags.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return (fd, Handed::NotOpen);
            }
            // SAFETY: by the protocol the descriptor is open and this
            // process's; nothing else in it owns it (the flag above makes
            // this the only taking), and it is taken once here.
            let l = unsafe { TcpListener::from_raw_fd(fd) };
            // SAFETY: fcntl on a descriptor this process now owns.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            (fd, Handed::Listener(l))
        })
        .collect()
}
