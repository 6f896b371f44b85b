//! The Azure LLM inference trace format (`TIMESTAMP,ContextTokens,GeneratedTokens`,
//! e.g. `2023-11-16 18:15:46.6805900,374,44`), one row at a time, for the
//! router's replay tests, the simulator and the demo alike ([`read_azure`]);
//! each caller decides what a bad row means (abort, or skip and count).

/// The header line the format starts with.
pub const AZURE_HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AzureRow {
    /// Seconds since the Unix epoch (UTC assumed; only differences matter).
    pub t: f64,
    pub context_tokens: u32,
    pub generated_tokens: u32,
}

/// Where a trace goes wrong: its line (from 1) and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub line: usize,
    pub what: String,
}

/// The data rows of a trace's text, in file order, each with its line
/// number (from 1); blank lines are skipped. A malformed row is an `Err`
/// saying what is wrong with it: the caller decides what it means.
#[derive(Debug, Clone)]
pub struct AzureRows<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
    header_line: Option<usize>,
}

impl AzureRows<'_> {
    /// The header's line; `None` when the text has no line but blank ones.
    pub fn header_line(&self) -> Option<usize> {
        self.header_line
    }
}

impl Iterator for AzureRows<'_> {
    type Item = (usize, Result<AzureRow, String>);

    fn next(&mut self) -> Option<Self::Item> {
        let (index, line) = self.lines.find(|(_, l)| !l.trim().is_empty())?;
        Some((index + 1, parse_azure_row(line)))
    }
}

/// Reads a trace: the header (after any blank lines) must be
/// [`AZURE_HEADER`]; the rows follow. The one reader of the format: the
/// simulator, the router's replay tests and the demo all read through it.
/// A text with nothing but blank lines has no header and no rows.
pub fn read_azure(text: &str) -> Result<AzureRows<'_>, TraceError> {
    let mut lines = text.lines().enumerate();
    let header_line = match lines.find(|(_, l)| !l.trim().is_empty()) {
        None => None,
        Some((index, h)) if h.trim() == AZURE_HEADER => Some(index + 1),
        Some((index, h)) => {
            return Err(TraceError { line: index + 1, what: format!("header is {h:?}; expected {AZURE_HEADER:?}") })
        }
    };
    Ok(AzureRows { lines, header_line })
}

/// One data row; the error says what is wrong with it.
pub fn parse_azure_row(line: &str) -> Result<AzureRow, String> {
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let [t, c, g] = fields.as_slice() else {
        return Err(format!("{} fields; expected 3 ({AZURE_HEADER})", fields.len()));
    };
    Ok(AzureRow {
        t: parse_time(t).ok_or_else(|| format!("TIMESTAMP {t:?} is not a time (YYYY-MM-DD HH:MM:SS[.fraction])"))?,
        context_tokens: c.parse().map_err(|_| format!("ContextTokens {c:?} is not a whole number"))?,
        generated_tokens: g.parse().map_err(|_| format!("GeneratedTokens {g:?} is not a whole number"))?,
    })
}

/// Seconds since the Unix epoch from a plain number of seconds or a
/// `YYYY-MM-DD[T ]HH:MM:SS[.fraction][Z]` time (taken as UTC; the `Z` of
/// [`format_time_ms`] says so).
pub fn parse_time(s: &str) -> Option<f64> {
    let s = s.trim();
    let s = s.strip_suffix('Z').unwrap_or(s);
    if let Ok(v) = s.parse::<f64>() {
        return v.is_finite().then_some(v);
    }
    let (date, time) = s.split_once(['T', ' '])?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, dd) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&dd) {
        return None;
    }
    let mut t = time.split(':');
    let (hh, mm) = (t.next()?.parse::<i64>().ok()?, t.next()?.parse::<i64>().ok()?);
    let ss: f64 = t.next()?.parse().ok()?;
    if t.next().is_some() || !(0..24).contains(&hh) || !(0..60).contains(&mm) || !(0.0..61.0).contains(&ss) {
        return None;
    }
    Some((days_from_civil(y, m, dd) * 86_400 + hh * 3_600 + mm * 60) as f64 + ss)
}

/// `YYYY-MM-DDTHH:MM:SS` of whole seconds since the Unix epoch: the
/// inverse of [`parse_time`] (the form sacct and slurmctld's log print).
pub fn format_time(t: f64) -> String {
    let secs = t.floor() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

/// [`format_time`] with milliseconds and the zone: `2026-12-05T09:52:30.123Z`
/// (the access log's time, always UTC).
pub fn format_time_ms(t: f64) -> String {
    let ms = ((t - t.floor()) * 1000.0).floor().clamp(0.0, 999.0) as u32;
    format!("{}.{ms:03}Z", format_time(t))
}

/// One line of onepoold's access log (issue #26), as JSON: written by the
/// router for every request that reached an endpoint, read back by
/// `onepool simulate` as an inference trace. Token counts are the model
/// server's own (its `usage`), absent where it gave none (a stream without
/// usage, the router's own answers).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AccessEntry {
    /// When the request arrived (UTC, [`format_time_ms`]).
    pub time: String,
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub status: u16,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// Seconds to the response's first body byte.
    #[serde(default)]
    pub ttfb_s: Option<f64>,
    /// Seconds to its last byte (or to the client leaving).
    pub latency_s: f64,
    /// The replica that answered; `None`: the router itself.
    #[serde(default)]
    pub replica: Option<String>,
    /// False when the client went away or the response was cut off.
    pub complete: bool,
    /// Times the answer moved to another replica mid-stream (issue #43);
    /// `replica` is the one it began on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moved: u32,
    /// The request's class (issue #44), on an endpoint with classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Why the router answered the request itself (issue #50): a refusal
    /// (`unauthorized`, `class_refused`, `class_full`, `queue_full`,
    /// `queue_timeout`, `body_too_large`, `body_timeout`, `body_budget`) or
    /// no replica's answer (`draining`, `replica_failed`,
    /// `replica_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A generation request on an endpoint with resumption: `yes` when
    /// the router followed its answer (it could yield and move), `replay`
    /// when it moves only by being generated again (a grammar, several
    /// choices), else why not (`several_choices` for `best_of`, `whole`,
    /// ...: issue #51 item 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followed: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl AccessEntry {
    /// The request as an inference trace row: its arrival and the tokens
    /// the server counted.
    pub fn as_request(&self) -> Result<AzureRow, String> {
        let t = parse_time(&self.time)
            .ok_or_else(|| format!("time {:?} is not a time (YYYY-MM-DDTHH:MM:SS[.fraction]Z)", self.time))?;
        let (Some(p), Some(c)) = (self.prompt_tokens, self.completion_tokens) else {
            return Err(format!(
                "no token counts (status {}, answered by {})",
                self.status,
                self.replica.as_deref().unwrap_or("the router")
            ));
        };
        let tokens = |n: u64| u32::try_from(n).map_err(|_| format!("{n} tokens is out of range"));
        Ok(AzureRow { t, context_tokens: tokens(p)?, generated_tokens: tokens(c)? })
    }
}

/// The date of a day count since 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_line_is_a_trace_row_when_the_server_counted_tokens() {
        assert_eq!(format_time_ms(1_700_158_546.25), "2023-11-16T18:15:46.250Z");
        assert_eq!(parse_time("2023-11-16T18:15:46.250Z"), Some(1_700_158_546.25));
        let line = r#"{"time":"2023-11-16T18:15:46.250Z","endpoint":"chat","model":"m","status":200,"stream":true,"prompt_tokens":374,"completion_tokens":44,"ttfb_s":0.1,"latency_s":0.9,"replica":"127.0.0.1:4000","complete":true}"#;
        let e: AccessEntry = serde_json::from_str(line).unwrap();
        let r = e.as_request().unwrap();
        assert_eq!((r.t, r.context_tokens, r.generated_tokens), (1_700_158_546.25, 374, 44));
        let router = AccessEntry { prompt_tokens: None, replica: None, status: 503, ..e.clone() };
        assert_eq!(router.as_request().unwrap_err(), "no token counts (status 503, answered by the router)");
        let late = AccessEntry { time: "noon".into(), ..e };
        assert!(late.as_request().unwrap_err().starts_with("time \"noon\""));
    }

    #[test]
    fn rows_and_errors() {
        let r = parse_azure_row("2023-11-16 18:15:46.25,374,44").unwrap();
        assert_eq!((r.t, r.context_tokens, r.generated_tokens), (1_700_158_546.25, 374, 44));
        assert_eq!(parse_azure_row("5,1,2").unwrap().t, 5.0);
        assert_eq!(
            parse_azure_row("5,1").unwrap_err(),
            "2 fields; expected 3 (TIMESTAMP,ContextTokens,GeneratedTokens)"
        );
        assert!(parse_azure_row("noon,1,1").unwrap_err().starts_with("TIMESTAMP \"noon\" is not a time"));
        assert!(parse_azure_row("5,x,1").unwrap_err().contains("ContextTokens"));
    }

    #[test]
    fn a_trace_is_its_header_then_numbered_rows() {
        let text = "\n  \nTIMESTAMP,ContextTokens,GeneratedTokens\n5,1,2\n\n6,x,1\n7,3,4\n";
        let rows = read_azure(text).unwrap();
        assert_eq!(rows.header_line(), Some(3));
        let rows: Vec<(usize, Result<AzureRow, String>)> = rows.collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0], (4, Ok(AzureRow { t: 5.0, context_tokens: 1, generated_tokens: 2 })));
        assert_eq!(rows[1], (6, Err("ContextTokens \"x\" is not a whole number".to_string())));
        assert_eq!(rows[2].0, 7);
    }

    #[test]
    fn a_wrong_header_names_its_line_and_what_was_expected() {
        assert_eq!(
            read_azure("\na,b\n5,1,2\n").unwrap_err(),
            TraceError {
                line: 2,
                what: "header is \"a,b\"; expected \"TIMESTAMP,ContextTokens,GeneratedTokens\"".to_string()
            }
        );
        let empty = read_azure(" \n\n").unwrap();
        assert_eq!(empty.header_line(), None);
        assert_eq!(empty.count(), 0);
        assert_eq!(read_azure("TIMESTAMP,ContextTokens,GeneratedTokens").unwrap().count(), 0);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(parse_time("1970-01-02T00:00:01"), Some(86_401.0));
        assert_eq!(parse_time("2023-13-01 00:00:00"), None);
    }

    #[test]
    fn the_real_trace_parses() {
        let text = include_str!("../../data/azure-llm-inference-2023-conv.csv");
        let rows = read_azure(text).unwrap();
        assert_eq!(rows.header_line(), Some(1));
        let rows: Vec<AzureRow> = rows.map(|(_, r)| r.unwrap()).collect();
        assert_eq!(rows.len(), 19_366);
        assert!(rows.last().unwrap().t - rows[0].t < 3_700.0, "one hour");
    }
}
