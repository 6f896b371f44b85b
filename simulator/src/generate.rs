//! The benchmark's long inputs, generated deterministically.
//!
//! [`tile`]: the one-hour Azure trace repeated hour after hour for `days`
//! days under a diurnal envelope `e(h) = 0.6 + 0.4 sin(2π (h - 8) / 24)`
//! (h = hour of day; lowest at 02:00, highest at 14:00). Hour `k` keeps
//! each request of the base hour `f·e(k)` times on average (the whole part
//! always, the fraction by a seeded coin), shifted by `k` hours plus a
//! sub-second jitter, where `f` is chosen so the total is `target`
//! requests. [`jobs`]: a batch history with one job every ~`gap_s`
//! seconds, 1-16 GPUs (whole 8-GPU nodes above 8) and 30 min to 12 h.

use crate::input::azure::Request;

/// xorshift64*: small, fast, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn envelope(hour_of_day: f64) -> f64 {
    0.6 + 0.4 * (2.0 * std::f64::consts::PI * (hour_of_day - 8.0) / 24.0).sin()
}

/// Tiles `base` (one hour, any start) to `days` days with about `target` requests.
pub fn tile(base: &[Request], days: u32, target: u64, seed: u64) -> Vec<Request> {
    let Some(first) = base.first().map(|r| r.t) else { return Vec::new() };
    let hours = days * 24;
    let env_sum: f64 = (0..hours).map(|h| envelope(f64::from(h % 24))).sum();
    let f = target as f64 / (env_sum * base.len() as f64);
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(target as usize + target as usize / 50);
    for h in 0..hours {
        let m = f * envelope(f64::from(h % 24));
        for r in base {
            let mut k = m.floor() as u32;
            if rng.unit() < m - m.floor() {
                k += 1;
            }
            for _ in 0..k {
                let t = (r.t - first).clamp(0.0, 3599.999) + f64::from(h) * 3600.0 + rng.unit() * 0.5;
                out.push(Request { t, ..*r });
            }
        }
    }
    out.sort_by(|a, b| a.t.total_cmp(&b.t));
    out
}

/// A generated batch history, as the simple CSV format.
pub fn jobs(days: u32, gap_s: f64, class: &str, seed: u64) -> String {
    let mut rng = Rng::new(seed);
    let mut out = String::from("submit,duration,gpus,gpus_per_node,class\n");
    let mut t = 0.0;
    let end = f64::from(days) * 86_400.0;
    while t < end {
        let gpus = [1u32, 1, 2, 4, 8, 8, 16][(rng.next_u64() % 7) as usize];
        let per = gpus.min(8);
        let dur = 1800.0 + rng.unit() * 41_400.0;
        out.push_str(&format!("{t:.0},{dur:.0},{gpus},{per},{class}\n"));
        t += gap_s * (0.5 + rng.unit());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiling_hits_the_target_and_is_deterministic() {
        let base: Vec<Request> =
            (0..1000).map(|i| Request { t: f64::from(i) * 3.6, context_tokens: 10, generated_tokens: 5 }).collect();
        let a = tile(&base, 2, 100_000, 7);
        let n = a.len() as f64;
        assert!((n - 100_000.0).abs() < 1_000.0, "{n}");
        assert!(a.windows(2).all(|w| w[0].t <= w[1].t));
        assert_eq!(a, tile(&base, 2, 100_000, 7));
        assert!(a.last().unwrap().t < 2.0 * 86_400.0);
    }
}
