// An ioredis `{sentinels, name}` application that writes every 15 ms (driven by
// tests/sentinel_api.rs).
//
// usage: node sentinel_writer.js SENTINELS NAME KEY SECONDS [default-disconnect] [lib=ioredis|ioredis5]
//   SENTINELS  comma-separated host:port of the Sentinels (or of polestar's Sentinel endpoint)
//   default-disconnect: the settings below without `disconnectTimeout` (ioredis's 2 s)
//
// Each value is RPUSHed to KEY until a node acknowledges it, then the next one. Prints:
//   ack <seq> <unix-ms> <port of the node that acknowledged>
//   err <seq> <unix-ms> <error>
'use strict';
const argv = process.argv.slice(2);
const libArg = argv.find((a) => a.startsWith('lib='));
const LIB = libArg ? libArg.slice(4) : 'ioredis';
const Redis = require(LIB);

const [sentinelsArg, name, key, seconds, variant] = argv.filter((a) => !a.startsWith('lib='));
const sentinels = sentinelsArg.split(',').map((a) => {
  const i = a.lastIndexOf(':');
  return { host: a.slice(0, i), port: Number(a.slice(i + 1)) };
});

// The settings a production ioredis user would pick for fast failover: reconnect at once,
// reconnect on READONLY (resending the command), give up on a command after 500 ms, and listen
// for +switch-master on the Sentinels (failoverDetector), and close a connection to a hung
// primary at once instead of waiting 2 s for its FIN (disconnectTimeout).
const redis = new Redis({
  sentinels,
  name,
  failoverDetector: true,
  ...(variant === 'default-disconnect' ? {} : { disconnectTimeout: 50 }),
  connectTimeout: 500,
  commandTimeout: 500,
  retryStrategy: () => 10,
  sentinelRetryStrategy: () => 10,
  maxRetriesPerRequest: 2,
  reconnectOnError: (err) => (err.message.startsWith('READONLY') ? 2 : false),
});
redis.on('error', () => {});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const line = (text) => process.stdout.write(text.replace(/\n/g, ' ') + '\n');

async function main() {
  line(`version ${require(`${LIB}/package.json`).name} ${require(`${LIB}/package.json`).version}`);
  line(`runtime Node.js ${process.versions.node}`);
  const end = Date.now() + Number(seconds) * 1000;
  let seq = 0;
  while (Date.now() < end) {
    try {
      await redis.rpush(key, seq);
      const port = redis.stream ? redis.stream.remotePort : 0;
      line(`ack ${seq} ${Date.now()} ${port}`);
      seq += 1;
    } catch (e) {
      line(`err ${seq} ${Date.now()} ${e.message}`);
    }
    await sleep(15);
  }
  process.exit(0);
}

main();
