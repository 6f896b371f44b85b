//! The lock's names, which only holders of the replica key can make
//! (issue #42). MariaDB's named locks need no privilege: any account on
//! the server may take or wait for any name it knows. A public name
//! (`onepoold.<ClusterName>`) let another account wait behind the holder
//! and win the lock when it let go, after which every instance followed
//! and nobody acted. So the name is an HMAC of the site's lock name under
//! the replica key, which every instance holds and nobody else may read.
//!
//! The name alone can leak (an account with the PROCESS privilege sees
//! statements in the process list). So the holder also proves itself: it
//! takes a second lock whose name is an HMAC, under the same key, of its
//! own database connection id. Followers check that proof; a holder
//! without it is not an onepoold instance of this configuration, and they
//! say so. Taking a leaked name gets a squatter only that alarm, never a
//! silent standstill.

use ring::hmac;

/// The prefix of every name (64 characters at most, MariaDB's limit).
const PREFIX: &str = "onepoold-";
/// Hex digits of the HMAC kept: 160 bits.
const DIGITS: usize = 40;

/// The lock's names for one configuration.
#[derive(Clone)]
pub struct LockNames {
    key: hmac::Key,
    /// The site's name for the lock (`[ha] lock_name`, else the cluster's
    /// name), the same on every instance.
    site: String,
    /// The lock itself.
    pub main: String,
}

impl std::fmt::Debug for LockNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("LockNames").field("site", &self.site).field("main", &self.main).finish()
    }
}

impl LockNames {
    pub fn new(replica_key: &str, site: &str) -> LockNames {
        let key = hmac::Key::new(hmac::HMAC_SHA256, replica_key.as_bytes());
        let main = name(&key, &format!("lock\0{site}"));
        LockNames { key, site: site.to_string(), main }
    }

    /// The lock that proves the connection `id` holds the main lock for an
    /// instance that has the replica key.
    pub fn proof(&self, connection_id: u64) -> String {
        name(&self.key, &format!("acting\0{}\0{connection_id}", self.site))
    }

    /// The site's name, as configured (for the log; it is no secret).
    pub fn site(&self) -> &str {
        &self.site
    }
}

fn name(key: &hmac::Key, message: &str) -> String {
    let tag = hmac::sign(key, message.as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{PREFIX}{}", &hex[..DIGITS])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_need_the_key_and_differ_per_site_and_connection() {
        let a = LockNames::new("0123456789abcdef0123456789abcdef", "dev");
        assert_eq!(a.main, LockNames::new("0123456789abcdef0123456789abcdef", "dev").main, "every instance agrees");
        assert!(a.main.starts_with("onepoold-") && a.main.len() == 9 + 40 && a.main.len() <= 64, "{}", a.main);
        assert!(!a.main.contains("dev"), "the site's name is not in it: {}", a.main);
        assert_ne!(a.main, LockNames::new("another key of thirty-two chars!", "dev").main);
        assert_ne!(a.main, LockNames::new("0123456789abcdef0123456789abcdef", "prod").main);
        assert_ne!(a.proof(7), a.proof(8));
        assert_ne!(a.proof(7), a.main);
        assert_ne!(a.proof(7), LockNames::new("another key of thirty-two chars!", "dev").proof(7));
        assert!(!format!("{a:?}").contains("0123456789abcdef"), "{a:?}");
    }
}
