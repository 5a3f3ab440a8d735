"""Real Celery workers and a Celery producer with zkq as their broker, through kombu's SQS
transport (`celery[sqs]`: boto3 for sends, acks and queue calls, pycurl for the workers' long polls).

celery_worker.py ENDPOINT QUEUE N VISIBILITY

starts two `celery worker` processes (threads pools) on QUEUE and, once both are ready, sends N/2
tasks `record(i)` from this process. The first worker stops (a warm shutdown, SIGTERM) once it
ran a fifth of them, while they may still flow, and the other N/2 are sent, for the second alone. When every task ran and zkq holds
nothing, waiting or in flight, the second worker stops too. Checks that every task ran exactly
once, that both workers exited with 0 and logged no error; prints `ok N`.
VISIBILITY is kombu's `visibility_timeout` in seconds: its CreateQueue sends it, and it becomes the
queue's own (a message a stopped worker did not hand back is delivered again after it). Every wait is bounded: the
script stops itself, failing, when a deadline passes.

The workers import this module (`celery -A celery_worker`); the arguments reach them through the
environment.
"""

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

if __name__ == "__main__":
    endpoint, queue, n, visibility = sys.argv[1:5]
    os.environ.update(
        ZKQ_CELERY_ENDPOINT=endpoint,
        ZKQ_CELERY_QUEUE=queue,
        ZKQ_CELERY_VISIBILITY=visibility,
        ZKQ_CELERY_RESULTS=os.path.join(tempfile.mkdtemp(prefix="zkq-celery-"), "ran"),
        # boto3 reads no profile, file or instance metadata of the machine.
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
        AWS_EC2_METADATA_DISABLED="true",
    )

from celery import Celery  # noqa: E402

ENDPOINT = os.environ["ZKQ_CELERY_ENDPOINT"]
QUEUE = os.environ["ZKQ_CELERY_QUEUE"]
RESULTS = os.environ["ZKQ_CELERY_RESULTS"]

app = Celery("zkq-celery", broker="sqs://any:any@" + ENDPOINT.removeprefix("http://"))
app.conf.update(
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,  # http://host:port of the broker URL
        # Sent in CreateQueue: zkq's own setting, the only value it accepts.
        "visibility_timeout": int(os.environ["ZKQ_CELERY_VISIBILITY"]),
        # Long polls of 5 s; kombu also hides what a stopping worker gives back for that long.
        "wait_time_seconds": 5,
        "polling_interval": 0.1,
    },
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    # Acknowledged (DeleteMessage) after the task ran: a message whose lease ended before would be
    # delivered and run again, which the checks below would see.
    task_acks_late=True,
    worker_prefetch_multiplier=2,
)


@app.task(name="zkq.record", bind=True)
def record(self, i):
    """Appends `i` and the worker's name to the results file (one write of a short line with
    O_APPEND: whole)."""
    line = f"{i} {self.request.hostname.split('@')[0]}\n"
    fd = os.open(RESULTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return i


def ran():
    """(task argument, worker name) of every run so far."""
    try:
        with open(RESULTS) as f:
            return [(int(i), worker) for i, worker in (line.split() for line in f.read().splitlines())]
    except FileNotFoundError:
        return []


def wait_for(condition, what, deadline):
    """Waits until `condition()` is true, checking it every 50 ms; fails at `deadline`."""
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Worker:
    """A `celery worker` process on QUEUE (threads pool), its output in a log file."""

    def __init__(self, name):
        here = os.path.dirname(os.path.abspath(__file__))
        self.name = name
        self.log_path = os.path.join(os.path.dirname(RESULTS), f"{name}.log")
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "celery_worker", "worker", "--pool=threads", "--concurrency=2",
             "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat", "-Q", QUEUE,
             "-n", f"{name}@%h"],
            cwd=here,
            env={**os.environ, "PYTHONPATH": here},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def ready(self):
        """Whether the worker said it is ready: connected, consuming QUEUE."""
        return re.search(rf"\] {self.name}@\S+ ready\.", self.text()) is not None

    def stop(self):
        """A warm shutdown (SIGTERM): the worker finishes the tasks it runs and gives back the messages
        it holds. It must exit cleanly, within 60 s, having logged no error."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self.log.close()
        text = self.text()
        if code != 0:
            raise AssertionError(f"{self.name} exited with {code}:\n{text}")
        errors = [line for line in text.splitlines() if "ERROR" in line or "CRITICAL" in line or "Traceback" in line]
        if errors:
            raise AssertionError(f"{self.name} logged errors:\n{text}")

    def abort(self):
        """Kills the worker if it still runs, and shows its log."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        sys.stderr.write(f"--- {self.name}'s log:\n{self.text()}\n")


def main():
    import boto3

    n = int(sys.argv[3])
    workers = [Worker("first"), Worker("second")]
    try:
        deadline = time.monotonic() + 180
        for worker in workers:
            wait_for(worker.ready, f"{worker.name} to be ready", deadline)
        # Both workers take the first half; the first stops as soon as it ran a fifth of it (or
        # all of it ran), while they still flow: a warm shutdown, whatever it received and did not
        # run goes back to the queue, its pending long poll is dropped. The second takes the rest
        # and, alone, the other half.
        half = n // 2
        for i in range(half):
            record.delay(i)

        def first_ran_some():
            runs = ran()
            return sum(w == "first" for _, w in runs) >= half // 5 or len(runs) >= half

        wait_for(first_ran_some, "the first worker to run tasks", deadline)
        workers[0].stop()
        for i in range(half, n):
            record.delay(i)
        wait_for(lambda: len({i for i, _ in ran()}) == n, f"{n} tasks to run", deadline)
        # Acknowledged after they ran: done once zkq holds nothing, waiting or in flight; no message
        # is left to run again then.
        sqs = boto3.client("sqs", endpoint_url=ENDPOINT, region_name="us-east-1",
                           aws_access_key_id="any", aws_secret_access_key="any")
        url = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]

        def drained():
            attributes = sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
            )["Attributes"]
            return attributes == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}

        wait_for(drained, "the queue to be empty, nothing in flight", deadline)
        workers[1].stop()
        runs = ran()
        by = collections.Counter(w for _, w in runs)
        sys.stderr.write(f"tasks run by each worker: {dict(by)}\n")
        if by["second"] < n - half:
            raise AssertionError(f"the second worker ran {by['second']} tasks, not all of the second half")
        counts = collections.Counter(i for i, _ in runs)
        twice = sorted(i for i, c in counts.items() if c > 1)
        missing = sorted(set(range(n)) - set(counts))
        extra = sorted(set(counts) - set(range(n)))
        if twice or missing or extra:
            raise AssertionError(f"ran twice {twice[:10]}, never {missing[:10]}, not sent {extra[:10]}")
        print("ok", n)
    except BaseException:
        for worker in workers:
            worker.abort()
        raise
    finally:
        shutil.rmtree(os.path.dirname(RESULTS), ignore_errors=True)


if __name__ == "__main__":
    main()
