//! A request class's place in an endpoint's queue.

/// A request's place in the queue: lower ranks are served first; requests
/// without a class all have the default, first come first served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank(pub u32);
