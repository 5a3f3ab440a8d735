"""A JSON-protocol SQS request signed as botocore signs it, printed instead of sent: what a listener
on the pod network could capture. With `narrow`, the signature covers only `host` and `x-amz-date`
(`content-type` and `x-amz-target` are added after signing), a request zkq must refuse, since its
action could be changed without breaking the signature.

Usage: capture.py ENDPOINT KEY_ID SECRET ACTION INPUT_JSON full|narrow. Prints
{"headers": {...}, "body": "..."}.
"""

import json
import sys

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

endpoint, key_id, secret, action, body, mode = sys.argv[1:7]
extra = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"AmazonSQS.{action}"}
request = AWSRequest(method="POST", url=endpoint + "/", data=body.encode(), headers=extra if mode == "full" else {})
SigV4Auth(Credentials(key_id, secret), "sqs", "eu-west-3").add_auth(request)
headers = dict(request.headers.items())
if mode == "narrow":
    headers.update(extra)
print(json.dumps({"headers": headers, "body": body}))
