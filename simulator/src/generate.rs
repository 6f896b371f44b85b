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
//! [`bursts`]: a bursty on/off trace (issue #18): see [`BurstShape`].

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

/// An on/off request process: a quiet Poisson background, and bursts
/// separated by heavy-tailed gaps, each burst a Poisson flood at a peak
/// rate many times the mean. Request sizes are drawn (seeded) from a base
/// trace's rows, so the tokens are real ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BurstShape {
    /// Requests per second between bursts.
    pub quiet_rate: f64,
    /// Gaps between bursts: Pareto with this minimum (s) and shape, cut at `gap_max`.
    pub gap_min: f64,
    pub gap_alpha: f64,
    pub gap_max: f64,
    /// Each burst lasts uniformly in this range (s)...
    pub burst_s: (f64, f64),
    /// ...at a peak rate uniformly in this range (requests/s).
    pub peak_rate: (f64, f64),
}

impl BurstShape {
    /// The shape of the trace issue #18 measured: peaks of 1.6-8 s at
    /// 36-62 requests/s, quiet gaps of 30-140 s.
    pub const ISSUE_18: BurstShape = BurstShape {
        quiet_rate: 0.5,
        gap_min: 30.0,
        gap_alpha: 1.2,
        gap_max: 140.0,
        burst_s: (1.6, 8.0),
        peak_rate: (36.0, 62.0),
    };
}

/// `seconds` of requests shaped by `shape`, sizes from `base`; sorted.
pub fn bursts(base: &[Request], seconds: f64, shape: &BurstShape, seed: u64) -> Vec<Request> {
    if base.is_empty() {
        return Vec::new();
    }
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let poisson = |rng: &mut Rng, from: f64, to: f64, rate: f64, out: &mut Vec<Request>| {
        if rate <= 0.0 {
            return;
        }
        let mut t = from;
        loop {
            t += -(1.0 - rng.unit()).ln() / rate;
            if t >= to {
                break;
            }
            let r = base[(rng.next_u64() % base.len() as u64) as usize];
            out.push(Request { t, ..r });
        }
    };
    let mut t = 0.0;
    while t < seconds {
        // Pareto by inversion: gap_min / U^(1/alpha).
        let gap = (shape.gap_min / (1.0 - rng.unit()).powf(1.0 / shape.gap_alpha)).min(shape.gap_max);
        let quiet_end = (t + gap).min(seconds);
        poisson(&mut rng, t, quiet_end, shape.quiet_rate, &mut out);
        let len = shape.burst_s.0 + rng.unit() * (shape.burst_s.1 - shape.burst_s.0);
        let peak = shape.peak_rate.0 + rng.unit() * (shape.peak_rate.1 - shape.peak_rate.0);
        let burst_end = (quiet_end + len).min(seconds);
        poisson(&mut rng, quiet_end, burst_end, peak, &mut out);
        t = burst_end;
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
    fn bursts_are_short_floods_between_long_quiet_gaps() {
        let base: Vec<Request> =
            (0..50).map(|i| Request { t: f64::from(i), context_tokens: 100 + i, generated_tokens: 10 + i }).collect();
        let shape = BurstShape::ISSUE_18;
        let a = bursts(&base, 3600.0, &shape, 3);
        assert_eq!(a, bursts(&base, 3600.0, &shape, 3), "seeded");
        assert!(a.windows(2).all(|w| w[0].t <= w[1].t) && a.last().unwrap().t < 3600.0);
        assert!(a.iter().all(|r| base
            .iter()
            .any(|b| (b.context_tokens, b.generated_tokens) == (r.context_tokens, r.generated_tokens))));
        // Per-second counts: the busiest seconds run at the peak rates, the
        // mean far below them, and most seconds are quiet.
        let mut per_s = vec![0u32; 3600];
        for r in &a {
            per_s[r.t as usize] += 1;
        }
        let mean = a.len() as f64 / 3600.0;
        let max = *per_s.iter().max().unwrap();
        assert!((30..=90).contains(&max), "peak second {max}");
        assert!(f64::from(max) > 5.0 * mean, "peak {max} vs mean {mean}");
        let quiet = per_s.iter().filter(|&&n| n <= 3).count();
        assert!(quiet > 3000, "{quiet} quiet seconds");
    }

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
