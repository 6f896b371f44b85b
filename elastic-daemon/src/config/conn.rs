//! A listener's connections: their limits and its TLS, the same for an
//! endpoint's own listener and a shared one.

use std::time::Duration;

use onepool_router::settings::ConnSettings;
use toml::Spanned;

use super::check::Checker;
use super::file::TlsFile;
use super::form::Raw;

/// A listener's connection limits, from an `[[endpoint]]` (its own
/// listener) or a `[[listener]]`: `[header_read_timeout,
/// http2_idle_timeout]`, `[max_header_bytes, max_connections,
/// max_connections_per_ip]`, and its `tls` table.
pub(super) fn conn_settings(
    c: &mut Checker,
    [head_timeout, h2_idle]: [&Option<Spanned<String>>; 2],
    [header_bytes, max_conns, per_ip]: [&Option<Spanned<i64>>; 3],
    tls: Option<&TlsFile<Raw>>,
) -> ConnSettings {
    let max_connections = c.number(max_conns, "max_connections", 1, 1_000_000, 4096) as usize;
    let mut max_connections_per_ip = c.number(per_ip, "max_connections_per_ip", 1, 1_000_000, 512) as usize;
    if max_connections_per_ip > max_connections {
        match per_ip {
            Some(v) => c.error(
                v.span(),
                format!(
                    "max_connections_per_ip = {max_connections_per_ip} is above max_connections = {max_connections}"
                ),
            ),
            // Only the total was lowered: one client may take all of it.
            None => max_connections_per_ip = max_connections,
        }
    }
    ConnSettings {
        header_read_timeout: c.duration(head_timeout, "header_read_timeout", Duration::from_secs(10)),
        max_header_bytes: c.number(header_bytes, "max_header_bytes", 8192, 1 << 20, 16384) as usize,
        max_connections,
        max_connections_per_ip,
        http2_idle_timeout: c.duration(h2_idle, "http2_idle_timeout", Duration::from_secs(60)),
        tls: tls.and_then(|t| tls_settings(c, t)),
    }
}

/// The listener's certificate and key, read and checked now (a listener
/// that could not complete a handshake is an error here, not at the first
/// client); the error sits at the key whose file is wrong.
fn tls_settings(c: &mut Checker, t: &TlsFile<Raw>) -> Option<std::sync::Arc<onepool_router::tls::Tls>> {
    use onepool_router::tls::{Tls, TlsError, TlsFiles};
    let files = TlsFiles { cert: t.cert_file.get_ref().into(), key: t.key_file.get_ref().into() };
    match Tls::new(files) {
        Ok(tls) => Some(std::sync::Arc::new(tls)),
        Err(e) => {
            let at = match &e {
                TlsError::Read { what: "cert_file", .. }
                | TlsError::Empty { what: "cert_file", .. }
                | TlsError::Pem { what: "cert_file", .. } => t.cert_file.span(),
                _ => t.key_file.span(),
            };
            c.error(at, format!("tls: {e}"));
            None
        }
    }
}
