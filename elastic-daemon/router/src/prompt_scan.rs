//! Finds a chat or completion request's prompt fields in its JSON body
//! without building the request: the strings of `model`,
//! `messages[].role`, `messages[].content` (a string, or the `text` of its
//! parts) and `prompt`, as slices of the body.
//!
//! Why not serde_json: prefix routing reads every request's prompt on the
//! forward path, and a full parse (UTF-8 checks and a look at every byte of
//! every string, a vector of messages) took about a microsecond for a 2 KiB
//! prompt, as much as the rest of the proxy's own work on the request
//! (issue #28 item 5). Here strings are skipped with `memchr` and only
//! their escapes are looked at when they are fed to the hash
//! ([`unescape`]), so the key stays the hash of the prompt's text, whatever
//! escapes a client chose.
//!
//! It reads well-formed bodies exactly as a JSON parser would; on
//! malformed ones it may find fields a parser would refuse, which costs
//! nothing: the replica refuses the request, and the key only routed it.
//! Nesting is bounded (as serde_json bounds it) so a hostile body cannot
//! exhaust the stack.

/// Deepest nesting looked into (serde_json's default limit too).
const MAX_DEPTH: usize = 128;

/// A message's content.
#[derive(Debug, PartialEq)]
pub enum Content<'a> {
    /// A string, raw (escapes as written).
    Text(&'a [u8]),
    /// Content parts: these of [`Prompt::parts`] are their texts.
    Parts(std::ops::Range<usize>),
    /// Absent, null, or of another kind.
    None,
}

/// One message: its role (raw; empty if absent) and content.
#[derive(Debug, PartialEq)]
pub struct Message<'a> {
    pub role: &'a [u8],
    pub content: Content<'a>,
}

/// The prompt fields of a request body, raw.
#[derive(Debug, Default, PartialEq)]
pub struct Prompt<'a> {
    pub model: Option<&'a [u8]>,
    /// `None` when the body has no `messages` array.
    pub messages: Option<Vec<Message<'a>>>,
    /// The texts of every message's content parts, in order.
    pub parts: Vec<&'a [u8]>,
    /// A completion's `prompt`, when it is a string.
    pub prompt: Option<&'a [u8]>,
}

/// The prompt fields of `body`, or `None` if it is not a JSON object.
pub fn scan(body: &[u8]) -> Option<Prompt<'_>> {
    let mut s = Scanner { b: body, i: 0 };
    let mut p = Prompt::default();
    s.object(0, |s, key| {
        match key {
            b"model" => p.model = s.string_or_skip(0)?,
            b"prompt" => p.prompt = s.string_or_skip(0)?,
            b"messages" if s.peek() == Some(b'[') => p.messages = Some(s.messages(&mut p.parts)?),
            _ => s.skip(1)?,
        }
        Some(())
    })?;
    Some(p)
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    /// The next byte that is not white space.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.i) {
            if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(c);
            }
            self.i += 1;
        }
        None
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// A string's contents between its quotes, escapes as written.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            self.i += memchr::memchr2(b'"', b'\\', &self.b[self.i..])?;
            if self.b[self.i] == b'"' {
                self.i += 1;
                return Some(&self.b[start..self.i - 1]);
            }
            // A backslash and the character it escapes (a \u's four hex
            // digits hold no quote or backslash).
            self.i += 2;
            if self.i > self.b.len() {
                return None;
            }
        }
    }

    /// A string value, or `None` for a value of another kind (skipped).
    fn string_or_skip(&mut self, depth: usize) -> Option<Option<&'a [u8]>> {
        if self.peek()? == b'"' {
            return self.string().map(Some);
        }
        self.skip(depth + 1).map(|()| None)
    }

    /// An object's members, each value read by `member` (which must
    /// consume it).
    fn object(&mut self, depth: usize, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array's elements, each read by `element`.
    fn array(&mut self, depth: usize, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Any value, unread.
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => self.object(depth, |s, _| s.skip(depth + 1)),
            b'[' => self.array(depth, |s| s.skip(depth + 1)),
            _ => {
                // A number or a literal: up to the next delimiter.
                let start = self.i;
                while self.b.get(self.i).is_some_and(|c| !b",}] \t\n\r".contains(c)) {
                    self.i += 1;
                }
                (self.i > start).then_some(())
            }
        }
    }

    fn messages(&mut self, parts: &mut Vec<&'a [u8]>) -> Option<Vec<Message<'a>>> {
        let mut messages = Vec::new();
        self.array(1, |s| {
            if s.peek()? != b'{' {
                return s.skip(2);
            }
            let mut m = Message { role: b"", content: Content::None };
            s.object(2, |s, key| {
                match key {
                    b"role" => m.role = s.string_or_skip(2)?.unwrap_or(b""),
                    b"content" => m.content = s.content(parts)?,
                    _ => s.skip(3)?,
                }
                Some(())
            })?;
            messages.push(m);
            Some(())
        })?;
        Some(messages)
    }

    /// A message's content: a string, parts (their texts into `parts`), or
    /// anything else.
    fn content(&mut self, parts: &mut Vec<&'a [u8]>) -> Option<Content<'a>> {
        match self.peek()? {
            b'"' => self.string().map(Content::Text),
            b'[' => {
                let first = parts.len();
                self.array(3, |s| {
                    if s.peek()? != b'{' {
                        return s.skip(4);
                    }
                    s.object(4, |s, key| match key {
                        b"text" => {
                            if let Some(t) = s.string_or_skip(4)? {
                                parts.push(t);
                            }
                            Some(())
                        }
                        _ => s.skip(5),
                    })
                })?;
                Some(Content::Parts(first..parts.len()))
            }
            _ => self.skip(3).map(|()| Content::None),
        }
    }
}

/// The raw value of `body`'s top-level member `name` (the last of that
/// name, however its key is escaped), `Ok(None)` without one; `Err(())`
/// when the body is no JSON object. A look at the keys only: the values
/// are skipped as [`scan`] skips them.
#[allow(clippy::result_unit_err, reason = "no JSON object is the one error, and its callers need no more")]
pub fn member<'a>(body: &'a [u8], name: &[u8]) -> Result<Option<&'a [u8]>, ()> {
    let mut found = None;
    top_level(body, |key, _, value| {
        if decodes_to(key, name)? {
            found = Some(&body[value]);
        }
        Some(())
    })
    .map(|()| found)
    .ok_or(())
}

/// `body`, a JSON object, with its top-level member `name` (however its
/// key is escaped) left out and `"name":value` (`value`: JSON) as its last
/// member; `None` when the body is no JSON object. A server whose parser
/// takes the last of two members of one name would take ours anyway; one
/// that takes the first, or refuses both, gets only ours.
pub fn set_member(body: &[u8], name: &[u8], value: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len() + name.len() + value.len() + 5);
    out.push(b'{');
    top_level(body, |key, member, _| {
        if !decodes_to(key, name)? {
            out.extend_from_slice(&body[member]);
            out.push(b',');
        }
        Some(())
    })?;
    out.push(b'"');
    out.extend_from_slice(name);
    out.extend_from_slice(b"\":");
    out.extend_from_slice(value);
    out.push(b'}');
    Some(out)
}

/// Walks `body`'s top-level members, giving `each` a member's raw key and
/// the byte ranges of the whole member (key to value) and of its value;
/// `None` when the body is no JSON object (or something follows it), or
/// `each` says so.
fn top_level<'a>(
    body: &'a [u8],
    mut each: impl FnMut(&'a [u8], std::ops::Range<usize>, std::ops::Range<usize>) -> Option<()>,
) -> Option<()> {
    let mut s = Scanner { b: body, i: 0 };
    s.eat(b'{')?;
    if s.peek()? != b'}' {
        loop {
            s.peek()?;
            let start = s.i;
            let key = s.string()?;
            s.eat(b':')?;
            s.peek()?;
            let value = s.i;
            s.skip(1)?;
            each(key, start..s.i, value..s.i)?;
            match s.peek()? {
                b',' => s.i += 1,
                b'}' => break,
                _ => return None,
            }
        }
    }
    s.eat(b'}')?;
    s.peek().is_none().then_some(())
}

/// Whether a raw JSON string (escapes as written) is `text`.
fn decodes_to(raw: &[u8], text: &[u8]) -> Option<bool> {
    if memchr::memchr(b'\\', raw).is_none() {
        return Some(raw == text);
    }
    let mut decoded = Vec::with_capacity(raw.len());
    unescape(raw, |b| decoded.extend_from_slice(b))?;
    Some(decoded == text)
}

/// Feeds a raw JSON string's text to `out`, its escapes decoded: runs
/// without escapes pass as they are, each escape as the UTF-8 of its
/// character. `None` on an escape JSON does not have.
pub fn unescape(raw: &[u8], mut out: impl FnMut(&[u8])) -> Option<()> {
    let mut rest = raw;
    while let Some(k) = memchr::memchr(b'\\', rest) {
        out(&rest[..k]);
        let (decoded, used) = escape(&rest[k + 1..])?;
        let mut utf8 = [0u8; 4];
        out(decoded.encode_utf8(&mut utf8).as_bytes());
        rest = &rest[k + 1 + used..];
    }
    out(rest);
    Some(())
}

/// The character an escape (after its backslash) stands for, and how many
/// bytes it took. A lone surrogate becomes U+FFFD.
fn escape(e: &[u8]) -> Option<(char, usize)> {
    let simple = match *e.first()? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let hi = hex4(e.get(1..5)?)?;
            if (0xD800..0xDC00).contains(&hi) && e.get(5..7) == Some(b"\\u") {
                if let Some(lo) = e.get(7..11).and_then(hex4).filter(|lo| (0xDC00..0xE000).contains(lo)) {
                    let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                    return Some((char::from_u32(c)?, 11));
                }
            }
            return Some((char::from_u32(hi).unwrap_or('\u{FFFD}'), 5));
        }
        _ => return None,
    };
    Some((simple, 1))
}

fn hex4(h: &[u8]) -> Option<u32> {
    u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok().filter(|_| h.iter().all(u8::is_ascii_hexdigit))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_top_level_member_is_found_by_its_key_and_nested_ones_are_not() {
        let body = br#"{"messages":[{"stream":true}],"stre\u0061m" : true , "n":2}"#;
        assert_eq!(member(body, b"stream"), Ok(Some(&b"true"[..])));
        assert_eq!(member(body, b"n"), Ok(Some(&b"2"[..])));
        assert_eq!(member(body, b"tools"), Ok(None));
        assert_eq!(member(br#"{"stream":false,"stream":true}"#, b"stream"), Ok(Some(&b"true"[..])), "the last");
        for bad in ["", "[1]", r#"{"a":1"#, r#"{"a":1} x"#] {
            assert_eq!(member(bad.as_bytes(), b"stream"), Err(()), "{bad:?}");
        }
    }

    #[test]
    fn a_member_is_set_last_and_a_client_s_own_of_that_name_goes_whatever_its_escapes() {
        let set = |b: &str| set_member(b.as_bytes(), b"priority", b"7").map(|o| String::from_utf8(o).unwrap());
        assert_eq!(set(r#"{"model":"m","stream":true}"#).unwrap(), r#"{"model":"m","stream":true,"priority":7}"#);
        assert_eq!(set(" { } ").unwrap(), r#"{"priority":7}"#);
        let own = set(r#"{"priority": 1000, "messages":[{"priority":1}], "\u0070riority":5, "n":2}"#).unwrap();
        assert_eq!(own, r#"{"messages":[{"priority":1}],"n":2,"priority":7}"#);
        let v: serde_json::Value = serde_json::from_str(&own).unwrap();
        assert_eq!(v["priority"], 7);
        for bad in ["", "[1]", r#"{"a":1"#, r#"{"a":1} x"#, r#"{"a" 1}"#, "\"x\""] {
            assert_eq!(set(bad), None, "{bad:?}");
        }
    }

    use super::*;

    fn text(raw: &[u8]) -> String {
        let mut s = Vec::new();
        unescape(raw, |b| s.extend_from_slice(b)).unwrap();
        String::from_utf8(s).unwrap()
    }

    #[test]
    fn finds_the_prompt_fields_in_any_order_and_skips_the_rest() {
        let body = br#" { "stream" : true, "messages": [ {"content": "hi \"there\"", "name": {"x": [1, 2.5e3, null]}, "role": "user"},
            {"role": "assistant", "content": null}, 7,
            {"content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}, {"text": "b"}]} ],
            "temperature": -0.5, "model": "m\/1", "prompt": ["not", "a", "string"] } "#;
        let p = scan(body).unwrap();
        assert_eq!(p.model, Some(&br"m\/1"[..]));
        assert_eq!(p.prompt, None);
        let m = p.messages.unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0], Message { role: b"user", content: Content::Text(br#"hi \"there\""#) });
        assert_eq!(m[1], Message { role: b"assistant", content: Content::None });
        assert_eq!(m[2], Message { role: b"", content: Content::Parts(0..2) });
        assert_eq!(p.parts, vec![&b"a"[..], b"b"]);
    }

    #[test]
    fn what_is_not_an_object_or_is_cut_short_has_no_prompt() {
        for body in
            [&b""[..], b"[]", b"\"s\"", b"{\"model\": \"m\"", b"{\"model\" \"m\"}", b"{\"a\": \"\\", b"{\"a\": }"]
        {
            assert_eq!(scan(body), None, "{}", String::from_utf8_lossy(body));
        }
        assert_eq!(scan(b"{}"), Some(Prompt::default()));
    }

    #[test]
    fn deep_nesting_is_refused_not_recursed_into() {
        let deep = format!("{{\"x\": {}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(scan(deep.as_bytes()), None);
        let fine = format!("{{\"x\": {}1{}, \"model\": \"m\"}}", "[".repeat(100), "]".repeat(100));
        assert_eq!(scan(fine.as_bytes()).unwrap().model, Some(&b"m"[..]));
    }

    #[test]
    fn escapes_decode_to_their_characters() {
        assert_eq!(text(br#"a\"b\\c\/d\n\t\r\b\f"#), "a\"b\\c/d\n\t\r\u{8}\u{c}");
        assert_eq!(text(br"\u00e9t\u00E9 \ud83d\ude00!"), "été 😀!");
        assert_eq!(text(br"lone \ud83d here"), "lone \u{FFFD} here");
        assert_eq!(text("plain ünïcode".as_bytes()), "plain ünïcode");
        assert!(unescape(br"bad \x", |_| ()).is_none());
        assert!(unescape(br"short \u12", |_| ()).is_none());
    }
}
