//! Buffers for C calls that copy their answer into the caller's memory
//! and say when it is too small (`getgrnam_r`'s ERANGE, `spank_getenv`'s
//! ESPANK_NOSPACE): start small, double and retry, up to a bound.

/// What one try at a call said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grow<E> {
    /// The buffer was too small; `E` is the error if it already was `max`.
    TooSmall(E),
    /// Any other failure, returned as it is.
    Failed(E),
}

/// Calls `call` with a zeroed buffer of `first` bytes (at least 1),
/// doubled while it answers [`Grow::TooSmall`], up to `max` bytes.
pub fn grow<T, E>(first: usize, max: usize, mut call: impl FnMut(&mut [u8]) -> Result<T, Grow<E>>) -> Result<T, E> {
    let mut len = first.clamp(1, max.max(1));
    loop {
        let mut buf = vec![0u8; len];
        match call(&mut buf) {
            Ok(v) => return Ok(v),
            Err(Grow::TooSmall(e)) if len >= max => return Err(e),
            Err(Grow::TooSmall(_)) => len = len.saturating_mul(2).min(max),
            Err(Grow::Failed(e)) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_bound() {
        let mut sizes = Vec::new();
        let r: Result<(), &str> = grow(3, 20, |b| {
            sizes.push(b.len());
            Err(Grow::TooSmall("small"))
        });
        assert_eq!((r, sizes), (Err("small"), vec![3, 6, 12, 20]));
        let mut sizes = Vec::new();
        let r: Result<usize, &str> = grow(1, 1 << 20, |b| {
            sizes.push(b.len());
            if b.len() >= 100 {
                Ok(b.len())
            } else {
                Err(Grow::TooSmall("small"))
            }
        });
        assert_eq!((r, sizes), (Ok(128), vec![1, 2, 4, 8, 16, 32, 64, 128]));
    }

    #[test]
    fn other_failures_end_it_at_once() {
        let mut n = 0;
        let r: Result<(), i32> = grow(0, 64, |b| {
            n += 1;
            assert!(b.iter().all(|x| *x == 0) && !b.is_empty());
            Err(Grow::Failed(5))
        });
        assert_eq!((r, n), (Err(5), 1));
    }
}
