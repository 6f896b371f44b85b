//! Inference request traces in the Azure LLM inference trace format:
//! a header `TIMESTAMP,ContextTokens,GeneratedTokens`, then one request a
//! line (`2023-11-16 18:15:46.6805900,374,44`). A timestamp may also be a
//! plain number of seconds. Rows need not be sorted; they are sorted here.

use onepool_decisions::trace::read_azure;

use super::{BadRow, OnBadRow, Rows};

/// One request: arrival (seconds since the epoch) and its tokens.
pub use onepool_decisions::trace::AzureRow as Request;

/// Reads an Azure trace, or onepoold's access log (its lines of
/// `endpoint` only; `None`: every line).
pub fn read(file: &str, text: &str, endpoint: Option<&str>, on_bad: OnBadRow) -> Result<Rows<Request>, BadRow> {
    if text.lines().map(str::trim_start).find(|l| !l.is_empty()).is_some_and(|l| l.starts_with('{')) {
        return read_access_log(file, text, endpoint, on_bad);
    }
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

/// onepoold's access log (one JSON object a line, issue #26) as a trace:
/// each request the model server counted tokens for. The router's own
/// answers (a 503 when the queue was full, say) carry no counts and are
/// rows the simulator cannot size: skipped, or refused, as `on_bad` says.
/// One log holds every endpoint's requests: the others' are counted as
/// left out, so a scenario endpoint never replays another's traffic.
fn read_access_log(file: &str, text: &str, endpoint: Option<&str>, on_bad: OnBadRow) -> Result<Rows<Request>, BadRow> {
    let mut out = Rows::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let row = serde_json::from_str::<onepool_decisions::trace::AccessEntry>(line)
            .map_err(|e| format!("not an access log line: {e}"))
            .and_then(|e| match endpoint {
                Some(want) if e.endpoint != want => Ok(None),
                _ => e.as_request().map(Some),
            });
        match row {
            Ok(Some(r)) => out.rows.push(r),
            Ok(None) => out.ignore("access log lines of other endpoints"),
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
    fn an_access_log_is_a_trace_of_what_the_server_counted() {
        let text = concat!(
            r#"{"time":"2026-12-05T10:00:01.500Z","endpoint":"chat","status":200,"stream":false,"prompt_tokens":31,"completion_tokens":8,"ttfb_s":0.2,"latency_s":0.4,"replica":"10.0.0.5:40000","complete":true}"#,
            "\n",
            r#"{"time":"2026-12-05T10:00:00.250Z","endpoint":"chat","status":503,"latency_s":0.0,"complete":true}"#,
            "\n\n",
            r#"{"time":"2026-12-05T10:00:00.000Z","endpoint":"chat","status":200,"prompt_tokens":12,"completion_tokens":3,"latency_s":0.1,"complete":true}"#,
            "\nnot json\n"
        );
        let r = read("access.jsonl", text, None, OnBadRow::Skip).unwrap();
        let got: Vec<(u32, u32)> = r.rows.iter().map(|x| (x.context_tokens, x.generated_tokens)).collect();
        assert_eq!(got, [(12, 3), (31, 8)], "sorted by arrival");
        assert!((r.rows[1].t - r.rows[0].t - 1.5).abs() < 1e-6);
        assert_eq!(r.skipped.len(), 2);
        assert_eq!(r.skipped[0].to_string(), "access.jsonl:2: no token counts (status 503, answered by the router)");
        assert!(read("access.jsonl", text, None, OnBadRow::Abort).is_err());
    }

    #[test]
    fn an_endpoint_reads_its_own_lines_of_a_shared_access_log() {
        let text = concat!(
            r#"{"time":"2026-12-05T10:00:01Z","endpoint":"chat","status":200,"prompt_tokens":31,"completion_tokens":8,"latency_s":0.4,"complete":true}"#,
            "\n",
            r#"{"time":"2026-12-05T10:00:02Z","endpoint":"code","status":200,"prompt_tokens":90,"completion_tokens":20,"latency_s":0.9,"complete":true}"#,
            "\n",
            r#"{"time":"2026-12-05T10:00:03Z","endpoint":"code","status":503,"latency_s":0.0,"complete":true}"#,
            "\n",
        );
        let r = read("access.jsonl", text, Some("chat"), OnBadRow::Abort).unwrap();
        assert_eq!(r.rows.len(), 1);
        assert_eq!(r.rows[0].context_tokens, 31);
        assert_eq!(r.ignored, vec![("access log lines of other endpoints".to_string(), 2)]);
        assert!(r.skipped.is_empty(), "another endpoint's 503 is not this one's bad row");
        assert_eq!(read("access.jsonl", text, Some("code"), OnBadRow::Skip).unwrap().rows.len(), 1);
    }

    #[test]
    fn reads_and_reports() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:50.5,396,109\n2023-11-16 18:15:46.25,374,44\nnoon,1,1\n5,1\n";
        let r = read("t.csv", text, None, OnBadRow::Skip).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0].t, 1_700_158_546.25);
        assert_eq!(r.skipped.len(), 2);
        assert_eq!(
            r.skipped[0].to_string(),
            "t.csv:4: TIMESTAMP \"noon\" is not a time (YYYY-MM-DD HH:MM:SS[.fraction])"
        );
        assert_eq!(r.skipped[1].line, 5);
        assert_eq!(
            read("t.csv", "\na,b,c\n", None, OnBadRow::Skip).unwrap_err().to_string(),
            "t.csv:2: header is \"a,b,c\"; expected \"TIMESTAMP,ContextTokens,GeneratedTokens\""
        );
        assert_eq!(read("t.csv", "", None, OnBadRow::Abort).unwrap().rows, vec![]);
        let e = read("t.csv", text, None, OnBadRow::Abort).unwrap_err();
        assert_eq!((e.line, e.what.as_str()), (4, "TIMESTAMP \"noon\" is not a time (YYYY-MM-DD HH:MM:SS[.fraction])"));
    }
}
