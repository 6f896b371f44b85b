//! The Mooncake FAST'25 conversation trace (data/NOTICE.md) as chat
//! requests whose prompts share text exactly where the trace's prompts
//! share blocks: each block hash becomes the same few words every time it
//! appears, so two requests with the same leading hash ids have the same
//! leading text, and a server's prompt cache can reuse it as the real
//! one would.
//!
//! Scaled down so that a CPU serving SmolLM2 copes: a 512-token block
//! becomes `words_per_block` words, prompts keep at most `max_blocks`
//! blocks (their leading ones: that is where the sharing is), answers are
//! the trace's lengths divided and bounded.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::{Prompted, Trace};

/// How the trace's sizes become this machine's.
#[derive(Clone, Copy, Debug)]
pub struct MooncakeScale {
    pub words_per_block: usize,
    pub max_blocks: usize,
    pub answer_div: u32,
    pub answer_tokens: (u32, u32),
}

impl MooncakeScale {
    /// About 16 tokens per 512-token block and at most 48 blocks (about
    /// 770 tokens of prompt), answers a fiftieth of the trace's (2 to 16
    /// tokens): SmolLM2-135M on one CPU thread answers in about a second.
    pub const CPU: MooncakeScale =
        MooncakeScale { words_per_block: 12, max_blocks: 48, answer_div: 50, answer_tokens: (2, 16) };
}

#[derive(Deserialize)]
struct Line {
    timestamp: u64,
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// A vocabulary of short common words: every word is one token or two
/// for most tokenizers, and no word joins its neighbour into one token.
const WORDS: [&str; 64] = [
    "the", "pool", "shares", "its", "GPUs", "between", "training", "and", "serving", "so", "no", "island", "sits",
    "idle", "while", "work", "waits", "queue", "node", "job", "model", "cache", "prompt", "answer", "token", "batch",
    "replica", "router", "request", "cluster", "memory", "time", "fast", "slow", "first", "last", "each", "every",
    "some", "more", "less", "new", "old", "data", "file", "line", "word", "block", "page", "step", "run", "stop",
    "start", "end", "open", "close", "read", "write", "send", "take", "give", "hold", "free", "busy",
];

/// The words of block `hash`: the same for every request that has it.
fn block_text(hash: u64, words: usize, out: &mut String) {
    let mut x = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    for _ in 0..words {
        // splitmix64: a different word sequence for each hash.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[(z % WORDS.len() as u64) as usize]);
    }
}

/// The trace at `path` (JSON lines) as arrival times and prompts; errors
/// name the file and line.
pub fn load(path: &Path, scale: MooncakeScale) -> anyhow::Result<(Trace, Vec<Prompted>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the trace {}", path.display()))?;
    read(&text, scale).map_err(|e| anyhow::anyhow!("{}:{e}", path.display()))
}

fn read(text: &str, scale: MooncakeScale) -> anyhow::Result<(Trace, Vec<Prompted>)> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let l: Line = serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{}: {e}", i + 1))?;
        let mut prompt = String::new();
        for h in l.hash_ids.iter().take(scale.max_blocks) {
            block_text(*h, scale.words_per_block, &mut prompt);
        }
        let (lo, hi) = scale.answer_tokens;
        let max_tokens = (l.output_length / scale.answer_div.max(1)).clamp(lo, hi);
        rows.push((l.timestamp as f64 / 1000.0, prompt, max_tokens));
    }
    let Some(first) = rows.iter().map(|r| r.0).reduce(f64::min) else { bail!("no requests in the trace") };
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let trace = Trace { rows: rows.iter().map(|(t, p, m)| (t - first, p.split(' ').count() as u32, *m)).collect() };
    let prompts = rows.into_iter().map(|(_, p, m)| Prompted { prompt: Arc::from(p), max_tokens: m }).collect();
    Ok((trace, prompts))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINES: &str = r#"{"timestamp": 0, "input_length": 1500, "output_length": 500, "hash_ids": [0, 1, 2]}
{"timestamp": 250, "input_length": 2100, "output_length": 3, "hash_ids": [0, 1, 2, 3, 4]}

{"timestamp": 100, "input_length": 900, "output_length": 9000, "hash_ids": [0, 7]}
"#;

    #[test]
    fn shared_blocks_become_shared_text_and_the_rest_differs() {
        let (trace, prompts) = read(LINES, MooncakeScale::CPU).unwrap();
        assert_eq!(trace.rows.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0.0, 0.1, 0.25]);
        let (a, b, c) = (&prompts[0].prompt, &prompts[2].prompt, &prompts[1].prompt);
        assert_eq!(a.split(' ').count(), 36);
        assert!(b.starts_with(&**a), "[0,1,2] begins [0,1,2,3,4]");
        let two_blocks: Vec<&str> = a.split(' ').take(24).collect();
        assert!(!c.starts_with(&two_blocks.join(" ")), "[0,7] shares block 0 only");
        let one_block: Vec<&str> = a.split(' ').take(12).collect();
        assert!(c.starts_with(&one_block.join(" ")));
        assert_eq!([prompts[0].max_tokens, prompts[1].max_tokens, prompts[2].max_tokens], [10, 16, 2]);
        assert_eq!(trace.rows[0].1, 36);
    }

    #[test]
    fn a_bad_line_is_named() {
        let e = read("{\"timestamp\": 0}\n", MooncakeScale::CPU).unwrap_err().to_string();
        assert!(e.starts_with("1: missing field"), "{e}");
        assert!(read("", MooncakeScale::CPU).is_err());
    }

    #[test]
    fn the_project_copy_reads_whole() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mooncake-fast25-conversation-3000.jsonl");
        let (trace, prompts) = load(&path, MooncakeScale::CPU).unwrap();
        assert_eq!((trace.rows.len(), prompts.len()), (3000, 3000));
        assert!((trace.rows.last().unwrap().0 - 987.0).abs() < 1e-9);
        assert!(prompts.iter().all(|p| p.prompt.split(' ').count() <= 48 * 12));
    }
}
