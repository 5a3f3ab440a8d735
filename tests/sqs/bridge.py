"""The SQS side of the bridge test, through boto3.

bridge.py send ENDPOINT QUEUE N PREFIX   sends PREFIX0 .. PREFIX{N-1} with SendMessageBatch (10 a call)
bridge.py drain ENDPOINT QUEUE N         receives (10 at a time) and deletes until N are deleted or
                                         the queue stays empty for 30 s; prints each deleted body
"""

import sys
import time

import boto3
import botocore

command, endpoint, queue, n = sys.argv[1:5]
n = int(n)
sqs = boto3.client(
    "sqs",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="any",
    aws_secret_access_key="any",
    config=botocore.config.Config(retries={"max_attempts": 5, "mode": "standard"}),
)
url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]

if command == "send":
    prefix = sys.argv[5]
    for start in range(0, n, 10):
        entries = [{"Id": str(i), "MessageBody": f"{prefix}{i}"} for i in range(start, min(start + 10, n))]
        answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        if answer.get("Failed"):
            raise SystemExit(f"failed: {answer['Failed']}")
    print("sent", n)
elif command == "drain":
    deleted = 0
    empty_since = None
    while deleted < n:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        if not messages:
            empty_since = empty_since or time.monotonic()
            if time.monotonic() - empty_since > 30:
                break
            continue
        empty_since = None
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        answer = sqs.delete_message_batch(QueueUrl=url, Entries=entries)
        done = {e["Id"] for e in answer.get("Successful", [])}
        for i, m in enumerate(messages):
            if str(i) in done:
                print(m["Body"])
                deleted += 1
else:
    raise SystemExit(f"unknown command {command}")
