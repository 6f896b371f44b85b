//! The checks every kind of value gets: durations, counts, addresses,
//! ratios and class names, each error at its value.

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use onepool_decisions::policy::Diagnostic;

use toml::Spanned;

/// The problems found so far, each at its place.
pub(super) struct Checker {
    pub(super) diags: Vec<Diagnostic>,
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
