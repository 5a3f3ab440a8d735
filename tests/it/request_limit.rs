//! Every transaction zkq builds fits ZooKeeper's request limit whatever the ACL: each create of a
//! transaction carries the node's whole ACL, so a long `zookeeper.acl` makes the same batch
//! several times larger. A batch that would not fit is refused (413) before anything is sent;
//! one that would have reset zkq's connection under a size estimate for the default ACL.

use zkq::config::AclEntry;

use zkq_testkit::*;

/// `world:anyone:cdrwa` (zkq's own access) and `extra` read-only `ip` entries.
fn long_acl(extra: usize) -> Vec<AclEntry> {
    let mut acl = vec![AclEntry::parse("world:anyone:cdrwa").expect("entry")];
    acl.extend((0..extra).map(|i| AclEntry::parse(&format!("ip:10.{}.{}.1:r", i / 256, i % 256)).expect("entry")));
    acl
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_a_long_acl_makes_too_large_is_refused_and_the_session_stays() {
    let zk = ZkServer::shared();
    let root = unique_root("acl-limit");
    let mut config = test_config(zk, &root);
    // About 14 KiB of ACL per create: 100 small messages are 1.4 MB encoded, 10 are 140 KB.
    config.zookeeper.acl = Some(long_acl(600));
    let zkq = TestZkq::start_ready(config).await;
    let api = zkq.client();
    let messages = |n: usize| {
        let messages: Vec<_> = (0..n).map(|i| serde_json::json!({ "text": format!("m{i}") })).collect();
        serde_json::json!({ "messages": messages })
    };
    assert_eq!(api.batch_put("q", "", &messages(10)).await.status, 201, "a batch that fits is stored");
    let reconnects = |text: &str| metric_value(text, "zkq_zookeeper_reconnects_total").unwrap_or(0.0);
    let before = reconnects(&zkq.metrics().await);

    let refused = api.batch_put("q", "", &messages(100)).await;
    assert_eq!((refused.status, refused.code.as_str()), (413, "payload_too_large"), "{}", refused.text());

    // Nothing of it was stored, the connection was never reset, and zkq goes on serving.
    let direct = zk_client(zk).await;
    assert_eq!(children(&direct, &format!("{root}/queues/q")).await.len(), 10);
    assert_eq!(api.put("q", "", b"after").await.status, 201);
    assert_eq!(reconnects(&zkq.metrics().await), before, "the refused batch disturbed zkq's connection");
    let (acl, _) = direct.get_acl(&format!("{root}/queues/q")).await.expect("acl");
    assert_eq!(acl.len(), 601, "every node carries the configured ACL");
}
