'use strict';
// Under a memory alarm the broker sends connection.blocked (amqplib advertises the capability).
const { run } = require('./run');

run(async (connection, name) => {
  const blocked = new Promise((resolve) => connection.once('blocked', (reason) => resolve(reason)));
  const channel = await connection.createChannel();
  await channel.assertQueue(name, { exclusive: true });
  channel.sendToQueue(name, Buffer.from('over the watermark'));
  const reason = await Promise.race([blocked, new Promise((resolve) => setTimeout(() => resolve(null), 8000))]);
  return { blocked: reason !== null, reason };
});
