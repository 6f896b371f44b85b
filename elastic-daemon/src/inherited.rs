//! Listening sockets handed to onepoold at its start (systemd's socket
//! activation: `LISTEN_PID`, `LISTEN_FDS`, descriptors from 3 on). The
//! socket outlives the process, so a restart or an upgrade of onepoold
//! refuses no connection: clients that connect meanwhile wait in the
//! socket's backlog until the new process accepts them. Each inherited
//! socket serves the listener configured with its address; one that no
//! listener asks for is closed, with a warning.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::RawFd;

/// The sockets handed over, by the address each listens on.
#[derive(Debug, Default)]
pub struct Inherited {
    listeners: Vec<(SocketAddr, TcpListener)>,
    /// Descriptors that were no listening TCP socket (logged once logging
    /// is up: they are found before it is).
    unusable: Vec<(RawFd, String)>,
}

impl Inherited {
    /// Takes the sockets this process was given, once (the variables are
    /// removed, so the Slurm commands onepoold runs see none of it, and the
    /// descriptors are closed on exec in them).
    pub fn take() -> Inherited {
        let ours = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
        let count = std::env::var("LISTEN_FDS").ok().and_then(|n| n.parse::<RawFd>().ok()).unwrap_or(0);
        // Called before onepoold starts any thread (main), so nothing reads
        // the environment meanwhile.
        for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            std::env::remove_var(v);
        }
        if !ours || count <= 0 {
            return Inherited::default();
        }
        let (mut listeners, mut unusable) = (Vec::new(), Vec::new());
        for (fd, handed) in onepool_os::take_listen_fds(u32::try_from(count).unwrap_or(0)) {
            match handed {
                onepool_os::Handed::NotOpen => unusable
                    .push((fd, "not open; LISTEN_FDS counts descriptors this process was not given".to_string())),
                onepool_os::Handed::Listener(l) => match l.local_addr() {
                    Ok(a) => listeners.push((a, l)),
                    Err(e) => unusable.push((fd, e.to_string())),
                },
            }
        }
        Inherited { listeners, unusable }
    }

    /// The inherited socket listening on `address`, if any, made ready
    /// for the async runtime.
    pub fn listener(&mut self, address: SocketAddr) -> std::io::Result<Option<tokio::net::TcpListener>> {
        let Some(i) = self.listeners.iter().position(|(a, _)| *a == address) else { return Ok(None) };
        let (_, l) = self.listeners.remove(i);
        l.set_nonblocking(true)?;
        tracing::info!(%address, "serving on a socket handed over at start (socket activation)");
        tokio::net::TcpListener::from_std(l).map(Some)
    }

    /// Closes the sockets no listener asked for.
    pub fn close_unused(self) {
        for (fd, e) in self.unusable {
            tracing::warn!(fd, "an inherited descriptor is not a listening TCP socket; not used: {e}");
        }
        for (a, _) in self.listeners {
            tracing::warn!(address = %a, "an inherited socket matches no listener in the configuration; closed");
        }
    }
}

/// Binds `address`, or takes the inherited socket already listening there.
pub async fn bind(inherited: &mut Inherited, address: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    match inherited.listener(address)? {
        Some(l) => Ok(l),
        None => tokio::net::TcpListener::bind(address).await,
    }
}

/// The handing side, as systemd does it (for launchers and tests): the
/// process `cmd` starts gets `socket` as descriptor 3. The command must
/// still set LISTEN_PID to onepoold's own pid and LISTEN_FDS=1; a shell's
/// `LISTEN_PID=$$ LISTEN_FDS=1 exec onepoold ...` does.
pub fn hand_over(cmd: &mut std::process::Command, socket: &TcpListener) {
    onepool_os::pass_as_first_listen_fd(cmd, socket);
}
