'use strict';
// A work queue: prefetch 3, manual acks sent a little later; the broker never has more than 3 unacked out.
const { run, gather } = require('./run');

run(async (connection, name) => {
  const channel = await connection.createChannel();
  await channel.assertQueue(name, { durable: true });
  await channel.prefetch(3);
  const total = 40;
  for (let i = 0; i < total; i++) {
    channel.sendToQueue(name, Buffer.from(`job ${i}`), { persistent: true, messageId: `m${i}` });
  }
  let unacked = 0;
  let maxUnacked = 0;
  const received = gather(total);
  const { consumerTag } = await channel.consume(name, (message) => {
    unacked += 1;
    maxUnacked = Math.max(maxUnacked, unacked);
    received.collect({ body: message.content.toString(), id: message.properties.messageId,
                       persistent: message.properties.deliveryMode === 2 });
    setTimeout(() => { unacked -= 1; channel.ack(message); }, 5);
  }, { noAck: false });
  const messages = await received.promise;
  await new Promise((resolve) => setTimeout(resolve, 50));
  await channel.cancel(consumerTag);
  const left = await channel.checkQueue(name);
  await channel.deleteQueue(name);
  return { messages, maxUnacked, left: left.messageCount };
});
