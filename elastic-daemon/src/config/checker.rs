//! What every value check shares: the diagnostics gathered (all of them,
//! not only the first), durations, positive numbers, workloads, the
//! access log and token files.

#[allow(unused_imports)]
use super::*;

pub(super) struct Checker {
    pub(super) diags: Vec<Diagnostic>,
}

/// `[access_log]`: a path (absolute: the daemon's working directory is
/// no place for it), and bounds on each file and on how many are kept.
pub(super) fn access_log(c: &mut Checker, a: &RawAccessLog) -> onepool_router::access_log::AccessLogSettings {
    let path = PathBuf::from(a.path.get_ref());
    if !path.is_absolute() {
        c.error(a.path.span(), format!("access_log.path {:?} must be an absolute path", a.path.get_ref()));
    }
    onepool_router::access_log::AccessLogSettings {
        path,
        max_file_bytes: c.number(&a.max_file_bytes, "access_log.max_file_bytes", 64 << 10, 1 << 40, 100 << 20) as u64,
        keep_files: c.number(&a.keep_files, "access_log.keep_files", 1, 100, 5) as u32,
    }
}

impl Checker {
    pub(super) fn error(&mut self, span: Range<usize>, msg: String) {
        self.diags.push(Diagnostic::error(Some(span), msg));
    }

    pub(super) fn duration(&mut self, v: &Option<Spanned<String>>, key: &str, default: Duration) -> Duration {
        let Some(v) = v else { return default };
        match onepool_decisions::duration::parse_millis(v.get_ref()) {
            Ok(d) if d.is_zero() => {
                self.error(v.span(), format!("{key} must be longer than zero"));
                default
            }
            Ok(d) => d,
            Err(e) => {
                self.error(v.span(), format!("{key}: {e}"));
                default
            }
        }
    }

    pub(super) fn number(&mut self, v: &Option<Spanned<i64>>, key: &str, min: i64, max: i64, default: i64) -> i64 {
        let Some(v) = v else { return default };
        let n = *v.get_ref();
        if n < min || n > max {
            self.error(v.span(), format!("{key} = {n} is out of range; use {min} to {max}"));
            return default;
        }
        n
    }

    pub(super) fn address(&mut self, v: &Spanned<String>, key: &str) -> Option<SocketAddr> {
        match v.get_ref().parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                self.error(
                    v.span(),
                    format!("{key} = {:?} is not an IP address with a port (127.0.0.1:8000, [::1]:8000)", v.get_ref()),
                );
                None
            }
        }
    }
}

/// Shortest token accepted: shorter ones can be guessed.
pub(super) const MIN_TOKEN_LEN: usize = 16;

/// The tokens of `[endpoint.auth] bearer_tokens_file`, or an error at the
/// key: the file is unreadable, open to anyone but its owner, empty, or
/// holds a short token.
pub(super) fn bearer_tokens(
    c: &mut Checker,
    path: &Spanned<String>,
    key: &str,
) -> Option<onepool_router::settings::BearerTokens> {
    use std::os::unix::fs::PermissionsExt;
    let (file, span) = (path.get_ref(), path.span());
    let text = match std::fs::metadata(file).and_then(|m| Ok((m, std::fs::read_to_string(file)?))) {
        Ok((m, _)) if m.permissions().mode() & 0o077 != 0 => {
            let mode = m.permissions().mode() & 0o777;
            c.error(span, format!("{key} {file:?} is readable or writable by others (mode {mode:o}): chmod 600 it and make onepoold's user its owner"));
            return None;
        }
        Ok((_, text)) => text,
        Err(e) => {
            c.error(span, format!("{key} {file:?}: cannot read it: {e}"));
            return None;
        }
    };
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.split('#').next().unwrap_or("").trim();
        if t.is_empty() {
            continue;
        }
        if t.len() < MIN_TOKEN_LEN || t.contains(char::is_whitespace) || !t.is_ascii() {
            c.error(span.clone(), format!("{key} {file:?} line {}: a token is one word of at least {MIN_TOKEN_LEN} ASCII characters (e.g. `openssl rand -hex 32`)", i + 1));
            return None;
        }
        tokens.push(t.to_string());
    }
    if tokens.is_empty() {
        c.error(span, format!("{key} {file:?} holds no token: every request would be refused"));
        return None;
    }
    Some(onepool_router::settings::BearerTokens::new(tokens))
}

pub(super) fn positive(c: &mut Checker, v: &Option<Spanned<f64>>, key: &str, default: f64) -> f64 {
    let Some(v) = v else { return default };
    let x = *v.get_ref();
    if !(x.is_finite() && x > 0.0) {
        c.error(v.span(), format!("{key} = {x} must be a number above zero"));
        return default;
    }
    x
}

pub(super) fn workload(c: &mut Checker, v: &Option<Spanned<String>>, key: &str, default: &str) -> String {
    let Some(v) = v else { return default.to_string() };
    let w = v.get_ref();
    if w.is_empty() || !w.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_".contains(ch)) {
        c.error(v.span(), format!("{key} = {w:?} is not a workload class name (letters, digits, '-', '_')"));
    }
    w.clone()
}
