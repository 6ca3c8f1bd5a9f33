'use strict';
// A passive declare of a missing queue: amqplib sees 404 NOT_FOUND and a closed channel, the
// connection and its other channels carry on.
const { run } = require('./run');

run(async (connection, name) => {
  const other = await connection.createChannel();
  const channel = await connection.createChannel();
  const channelClosed = new Promise((resolve) => channel.once('close', () => resolve(true)));
  let channelError = null;
  channel.on('error', (err) => { channelError = { code: err.code, message: err.message }; });
  let checkError = null;
  try {
    await channel.checkQueue(`${name}.missing`);
  } catch (err) {
    checkError = { code: err.code, classId: err.classId, methodId: err.methodId, message: err.message };
  }
  await channelClosed;
  let connectionError = null;
  connection.on('error', (err) => { connectionError = err.message; });
  const { queue } = await other.assertQueue(name, { exclusive: true });
  other.sendToQueue(queue, Buffer.from('still here'));
  let got = false;
  for (let i = 0; i < 50 && !got; i++) {
    got = await other.get(queue, { noAck: true });
    if (!got) await new Promise((resolve) => setTimeout(resolve, 20));
  }
  const fresh = await connection.createChannel();
  const check = await fresh.checkQueue(queue);
  return { checkError, channelError, connectionError, otherChannelGot: got && got.content.toString(),
           freshChannelSees: check.queue };
});
