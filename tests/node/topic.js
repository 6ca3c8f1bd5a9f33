'use strict';
// A topic exchange: each queue gets exactly the keys its binding patterns match; CC and BCC headers
// (sender-selected distribution) add keys, one copy per queue, and BCC is not delivered.
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
  const expected = gather(keys.length + 2 + 2 + 2 + 3);
  for (const [label, entry] of Object.entries(result)) {
    await channel.consume(entry.queue, (message) => {
      entry.keys.push(message.fields.routingKey);
      if (message.properties.headers.CC) entry.headers = message.properties.headers;
      expected.collect(label);
    }, { noAck: true });
  }
  for (const key of keys) channel.publish(exchange, key, Buffer.from(key));
  channel.publish(exchange, 'nothing', Buffer.from('cc'),
                  { headers: { CC: ['kern.critical', 'app.web.db'], BCC: ['app.audit.db'], n: 1 } });
  await Promise.race([expected.promise, new Promise((resolve) => setTimeout(resolve, 5000))]);
  await new Promise((resolve) => setTimeout(resolve, 200)); // anything extra would show up now
  return Object.fromEntries(Object.entries(result).map(([label, entry]) => [label, entry.keys.sort()]).concat(
    [['ccHeaders', result.kern.headers]]));
});
