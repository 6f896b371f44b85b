//! The bounds of the router's exchanges with replicas: how long a
//! connection may idle, and how large a response head or chunk line
//! may be.

use std::time::Duration;

/// How soon after our request a replica's close of a reused connection is
/// taken for its keep-alive timeout having fired as the request arrived
/// (the close is then already on its way: on one network, well under a
/// millisecond) rather than for the replica failing on the request.
pub const KEEP_ALIVE_RACE: Duration = Duration::from_millis(100);

/// How long a connection may sit unused before it is closed rather than
/// reused (replicas close idle connections on their own schedule too).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most header fields in a response head (hyper's limit too).
pub(super) const MAX_HEADERS: usize = 100;

/// Largest response head, and largest trailer section (hyper's read limit).
pub(super) const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;

/// Longest chunk-size line, extensions included.
pub(super) const MAX_CHUNK_LINE: usize = 4096;

/// Read buffer growth.
pub(super) const READ_CHUNK: usize = 8192;
