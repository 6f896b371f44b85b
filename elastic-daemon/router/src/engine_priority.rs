//! The engine's own priority (issue #51 item 3). SGLang (with
//! `--enable-priority-scheduling`) and vLLM (with `--scheduling-policy
//! priority`) schedule by a request's `priority`: SGLang preempts a running
//! request of a lower one inside the engine, keeping its stream, parser and
//! grammar state; vLLM preempts only under KV-cache pressure. The router
//! sets each generation request's `priority` to its class's value, so
//! that the engine orders what the router already let in; a client's own
//! `priority` is replaced, never passed (it would raise itself).

use crate::rank::Rank;

/// Which engine's scale the values are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Higher is served first (SGLang's default).
    HigherFirst,
    /// Lower is served first (vLLM; SGLang with
    /// `--schedule-low-priority-values-first`).
    LowerFirst,
}

/// Each class's value, by rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnginePriority {
    /// (rank, value as JSON), by rank.
    values: Vec<(Rank, String)>,
}

impl EnginePriority {
    /// `ranks`: the endpoint's classes' ranks; `own`: values a class was
    /// given (the rest come from the ranks: the first class 0 with
    /// [`Engine::LowerFirst`], the last 0 with [`Engine::HigherFirst`],
    /// one apart).
    pub fn new(engine: Engine, ranks: &[Rank], own: &[(Rank, i64)]) -> EnginePriority {
        let mut distinct: Vec<Rank> = ranks.to_vec();
        distinct.sort();
        distinct.dedup();
        let n = distinct.len();
        let values = distinct
            .iter()
            .enumerate()
            .map(|(i, rank)| {
                let derived = match engine {
                    Engine::LowerFirst => i,
                    Engine::HigherFirst => n - 1 - i,
                } as i64;
                let v = own.iter().find(|(r, _)| r == rank).map_or(derived, |(_, v)| *v);
                (*rank, v.to_string())
            })
            .collect();
        EnginePriority { values }
    }

    /// The value a request of `rank` is sent with, as JSON.
    pub fn value(&self, rank: Rank) -> Option<&str> {
        self.values.iter().find(|(r, _)| *r == rank).map(|(_, v)| v.as_str())
    }

    /// Each rank and its value.
    pub fn values(&self) -> impl Iterator<Item = (Rank, &str)> {
        self.values.iter().map(|(r, v)| (*r, v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_ranks_on_the_engine_s_scale_unless_a_class_has_its_own() {
        let ranks = [Rank(0), Rank(0), Rank(2), Rank(3)];
        let vllm = EnginePriority::new(Engine::LowerFirst, &ranks, &[]);
        assert_eq!(vllm.values().collect::<Vec<_>>(), [(Rank(0), "0"), (Rank(2), "1"), (Rank(3), "2")]);
        let sglang = EnginePriority::new(Engine::HigherFirst, &ranks, &[(Rank(3), -5)]);
        assert_eq!(sglang.values().collect::<Vec<_>>(), [(Rank(0), "2"), (Rank(2), "1"), (Rank(3), "-5")]);
        assert_eq!(sglang.value(Rank(2)), Some("1"));
        assert_eq!(sglang.value(Rank(9)), None);
    }
}
