// One producer/consumer session through the AWS SDK for JavaScript v3, whose SQS client checks
// MD5OfMessageBody and MD5OfBody on every answer (and fails the call on a mismatch).
// Usage: node client.mjs ENDPOINT QUEUE. Prints `ok N checks`.
import {
  SQSClient, CreateQueueCommand, SendMessageCommand, SendMessageBatchCommand,
  ReceiveMessageCommand, DeleteMessageBatchCommand,
} from "@aws-sdk/client-sqs";

const [endpoint, queue] = process.argv.slice(2);
const sqs = new SQSClient({
  endpoint, region: "us-east-1", maxAttempts: 1,
  // zkq checks signatures only with a key pair configured (ZKQ_SQS_KEY_ID and ZKQ_SQS_SECRET here).
  credentials: { accessKeyId: process.env.ZKQ_SQS_KEY_ID ?? "any", secretAccessKey: process.env.ZKQ_SQS_SECRET ?? "any" },
});
let checks = 0;
const check = (condition, what) => { if (!condition) throw new Error(what); checks += 1; };

const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: queue }));
const bodies = ["plain", "ünïcödé ✓", "a\r\nb <&> \"q\"", "x".repeat(100000)];
const sent = await sqs.send(new SendMessageCommand({ QueueUrl, MessageBody: bodies[0] }));
check(sent.MessageId, "a message id");
const batch = await sqs.send(new SendMessageBatchCommand({
  QueueUrl, Entries: bodies.slice(1).map((MessageBody, i) => ({ Id: `e${i}`, MessageBody })),
}));
check(batch.Successful.length === 3, JSON.stringify(batch.Failed));
const received = [];
while (received.length < bodies.length) {
  const answer = await sqs.send(new ReceiveMessageCommand({ QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 2 }));
  const messages = answer.Messages ?? [];
  check(messages.length > 0, "messages arrive");
  received.push(...messages);
}
check(JSON.stringify(received.map((m) => m.Body).sort()) === JSON.stringify([...bodies].sort()), "bodies intact");
const deleted = await sqs.send(new DeleteMessageBatchCommand({
  QueueUrl, Entries: received.map((m, i) => ({ Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })),
}));
check(deleted.Successful.length === bodies.length, JSON.stringify(deleted.Failed));
console.log(`ok ${checks} checks`);
