//! What the replica side and onepoold agree on without linking each
//! other's code: the status header of a draining replica (the launcher
//! sends it, the router's proxy reads it) and the replica job's name with
//! its port (the controller submits and finds its jobs by it). A per-node
//! job's step names are [`crate::replica_group`]'s.

/// The launcher's answer while a replica drains: 503 with this header set
/// to "1". The request was not processed, so it is always retried.
pub const DRAINING_HEADER: &str = "x-onepool-draining";

/// The replica job's name: the port it listens on is part of it.
pub fn job_name(endpoint: &str, port: u16) -> String {
    format!("onepool-{endpoint}-{port}")
}

/// The port encoded in a replica job's name, if the name is this endpoint's.
pub fn port_from_name(endpoint: &str, name: &str) -> Option<u16> {
    let port = name.strip_prefix("onepool-")?.strip_prefix(endpoint)?.strip_prefix('-')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_port_and_only_this_endpoint_s_parse() {
        assert_eq!(job_name("llm", 18000), "onepool-llm-18000");
        assert_eq!(port_from_name("llm", "onepool-llm-18000"), Some(18000));
        assert_eq!(port_from_name("llm-2", "onepool-llm-2-18000"), Some(18000));
        assert_eq!(port_from_name("llm", "onepool-llm-2-18000"), None);
        assert_eq!(port_from_name("llm", "onepool-llm-+18000"), None);
        assert_eq!(port_from_name("llm", "onepool-llm-"), None);
        assert_eq!(port_from_name("llm", "other-llm-18000"), None);
    }
}
