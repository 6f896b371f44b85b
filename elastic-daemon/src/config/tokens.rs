//! Bearer tokens, read from the files the configuration names.

use super::check::Checker;
use toml::Spanned;

/// Shortest token accepted: shorter ones can be guessed.
const MIN_TOKEN_LEN: usize = 16;

/// The tokens of `[endpoint.auth] bearer_tokens_file`, or an error at the
/// key: the file is unreadable, open to anyone but its owner, empty, or
/// holds a short token. A line may name a request class after its token
/// (`TOKEN agents`, issue #44) where `classes` says so; each class named is
/// returned with where (file and line), for the policy to check.
pub(super) fn bearer_tokens(
    c: &mut Checker,
    path: &Spanned<String>,
    key: &str,
    classes: bool,
) -> Option<(onepool_router::settings::BearerTokens, Vec<(String, String)>)> {
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
    let (mut tokens, mut named) = (Vec::new(), Vec::new());
    for (i, line) in text.lines().enumerate() {
        let mut words = line.split('#').next().unwrap_or("").split_whitespace();
        let Some(t) = words.next() else { continue };
        let class = words.next();
        let (at, line_no) = (format!("{file}:{}", i + 1), i + 1);
        let at_line = format!("{file:?} line {line_no}");
        if t.len() < MIN_TOKEN_LEN || !t.is_ascii() {
            c.error(span.clone(), format!("{key} {at_line}: a token is one word of at least {MIN_TOKEN_LEN} ASCII characters (e.g. `openssl rand -hex 32`)"));
            return None;
        }
        let class = match (class, words.next(), classes) {
            (None, _, _) => None,
            (Some(_), None, false) => {
                c.error(
                    span.clone(),
                    format!("{key} {at_line}: these tokens name no request class; give the token alone"),
                );
                return None;
            }
            (Some(name), None, true) if valid_class(name) => Some(name.to_string()),
            (Some(name), None, true) => {
                c.error(
                    span.clone(),
                    format!("{key} {at_line}: {name:?} is not a class name (letters, digits, '-', '_')"),
                );
                return None;
            }
            (Some(_), Some(extra), _) => {
                c.error(
                    span.clone(),
                    format!("{key} {at_line}: {extra:?} after the token and its class: a line is `TOKEN [CLASS]`"),
                );
                return None;
            }
        };
        if let Some(class) = &class {
            named.push((class.clone(), at));
        }
        tokens.push((t.to_string(), class));
    }
    if tokens.is_empty() {
        c.error(span, format!("{key} {file:?} holds no token: every request would be refused"));
        return None;
    }
    Some((onepool_router::settings::BearerTokens::with_classes(tokens), named))
}

fn valid_class(name: &str) -> bool {
    name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
}
