//! Prefix-aware routing (issue #28): a request goes to the replica that
//! most likely still holds its prompt's beginning in its KV cache, unless
//! that replica is busier than its fair share allows.
//!
//! Why it pays: llama-server (and vLLM, SGLang) keep the prompts they
//! served in their cache (`cache_prompt`); a request that begins like one
//! the replica served recently skips computing that beginning again, so
//! its first token comes sooner. Multi-turn chats and agents resend their
//! whole conversation every turn, so most of each prompt is a prefix some
//! replica has already seen.
//!
//! How the router knows: it never asks the replicas. It remembers, per
//! endpoint, which replica it last sent each prompt prefix to (the block
//! hashes below), as llm-d's approximate prefix scorer does. A replica
//! that drains, is reclaimed or is removed leaves the table at once; a new
//! replica gets the prompts nobody holds yet (they go least-outstanding),
//! which is its fair share.
//!
//! Why the bound: without one, a popular prefix (a shared system prompt)
//! would pile every request onto one replica. A replica takes a request
//! for its prefix only while its in-flight count stays within
//! `load_bound` times the endpoint's average (consistent hashing with
//! bounded loads, Mirrokni, Thorup and Zadimoghaddam, SODA 2018);
//! otherwise the request goes to the least loaded replica as before.

use std::collections::HashMap;

use crate::prompt_scan::{scan, unescape, Content};
use crate::registry::ReplicaId;

/// How one endpoint routes by prefix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefixSettings {
    /// Bytes of rendered prompt per block: a prefix counts only in whole
    /// blocks, so a block is the finest grain two prompts are told apart
    /// by. Smaller blocks find more sharing and cost more hashes.
    pub block_bytes: usize,
    /// How far above the average in-flight count a replica may go for the
    /// prefixes it holds (1.0: never above; 1.25: a quarter above).
    pub load_bound: f64,
    /// Most block hashes remembered per endpoint (16 bytes each with their
    /// replica): the oldest half is forgotten when it is full.
    pub table_entries: usize,
}

impl Default for PrefixSettings {
    fn default() -> Self {
        PrefixSettings { block_bytes: 512, load_bound: 1.25, table_entries: 1 << 16 }
    }
}

/// A request's prompt as a chain of block hashes: entry `i` stands for the
/// prompt's first `i + 1` whole blocks (each hash covers every block before
/// it), so two requests share entry `i` exactly when their first `i + 1`
/// blocks are equal. Empty when the request has no prompt the router can
/// read or a prompt shorter than one block.
pub type PrefixKey = Vec<u64>;

/// The hashes of `body`'s rendered prompt, one per whole block of
/// `block_bytes`. The model's name seeds the chain: the same prompt for
/// two models on one endpoint shares nothing. The prompt is read by
/// [`crate::prompt_scan`] (no JSON parse) and rendered from its text, so
/// two requests with the same messages share their blocks however their
/// clients escaped them.
pub fn prefix_key(body: &[u8], block_bytes: usize) -> PrefixKey {
    if body.is_empty() || block_bytes == 0 {
        return Vec::new();
    }
    render(body, block_bytes).unwrap_or_default()
}

fn render(body: &[u8], block_bytes: usize) -> Option<PrefixKey> {
    let p = scan(body)?;
    let mut model = Vec::new();
    unescape(p.model.unwrap_or(b""), |b| model.extend_from_slice(b))?;
    let mut chain = Chain::new(&model, block_bytes);
    if let Some(messages) = &p.messages {
        for m in messages {
            // Role and content apart, so that "a" + "bc" and "ab" + "c"
            // render differently.
            unescape(m.role, |b| chain.feed(b))?;
            chain.feed(&[0]);
            match &m.content {
                Content::Text(t) => unescape(t, |b| chain.feed(b))?,
                Content::Parts(range) => {
                    for t in &p.parts[range.clone()] {
                        unescape(t, |b| chain.feed(b))?;
                        chain.feed(&[0]);
                    }
                }
                Content::None => {}
            }
            chain.feed(&[0]);
        }
    } else if let Some(prompt) = p.prompt {
        unescape(prompt, |b| chain.feed(b))?;
    }
    Some(chain.blocks)
}

/// The rendered prompt's running hash, sampled at every block boundary.
///
/// A multiply-rotate hash (FxHash's step) over 8-byte words: about ten
/// times faster than SipHash, which matters because it runs over every
/// prompt byte on the request path. It is not collision resistant, and
/// need not be: a collision sends a request to a replica whose cache does
/// not hold its prompt (the server compares the real tokens), bounded by
/// the load bound like any routing choice.
///
/// Four lanes take a block's words in turn (word `j` of the block goes to
/// lane `j % 4`) and are folded into one state at each block boundary:
/// one lane's multiply waits for its previous one, so four independent
/// lanes let the processor run four at once (a 2 KiB prompt hashed in a
/// quarter of the time of one chain). The next block's lanes start from
/// the folded state, so each block's hash still covers every block before
/// it.
struct Chain {
    lanes: [u64; 4],
    /// Words of the current block mixed so far (the next one's lane).
    words: usize,
    /// Bytes of the current 8-byte word, not yet mixed in.
    word: [u8; 8],
    in_word: usize,
    in_block: usize,
    block_bytes: usize,
    blocks: Vec<u64>,
}

impl Chain {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

    fn new(seed: &[u8], block_bytes: usize) -> Chain {
        let mut c =
            Chain { lanes: [0; 4], words: 0, word: [0; 8], in_word: 0, in_block: 0, block_bytes, blocks: Vec::new() };
        for b in seed {
            c.byte(*b);
        }
        c.flush_word();
        c.mix(seed.len() as u64);
        c.fold();
        c
    }

    fn step(lane: u64, word: u64) -> u64 {
        (lane.rotate_left(5) ^ word).wrapping_mul(Self::K)
    }

    fn mix(&mut self, word: u64) {
        let lane = &mut self.lanes[self.words % 4];
        *lane = Self::step(*lane, word);
        self.words += 1;
    }

    /// Folds the lanes into one state, from which the next block's lanes
    /// start; returns it.
    fn fold(&mut self) -> u64 {
        let state = self.lanes.iter().fold(self.words as u64, |s, l| Self::step(s, *l));
        self.lanes = [state, state ^ 1, state ^ 2, state ^ 3];
        self.words = 0;
        state
    }

    /// Whole words mix in alike whether they came byte by byte or at
    /// once, so the hash depends on the bytes and the block boundaries
    /// alone, not on how the prompt was cut into pieces.
    fn byte(&mut self, b: u8) {
        self.word[self.in_word] = b;
        self.in_word += 1;
        if self.in_word == 8 {
            self.mix(u64::from_le_bytes(self.word));
            self.in_word = 0;
        }
    }

    /// A partial word, tagged with its length (only at block boundaries
    /// and after the seed).
    fn flush_word(&mut self) {
        if self.in_word > 0 {
            self.word[self.in_word..].fill(0);
            let w = u64::from_le_bytes(self.word);
            self.mix(w ^ (self.in_word as u64) << 61);
            self.in_word = 0;
        }
    }

    /// Whole words: one at a time up to a lane-0 word, then four at a time
    /// in registers, then the rest.
    fn words(&mut self, bytes: &[u8]) {
        let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
        let mut at = 0;
        while !self.words.is_multiple_of(4) && at < bytes.len() {
            self.mix(word(&bytes[at..at + 8]));
            at += 8;
        }
        let quads = at + (bytes.len() - at) / 32 * 32;
        let mut l = self.lanes;
        for q in bytes[at..quads].chunks_exact(32) {
            l[0] = Self::step(l[0], word(&q[..8]));
            l[1] = Self::step(l[1], word(&q[8..16]));
            l[2] = Self::step(l[2], word(&q[16..24]));
            l[3] = Self::step(l[3], word(&q[24..]));
        }
        self.lanes = l;
        self.words += (quads - at) / 8;
        for w in bytes[quads..].chunks_exact(8) {
            self.mix(word(w));
        }
    }

    /// Feeds prompt bytes; a block boundary records the hash so far.
    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = self.block_bytes - self.in_block;
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            // The word begun before byte by byte, then whole words
            // straight in, then the rest byte by byte.
            let mut i = 0;
            while self.in_word != 0 && i < now.len() {
                self.byte(now[i]);
                i += 1;
            }
            let whole = (now.len() - i) / 8 * 8;
            self.words(&now[i..i + whole]);
            for b in &now[i + whole..] {
                self.byte(*b);
            }
            self.in_block += now.len();
            if self.in_block == self.block_bytes {
                self.flush_word();
                // Avalanche the sample so near-equal states spread in the
                // table's hash map.
                let state = self.fold();
                let mut h = state ^ (state >> 33);
                h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
                h ^= h >> 33;
                self.blocks.push(h);
                self.in_block = 0;
            }
            bytes = rest;
        }
    }
}

/// How a request was routed, for the affinity metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affine {
    /// To the replica that last took its longest known prefix (`blocks`
    /// of its blocks).
    Hit { blocks: usize },
    /// No replica that may take it holds any of its prefix.
    Miss,
    /// The replica that holds it is above the load bound: least
    /// outstanding instead.
    OverBound,
    /// No prefix to route by (no prompt, or shorter than a block).
    NoKey,
}

impl Affine {
    /// Every outcome's label, in the order of [`Affine::slot`].
    pub const SLOTS: [&'static str; 4] = ["hit", "miss", "over_bound", "no_key"];

    pub fn slot(self) -> usize {
        match self {
            Affine::Hit { .. } => 0,
            Affine::Miss => 1,
            Affine::OverBound => 2,
            Affine::NoKey => 3,
        }
    }

    pub fn label(self) -> &'static str {
        Affine::SLOTS[self.slot()]
    }
}

/// Which replica took each prefix last, bounded in size.
#[derive(Debug)]
pub struct Affinity {
    settings: PrefixSettings,
    table: HashMap<u64, (ReplicaId, u64)>,
    /// Counts records; an entry's stamp says how recent it is.
    clock: u64,
}

impl Affinity {
    pub fn new(settings: PrefixSettings) -> Affinity {
        Affinity { settings, table: HashMap::new(), clock: 0 }
    }

    pub fn settings(&self) -> &PrefixSettings {
        &self.settings
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The replica that took the longest prefix of `key` last among those
    /// `eligible` says may take requests, with how many blocks match.
    pub fn lookup(&self, key: &[u64], eligible: impl Fn(ReplicaId) -> bool) -> Option<(ReplicaId, usize)> {
        key.iter()
            .enumerate()
            .rev()
            .find_map(|(i, h)| self.table.get(h).filter(|(id, _)| eligible(*id)).map(|(id, _)| (*id, i + 1)))
    }

    /// `replica` now holds every prefix of `key` (it computes them all).
    pub fn record(&mut self, key: &[u64], replica: ReplicaId) {
        if key.is_empty() {
            return;
        }
        self.clock += 1;
        if self.table.len() + key.len() > self.settings.table_entries.max(1) {
            self.forget_oldest_half();
        }
        for h in key {
            self.table.insert(*h, (replica, self.clock));
        }
    }

    /// A replica that drains or leaves holds nothing any more, as far as
    /// routing goes.
    pub fn forget(&mut self, replica: ReplicaId) {
        self.table.retain(|_, (id, _)| *id != replica);
    }

    fn forget_oldest_half(&mut self) {
        let mut stamps: Vec<u64> = self.table.values().map(|(_, t)| *t).collect();
        let mid = stamps.len() / 2;
        let (_, cut, _) = stamps.select_nth_unstable(mid);
        let cut = *cut;
        self.table.retain(|_, (_, t)| *t > cut);
    }
}

/// Whether a replica with `in_flight` requests may take one more for a
/// prefix it holds: within `bound` times the average over `replicas`
/// ready ones (counting the new request), or at most one above the least
/// loaded replica. The second arm matters when the endpoint is quiet: the
/// average is then below one, and the holder of a conversation would lose
/// its next turn to an idle replica for the sake of a balance nobody
/// needs.
pub fn within_bound(in_flight: u32, total_in_flight: u32, least: u32, replicas: usize, bound: f64) -> bool {
    if replicas == 0 {
        return false;
    }
    let fair = (f64::from(total_in_flight) + 1.0) / replicas as f64;
    let cap = (bound.max(1.0) * fair).ceil().max(f64::from(least) + 2.0);
    f64::from(in_flight) + 1.0 <= cap
}

/// The key as it was made before `prompt_scan`: from serde_json's parse of
/// the whole body. The tests hold the scan to it.
#[cfg(test)]
mod by_serde {
    use super::Chain;
    use super::PrefixKey;
    use std::borrow::Cow;

    /// The JSON fields a prompt is rendered from; everything else is ignored
    /// (and a body that is not JSON has no key). Strings are borrowed from the
    /// body where they hold no escapes: the common case costs no copy.
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(default, borrow)]
        model: Option<Cow<'a, str>>,
        /// Chat completions.
        #[serde(default, borrow)]
        messages: Option<Vec<Message<'a>>>,
        /// Completions: a string (an array of prompts has no single prefix).
        #[serde(default, borrow)]
        prompt: Option<Content<'a>>,
    }

    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(default, borrow)]
        role: Cow<'a, str>,
        #[serde(default, borrow)]
        content: Option<Content<'a>>,
    }

    /// A message's content: a string, or parts of which the text ones count.
    enum Content<'a> {
        Text(Cow<'a, str>),
        Parts(Vec<Cow<'a, str>>),
        Other,
    }

    impl<'de: 'a, 'a> serde::Deserialize<'de> for Content<'a> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit<'a>(std::marker::PhantomData<&'a ()>);
            impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
                type Value = Content<'a>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a string or content parts")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Content<'a>, E> {
                    Ok(Content::Text(Cow::Borrowed(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Content<'a>, E> {
                    Ok(Content::Text(Cow::Owned(v.to_string())))
                }
                fn visit_string<E>(self, v: String) -> Result<Content<'a>, E> {
                    Ok(Content::Text(Cow::Owned(v)))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'a>, A::Error> {
                    let mut texts = Vec::new();
                    while let Some(part) = seq.next_element::<Part<'a>>()? {
                        texts.extend(part.text);
                    }
                    Ok(Content::Parts(texts))
                }
                fn visit_unit<E>(self) -> Result<Content<'a>, E> {
                    Ok(Content::Other)
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Content<'a>, A::Error> {
                    while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                    Ok(Content::Other)
                }
            }
            d.deserialize_any(Visit(std::marker::PhantomData))
        }
    }

    #[derive(serde::Deserialize)]
    struct Part<'a> {
        #[serde(default, borrow)]
        text: Option<Cow<'a, str>>,
    }

    /// The hashes of `body`'s rendered prompt, one per whole block of
    /// `block_bytes`. The model's name seeds the chain: the same prompt for
    /// two models on one endpoint shares nothing.
    pub(super) fn prefix_key_serde(body: &[u8], block_bytes: usize) -> PrefixKey {
        if body.is_empty() || block_bytes == 0 {
            return Vec::new();
        }
        let Ok(req) = serde_json::from_slice::<Request>(body) else { return Vec::new() };
        let mut chain = Chain::new(req.model.as_deref().unwrap_or("").as_bytes(), block_bytes);
        if let Some(messages) = &req.messages {
            for m in messages {
                // Role and content apart, so that "a" + "bc" and "ab" + "c"
                // render differently.
                chain.feed(m.role.as_bytes());
                chain.feed(&[0]);
                match &m.content {
                    Some(Content::Text(t)) => chain.feed(t.as_bytes()),
                    Some(Content::Parts(parts)) => {
                        for t in parts {
                            chain.feed(t.as_bytes());
                            chain.feed(&[0]);
                        }
                    }
                    Some(Content::Other) | None => {}
                }
                chain.feed(&[0]);
            }
        } else if let Some(Content::Text(p)) = &req.prompt {
            chain.feed(p.as_bytes());
        }
        chain.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chat(model: &str, turns: &[(&str, &str)]) -> Vec<u8> {
        let messages: Vec<_> = turns.iter().map(|(r, c)| serde_json::json!({"role": r, "content": c})).collect();
        serde_json::to_vec(&serde_json::json!({"model": model, "messages": messages})).unwrap()
    }

    #[test]
    fn a_later_turn_shares_the_earlier_turns_blocks() {
        let system = "You are a helpful assistant. ".repeat(10);
        let first = chat("m", &[("system", &system), ("user", "What is Slurm?")]);
        let second = chat(
            "m",
            &[("system", &system), ("user", "What is Slurm?"), ("assistant", "A scheduler."), ("user", "And QOS?")],
        );
        let (a, b) = (prefix_key(&first, 64), prefix_key(&second, 64));
        assert!(a.len() >= 4, "{}", a.len());
        assert!(b.len() > a.len());
        assert_eq!(a[..], b[..a.len()], "the first turn's prompt begins the second's: all its whole blocks match");
        let other = chat("m", &[("system", &"Another prompt entirely. ".repeat(10)), ("user", "What is Slurm?")]);
        assert_ne!(prefix_key(&other, 64)[0], a[0]);
    }

    #[test]
    fn the_model_and_the_message_boundaries_count() {
        let long = "x".repeat(300);
        assert_ne!(prefix_key(&chat("a", &[("user", &long)]), 64), prefix_key(&chat("b", &[("user", &long)]), 64));
        let split = |r1: &str, c1: &str| prefix_key(&chat("m", &[(r1, c1), ("user", &long)]), 16);
        assert_ne!(split("user", "ab"), split("userab", ""));
    }

    #[test]
    fn what_has_no_prompt_has_no_key() {
        assert!(prefix_key(b"", 64).is_empty());
        assert!(prefix_key(b"not json", 64).is_empty());
        assert!(prefix_key(br#"{"model":"m"}"#, 64).is_empty());
        assert!(prefix_key(&chat("m", &[("user", "short")]), 64).is_empty(), "shorter than a block");
        let completion = serde_json::to_vec(&serde_json::json!({"prompt": "p".repeat(130)})).unwrap();
        assert_eq!(prefix_key(&completion, 64).len(), 2);
        let parts = serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "t".repeat(100)}, {"type": "image_url", "image_url": {"url": "x"}}]}]});
        assert_eq!(prefix_key(&serde_json::to_vec(&parts).unwrap(), 32).len(), 3);
    }

    #[test]
    fn the_longest_known_prefix_wins_among_eligible_replicas() {
        let mut a = Affinity::new(PrefixSettings::default());
        a.record(&[1, 2], 7);
        a.record(&[1, 2, 3, 4], 8);
        assert_eq!(a.lookup(&[1, 2, 3, 4, 5], |_| true), Some((8, 4)));
        assert_eq!(a.lookup(&[1, 2, 9], |_| true), Some((8, 2)), "the latest to take [1, 2] holds it");
        assert_eq!(a.lookup(&[1, 2, 3, 4], |id| id != 8), None, "8 cannot take it; 7's entries were overwritten");
        a.record(&[1, 2], 7);
        assert_eq!(a.lookup(&[1, 2, 3, 4], |id| id != 8), Some((7, 2)));
        a.forget(7);
        assert_eq!(a.lookup(&[1, 2, 3, 4], |id| id != 8), None);
        assert_eq!(a.lookup(&[1, 2, 3, 4], |_| true), Some((8, 4)));
    }

    #[test]
    fn a_full_table_forgets_its_oldest_half() {
        let mut a = Affinity::new(PrefixSettings { table_entries: 10, ..PrefixSettings::default() });
        for i in 0..10u64 {
            a.record(&[i], i);
        }
        assert_eq!(a.len(), 10);
        a.record(&[100], 100);
        assert!(a.len() <= 10, "{}", a.len());
        assert_eq!(a.lookup(&[0], |_| true), None, "the oldest went");
        assert_eq!(a.lookup(&[9], |_| true), Some((9, 1)), "the newest stayed");
        assert_eq!(a.lookup(&[100], |_| true), Some((100, 1)));
    }

    #[test]
    fn the_bound_lets_a_quiet_endpoint_keep_affinity_and_stops_a_pile_up() {
        assert!(within_bound(0, 0, 0, 3, 1.25));
        // Quiet: one above the least loaded is allowed, two are not.
        assert!(within_bound(1, 1, 0, 3, 1.25));
        assert!(!within_bound(2, 2, 0, 3, 1.25));
        // Busy: 3 replicas, 12 in flight: fair 13/3, bound 1.25 -> ceil(5.42) = 6.
        assert!(within_bound(5, 12, 3, 3, 1.25));
        assert!(!within_bound(6, 12, 3, 3, 1.25));
        assert!(!within_bound(0, 0, 0, 0, 1.25));
        // A bound under 1 is taken as 1: the holder may still get its share.
        assert!(within_bound(1, 3, 1, 3, 0.5));
    }

    #[test]
    fn the_hash_depends_on_the_bytes_not_on_how_they_were_cut() {
        let text: Vec<u8> = (0..200u8).collect();
        let whole = {
            let mut c = Chain::new(b"m", 64);
            c.feed(&text);
            c.blocks
        };
        for cut in [1, 3, 7, 8, 9, 63, 64, 65, 150] {
            let mut c = Chain::new(b"m", 64);
            c.feed(&text[..cut]);
            c.feed(&text[cut..]);
            assert_eq!(c.blocks, whole, "cut at {cut}");
        }
        assert_eq!(whole.len(), 3);
        let mut other = Chain::new(b"n", 64);
        other.feed(&text);
        assert!(other.blocks.iter().zip(&whole).all(|(a, b)| a != b), "another model shares nothing");
    }

    #[test]
    fn escapes_written_either_way_give_the_serde_key() {
        let escaped = br#"{"messages": [{"role": "us\u0065r", "content": "caf\u00e9 \/ \ud83d\ude00 \"q\" \n and more text to fill a block"}], "model": "m\u002f1"}"#;
        let plain = "{\"model\": \"m/1\", \"messages\": [{\"content\": \"café / 😀 \\\"q\\\" \\n and more text to fill a block\", \"role\": \"user\"}]}";
        let key = prefix_key(escaped, 8);
        assert!(key.len() > 4, "{key:?}");
        assert_eq!(key, by_serde::prefix_key_serde(escaped, 8));
        assert_eq!(key, prefix_key(plain.as_bytes(), 8));
    }

    /// A request body as a client could send it: a model or not, messages
    /// with string or part contents (any text: quotes, backslashes, control
    /// characters, any script), other fields beside them.
    fn any_body() -> impl Strategy<Value = Vec<u8>> {
        let text = "(\\PC|[\"\\\\\n\t\u{1}/é😀]){0,40}";
        let content = prop_oneof![
            text.prop_map(serde_json::Value::from),
            proptest::collection::vec(text, 0..3).prop_map(|ts| {
                ts.into_iter().map(|t| serde_json::json!({"type": "text", "text": t})).collect::<serde_json::Value>()
            }),
            Just(serde_json::Value::Null),
        ];
        let message =
            ("(system|user|assistant|[a-z\"]{0,5})", content, any::<bool>()).prop_map(|(role, content, extra)| {
                let mut m = serde_json::json!({"role": role, "content": content});
                if extra {
                    m["name"] = serde_json::json!({"nested": [1, 2.5, null, true, {"x": "y"}]});
                }
                m
            });
        (
            proptest::option::of(text),
            proptest::collection::vec(message, 0..5),
            proptest::option::of(text),
            any::<bool>(),
        )
            .prop_map(|(model, messages, prompt, chat)| {
                let mut b = serde_json::json!({"temperature": 0.5, "stream": true});
                if let Some(m) = model {
                    b["model"] = m.into();
                }
                if chat {
                    b["messages"] = messages.into();
                }
                if let Some(p) = prompt {
                    b["prompt"] = p.into();
                }
                serde_json::to_vec(&b).unwrap()
            })
    }

    proptest! {
        /// The scan gives serde_json's key on every well-formed body.
        #[test]
        fn the_scan_gives_the_key_a_json_parse_gives(body in any_body(), block in 1usize..64) {
            prop_assert_eq!(prefix_key(&body, block), by_serde::prefix_key_serde(&body, block));
        }

        /// Whatever the requests, the holder never goes above the bound
        /// when routed by affinity: the property the bound exists for.
        #[test]
        fn affinity_never_breaks_the_bound(loads in proptest::collection::vec(0u32..50, 1..8), bound in 1.0f64..3.0) {
            let total: u32 = loads.iter().sum();
            let least = *loads.iter().min().unwrap();
            let n = loads.len();
            for (i, l) in loads.iter().enumerate() {
                if within_bound(*l, total, least, n, bound) {
                    let fair = (f64::from(total) + 1.0) / n as f64;
                    prop_assert!(
                        f64::from(*l + 1) <= (bound * fair).ceil() || *l <= least + 1,
                        "replica {i}: {l} in flight, least {least}"
                    );
                }
            }
            // The least loaded replica is always within the bound: routing
            // by affinity never runs out of replicas.
            prop_assert!(within_bound(least, total, least, n, bound));
        }

        /// Equal leading text gives equal leading hashes, and a differing
        /// block makes every later hash differ.
        #[test]
        fn equal_prefixes_share_exactly_their_blocks(common in "[a-z]{0,200}", a in "[a-z]{1,100}", b in "[A-Z]{1,100}") {
            let key = |s: &str| prefix_key(&serde_json::to_vec(&serde_json::json!({"prompt": s})).unwrap(), 16);
            let (ka, kb) = (key(&format!("{common}{a}")), key(&format!("{common}{b}")));
            let shared = common.len() / 16;
            prop_assert_eq!(&ka[..shared.min(ka.len())], &kb[..shared.min(kb.len())]);
            for i in shared..ka.len().min(kb.len()) {
                prop_assert_ne!(ka[i], kb[i]);
            }
        }
    }
}
