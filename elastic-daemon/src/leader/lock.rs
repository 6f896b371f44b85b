//! What the leadership needs of a lock: take it without waiting, confirm
//! it is still held, say who holds it, and let it go by closing.

use std::future::Future;

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

/// A named lock held by one connection at a time, released by the server
/// when that connection ends.
pub trait Lock: Send {
    /// Takes the lock if nobody holds it; never waits for it.
    fn try_acquire(&mut self) -> impl Future<Output = Result<bool, LockError>> + Send;
    /// Whether this connection holds the lock now.
    fn still_held(&mut self) -> impl Future<Output = Result<bool, LockError>> + Send;
    /// Who holds the lock, in words, when the server says.
    fn holder(&mut self) -> impl Future<Output = Result<Option<String>, LockError>> + Send;
    /// Ends the connection, and with it any lock it holds; the next call
    /// connects anew.
    fn close(&mut self) -> impl Future<Output = ()> + Send;
}
