//! Server-sent events as they arrive: whole events out of reads that cut
//! them anywhere (a multi-byte character included), the `data:` of one,
//! and a key taken out of an event's JSON without parsing it whole.

use bytes::{Bytes, BytesMut};

/// Whole events out of a body read in arbitrary pieces. An event inside
/// one read is handed out as a slice of it (no copy); only an event cut by
/// a read is put together in a buffer of its own.
#[derive(Default)]
pub struct Splitter {
    /// The start of an event cut by the last read.
    held: BytesMut,
    /// What is left of the last read.
    current: Bytes,
}

impl Splitter {
    /// Bytes read and not yet part of a whole event.
    pub fn held(&self) -> usize {
        self.held.len() + self.current.len()
    }

    pub fn push(&mut self, data: Bytes) {
        if !self.current.is_empty() {
            // The last read's rest had no event end: it joins what is held.
            self.held.extend_from_slice(&self.current);
        }
        self.current = data;
    }

    /// The next whole event, its blank line included.
    pub fn next_event(&mut self) -> Option<Bytes> {
        if self.held.is_empty() {
            let end = event_end(&self.current)?;
            return Some(self.current.split_to(end));
        }
        // An event cut by a read: its end may straddle the two.
        self.held.extend_from_slice(&self.current);
        self.current = Bytes::new();
        let end = event_end(&self.held)?;
        let event = self.held.split_to(end).freeze();
        self.current = self.held.split().freeze();
        Some(event)
    }

    /// What is held, as it is (for a stream the router stops following).
    pub fn take_rest(&mut self) -> Bytes {
        self.held.extend_from_slice(&self.current);
        self.current = Bytes::new();
        self.held.split().freeze()
    }
}

/// The end of the first event in `b` (after its blank line: `\n\n`,
/// `\r\n\r\n` or `\r\r`).
fn event_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(at) = memchr::memchr2(b'\n', b'\r', &b[i..]) {
        let p = i + at;
        let rest = &b[p..];
        if rest.starts_with(b"\n\n") || rest.starts_with(b"\r\r") {
            return Some(p + 2);
        }
        if rest.starts_with(b"\r\n\r\n") {
            return Some(p + 4);
        }
        i = p + 1;
    }
    None
}

/// A JSON key to take out of events, `"KEY":` (searched for once made).
pub struct Key(memchr::memmem::Finder<'static>);

impl Key {
    pub fn new(key: &str) -> Key {
        Key(memchr::memmem::Finder::new(format!("\"{key}\":").as_bytes()).into_owned())
    }
}

/// The key that carries the token ids the router asked for.
pub static LOGPROBS: std::sync::LazyLock<Key> = std::sync::LazyLock::new(|| Key::new("logprobs"));

/// What one event holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Data<'a> {
    /// Its single `data:` field.
    One(&'a [u8]),
    /// No `data:` field (a comment, a keep-alive).
    None,
    /// Several `data:` fields, or fields beside it the router does not know
    /// (`event:`, `id:`): passed on, never followed.
    Other,
}

/// The `data:` of an event.
pub fn data_of(event: &[u8]) -> Data<'_> {
    let mut found = None;
    for line in event.split(|&b| b == b'\n' || b == b'\r') {
        if line.is_empty() || line[0] == b':' {
            continue;
        }
        match line.strip_prefix(b"data:") {
            Some(d) if found.is_none() => found = Some(d.strip_prefix(b" ").unwrap_or(d)),
            _ => return Data::Other,
        }
    }
    found.map_or(Data::None, Data::One)
}

/// The event with `"KEY":VALUE` taken out of its JSON (with the comma
/// that joined it), or `None` when the key is not there. A quote inside a
/// JSON string is always escaped, so `,"KEY":` or `{"KEY":` unescaped is
/// the key itself, never text a model wrote.
pub fn without_key(event: &[u8], key: &Key) -> Option<Bytes> {
    let pattern = key.0.needle();
    let at = key.0.find(event)?;
    let before = event[..at].iter().rposition(|b| !b.is_ascii_whitespace())?;
    let value_start = at + pattern.len();
    let value_end = value_start + value_len(&event[value_start..])?;
    let mut after = value_end;
    while after < event.len() && event[after].is_ascii_whitespace() {
        after += 1;
    }
    let (cut_from, cut_to) = match (event[before], event.get(after)) {
        (b',', _) => (before, value_end),
        (b'{', Some(b',')) => (at, after + 1),
        (b'{', Some(b'}')) => (at, value_end),
        _ => return None,
    };
    let mut out = BytesMut::with_capacity(event.len() - (cut_to - cut_from));
    out.extend_from_slice(&event[..cut_from]);
    out.extend_from_slice(&event[cut_to..]);
    Some(out.freeze())
}

/// The length of the JSON value at the start of `b` (after blanks).
fn value_len(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let start = i;
    while i < b.len() {
        let c = b[i];
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
        } else {
            match c {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    if depth == 0 {
                        // A scalar ended by its object's close.
                        return (i > start).then_some(i);
                    }
                    depth -= 1;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                b',' if depth == 0 => return (i > start).then_some(i),
                _ => {}
            }
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_whole_however_the_reads_cut_them_even_inside_a_character() {
        let stream = "data: {\"c\":\"é—ü\"}\n\ndata: {\"c\":\"x\"}\r\n\r\n: ping\n\ndata: [DONE]\n\n".as_bytes();
        let whole: Vec<Bytes> = {
            let mut s = Splitter::default();
            s.push(Bytes::from_static(stream));
            std::iter::from_fn(|| s.next_event()).collect()
        };
        assert_eq!(whole.len(), 4);
        for cut in 1..stream.len() {
            for second in cut..stream.len() {
                let mut s = Splitter::default();
                let mut got = Vec::new();
                for piece in [&stream[..cut], &stream[cut..second], &stream[second..]] {
                    s.push(Bytes::copy_from_slice(piece));
                    got.extend(std::iter::from_fn(|| s.next_event()));
                }
                assert_eq!(got, whole, "cut at {cut} and {second}");
                assert_eq!(s.held(), 0);
            }
        }
        assert_eq!(std::str::from_utf8(&whole[0]).unwrap(), "data: {\"c\":\"é—ü\"}\n\n");
        assert_eq!(data_of(&whole[1]), Data::One(b"{\"c\":\"x\"}"));
        assert_eq!(data_of(&whole[2]), Data::None);
        assert_eq!(data_of(&whole[3]), Data::One(b"[DONE]"));
        assert_eq!(data_of(b"event: x\ndata: 1\n\n"), Data::Other);
        assert_eq!(data_of(b"data: 1\ndata: 2\n\n"), Data::Other);
    }

    #[test]
    fn a_key_is_taken_out_with_its_value_wherever_it_sits() {
        let e = br#"data: {"choices":[{"delta":{"content":"a,\"logprobs\":{"},"logprobs":{"content":[{"id":1,"bytes":[97]}]},"finish_reason":null}]}"#;
        let out = without_key(e, &LOGPROBS).unwrap();
        assert_eq!(&out[..], br#"data: {"choices":[{"delta":{"content":"a,\"logprobs\":{"},"finish_reason":null}]}"#);
        assert_eq!(&without_key(br#"{"logprobs":null,"a":1}"#, &LOGPROBS).unwrap()[..], br#"{"a":1}"#);
        assert_eq!(&without_key(br#"{"logprobs":"x}"}"#, &LOGPROBS).unwrap()[..], br#"{}"#);
        assert_eq!(&without_key(br#"{"a":1, "logprobs" :1}"#, &LOGPROBS), &None);
        assert_eq!(&without_key(br#"{"a":1, "logprobs":[1,[2]] }"#, &LOGPROBS).unwrap()[..], br#"{"a":1 }"#);
        assert_eq!(without_key(br#"{"a":"no key"}"#, &LOGPROBS), None);
        // Cut short: left alone rather than guessed.
        assert_eq!(without_key(br#"{"a":1,"logprobs":{"content":["#, &LOGPROBS), None);
    }
}
