//! One producer and consumer session of the Rust AWS SDK against zkq's SQS-compatible API:
//! queues, single and batch sends with attributes, receives (the SDK checks every MD5 it is
//! given), visibility changes, deletes, attributes, purge and delete. Prints `ok N` (N checks) and
//! exits 0, or names the first check that failed and exits 1.
//!
//! Usage: zkq-sqs-rust-client ENDPOINT QUEUE

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};

struct Checks(usize);

impl Checks {
    fn check(&mut self, ok: bool, what: &str) {
        if !ok {
            eprintln!("failed: {what}");
            std::process::exit(1);
        }
        self.0 += 1;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(endpoint), Some(queue)) = (args.next(), args.next()) else {
        eprintln!("usage: zkq-sqs-rust-client ENDPOINT QUEUE");
        std::process::exit(2);
    };
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("any", "any", None, None, "static"))
        .build();
    let sqs = Client::from_conf(config);
    let mut checks = Checks(0);
    if let Err(err) = session(&sqs, &queue, &mut checks).await {
        eprintln!("failed: {err:?}");
        std::process::exit(1);
    }
    println!("ok {}", checks.0);
}

async fn session(sqs: &Client, queue: &str, checks: &mut Checks) -> Result<(), aws_sdk_sqs::Error> {
    let url = sqs.create_queue().queue_name(queue).send().await?.queue_url.unwrap_or_default();
    checks.check(url.ends_with(&format!("/{queue}")), "CreateQueue answers the queue's URL");
    let found = sqs.get_queue_url().queue_name(queue).send().await?.queue_url;
    checks.check(found.as_deref() == Some(url.as_str()), "GetQueueUrl");

    let attribute = MessageAttributeValue::builder().data_type("String").string_value("ünïcode").build()?;
    let sent =
        sqs.send_message().queue_url(&url).message_body("one ✓").message_attributes("k", attribute).send().await?;
    checks.check(sent.md5_of_message_attributes.is_some(), "SendMessage answers the attributes' MD5");
    let entries = (0..5)
        .map(|i| SendMessageBatchRequestEntry::builder().id(format!("e{i}")).message_body(format!("batch {i}")).build())
        .collect::<Result<Vec<_>, _>>()?;
    let batch = sqs.send_message_batch().queue_url(&url).set_entries(Some(entries)).send().await?;
    checks.check(batch.successful.len() == 5 && batch.failed.is_empty(), "SendMessageBatch stores all five");

    let depth = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await?;
    let depth = depth.attributes.and_then(|a| a.get(&QueueAttributeName::ApproximateNumberOfMessages).cloned());
    checks.check(depth.as_deref() == Some("6"), "GetQueueAttributes counts six");

    let mut bodies = Vec::new();
    let mut receipts = Vec::new();
    while bodies.len() < 6 {
        let got = sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .wait_time_seconds(2)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await?;
        let messages = got.messages.unwrap_or_default();
        checks.check(!messages.is_empty(), "ReceiveMessage finds the rest");
        for message in messages {
            if message.body.as_deref() == Some("one ✓") {
                let value = message.message_attributes.as_ref().and_then(|a| a.get("k")).and_then(|v| v.string_value());
                checks.check(value == Some("ünïcode"), "the attribute comes back");
            }
            bodies.push(message.body.unwrap_or_default());
            receipts.push(message.receipt_handle.unwrap_or_default());
        }
    }
    bodies.sort();
    checks.check(bodies.len() == 6 && bodies.last().map(String::as_str) == Some("one ✓"), "every body once");

    // One is handed back and received again, counted twice.
    let handed_back = receipts.pop().unwrap_or_default();
    sqs.change_message_visibility().queue_url(&url).receipt_handle(&handed_back).visibility_timeout(0).send().await?;
    let again = sqs
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(2)
        .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
        .send()
        .await?
        .messages
        .unwrap_or_default();
    let count = again
        .first()
        .and_then(|m| m.attributes.as_ref())
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount).cloned());
    checks.check(count.as_deref() == Some("2"), "a message handed back is received a second time");
    receipts.extend(again.into_iter().filter_map(|m| m.receipt_handle));

    let entries = receipts
        .iter()
        .enumerate()
        .map(|(i, receipt)| {
            DeleteMessageBatchRequestEntry::builder().id(format!("d{i}")).receipt_handle(receipt).build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let deleted = sqs.delete_message_batch().queue_url(&url).set_entries(Some(entries)).send().await?;
    checks.check(deleted.successful.len() == 6 && deleted.failed.is_empty(), "DeleteMessageBatch deletes all six");
    let stale = sqs.delete_message().queue_url(&url).receipt_handle("not-a-receipt").send().await;
    checks.check(stale.is_err(), "a receipt that is no receipt is refused");

    sqs.send_message().queue_url(&url).message_body("purged").send().await?;
    sqs.purge_queue().queue_url(&url).send().await?;
    let left = sqs.receive_message().queue_url(&url).send().await?.messages.unwrap_or_default();
    checks.check(left.is_empty(), "PurgeQueue empties the queue");

    sqs.delete_queue().queue_url(&url).send().await?;
    let gone = sqs.get_queue_url().queue_name(queue).send().await;
    checks.check(
        gone.is_err_and(|err| err.into_service_error().is_queue_does_not_exist()),
        "a deleted queue does not exist",
    );
    Ok(())
}
