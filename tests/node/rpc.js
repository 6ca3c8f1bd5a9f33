'use strict';
// RPC: a server consumes the request queue and answers on reply_to with the correlation id, once through
// an exclusive server-named reply queue and once through direct reply-to (amq.rabbitmq.reply-to).
const { run } = require('./run');

async function call(channel, requestQueue, replyQueue, pending, n) {
  const correlationId = `c${n}-${Math.random()}`;
  const answer = new Promise((resolve) => pending.set(correlationId, resolve));
  channel.sendToQueue(requestQueue, Buffer.from(String(n)), { correlationId, replyTo: replyQueue });
  return answer;
}

run(async (connection, name) => {
  const server = await connection.createChannel();
  await server.assertQueue(name, { exclusive: true });
  await server.prefetch(1);
  await server.consume(name, (request) => {
    const n = Number(request.content.toString());
    server.sendToQueue(request.properties.replyTo, Buffer.from(String(n * n)),
                       { correlationId: request.properties.correlationId });
    server.ack(request);
  });
  const client = await connection.createChannel();
  const pending = new Map();
  const onReply = (message) => {
    const resolve = pending.get(message.properties.correlationId);
    pending.delete(message.properties.correlationId);
    if (resolve) resolve(Number(message.content.toString()));
  };
  const { queue: replyQueue } = await client.assertQueue('', { exclusive: true });
  await client.consume(replyQueue, onReply, { noAck: true });
  const named = await Promise.all([1, 2, 3].map((n) => call(client, name, replyQueue, pending, n)));
  const direct = await connection.createChannel();
  await direct.consume('amq.rabbitmq.reply-to', onReply, { noAck: true });
  const viaDirect = await Promise.all([4, 5].map((n) => call(direct, name, 'amq.rabbitmq.reply-to', pending, n)));
  return { named, viaDirect, replyQueue };
});
