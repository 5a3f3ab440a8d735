"""zkq's SQS listener with a key pair configured (`sqs.access_key_id`): requests signed with it
work; a wrong secret, another key id and an unsigned request are refused with SQS's codes, as the
SDK raises them.

Usage: signed.py ENDPOINT PROTOCOL KEY_ID SECRET, where PROTOCOL is the wire protocol this
botocore speaks (`json`, `query`). Prints `ok N checks`.
"""

import sys

import boto3
import botocore
from botocore import UNSIGNED

import checks
from checks import check, error_of

endpoint, protocol, key_id, secret = sys.argv[1:5]


def client(key, secret_key, **config):
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="eu-west-3",
        aws_access_key_id=key,
        aws_secret_access_key=secret_key,
        config=botocore.config.Config(retries={"max_attempts": 1}, **config),
    )


good = client(key_id, secret)
check(good.meta.service_model.protocol == protocol, f"botocore speaks {good.meta.service_model.protocol}")
queue = f"signed-{protocol}"
url = good.create_queue(QueueName=queue)["QueueUrl"]
good.send_message(QueueUrl=url, MessageBody="signed body ü")
got = good.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
check(got[0]["Body"] == "signed body ü", got)
good.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
batch = good.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x y+z&=%"}])
check(len(batch["Successful"]) == 1, batch)
check(url in good.list_queues(QueueNamePrefix="signed-").get("QueueUrls", []), "ListQueues with a prefix")

for refused, expected in [
    (client(key_id, secret + "x"), ("SignatureDoesNotMatch", 403)),
    (client("AKIDOTHER", secret), ("InvalidClientTokenId", 403)),
    (client(key_id, secret, signature_version=UNSIGNED), ("MissingAuthenticationToken", 403)),
]:
    check(error_of(refused.get_queue_url, QueueName=queue) == expected, expected)
    check(error_of(refused.send_message, QueueUrl=url, MessageBody="no") == expected, expected)

# Nothing a refused request sent was stored.
left = good.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
check([m["Body"] for m in left] == ["x y+z&=%"], left)
print(f"ok {checks.count} checks")
