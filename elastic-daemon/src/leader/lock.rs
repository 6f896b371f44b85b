//! What the leadership needs of a lock: take it (queued behind its holder
//! for a while), confirm it is still held, say who holds it and whether
//! that holder proved itself one of ours, and let it go by closing.

use std::future::Future;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{what}: {source}")]
    Database {
        what: String,
        #[source]
        source: mysql_async::Error,
    },
    #[error("{0}")]
    Answer(String),
}

/// Who holds the lock, as a follower sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// In words: the connection's client address and id, as far as the
    /// server shows them.
    pub description: String,
    /// Whether it holds the proof only an instance with the replica key can
    /// make ([`super::names`]); `false`: not an onepoold instance of this
    /// configuration.
    pub proven: bool,
}

/// A named lock held by one connection at a time, released by the server
/// when that connection ends.
pub trait Lock: Send {
    /// Takes the lock, waiting up to `wait` in the server's queue for its
    /// holder to let go (so that a follower is served the moment it does);
    /// then proves the holding ([`super::names`]).
    fn acquire(&mut self, wait: Duration) -> impl Future<Output = Result<bool, LockError>> + Send;
    /// Whether this connection holds the lock now.
    fn still_held(&mut self) -> impl Future<Output = Result<bool, LockError>> + Send;
    /// Who holds the lock, when the server says anyone does.
    fn holder(&mut self) -> impl Future<Output = Result<Option<Holder>, LockError>> + Send;
    /// Ends the connection, and with it any lock it holds; the next call
    /// connects anew.
    fn close(&mut self) -> impl Future<Output = ()> + Send;
}
