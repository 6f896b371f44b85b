//! A manual page for a configuration file, in roff: a section 5 page
//! whose body is the commented sample file the packages install, so the
//! page says what the parser is tested against and cannot drift from it.
//! Pure text (onepool(1) and onepoold(8) come from their clap definitions
//! through clap_mangen; these two pages have no such definition).

use std::io::Write;

/// A section 5 page whose body is a commented sample file.
pub fn config_page(name: &str, what: &str, path: &str, description: &str, sample: &str, see_also: &str) -> String {
    let mut out = Vec::new();
    let _ = writeln!(
        out,
        ".TH \"{}\" 5 \"\" \"onepool {}\" \"File formats\"",
        name.to_uppercase(),
        env!("CARGO_PKG_VERSION")
    );
    let _ = writeln!(out, ".SH NAME\n{} \\- {}", escape(name), escape(what));
    let _ = writeln!(out, ".SH SYNOPSIS\n{}", escape(path));
    let _ = writeln!(out, ".SH DESCRIPTION\n{}", escape(description));
    let _ = writeln!(out, ".SH SAMPLE\n.nf");
    for line in sample.lines() {
        // A line starting with a dot or quote would be a request.
        let l = escape(line);
        let _ = writeln!(out, "{}{l}", if l.starts_with(['.', '\'']) { "\\&" } else { "" });
    }
    let _ = writeln!(out, ".fi\n.SH SEE ALSO\n{}", escape(see_also));
    String::from_utf8(out).unwrap_or_default()
}

/// roff's escape character and hyphens.
pub fn escape(s: &str) -> String {
    s.replace('\\', "\\e").replace('-', "\\-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_line_cannot_become_a_request() {
        let page = config_page("x.toml", "w", "/p", "d", ".TH evil\n'x\nkey = \"a-b\\\\c\"", "y");
        assert!(page.contains("\n\\&.TH evil\n\\&'x\nkey = \"a\\-b\\e\\ec\"\n"), "{page}");
    }
}
