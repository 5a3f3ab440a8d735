//! Where zkq keeps its nodes under `zookeeper.root`: the one place these paths are written, so
//! that the tree a Curator application, kazoo or an operator sees is stated here once.
//!
//! ```text
//! {root}/queues/{queue}        a dynamic queue (or a declared one without its own `path`)
//! {root}/locks/{queue}         its lock directory (Curator's lockPath)
//! {root}/deliveries/{queue}    delivery counts of its leased messages
//! {root}/idempotency/{queue}   records of its idempotency keys
//! {root}/sqs/tags/{queue}     its tags, set through the SQS-compatible API
//! {root}/settings/{queue}     a dynamic queue's own settings (set through the SQS-compatible API)
//! {root}/moves/{queue}        the message move task running for it (ephemeral)
//! {root}/claims                claim markers: evidence for transactions whose answer was lost
//! {root}/counters/{counter}    a dynamic counter (Curator SharedCount)
//! ```

/// The paths under one `zookeeper.root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    root: String,
}

impl Layout {
    pub(crate) fn new(root: &str) -> Layout {
        Layout { root: root.to_owned() }
    }

    /// The parent of dynamic queues.
    pub(crate) fn queues(&self) -> String {
        format!("{}/queues", self.root)
    }

    pub(crate) fn queue(&self, queue: &str) -> String {
        format!("{}/queues/{queue}", self.root)
    }

    pub(crate) fn locks(&self, queue: &str) -> String {
        format!("{}/locks/{queue}", self.root)
    }

    /// The sidecars taking from a queue now: one ephemeral node each (`queue/cache/fleet.rs`).
    pub(crate) fn members(&self, queue: &str) -> String {
        format!("{}/members/{queue}", self.root)
    }

    pub(crate) fn deliveries(&self, queue: &str) -> String {
        format!("{}/deliveries/{queue}", self.root)
    }

    /// The parent of every queue's idempotency records.
    pub(crate) fn idempotency(&self) -> String {
        format!("{}/idempotency", self.root)
    }

    pub(crate) fn idempotency_of(&self, queue: &str) -> String {
        format!("{}/idempotency/{queue}", self.root)
    }

    /// A queue's tags (the SQS-compatible API's `TagQueue`), a JSON object of strings.
    pub(crate) fn tags(&self, queue: &str) -> String {
        format!("{}/sqs/tags/{queue}", self.root)
    }

    /// The parent of dynamic queues' settings.
    pub(crate) fn settings_dir(&self) -> String {
        format!("{}/settings", self.root)
    }

    /// A dynamic queue's own settings.
    pub(crate) fn settings(&self, queue: &str) -> String {
        format!("{}/settings/{queue}", self.root)
    }

    /// The parent of running message move tasks.
    pub(crate) fn moves_dir(&self) -> String {
        format!("{}/moves", self.root)
    }

    /// The message move task running for source queue `queue`.
    pub(crate) fn moves(&self, queue: &str) -> String {
        format!("{}/moves/{queue}", self.root)
    }

    pub(crate) fn claims(&self) -> String {
        format!("{}/claims", self.root)
    }

    pub(crate) fn counter(&self, counter: &str) -> String {
        format!("{}/counters/{counter}", self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_sit_under_the_root() {
        let layout = Layout::new("/app/zkq");
        assert_eq!(layout.queue("orders"), "/app/zkq/queues/orders");
        assert_eq!(layout.locks("orders"), "/app/zkq/locks/orders");
        assert_eq!(layout.deliveries("orders"), "/app/zkq/deliveries/orders");
        assert_eq!(layout.idempotency_of("orders"), "/app/zkq/idempotency/orders");
        assert_eq!(layout.tags("orders"), "/app/zkq/sqs/tags/orders");
        assert_eq!(layout.moves("orders"), "/app/zkq/moves/orders");
        assert_eq!(layout.claims(), "/app/zkq/claims");
        assert_eq!(layout.counter("hits"), "/app/zkq/counters/hits");
    }

    /// A tidy check: no other source file writes a path under the root by hand (the names of
    /// the tree's directories appear in a `format!` only here).
    #[test]
    fn no_other_file_formats_a_path_under_the_root() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut offenders = Vec::new();
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src is readable").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") || path.ends_with("types/layout.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("a source file is text");
                for (number, line) in text.lines().enumerate() {
                    let by_hand = line.contains("format!(")
                        && [
                            "/queues/",
                            "/locks/",
                            "/deliveries/",
                            "/idempotency",
                            "/claims",
                            "/counters/",
                            "/sqs/",
                            "/moves",
                        ]
                        .iter()
                        .any(|dir| line.contains(&format!("}}{dir}")));
                    if by_hand {
                        offenders.push(format!("{}:{}: {}", path.display(), number + 1, line.trim()));
                    }
                }
            }
        }
        assert!(offenders.is_empty(), "paths under the root belong in types::Layout:\n{}", offenders.join("\n"));
    }
}
