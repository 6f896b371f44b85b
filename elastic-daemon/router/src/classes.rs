//! Requests served by class (issue #44): the pool's classes down to the
//! request. A request's class comes from its API key (a line of the
//! endpoint's `bearer_tokens_file` may name one), else it is the
//! endpoint's own; a client may lower it (`x-request-class`), never raise
//! it. The queue serves protected classes first, then flexible ones by
//! rank, the keys of a class in turns ([`crate::fair`]); each class has
//! its own bound, and a class below the endpoint's own is shed with 429
//! past it.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::HeaderMap;

use crate::engine_priority::EnginePriority;
use crate::headroom::Headroom;

pub use crate::rank::Rank;

/// The header a client lowers its request's class with.
pub const CLASS_HEADER: &str = "x-request-class";

/// An endpoint's classes: each one's place in the queue, the slots the
/// lower ones leave to those above ([`Headroom`]), and what the engine is
/// told of each ([`EnginePriority`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestClasses {
    /// The endpoint's own class (requests without a class of their key).
    own: Arc<str>,
    /// Each class's rank: 0 for protected classes, the policy's rank for
    /// flexible ones (lower is served first).
    ranks: BTreeMap<Arc<str>, Rank>,
    headroom: Option<Headroom>,
    engine_priority: Option<EnginePriority>,
}

/// A request's class and its place in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub name: Arc<str>,
    pub rank: Rank,
    /// Below the endpoint's own class: shed with 429 past its bound, and
    /// its streams yield their slots to the classes above.
    pub lower: bool,
}

impl RequestClasses {
    /// `ranks`: every class a request may have; `own` must be one.
    pub fn new(own: &str, ranks: impl IntoIterator<Item = (String, u32)>) -> Option<RequestClasses> {
        let ranks: BTreeMap<Arc<str>, Rank> = ranks.into_iter().map(|(n, r)| (Arc::from(n), Rank(r))).collect();
        let own = ranks.keys().find(|k| &***k == own)?.clone();
        Some(RequestClasses { own, ranks, headroom: None, engine_priority: None })
    }

    /// With ceilings for the classes below others ([`crate::headroom`]).
    pub fn with_headroom(mut self, headroom: Headroom) -> RequestClasses {
        self.headroom = Some(headroom).filter(|h| !h.ceilings().is_empty());
        self
    }

    pub fn headroom(&self) -> Option<&Headroom> {
        self.headroom.as_ref()
    }

    /// With each class's value of the engine's own priority
    /// ([`crate::engine_priority`]).
    pub fn with_engine_priority(mut self, p: EnginePriority) -> RequestClasses {
        self.engine_priority = Some(p);
        self
    }

    pub fn engine_priority(&self) -> Option<&EnginePriority> {
        self.engine_priority.as_ref()
    }

    pub fn own(&self) -> &str {
        &self.own
    }

    /// Every class and its rank.
    pub fn all(&self) -> impl Iterator<Item = (&str, Rank)> {
        self.ranks.iter().map(|(n, r)| (&**n, *r))
    }

    pub fn rank(&self, class: &str) -> Option<Rank> {
        self.ranks.get(class).copied()
    }

    /// Whether `rank` is below the endpoint's own class.
    pub fn lower(&self, rank: Rank) -> bool {
        rank > self.ranks.get(&self.own).copied().unwrap_or_default()
    }

    fn class(&self, name: &Arc<str>) -> Class {
        let rank = self.ranks.get(name).copied().unwrap_or_default();
        Class { name: name.clone(), rank, lower: self.lower(rank) }
    }

    /// The class of a request whose key names `keyed` (or none): the key's,
    /// else the endpoint's own; lowered to `x-request-class` when that
    /// names a class ranked at or below it. `Err` says why the header was
    /// refused (a class above the key's, or none of the endpoint's).
    pub fn of(&self, keyed: Option<&Arc<str>>, headers: &HeaderMap) -> Result<Class, String> {
        let base = keyed.filter(|k| self.ranks.contains_key(&***k)).unwrap_or(&self.own);
        let base = self.class(base);
        let Some(asked) = headers.get(CLASS_HEADER) else { return Ok(base) };
        let asked = asked.to_str().map(str::trim).unwrap_or_default();
        let Some((name, rank)) = self.ranks.get_key_value(asked) else {
            let known: Vec<&str> = self.ranks.keys().map(|k| &**k).collect();
            return Err(format!("{CLASS_HEADER}: {asked:?} is not a class of this endpoint ({})", known.join(", ")));
        };
        if *rank < base.rank {
            return Err(format!(
                "{CLASS_HEADER}: {asked:?} ranks above this request's class {:?}; a request may lower its class, never raise it",
                &*base.name
            ));
        }
        Ok(self.class(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes() -> RequestClasses {
        let ranks = [("inference-baseline", 0), ("training", 1), ("inference", 2), ("agents", 3)];
        RequestClasses::new("inference", ranks.map(|(n, r)| (n.to_string(), r))).unwrap()
    }

    fn asking(class: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CLASS_HEADER, class.parse().unwrap());
        h
    }

    #[test]
    fn a_request_has_its_key_s_class_else_the_endpoint_s_and_may_lower_it_only() {
        let c = classes();
        let none = HeaderMap::new();
        let own = c.of(None, &none).unwrap();
        assert_eq!((&*own.name, own.rank, own.lower), ("inference", Rank(2), false));
        let agents: Arc<str> = Arc::from("agents");
        let keyed = c.of(Some(&agents), &none).unwrap();
        assert_eq!((&*keyed.name, keyed.rank, keyed.lower), ("agents", Rank(3), true));
        // Lowered by the header, never raised.
        assert_eq!(&*c.of(None, &asking("agents")).unwrap().name, "agents");
        assert_eq!(&*c.of(None, &asking(" inference ")).unwrap().name, "inference");
        let raise = c.of(Some(&agents), &asking("inference")).unwrap_err();
        assert!(raise.contains("ranks above") && raise.contains("\"agents\""), "{raise}");
        let unknown = c.of(None, &asking("gold")).unwrap_err();
        assert!(unknown.contains("not a class") && unknown.contains("agents"), "{unknown}");
        // A protected class ranks first.
        let base: Arc<str> = Arc::from("inference-baseline");
        assert_eq!(c.of(Some(&base), &none).unwrap().rank, Rank(0));
        assert!(RequestClasses::new("nope", [("a".to_string(), 1)]).is_none());
    }
}
