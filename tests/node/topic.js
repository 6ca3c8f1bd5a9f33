'use strict';
// A topic exchange: each queue gets exactly the keys its binding patterns match.
const { run, gather } = require('./run');

run(async (connection, name) => {
  const channel = await connection.createChannel();
  const exchange = `${name}.logs`;
  await channel.assertExchange(exchange, 'topic', { autoDelete: true });
  const patterns = { all: '#', errors: '*.error', kern: 'kern.*', deep: 'app.#.db' };
  const keys = ['kern.error', 'kern.info', 'app.error', 'app.web.db', 'app.db', 'user.info.more'];
  const result = {};
  for (const [label, pattern] of Object.entries(patterns)) {
    const { queue } = await channel.assertQueue('', { exclusive: true });
    await channel.bindQueue(queue, exchange, pattern);
    result[label] = { queue, keys: [] };
  }
  const expected = gather(1 + 2 + 2 + 2 + keys.length - 1);
  for (const [label, entry] of Object.entries(result)) {
    await channel.consume(entry.queue, (message) => {
      entry.keys.push(message.fields.routingKey);
      expected.collect(label);
    }, { noAck: true });
  }
  for (const key of keys) channel.publish(exchange, key, Buffer.from(key));
  await Promise.race([expected.promise, new Promise((resolve) => setTimeout(resolve, 5000))]);
  await new Promise((resolve) => setTimeout(resolve, 200)); // anything extra would show up now
  return Object.fromEntries(Object.entries(result).map(([label, entry]) => [label, entry.keys.sort()]));
});
