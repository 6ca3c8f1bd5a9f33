'use strict';
// Shared by the scenario scripts: connect to AMQP_URL, run the scenario, print its result as one JSON line.
const amqp = require('amqplib');

function run(scenario) {
  (async () => {
    const connection = await amqp.connect(process.env.AMQP_URL);
    try {
      const result = await scenario(connection, process.env.NAME);
      process.stdout.write(JSON.stringify(result) + '\n');
    } finally {
      await connection.close();
    }
  })().catch((err) => {
    process.stderr.write(`${err.stack || err}\n`);
    process.exit(1);
  });
}

// Resolves with the first ``count`` values ``collect`` is called with.
function gather(count) {
  const values = [];
  let done;
  const promise = new Promise((resolve) => { done = resolve; });
  return {
    promise,
    collect(value) {
      values.push(value);
      if (values.length === count) done(values);
    },
  };
}

module.exports = { run, gather };
