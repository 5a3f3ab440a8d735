"""What the SQS client scripts share: counted checks, and the error code and status an SDK call
fails with."""

from botocore.exceptions import ClientError

count = 0


def check(condition, what):
    """Fails the script with `what` unless `condition`; counts the check."""
    global count
    if not condition:
        raise AssertionError(what)
    count += 1


def error_of(call, **kwargs):
    """The error code and HTTP status `call(**kwargs)` fails with (it must fail)."""
    try:
        call(**kwargs)
    except ClientError as err:
        return err.response["Error"]["Code"], err.response["ResponseMetadata"]["HTTPStatusCode"]
    raise AssertionError(f"{call.__name__} did not fail")
