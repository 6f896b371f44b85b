//! Names users and admins choose (workload classes, endpoints): one syntax,
//! checked the same way on login nodes and in slurmctld.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} name {value:?}: {reason} (use 1-{max} characters: lowercase letters, digits, '-' or '_', starting with a letter)")]
pub struct NameError {
    pub kind: &'static str,
    pub value: String,
    pub reason: &'static str,
    pub max: usize,
}

pub const MAX_CLASS_NAME: usize = 32;
pub const MAX_ENDPOINT_NAME: usize = 63;

pub fn check(kind: &'static str, s: &str, max: usize) -> Result<(), NameError> {
    let err = |reason| NameError { kind, value: s.chars().take(80).collect(), reason, max };
    if s.is_empty() {
        return Err(err("it is empty"));
    }
    if s.len() > max {
        return Err(err("it is too long"));
    }
    if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(err("it does not start with a lowercase letter"));
    }
    if !s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') {
        return Err(err("it contains a character other than a-z, 0-9, '-' and '_'"));
    }
    Ok(())
}

pub fn check_class(s: &str) -> Result<(), NameError> {
    check("workload class", s, MAX_CLASS_NAME)
}

pub fn check_endpoint(s: &str) -> Result<(), NameError> {
    check("endpoint", s, MAX_ENDPOINT_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_and_invalid() {
        assert!(check_class("training").is_ok());
        assert!(check_class("eval-2_b").is_ok());
        assert!(check_class("").unwrap_err().to_string().contains("empty"));
        assert!(check_class("Training").unwrap_err().to_string().contains("lowercase"));
        assert!(check_class("a b").unwrap_err().to_string().contains("other than"));
        assert!(check_class(&"a".repeat(33)).unwrap_err().to_string().contains("too long"));
        assert!(check_endpoint(&"a".repeat(63)).is_ok());
    }
}
