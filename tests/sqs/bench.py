"""The SQS listener's drain rate beside zkq's own API on the same zkq and queue, one consumer each,
both driven from Python so that the client's own cost is alike. Prints figures; asserts nothing.

Usage: bench.py API_URL SQS_URL [N]   (e.g. scripts/dev.sh with ZKQ__SQS__LISTEN=127.0.0.1:9324)
Each round puts N messages (batches of 100 through zkq's API), then drains them: through SQS
(ReceiveMessage of 10, DeleteMessageBatch) or through zkq's API (?max=10 lease, one batch ack).
"""

import json
import sys
import time
import urllib.request

import boto3
import botocore

api, endpoint = sys.argv[1:3]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
queue = "bench-sqs"
sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="any",
                   aws_secret_access_key="any", config=botocore.config.Config(retries={"max_attempts": 3}))
url = sqs.create_queue(QueueName=queue)["QueueUrl"]


def post(path, body=None):
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(api + path, data=data, method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return response.status, response.read()


def fill():
    for start in range(0, n, 100):
        status, _ = post(f"/v1/queues/{queue}/batch", {"messages": [{"text": f"m{i}"} for i in range(start, min(start + 100, n))]})
        assert status == 201


def drain_sqs():
    done = 0
    while done < n:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        if not messages:
            continue
        answer = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)])
        done += len(answer["Successful"])


def drain_native():
    done = 0
    while done < n:
        status, body = post(f"/v1/queues/{queue}/leases?max=10&wait=1s")
        if status == 204:
            continue
        leases = [m["lease"] for m in json.loads(body)["messages"]]
        status, body = post(f"/v1/queues/{queue}/acks", {"leases": leases})
        done += sum(1 for r in json.loads(body)["results"] if r["status"] == 204)


for round_ in range(2):
    for name, drain in (("SQS (boto3)", drain_sqs), ("zkq API (urllib)", drain_native)):
        fill()
        started = time.monotonic()
        drain()
        took = time.monotonic() - started
        print(f"round {round_ + 1}: {name:18} {n / took:8.0f} msg/s")
