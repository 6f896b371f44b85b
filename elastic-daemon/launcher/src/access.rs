//! Who may use a replica, and for what (issue #25). The launcher's port is
//! reachable from the whole cluster network and its server's from every
//! process on the node, other users' jobs included; before this, both
//! answered anyone, and the launcher passed on every path, the model
//! server's administrative ones (llama-server's `/slots`, `/props`) too.
//! Now a request must carry onepoold's replica key
//! ([`crate::conventions::REPLICA_KEY_HEADER`]) and ask for a path the
//! endpoint serves.

use http::HeaderMap;

use crate::conventions::{MOVABLE_HEADER, REPLICA_KEY_HEADER};

/// The paths a replica serves when nothing else is said: the
/// OpenAI-compatible API and what onepoold reads (health, metrics).
pub const DEFAULT_PATHS: [&str; 3] = ["/v1/", "/health", "/metrics"];

/// llama-server's paths that continue an answer on this replica by its
/// token ids (issue #43): its chat template, its tokenizer and its native
/// completion. Passed only for the router's own continuations (the
/// replica key and [`MOVABLE_HEADER`]; the router never passes a client's
/// `x-onepool-*` field), whatever the endpoint serves.
pub const CONTINUATION_PATHS: [&str; 3] = ["/apply-template", "/tokenize", "/completion"];

#[derive(Clone, Debug)]
pub struct Access {
    /// The SHA-256 of onepoold's replica key; `None` answers every caller
    /// (in-process tests only: `onepool replica` refuses to start without
    /// a key). A digest, so that the key need not reach the node
    /// ([`crate::conventions::REPLICA_KEY_DIGEST_ENV`]).
    key: Option<[u8; 32]>,
    /// Exact paths, or prefixes when they end with `/` (`/` itself is
    /// the root only); `None`: every path.
    paths: Option<Vec<String>>,
}

/// Why a request is refused, with the status it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// 401: no key, or not onepoold's.
    Key,
    /// 404: a path this replica does not serve through onepool.
    Path,
}

impl Access {
    pub fn new(key: Option<Vec<u8>>, paths: Vec<String>) -> Access {
        Access::with_digest(key.map(|k| digest(&k)), paths)
    }

    /// [`Access::new`] from the key's SHA-256 alone.
    pub fn with_digest(key: Option<[u8; 32]>, paths: Vec<String>) -> Access {
        let paths = if paths.is_empty() { DEFAULT_PATHS.iter().map(|p| p.to_string()).collect() } else { paths };
        Access { key, paths: Some(paths) }
    }

    /// Every caller, every path: for tests of the drain alone.
    pub fn open() -> Access {
        Access { key: None, paths: None }
    }

    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    /// The key is checked first, so a caller without it learns nothing
    /// of which paths exist.
    pub fn check(&self, path: &str, headers: &HeaderMap) -> Result<(), Refused> {
        if let Some(key) = &self.key {
            let given = headers.get(REPLICA_KEY_HEADER).map(|v| v.as_bytes()).unwrap_or_default();
            // Compared as digests: the same length whatever was sent.
            if !constant_time_eq(&digest(given), key) {
                return Err(Refused::Key);
            }
        }
        if !plain_path(path) {
            return Err(Refused::Path);
        }
        let Some(paths) = &self.paths else { return Ok(()) };
        let continuation = self.key.is_some() && headers.get(MOVABLE_HEADER).is_some_and(|v| v.as_bytes() == b"1");
        if continuation && CONTINUATION_PATHS.contains(&path) {
            return Ok(());
        }
        let allowed = paths.iter().any(|p| match p.strip_suffix('/') {
            Some(dir) if !dir.is_empty() => path.starts_with(p.as_str()) || path == dir,
            _ => path == p,
        });
        allowed.then_some(()).ok_or(Refused::Path)
    }
}

/// A path a server cannot read as another one: no dot segments, empty
/// segments, backslashes or percent-escapes (`/v1/../slots`,
/// `/v1/%2e%2e/slots`, `//slots` would all leave the allowed prefix in
/// some server's normalisation).
fn plain_path(path: &str) -> bool {
    path.starts_with('/')
        && !path.contains(['\\', '%'])
        && !path[1..].split('/').any(|seg| seg == "." || seg == "..")
        && !path.contains("//")
}

/// The SHA-256 of a replica key, as [`Access`] keeps it.
pub fn digest(key: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, key);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The hex form of [`digest`] that onepoold hands its replica jobs.
pub fn digest_hex(key: &[u8]) -> String {
    digest(key).iter().map(|b| format!("{b:02x}")).collect()
}

/// A digest back from its hex form; `None` unless exactly 64 hex digits.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let b = hex.as_bytes();
    if b.len() != 64 || !b.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Compares in time that depends on the lengths only, so that the time of
/// an answer does not tell a caller how much of a guessed key was right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the fold from being cut short by the optimiser's knowledge of
    // the result.
    std::hint::black_box(diff) == 0
}

/// A new random key, as hex (32 bytes from the kernel's random source).
pub fn random_key() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_key(k: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(REPLICA_KEY_HEADER, k.parse().unwrap());
        h
    }

    #[test]
    fn a_digest_admits_exactly_the_key_it_was_made_from() {
        let key = "0123456789abcdef0123456789abcdef";
        let hex = digest_hex(key.as_bytes());
        assert_eq!(hex.len(), 64);
        let a = Access::with_digest(parse_digest(&hex), vec![]);
        assert_eq!(a.check("/v1/models", &with_key(key)), Ok(()));
        // The digest itself is no key.
        assert_eq!(a.check("/v1/models", &with_key(&hex)), Err(Refused::Key));
        assert_eq!(a.check("/v1/models", &with_key("0123456789abcdef0123456789abcdeF")), Err(Refused::Key));
        for bad in ["", "ab", &hex[1..], &format!("{}g", &hex[1..])] {
            assert_eq!(parse_digest(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_key_is_required_before_the_path_is_looked_at() {
        let a = Access::new(Some(b"secret".to_vec()), vec![]);
        assert_eq!(a.check("/v1/chat/completions", &HeaderMap::new()), Err(Refused::Key));
        assert_eq!(a.check("/slots", &HeaderMap::new()), Err(Refused::Key));
        assert_eq!(a.check("/v1/chat/completions", &with_key("secreT")), Err(Refused::Key));
        assert_eq!(a.check("/v1/chat/completions", &with_key("secret ")), Err(Refused::Key));
        assert_eq!(a.check("/v1/chat/completions", &with_key("secret")), Ok(()));
    }

    #[test]
    fn only_the_endpoint_s_paths_pass_and_none_that_escapes_them() {
        let a = Access::new(Some(b"k".to_vec()), vec![]);
        let k = with_key("k");
        for ok in ["/v1/chat/completions", "/v1/models", "/v1", "/health", "/metrics"] {
            assert_eq!(a.check(ok, &k), Ok(()), "{ok}");
        }
        for bad in [
            "/slots",
            "/props",
            "/slots/0?action=save",
            "/v1/../slots",
            "/v1/%2e%2e/slots",
            "/v1//slots",
            "/v1/./x",
            "/healthz",
            "/health/",
            "/metrics/../props",
            "/v1\\..\\slots",
            "",
        ] {
            assert_eq!(a.check(bad, &k), Err(Refused::Path), "{bad}");
        }
        let own = Access::new(Some(b"k".to_vec()), vec!["/generate".into(), "/v1/".into()]);
        assert_eq!(own.check("/generate", &k), Ok(()));
        assert_eq!(own.check("/health", &k), Err(Refused::Path));
        // A health check on "/" opens the root, not every path.
        let root = Access::new(Some(b"k".to_vec()), vec!["/v1/".into(), "/".into()]);
        assert_eq!(root.check("/", &k), Ok(()));
        assert_eq!(root.check("/slots", &k), Err(Refused::Path));
        assert_eq!(Access::open().check("/slots", &HeaderMap::new()), Ok(()));
    }

    #[test]
    fn continuation_paths_pass_for_the_router_s_movable_requests_only() {
        let a = Access::new(Some(b"k".to_vec()), vec!["/v1/".into()]);
        let mut moving = with_key("k");
        moving.insert(MOVABLE_HEADER, http::HeaderValue::from_static("1"));
        for p in CONTINUATION_PATHS {
            assert_eq!(a.check(p, &with_key("k")), Err(Refused::Path), "{p} without the mark");
            assert_eq!(a.check(p, &moving), Ok(()), "{p}");
        }
        for bad in ["/slots", "/props", "/completion/../slots", "/tokenize/x"] {
            assert_eq!(a.check(bad, &moving), Err(Refused::Path), "{bad}");
        }
        // The mark without the key opens nothing.
        moving.remove(REPLICA_KEY_HEADER);
        assert_eq!(a.check("/completion", &moving), Err(Refused::Key));
    }

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
        let k = random_key().unwrap();
        assert_eq!(k.len(), 64);
        assert_ne!(k, random_key().unwrap());
    }
}
