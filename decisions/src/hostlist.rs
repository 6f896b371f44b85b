//! Slurm's host list expressions (`node[1-4,7]`, `gpu-a[01-10]`, `n1,n2`),
//! expanded, as gres.conf and slurm.conf use them; and the range lists
//! inside them (`1-4,7`), which Slurm also uses on their own for GPU
//! indices (`SLURM_JOB_GPUS=0,2-3`): [`ranges`] is onepool's one parser of
//! those, for host lists, GPU index lists and the fake GPU file's minors.

use std::ops::RangeInclusive;

/// Expands a host list; `Err` names the malformed part.
pub fn expand(expr: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top_level(expr) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        match item.find('[') {
            None => out.push(item.to_string()),
            Some(open) => {
                let close = item.rfind(']').filter(|c| *c > open).ok_or_else(|| format!("{item:?}: unbalanced '['"))?;
                let (prefix, list, suffix) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
                for r in ranges(list, HOST_RANGES).map_err(|e| format!("{item:?}: {e}"))? {
                    let width = r.width;
                    for n in r.numbers() {
                        out.push(format!("{prefix}{n:0width$}{suffix}"));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Host lists: any number, zero padding kept, at most 100,000 hosts a range.
const HOST_RANGES: RangeRules = RangeRules { max: u64::MAX, max_len: 100_000, lenient: false };

/// Splits on commas outside brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// Whether `host` is in the list (a malformed list matches nothing).
pub fn contains(expr: &str, host: &str) -> bool {
    expand(expr).is_ok_and(|hosts| hosts.iter().any(|h| h == host))
}

/// One item of a range list: a number (`7`) or an inclusive range (`2-5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub first: u64,
    pub last: u64,
    /// Characters of `first` as written (`01-10`: 2), for the zero padding
    /// of host names.
    pub width: usize,
}

impl Range {
    pub fn numbers(&self) -> RangeInclusive<u64> {
        self.first..=self.last
    }
}

/// What a range list may hold; anything else is a [`RangeError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeRules {
    /// The largest number allowed.
    pub max: u64,
    /// The most numbers one range may hold (`last - first + 1`).
    pub max_len: u64,
    /// Spaces around an item, and empty items, are ignored (`" 0, 2-3,"`);
    /// otherwise they are errors.
    pub lenient: bool,
}

/// What is wrong with a range list, and where: the item (or, for an empty
/// one, its position in the list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeError {
    /// Item `position` (from 1) is empty: `0,,3`, `1,`.
    Empty { list: String, position: usize },
    /// `text`, one end of `item`, is not a whole number.
    NotANumber { item: String, text: String },
    /// `value`, one end of `item`, is above the largest allowed.
    TooLarge { item: String, value: u64, max: u64 },
    /// `item` is a range whose first number is above its last.
    Backwards { item: String },
    /// `item` holds more numbers than one range may.
    TooLong { item: String, len: u64, max_len: u64 },
}

impl std::fmt::Display for RangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // "`x`" when the item is that number alone, "`x` in `1-x`" otherwise.
        let end = |f: &mut std::fmt::Formatter<'_>, text: &str, item: &str| {
            if text == item {
                write!(f, "`{text}`")
            } else {
                write!(f, "`{text}` in `{item}`")
            }
        };
        match self {
            RangeError::Empty { list, position } => {
                write!(f, "item {position} of `{list}` is empty: write numbers and ranges like `0,2,4-7`")
            }
            RangeError::NotANumber { item, text } => {
                end(f, text, item)?;
                f.write_str(" is not a whole number")
            }
            RangeError::TooLarge { item, value, max } => {
                end(f, &value.to_string(), item)?;
                write!(f, " is above {max}, the largest allowed")
            }
            RangeError::Backwards { item } => write!(f, "range `{item}` runs backwards: write the lower number first"),
            RangeError::TooLong { item, len, max_len } => {
                write!(f, "range `{item}` holds {len} numbers, more than the {max_len} allowed")
            }
        }
    }
}

impl std::error::Error for RangeError {}

/// A range list: comma-separated whole numbers and inclusive ranges
/// (`0-15`, `0,2,4-7`, `01-10`), in the order written.
pub fn ranges(list: &str, rules: RangeRules) -> Result<Vec<Range>, RangeError> {
    let mut out = Vec::new();
    for (index, raw) in list.split(',').enumerate() {
        let item = if rules.lenient { raw.trim() } else { raw };
        if item.is_empty() {
            if rules.lenient {
                continue;
            }
            return Err(RangeError::Empty { list: list.to_string(), position: index + 1 });
        }
        let number = |text: &str| match text.parse::<u64>() {
            Ok(value) if value <= rules.max => Ok(value),
            Ok(value) => Err(RangeError::TooLarge { item: item.to_string(), value, max: rules.max }),
            Err(_) => Err(RangeError::NotANumber { item: item.to_string(), text: text.to_string() }),
        };
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let (first, last) = (number(a)?, number(b)?);
        if first > last {
            return Err(RangeError::Backwards { item: item.to_string() });
        }
        let len = (last - first).saturating_add(1);
        if len > rules.max_len {
            return Err(RangeError::TooLong { item: item.to_string(), len, max_len: rules.max_len });
        }
        out.push(Range { first, last, width: a.len() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(expand("node[1-3]").unwrap(), ["node1", "node2", "node3"]);
        assert_eq!(expand("gpu[01-02,7],login").unwrap(), ["gpu01", "gpu02", "gpu7", "login"]);
        assert_eq!(expand("/dev/nvidia[4-5]").unwrap(), ["/dev/nvidia4", "/dev/nvidia5"]);
        assert!(expand("node[1-").is_err());
        assert!(expand("node[3-1]").is_err());
        assert!(contains("node[1-4]", "node3"));
        assert!(!contains("node[1-4]", "node5"));
    }

    #[test]
    fn host_list_errors_name_the_host_item_and_what_is_wrong_in_it() {
        assert_eq!(expand("node[1-").unwrap_err(), "\"node[1-\": unbalanced '['");
        assert_eq!(
            expand("node[3-1]").unwrap_err(),
            "\"node[3-1]\": range `3-1` runs backwards: write the lower number first"
        );
        assert_eq!(expand("n1,node[1-x]").unwrap_err(), "\"node[1-x]\": `x` in `1-x` is not a whole number");
        assert_eq!(
            expand("node[1,,2]").unwrap_err(),
            "\"node[1,,2]\": item 2 of `1,,2` is empty: write numbers and ranges like `0,2,4-7`"
        );
        assert_eq!(
            expand("node[]").unwrap_err(),
            "\"node[]\": item 1 of `` is empty: write numbers and ranges like `0,2,4-7`"
        );
        assert_eq!(
            expand("node[0-100000]").unwrap_err(),
            "\"node[0-100000]\": range `0-100000` holds 100001 numbers, more than the 100000 allowed"
        );
        assert_eq!(expand("node[1-100000]").unwrap().len(), 100_000);
        assert_eq!(expand("node[1, 2]").unwrap_err(), "\"node[1, 2]\": ` 2` is not a whole number");
    }

    const STRICT: RangeRules = RangeRules { max: 253, max_len: u64::MAX, lenient: false };
    const LENIENT: RangeRules = RangeRules { max: u32::MAX as u64, max_len: 4097, lenient: true };

    fn numbers(list: &str, rules: RangeRules) -> Result<Vec<u64>, String> {
        Ok(ranges(list, rules).map_err(|e| e.to_string())?.iter().flat_map(Range::numbers).collect())
    }

    #[test]
    fn range_lists_hold_numbers_and_inclusive_ranges_in_order() {
        assert_eq!(numbers("0-3", STRICT).unwrap(), [0, 1, 2, 3]);
        assert_eq!(numbers("7,0,2-3", STRICT).unwrap(), [7, 0, 2, 3]);
        assert_eq!(numbers("5-5", STRICT).unwrap(), [5]);
        assert_eq!(numbers("253", STRICT).unwrap(), [253]);
        assert_eq!(
            ranges("01-10,7", STRICT).unwrap(),
            [Range { first: 1, last: 10, width: 2 }, Range { first: 7, last: 7, width: 1 }]
        );
    }

    #[test]
    fn lenient_lists_ignore_spaces_and_empty_items() {
        assert_eq!(numbers("", LENIENT).unwrap(), Vec::<u64>::new());
        assert_eq!(numbers(" 0 , 2-3,,", LENIENT).unwrap(), [0, 2, 3]);
        assert_eq!(numbers("0-4096", LENIENT).unwrap().len(), 4097);
        // Spaces inside an item are still wrong.
        assert_eq!(numbers("2 - 3", LENIENT).unwrap_err(), "`2 ` in `2 - 3` is not a whole number");
    }

    #[test]
    fn each_error_says_what_is_wrong_and_where() {
        let e = |list: &str, rules| ranges(list, rules).unwrap_err();
        assert_eq!(e("0,,3", STRICT), RangeError::Empty { list: "0,,3".into(), position: 2 });
        assert_eq!(e("", STRICT).to_string(), "item 1 of `` is empty: write numbers and ranges like `0,2,4-7`");
        assert_eq!(e("a", STRICT).to_string(), "`a` is not a whole number");
        assert_eq!(e("0-a", STRICT).to_string(), "`a` in `0-a` is not a whole number");
        assert_eq!(e("-3", STRICT).to_string(), "`` in `-3` is not a whole number");
        assert_eq!(e("1-2-3", STRICT).to_string(), "`2-3` in `1-2-3` is not a whole number");
        assert_eq!(e("99999999999999999999", STRICT).to_string(), "`99999999999999999999` is not a whole number");
        assert_eq!(e("254", STRICT).to_string(), "`254` is above 253, the largest allowed");
        assert_eq!(e("0-300", STRICT), RangeError::TooLarge { item: "0-300".into(), value: 300, max: 253 });
        assert_eq!(e("0-300", STRICT).to_string(), "`300` in `0-300` is above 253, the largest allowed");
        // The first end is checked first, then the second, then the order.
        assert_eq!(e("300-2", STRICT), RangeError::TooLarge { item: "300-2".into(), value: 300, max: 253 });
        assert_eq!(e("a-b", STRICT), RangeError::NotANumber { item: "a-b".into(), text: "a".into() });
        assert_eq!(e("1,5-2", STRICT).to_string(), "range `5-2` runs backwards: write the lower number first");
        assert_eq!(e("0-5000", LENIENT).to_string(), "range `0-5000` holds 5001 numbers, more than the 4097 allowed");
        assert_eq!(e("4294967296", LENIENT).to_string(), "`4294967296` is above 4294967295, the largest allowed");
    }
}
