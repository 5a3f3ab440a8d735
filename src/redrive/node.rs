//! A task's node at `{root}/moves/{source}`: what it holds, and how a node another client wrote
//! is told from a task's.

use serde::{Deserialize, Serialize};

use super::TaskReport;
use crate::zk::NodeStat;

/// What a task's node holds: the task's report, and whether a cancel asked it to stop.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TaskNode {
    #[serde(flatten)]
    pub(super) report: TaskReport,
    /// Written by a cancel on another zkq: the task stops, writes how it ended, and leaves the
    /// node for that cancel to delete.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) cancel_requested: bool,
}

impl TaskNode {
    pub(super) fn bytes(&self) -> Vec<u8> {
        // A struct of strings and numbers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What a node at `{root}/moves/{source}` is.
pub(super) enum Found {
    /// A task's node.
    Task(TaskNode),
    /// One no task wrote (another client's): data that does not parse as a task, or a node that
    /// is not ephemeral (every task's is). Why.
    Foreign(String),
}

pub(super) fn judge(data: &[u8], stat: &NodeStat) -> Found {
    if stat.ephemeral_owner == 0 {
        return Found::Foreign("the node is not ephemeral".to_owned());
    }
    match serde_json::from_slice::<TaskNode>(data) {
        Ok(node) => Found::Task(node),
        Err(err) => Found::Foreign(format!("its data is not a task's: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redrive::TaskStatus;

    fn report() -> TaskReport {
        TaskReport {
            handle: "dead:0".to_owned(),
            source: "dead".to_owned(),
            destination: "orders".to_owned(),
            max_per_second: 10,
            status: TaskStatus::Running,
            moved: 3,
            to_move: 9,
            started_at: 1,
            failure: None,
        }
    }

    fn ephemeral() -> NodeStat {
        NodeStat { ephemeral_owner: 7, czxid: 11, ..NodeStat::default() }
    }

    #[test]
    fn a_task_node_reads_back_with_its_cancel_mark_and_without_it() {
        let marked = TaskNode { report: report(), cancel_requested: true }.bytes();
        assert!(
            matches!(judge(&marked, &ephemeral()), Found::Task(node) if node.cancel_requested && node.report == report())
        );
        let plain = TaskNode { report: report(), cancel_requested: false }.bytes();
        assert!(!String::from_utf8_lossy(&plain).contains("cancel_requested"), "written only when set");
        assert!(matches!(judge(&plain, &ephemeral()), Found::Task(node) if !node.cancel_requested));
    }

    #[test]
    fn a_node_no_task_wrote_is_foreign() {
        assert!(matches!(judge(b"\x00not a task", &ephemeral()), Found::Foreign(_)));
        assert!(matches!(judge(b"{}", &ephemeral()), Found::Foreign(_)));
        // Every task's node is ephemeral: a persistent one with a task's data is another client's.
        let data = TaskNode { report: report(), cancel_requested: false }.bytes();
        assert!(matches!(judge(&data, &NodeStat::default()), Found::Foreign(_)));
    }
}
