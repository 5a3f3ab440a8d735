"""One SQS producer/consumer session through a real AWS SDK (boto3), against zkq's SQS-compatible
listener: every action zkq serves, its answers and its errors, as an app using the SDK sees them.

Usage: client.py ENDPOINT QUEUE PROTOCOL, where PROTOCOL is the wire protocol this botocore is
expected to speak (`json` for current releases, `query` for Debian's 1.29). Prints `ok N checks`.
"""

import hashlib
import json
import sys

import boto3
import botocore

import checks
from checks import check, error_of

endpoint, queue, protocol = sys.argv[1:4]
sqs = boto3.client(
    "sqs",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="any",
    aws_secret_access_key="any",
    config=botocore.config.Config(retries={"max_attempts": 1}),
)


def md5(text):
    return hashlib.md5(text.encode()).hexdigest()


check(sqs.meta.service_model.protocol == protocol, f"botocore speaks {sqs.meta.service_model.protocol}")
url = sqs.create_queue(QueueName=queue)["QueueUrl"]
check(url.endswith(f"/000000000000/{queue}"), url)
check(sqs.create_queue(QueueName=queue)["QueueUrl"] == url, "CreateQueue is idempotent")
check(sqs.get_queue_url(QueueName=queue)["QueueUrl"] == url, "GetQueueUrl")
check(url in sqs.list_queues(QueueNamePrefix=queue[:5]).get("QueueUrls", []), "ListQueues")

sent = sqs.send_message(QueueUrl=url, MessageBody="héllo <&> \"world\"")
check(sent["MD5OfMessageBody"] == md5("héllo <&> \"world\""), "MD5OfMessageBody")
first_id = sent["MessageId"]
batch = sqs.send_message_batch(
    QueueUrl=url, Entries=[{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(3)]
)
check([e["Id"] for e in sorted(batch["Successful"], key=lambda e: e["Id"])] == ["m0", "m1", "m2"], batch)
check(all(e["MD5OfMessageBody"] == md5(f"body {e['Id'][1:]}") for e in batch["Successful"]), "batch MD5s")
check(not batch.get("Failed"), batch.get("Failed"))

got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2, AttributeNames=["All"])
messages = got["Messages"]
check(len(messages) == 4, f"{len(messages)} messages")
check(messages[0]["MessageId"] == first_id and messages[0]["Body"] == "héllo <&> \"world\"", messages[0])
for m in messages:
    check(m["MD5OfBody"] == md5(m["Body"]), "MD5OfBody")
    check(m["Attributes"]["ApproximateReceiveCount"] == "1", m["Attributes"])
    check(int(m["Attributes"]["SentTimestamp"]) > 1_600_000_000_000, m["Attributes"])
    first_receive = int(m["Attributes"]["ApproximateFirstReceiveTimestamp"])
    check(first_receive >= int(m["Attributes"]["SentTimestamp"]), m["Attributes"])
check(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == [], "all four are in flight")
attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
check(attributes["ApproximateNumberOfMessagesNotVisible"] == "4", attributes)
check(attributes["QueueArn"] == f"arn:aws:sqs:us-east-1:000000000000:{queue}", attributes)

sqs.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
# Visibility 0: released now, delivered again, counted twice.
sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=messages[1]["ReceiptHandle"], VisibilityTimeout=0)
again = sqs.receive_message(
    QueueUrl=url, WaitTimeSeconds=2, AttributeNames=["ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp"]
)["Messages"]
check(again[0]["MessageId"] == messages[1]["MessageId"], "the released message comes back")
first_of_released = messages[1]["Attributes"]["ApproximateFirstReceiveTimestamp"]
check(
    again[0]["Attributes"] == {"ApproximateReceiveCount": "2", "ApproximateFirstReceiveTimestamp": first_of_released},
    again[0]["Attributes"],
)
changed = sqs.change_message_visibility_batch(
    QueueUrl=url,
    Entries=[{"Id": "a", "ReceiptHandle": again[0]["ReceiptHandle"], "VisibilityTimeout": 60},
             {"Id": "b", "ReceiptHandle": messages[0]["ReceiptHandle"], "VisibilityTimeout": 60}],
)
check([e["Id"] for e in changed["Successful"]] == ["a"], changed)
check([e["Id"] for e in changed["Failed"]] == ["b"] and changed["Failed"][0]["SenderFault"], changed)
deleted = sqs.delete_message_batch(
    QueueUrl=url,
    Entries=[{"Id": "x", "ReceiptHandle": again[0]["ReceiptHandle"]},
             {"Id": "y", "ReceiptHandle": messages[2]["ReceiptHandle"]},
             {"Id": "z", "ReceiptHandle": messages[3]["ReceiptHandle"]}],
)
check(sorted(e["Id"] for e in deleted["Successful"]) == ["x", "y", "z"], deleted)
attributes = sqs.get_queue_attributes(
    QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
)["Attributes"]
check(attributes == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}, attributes)

# Message attributes: kept with the message, answered with SQS's MD5 of them.
def attributes_md5(attributes):
    import struct
    out = b""
    for name in sorted(attributes):
        value = attributes[name]
        out += struct.pack(">I", len(name.encode())) + name.encode()
        out += struct.pack(">I", len(value["DataType"].encode())) + value["DataType"].encode()
        if "StringValue" in value:
            out += b"\x01" + struct.pack(">I", len(value["StringValue"].encode())) + value["StringValue"].encode()
        else:
            out += b"\x02" + struct.pack(">I", len(value["BinaryValue"])) + value["BinaryValue"]
    return hashlib.md5(out).hexdigest()


given = {
    "trace.id": {"DataType": "String", "StringValue": "abc-123"},
    "count": {"DataType": "Number", "StringValue": "42"},
    "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff bytes"},
    "kind": {"DataType": "String.custom", "StringValue": "ünï"},
}
sent = sqs.send_message(QueueUrl=url, MessageBody="with attributes", MessageAttributes=given)
check(sent["MD5OfMessageAttributes"] == attributes_md5(given), "MD5OfMessageAttributes on send")
got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, MessageAttributeNames=["All"])["Messages"][0]
check(got["MessageAttributes"] == given, got.get("MessageAttributes"))
check(got["MD5OfMessageAttributes"] == attributes_md5(given), "MD5OfMessageAttributes on receive")
# Released and received again, asking for some of them: the others are left out.
sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"], VisibilityTimeout=0)
got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, MessageAttributeNames=["trace.*", "count"])["Messages"][0]
chosen = {k: given[k] for k in ("trace.id", "count")}
check(got["MessageAttributes"] == chosen and got["MD5OfMessageAttributes"] == attributes_md5(chosen), got)
sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
check(error_of(sqs.send_message, QueueUrl=url, MessageBody="x",
               MessageAttributes={"AWS.reserved": {"DataType": "String", "StringValue": "v"}})[0] == "InvalidParameterValue", "reserved name")

# Errors, with SQS's codes.
check(error_of(sqs.get_queue_url, QueueName="no-such-queue") == ("AWS.SimpleQueueService.NonExistentQueue", 400), "no queue")
try:
    sqs.get_queue_url(QueueName="no-such-queue")
except sqs.exceptions.QueueDoesNotExist:
    check(True, "QueueDoesNotExist")
check(error_of(sqs.delete_message, QueueUrl=url, ReceiptHandle="not-a-receipt")[0] == "ReceiptHandleIsInvalid", "bad receipt")
check(error_of(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=11)[0] == "InvalidParameterValue", "max 10")
check(error_of(sqs.send_message_batch, QueueUrl=url, Entries=[{"Id": "d", "MessageBody": "1"}, {"Id": "d", "MessageBody": "2"}])[0]
      == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "distinct ids")
# Permissions: statements of the queue's stored Policy.
sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["111111111111", "222222222222"], Actions=["SendMessage"])
statements = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])["Statement"]
check([(s["Sid"], s["Action"], s["Principal"]["AWS"]) for s in statements]
      == [("l", "SQS:SendMessage", ["arn:aws:iam::111111111111:root", "arn:aws:iam::222222222222:root"])], "a permission")
check(error_of(sqs.add_permission, QueueUrl=url, Label="m", AWSAccountIds=["1"], Actions=["SendMessage"])[0]
      == "InvalidParameterValue", "an account id is 12 digits")
sqs.remove_permission(QueueUrl=url, Label="l")
check(error_of(sqs.remove_permission, QueueUrl=url, Label="l")[0] == "InvalidParameterValue", "removed")

# Tags: stored in ZooKeeper, shared by every sidecar.
check(sqs.list_queue_tags(QueueUrl=url).get("Tags", {}) == {}, "no tags yet")
sqs.tag_queue(QueueUrl=url, Tags={"team": "orders", "note": "a <&> \"b\" é"})
check(sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "orders", "note": "a <&> \"b\" é"}, "TagQueue")
sqs.tag_queue(QueueUrl=url, Tags={"team": "billing"})
sqs.untag_queue(QueueUrl=url, TagKeys=["note", "never-set"])
check(sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing"}, "UntagQueue")
check(error_of(sqs.tag_queue, QueueUrl=url, Tags={"aws:owner": "x"})[0] == "InvalidParameterValue", "aws: keys")
check(error_of(sqs.tag_queue, QueueUrl=url, Tags={f"k{i}": "v" for i in range(50)})[0] == "InvalidParameterValue",
      "at most 50 tags")
check(sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "billing"}, "a refused TagQueue changed nothing")
tagged = sqs.create_queue(QueueName=f"{queue}-tagged", tags={"made-by": "CreateQueue"})["QueueUrl"]
check(sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"made-by": "CreateQueue"}, "CreateQueue's tags")
check(error_of(sqs.send_message, QueueUrl=url.replace(queue, "never-created"), MessageBody="x")[0]
      == "AWS.SimpleQueueService.NonExistentQueue", "a send needs the queue")
check("MessageId" in sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=5), "a standard queue's delay")
check(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == [], "not delivered before its delay")
# Purge: every message goes, as in SQS, a held one too.
sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"p{i}", "MessageBody": f"purge {i}"} for i in range(3)])
held = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"][0]
sqs.purge_queue(QueueUrl=url)
check(sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == [], "purged")
check(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])["Attributes"]
      ["ApproximateNumberOfMessagesNotVisible"] == "0", "the held one purged too")
sqs.delete_message(QueueUrl=url, ReceiptHandle=held["ReceiptHandle"])
check(error_of(sqs.create_queue, QueueName=queue, Attributes={"MessageRetentionPeriod": "59"})[0] == "InvalidAttributeValue",
      "a retention under a minute")
visibility = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]["VisibilityTimeout"]
check(sqs.create_queue(QueueName=queue, Attributes={"VisibilityTimeout": visibility})["QueueUrl"] == url, "same settings")
sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": visibility, "DelaySeconds": "0"})
check(sqs.list_dead_letter_source_queues(QueueUrl=url).get("queueUrls", []) == [], "no dead-letter sources")

# A dynamic queue's own settings: kept in ZooKeeper, served by every sidecar.
def attribute(queue_url, name):
    return sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[name]).get("Attributes", {}).get(name)

sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "7", "ReceiveMessageWaitTimeSeconds": "1"})
check((attribute(url, "VisibilityTimeout"), attribute(url, "ReceiveMessageWaitTimeSeconds")) == ("7", "1"), "settings set")
check(error_of(sqs.set_queue_attributes, QueueUrl=url, Attributes={"VisibilityTimeout": "99999"})[0] == "InvalidAttributeValue",
      "visibility over 12 hours")
check(error_of(sqs.set_queue_attributes, QueueUrl=url, Attributes={"ReceiveMessageWaitTimeSeconds": "21"})[0]
      == "InvalidAttributeValue", "a wait over 20 s")
check(error_of(sqs.set_queue_attributes, QueueUrl=url, Attributes={"RedriveAllowPolicy": "{}"})[0]
      == "InvalidAttributeName", "a setting zkq does not take")
sqs.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "120", "DelaySeconds": "0"})
check(attribute(url, "MessageRetentionPeriod") == "120", "a retention set")
made = sqs.create_queue(QueueName=f"{queue}-made", Attributes={"VisibilityTimeout": "1800"})["QueueUrl"]
check(attribute(made, "VisibilityTimeout") == "1800", "CreateQueue's attributes make the queue's settings")
check(sqs.create_queue(QueueName=f"{queue}-made", Attributes={"VisibilityTimeout": "1800"})["QueueUrl"] == made,
      "CreateQueue again with the same attributes")
check(error_of(sqs.create_queue, QueueName=f"{queue}-made", Attributes={"VisibilityTimeout": "60"})[0]
      == "QueueAlreadyExists", "CreateQueue of an existing queue with other attributes")
# A redrive policy: past maxReceiveCount, a message moves to the dead-letter queue.
dlq = sqs.create_queue(QueueName=f"{queue}-dlq")["QueueUrl"]
dlq_arn = attribute(dlq, "QueueArn")
policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1}
sqs.set_queue_attributes(QueueUrl=made, Attributes={"RedrivePolicy": json.dumps(policy)})
check(json.loads(attribute(made, "RedrivePolicy")) == policy, "RedrivePolicy set")
check(sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [made], "a dynamic dead-letter source")
sqs.send_message(QueueUrl=made, MessageBody="poison")
first = sqs.receive_message(QueueUrl=made, WaitTimeSeconds=2)["Messages"][0]
sqs.change_message_visibility(QueueUrl=made, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
check(sqs.receive_message(QueueUrl=made, WaitTimeSeconds=0).get("Messages", []) == [], "not delivered a second time")
moved = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=2)["Messages"]
check([m["Body"] for m in moved] == ["poison"], "moved to the dead-letter queue")
check(error_of(sqs.set_queue_attributes, QueueUrl=made,
               Attributes={"RedrivePolicy": json.dumps({**policy, "maxReceiveCount": 0})})[0] == "InvalidAttributeValue",
      "maxReceiveCount of 0")
check(error_of(sqs.set_queue_attributes, QueueUrl=made, Attributes={"RedrivePolicy": json.dumps(
    {"deadLetterTargetArn": dlq_arn.replace(f"{queue}-dlq", "never"), "maxReceiveCount": 3})})[0] == "InvalidAttributeValue",
      "a dead-letter queue that does not exist")
sqs.set_queue_attributes(QueueUrl=made, Attributes={"RedrivePolicy": ""})
check(attribute(made, "RedrivePolicy") is None and sqs.list_dead_letter_source_queues(QueueUrl=dlq).get("queueUrls", []) == [],
      "RedrivePolicy removed")
# DeleteQueue: its messages (a received one too), tags and settings go with it; made anew, it is empty.
sqs.set_queue_attributes(QueueUrl=tagged, Attributes={"VisibilityTimeout": "5"})
sqs.send_message_batch(QueueUrl=tagged, Entries=[{"Id": f"d{i}", "MessageBody": f"doomed {i}"} for i in range(5)])
sqs.receive_message(QueueUrl=tagged, WaitTimeSeconds=2)
sqs.delete_queue(QueueUrl=tagged)
check(error_of(sqs.get_queue_url, QueueName=f"{queue}-tagged")[0] == "AWS.SimpleQueueService.NonExistentQueue", "deleted")
check(error_of(sqs.send_message, QueueUrl=tagged, MessageBody="x")[0] == "AWS.SimpleQueueService.NonExistentQueue",
      "a send to a deleted queue")
check(error_of(sqs.delete_queue, QueueUrl=tagged)[0] == "AWS.SimpleQueueService.NonExistentQueue", "deleted twice")
check(sqs.create_queue(QueueName=f"{queue}-tagged")["QueueUrl"] == tagged, "made anew")
check(sqs.list_queue_tags(QueueUrl=tagged).get("Tags", {}) == {}, "a queue made anew has no tags")
check(attribute(tagged, "VisibilityTimeout") == visibility, "a queue made anew has the default settings")
check(sqs.receive_message(QueueUrl=tagged, WaitTimeSeconds=0).get("Messages", []) == [], "a queue made anew is empty")
# A FIFO queue: a grouped queue in zkq, its messages deduplicated by id or by body.
fifo = sqs.create_queue(QueueName=f"{queue}.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
check(attribute(fifo, "ContentBasedDeduplication") == "true" and attribute(fifo, "FifoQueue") == "true", "a FIFO queue")
for group, body in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("a", "a3"), ("b", "b2")]:
    sqs.send_message(QueueUrl=fifo, MessageBody=body, MessageGroupId=group)
first = sqs.send_message(QueueUrl=fifo, MessageBody="a1", MessageGroupId="a")
check(error_of(sqs.send_message, QueueUrl=fifo, MessageBody="x")[0] == "MissingParameter", "MessageGroupId is required")
order = []
while len(order) < 5:
    got = sqs.receive_message(QueueUrl=fifo, MaxNumberOfMessages=10, WaitTimeSeconds=2,
                              AttributeNames=["MessageGroupId"]).get("Messages", [])
    # As SQS, one receive may hold several messages of a group, in the group's order.
    check(got and all(sorted(bs) == bs for bs in ([m["Body"] for m in got if m["Attributes"]["MessageGroupId"] == g]
                                                  for g in "ab")), f"each group in order: {got}")
    order += [m["Body"] for m in got]
    sqs.delete_message_batch(QueueUrl=fifo, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
check([b for b in order if b.startswith("a")] == ["a1", "a2", "a3"] and [b for b in order if b.startswith("b")] == ["b1", "b2"],
      f"each group in send order, a1 once: {order}")
explicit = sqs.create_queue(QueueName=f"{queue}-ids.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
check(error_of(sqs.send_message, QueueUrl=explicit, MessageBody="x", MessageGroupId="g")[0] == "InvalidParameterValue",
      "without ContentBasedDeduplication a MessageDeduplicationId is needed")
sqs.send_message(QueueUrl=explicit, MessageBody="once", MessageGroupId="g", MessageDeduplicationId="d1")
sqs.send_message(QueueUrl=explicit, MessageBody="once", MessageGroupId="g", MessageDeduplicationId="d1")
got = sqs.receive_message(QueueUrl=explicit, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
check([m["Body"] for m in got] == ["once"], "a deduplication id stores once")
check(error_of(sqs.set_queue_attributes, QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"})[0]
      == "InvalidAttributeName", "ContentBasedDeduplication is for FIFO queues")

# Message move tasks (botocore learned them after Debian's 1.29: the JSON protocol's client only).
if protocol == "json":
    import time

    def arn_of(queue_url):
        return sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

    dead = sqs.create_queue(QueueName=f"{queue}-dead")["QueueUrl"]
    back = sqs.create_queue(QueueName=f"{queue}-back")["QueueUrl"]
    check(sqs.list_message_move_tasks(SourceArn=arn_of(dead)).get("Results", []) == [], "no move task yet")
    check(error_of(sqs.start_message_move_task, SourceArn=arn_of(dead))[0] == "InvalidParameterValue",
          "no declared source: a destination is needed")
    sqs.send_message_batch(QueueUrl=dead, Entries=[{"Id": f"m{i}", "MessageBody": f"moved {i}"} for i in range(5)])
    handle = sqs.start_message_move_task(SourceArn=arn_of(dead), DestinationArn=arn_of(back),
                                         MaxNumberOfMessagesPerSecond=100)["TaskHandle"]
    deadline = time.monotonic() + 30
    while sqs.list_message_move_tasks(SourceArn=arn_of(dead), MaxResults=10)["Results"][0]["Status"] != "COMPLETED":
        check(time.monotonic() < deadline, "the move task completes")
    task = sqs.list_message_move_tasks(SourceArn=arn_of(dead))["Results"][0]
    check(task["ApproximateNumberOfMessagesMoved"] == 5 and task["DestinationArn"] == arn_of(back), task)
    moved = sqs.receive_message(QueueUrl=back, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    check(sorted(m["Body"] for m in moved) == [f"moved {i}" for i in range(5)], moved)
    check(error_of(sqs.cancel_message_move_task, TaskHandle=handle)[0] == "ResourceNotFoundException",
          "a finished task cannot be cancelled")
print(f"ok {checks.count} checks")
