//! Inference request traces in the Azure LLM inference trace format:
//! a header `TIMESTAMP,ContextTokens,GeneratedTokens`, then one request a
//! line (`2023-11-16 18:15:46.6805900,374,44`). A timestamp may also be a
//! plain number of seconds. Rows need not be sorted; they are sorted here.

use onepool_decisions::trace::{parse_azure_row, AZURE_HEADER};

use super::{BadRow, OnBadRow, Rows};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// Arrival, seconds since the epoch.
    pub t: f64,
    pub context_tokens: u32,
    pub generated_tokens: u32,
}

pub fn read(file: &str, text: &str, on_bad: OnBadRow) -> Result<Rows<Request>, BadRow> {
    let mut out = Rows::new();
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    if let Some((i, h)) = lines.next() {
        if h.trim() != AZURE_HEADER {
            return Err(BadRow {
                file: file.into(),
                line: i + 1,
                what: "the header must be TIMESTAMP,ContextTokens,GeneratedTokens".into(),
            });
        }
    }
    for (i, line) in lines {
        match parse_azure_row(line) {
            Ok(r) => out.rows.push(Request {
                t: r.t,
                context_tokens: r.context_tokens,
                generated_tokens: r.generated_tokens,
            }),
            Err(what) => out.bad(file, i + 1, what, on_bad)?,
        }
    }
    out.rows.sort_by(|a, b| a.t.total_cmp(&b.t));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_reports() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:50.5,396,109\n2023-11-16 18:15:46.25,374,44\nnoon,1,1\n5,1\n";
        let r = read("t.csv", text, OnBadRow::Skip).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].t, 1_700_158_546.25);
        assert_eq!(r.skipped.len(), 2);
        assert_eq!(
            r.skipped[0].to_string(),
            "t.csv:4: TIMESTAMP \"noon\" is not a time (YYYY-MM-DD HH:MM:SS[.fraction])"
        );
        assert_eq!(r.skipped[1].line, 5);
        assert!(read("t.csv", "a,b,c\n", OnBadRow::Skip).is_err());
    }
}
