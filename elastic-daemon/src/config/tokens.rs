//! Bearer tokens, read from the files the configuration names.

use super::check::Checker;
use toml::Spanned;

/// Shortest token accepted: shorter ones can be guessed.
const MIN_TOKEN_LEN: usize = 16;

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
