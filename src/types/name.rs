//! Names of queues and counters: one URL segment and one ZooKeeper node name.

/// Longest queue or counter name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Checks a queue or counter name: what may appear as one URL segment and one ZooKeeper node name.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err("must be 1 to 200 characters");
    }
    if name == "." || name == ".." {
        return Err("must not be . or ..");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        return Err("may contain only A-Z a-z 0-9 . _ -");
    }
    Ok(())
}
