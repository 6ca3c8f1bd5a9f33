'use strict';
// Publisher confirms: every publish acked once, waitForConfirms resolves; an unroutable mandatory
// publish comes back as basic.return (312 NO_ROUTE) and is still confirmed.
const { run } = require('./run');

run(async (connection, name) => {
  const channel = await connection.createConfirmChannel();
  await channel.assertQueue(name, { exclusive: true });
  const total = 200;
  const acked = [];
  for (let i = 0; i < total; i++) {
    channel.sendToQueue(name, Buffer.from(String(i)), {}, (err) => { acked.push(err ? 'nack' : i); });
  }
  await channel.waitForConfirms();
  const returned = new Promise((resolve) => channel.once('return', resolve));
  let unroutableConfirmed = null;
  channel.publish('', `${name}.nowhere`, Buffer.from('lost'), { mandatory: true },
                  (err) => { unroutableConfirmed = !err; });
  const ret = await returned;
  await channel.waitForConfirms();
  const depth = await channel.checkQueue(name);
  return { acked, messageCount: depth.messageCount, unroutableConfirmed,
           returned: { replyCode: ret.fields.replyCode, replyText: ret.fields.replyText,
                       routingKey: ret.fields.routingKey, body: ret.content.toString() } };
});
