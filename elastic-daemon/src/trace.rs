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

const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";

/// Reads at most `limit` requests from the trace file at `path`.
pub fn load(path: &Path, limit: usize) -> Result<Vec<TraceRequest>, TraceError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read { file: file.clone(), source })?;
    parse(&file, &text, limit)
}

pub fn parse(file: &str, text: &str, limit: usize) -> Result<Vec<TraceRequest>, TraceError> {
    let err = |line: usize, message: String| TraceError::Parse { file: file.to_string(), line, message };
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, h)) if h.trim() == HEADER => {}
        Some((_, h)) => return Err(err(1, format!("header is {h:?}; expected {HEADER:?}"))),
        None => return Err(err(1, "the file is empty; expected a header and requests".into())),
    }
    let mut out = Vec::new();
    let mut first: Option<f64> = None;
    let mut previous = f64::MIN;
    for (i, l) in lines {
        if out.len() >= limit {
            break;
        }
        let line = i + 1;
        if l.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = l.split(',').collect();
        let [ts, ctx, generated] = fields.as_slice() else {
            return Err(err(line, format!("{} fields; expected 3 ({HEADER})", fields.len())));
        };
        let t = parse_timestamp(ts.trim())
            .ok_or_else(|| err(line, format!("timestamp {ts:?} is not YYYY-MM-DD HH:MM:SS[.fraction]")))?;
        if t < previous {
            return Err(err(
                line,
                format!("timestamp {ts:?} is earlier than the line before; the trace must be sorted"),
            ));
        }
        previous = t;
        let tokens = |name: &str, v: &str| {
            v.trim().parse::<u32>().map_err(|_| err(line, format!("{name} {v:?} is not a whole number of tokens")))
        };
        let context_tokens = tokens("ContextTokens", ctx)?;
        let generated_tokens = tokens("GeneratedTokens", generated)?;
        let start = *first.get_or_insert(t);
        out.push(TraceRequest { at: Duration::from_secs_f64(t - start), context_tokens, generated_tokens });
    }
    Ok(out)
}

/// Seconds since 1970-01-01 (UTC assumed; only differences matter).
fn parse_timestamp(s: &str) -> Option<f64> {
    let (date, time) = s.split_once(' ')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.split(':');
    let (h, min, sec) = (t.next()?.parse::<u32>().ok()?, t.next()?.parse::<u32>().ok()?, t.next()?);
    if t.next().is_some() || h > 23 || min > 59 {
        return None;
    }
    let sec: f64 = sec.parse().ok().filter(|s: &f64| (0.0..61.0).contains(s))?;
    Some(days_from_civil(y, m, day) as f64 * 86400.0 + (h * 3600 + min * 60) as f64 + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
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
        assert_eq!(e, "t.csv:3: ContextTokens \"x\" is not a whole number of tokens");
        let e = parse("t.csv", "a,b\n", 10).unwrap_err().to_string();
        assert!(e.starts_with("t.csv:1: header is"), "{e}");
        let e = parse("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-01 00:00:00,1,1\n", 10).unwrap_err();
        assert!(e.to_string().starts_with("t.csv:2: timestamp"), "{e}");
    }

    #[test]
    fn the_real_trace_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/azure-llm-inference-2023-conv.csv");
        let r = load(&path, usize::MAX).unwrap();
        assert!(r.len() > 19_000);
        assert!(r.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11017);
    }
}
