"""What zkq's SQS listener refuses before an action runs, as boto3 sees it: SQS's codes in the
request's protocol, retried by botocore only where SQS's own answer would be.

Usage: refusals.py ENDPOINT PROTOCOL MODE ..., where PROTOCOL is the wire protocol this botocore
speaks (`json`, `query`) and MODE one of
- `too-large MAX_MESSAGE_BYTES OVER`: a message over `api.max_message_bytes`, and requests
  of OVER bytes (more than the listener reads), are refused `InvalidParameterValue` (a JSON-protocol batch:
  `BatchRequestTooLong`) and not retried;
- `throttled QUEUE_URL`: a request shed for load (the listener's `api.max_concurrent_requests` are
  held) is refused `RequestThrottled` (403, `Retry-After`), which botocore retries.
Prints `ok N checks`.
"""

import sys

import boto3
import botocore
from botocore.exceptions import ClientError

import checks
from checks import check

endpoint, protocol, mode = sys.argv[1:4]


def client(**retries):
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
        config=botocore.config.Config(retries={"mode": "legacy", **retries}),
    )


def refusal(call, **kwargs):
    """The error response `call(**kwargs)` fails with (it must fail)."""
    try:
        call(**kwargs)
    except ClientError as err:
        return err.response
    raise AssertionError(f"{call.__name__} did not fail")


def summary(response):
    """The error's code, its HTTP status, and the retries botocore spent on it."""
    metadata = response["ResponseMetadata"]
    return response["Error"]["Code"], metadata["HTTPStatusCode"], metadata["RetryAttempts"]


if mode == "too-large":
    max_message, over = int(sys.argv[4]), int(sys.argv[5])
    # botocore's default retries (legacy: up to 4): none may be spent on these.
    sqs = client()
    check(sqs.meta.service_model.protocol == protocol, f"botocore speaks {sqs.meta.service_model.protocol}")
    url = sqs.create_queue(QueueName=f"large-{protocol}")["QueueUrl"]
    # Read by the action: over api.max_message_bytes.
    long = refusal(sqs.send_message, QueueUrl=url, MessageBody="x" * (max_message + 1))
    check(summary(long) == ("InvalidParameterValue", 400, 0), summary(long))
    check(f"Message must be shorter than {max_message} bytes" in long["Error"]["Message"], long["Error"])
    # Refused by the guard, before the body is read: over what the listener reads.
    huge = refusal(sqs.send_message, QueueUrl=url, MessageBody="x" * over)
    check(summary(huge) == ("InvalidParameterValue", 400, 0), summary(huge))
    message = huge["Error"]["Message"]
    # SQS's own words, which clients match on.
    aws = f"One or more parameters are invalid. Reason: Message must be shorter than {max_message} bytes."
    check(message == aws, message)
    entries = [{"Id": f"e{i}", "MessageBody": "x" * (over // 10)} for i in range(10)]
    batch = refusal(sqs.send_message_batch, QueueUrl=url, Entries=entries)
    # The JSON protocol names its action in a header; a query-protocol request names it in the
    # body, which is not read.
    if protocol == "json":
        check(summary(batch) == ("AWS.SimpleQueueService.BatchRequestTooLong", 400, 0), summary(batch))
        check(batch["Error"]["Message"].startswith("Batch requests cannot be longer than "), batch["Error"])
    else:
        check(summary(batch) == ("InvalidParameterValue", 400, 0), summary(batch))
        check(batch["Error"]["Message"] == aws, batch["Error"])
    # Nothing was stored, and the listener goes on serving.
    sqs.send_message(QueueUrl=url, MessageBody="x" * max_message)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
    check([len(m["Body"]) for m in got] == [max_message], [len(m["Body"]) for m in got])
elif mode == "throttled":
    url = sys.argv[4]
    # One retry: botocore takes RequestThrottled (403) as SQS's throttling.
    sqs = client(total_max_attempts=2)
    check(sqs.meta.service_model.protocol == protocol, f"botocore speaks {sqs.meta.service_model.protocol}")
    shed = refusal(sqs.send_message, QueueUrl=url, MessageBody="shed")
    check(summary(shed) == ("RequestThrottled", 403, 1), summary(shed))
    check(shed["ResponseMetadata"]["HTTPHeaders"].get("retry-after") == "1", shed["ResponseMetadata"]["HTTPHeaders"])
else:
    raise AssertionError(f"unknown mode {mode}")

print(f"ok {checks.count} checks")
