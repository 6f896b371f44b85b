//! The Azure LLM inference trace (TIMESTAMP,ContextTokens,GeneratedTokens),
//! read for replaying real request arrivals and sizes through the router.

use std::path::Path;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival time after the trace's first request.
    pub at: Duration,
    pub context_tokens: u32,
    pub generated_tokens: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{file}: cannot read the trace: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}:{line}: {message}")]
    Parse { file: String, line: usize, message: String },
}

use onepool_decisions::trace::read_azure;

/// Reads at most `limit` requests from the trace file at `path`.
pub fn load(path: &Path, limit: usize) -> Result<Vec<TraceRequest>, TraceError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read { file: file.clone(), source })?;
    parse(&file, &text, limit)
}

/// The trace must have a header and be sorted by time.
pub fn parse(file: &str, text: &str, limit: usize) -> Result<Vec<TraceRequest>, TraceError> {
    let err = |line: usize, message: String| TraceError::Parse { file: file.to_string(), line, message };
    let rows = read_azure(text).map_err(|e| err(e.line, e.what))?;
    if rows.header_line().is_none() {
        return Err(err(1, "the file is empty; expected a header and requests".into()));
    }
    let mut out = Vec::new();
    let mut first: Option<f64> = None;
    let mut previous = f64::MIN;
    for (line, row) in rows {
        if out.len() >= limit {
            break;
        }
        let row = row.map_err(|message| err(line, message))?;
        let t = row.t;
        if t < previous {
            return Err(err(
                line,
                format!("timestamp at line {line} is earlier than the line before; the trace must be sorted"),
            ));
        }
        previous = t;
        let (context_tokens, generated_tokens) = (row.context_tokens, row.generated_tokens);
        let start = *first.get_or_insert(t);
        out.push(TraceRequest { at: Duration::from_secs_f64(t - start), context_tokens, generated_tokens });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_offsets_and_tokens() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 23:59:59.5,374,44\n2023-11-17 00:00:00.2500000,396,109\n";
        let r = parse("t.csv", text, 10).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], TraceRequest { at: Duration::ZERO, context_tokens: 374, generated_tokens: 44 });
        assert_eq!(r[1].at, Duration::from_millis(750));
        assert_eq!(r[1].generated_tokens, 109);
    }

    #[test]
    fn errors_name_file_and_line() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47,x,1\n";
        let e = parse("t.csv", text, 10).unwrap_err().to_string();
        assert_eq!(e, "t.csv:3: ContextTokens \"x\" is not a whole number");
        let e = parse("t.csv", "a,b\n", 10).unwrap_err().to_string();
        assert!(e.starts_with("t.csv:1: header is"), "{e}");
        let e = parse("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-01 00:00:00,1,1\n", 10).unwrap_err();
        assert!(e.to_string().starts_with("t.csv:2: TIMESTAMP"), "{e}");
        let e = parse("t.csv", "", 10).unwrap_err().to_string();
        assert_eq!(e, "t.csv:1: the file is empty; expected a header and requests");
        let e = parse("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n4,1,1\n", 10).unwrap_err().to_string();
        assert_eq!(e, "t.csv:3: timestamp at line 3 is earlier than the line before; the trace must be sorted");
        assert_eq!(parse("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n4,x,1\n", 1).unwrap().len(), 1);
    }

    #[test]
    fn the_real_trace_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/azure-llm-inference-2023-conv.csv");
        let r = load(&path, usize::MAX).unwrap();
        assert!(r.len() > 19_000);
        assert!(r.windows(2).all(|w| w[0].at <= w[1].at));
    }
}
