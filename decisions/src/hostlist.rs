//! Slurm's host list expressions (`node[1-4,7]`, `gpu-a[01-10]`, `n1,n2`),
//! expanded, as gres.conf and slurm.conf use them.

/// Expands a host list; `Err` names the malformed part.
pub fn expand(expr: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top_level(expr) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        match item.find('[') {
            None => out.push(item.to_string()),
            Some(open) => {
                let close = item.rfind(']').filter(|c| *c > open).ok_or_else(|| format!("{item:?}: unbalanced '['"))?;
                let (prefix, ranges, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
                for r in ranges.split(',') {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    let width = a.len();
                    let (lo, hi): (u64, u64) = match (a.parse(), b.parse()) {
                        (Ok(lo), Ok(hi)) if lo <= hi && hi - lo < 100_000 => (lo, hi),
                        _ => return Err(format!("{item:?}: {r:?} is not a range like 1-4")),
                    };
                    for n in lo..=hi {
                        out.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Splits on commas outside brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Whether `host` is in the list (a malformed list matches nothing).
pub fn contains(expr: &str, host: &str) -> bool {
    expand(expr).is_ok_and(|hosts| hosts.iter().any(|h| h == host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(expand("node[1-3]").unwrap(), ["node1", "node2", "node3"]);
        assert_eq!(expand("gpu[01-02,7],login").unwrap(), ["gpu01", "gpu02", "gpu7", "login"]);
        assert_eq!(expand("/dev/nvidia[4-5]").unwrap(), ["/dev/nvidia4", "/dev/nvidia5"]);
        assert!(expand("node[1-").is_err());
        assert!(expand("node[3-1]").is_err());
        assert!(contains("node[1-4]", "node3"));
        assert!(!contains("node[1-4]", "node5"));
    }
}
