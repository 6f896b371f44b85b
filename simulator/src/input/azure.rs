//! Inference request traces in the Azure LLM inference trace format:
//! a header `TIMESTAMP,ContextTokens,GeneratedTokens`, then one request a
//! line (`2023-11-16 18:15:46.6805900,374,44`). A timestamp may also be a
//! plain number of seconds. Rows need not be sorted; they are sorted here.

use onepool_decisions::trace::read_azure;

use super::{BadRow, OnBadRow, Rows};

/// One request: arrival (seconds since the epoch) and its tokens.
pub use onepool_decisions::trace::AzureRow as Request;

pub fn read(file: &str, text: &str, on_bad: OnBadRow) -> Result<Rows<Request>, BadRow> {
    let mut out = Rows::new();
    let rows = read_azure(text).map_err(|e| BadRow { file: file.into(), line: e.line, what: e.what })?;
    for (line, row) in rows {
        match row {
            Ok(r) => out.rows.push(r),
            Err(what) => out.bad(file, line, what, on_bad)?,
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
        assert_eq!(
            read("t.csv", "\na,b,c\n", OnBadRow::Skip).unwrap_err().to_string(),
            "t.csv:2: header is \"a,b,c\"; expected \"TIMESTAMP,ContextTokens,GeneratedTokens\""
        );
        assert_eq!(read("t.csv", "", OnBadRow::Abort).unwrap().rows, vec![]);
        let e = read("t.csv", text, OnBadRow::Abort).unwrap_err();
        assert_eq!((e.line, e.what.as_str()), (4, "TIMESTAMP \"noon\" is not a time (YYYY-MM-DD HH:MM:SS[.fraction])"));
    }
}
