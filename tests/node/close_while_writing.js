'use strict';
// Connection close while the client still has frames buffered: assert an exclusive queue, sendToQueue
// until the socket buffer is full, then connection.close(). The close must complete (no ECONNRESET).
const amqp = require('amqplib/callback_api');

amqp.connect(process.env.AMQP_URL, (err, connection) => {
  if (err) throw err;
  connection.on('error', (e) => { process.stderr.write(`connection error: ${e.code || e}\n`); process.exit(1); });
  connection.createChannel((err2, channel) => {
    if (err2) throw err2;
    channel.assertQueue(process.env.NAME, { exclusive: true }, (err3) => {
      if (err3) throw err3;
      let sent = 0;
      while (channel.sendToQueue(process.env.NAME, Buffer.alloc(1000, 'x'))) sent += 1;
      sent += 1;
      connection.close((err4) => {
        if (err4) { process.stderr.write(`close failed: ${err4.code || err4}\n`); process.exit(1); }
        process.stdout.write(JSON.stringify({ sent, closed: true }) + '\n');
      });
    });
  });
});
