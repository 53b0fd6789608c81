// A node-redis `createSentinel({name, sentinelRootNodes})` application that writes every
// 15 ms (driven by tests/clients_sentinel.rs), with node-redis's defaults.
//
// usage: node sentinel_writer_node_redis.js SENTINELS NAME KEY SECONDS [lib=redis|redis5]
//   SENTINELS  comma-separated host:port of the Sentinels (or of polestar's Sentinel endpoint)
//
// NR_TRACE=1 also prints node-redis's own trace (`trace <unix-ms> ...`).
//
// Each value is RPUSHed to KEY until a node acknowledges it, then the next one. Prints:
//   ack <seq> <unix-ms> <port of the primary the client writes to>
//   err <seq> <unix-ms> <error>
//
// A fifth argument `lib=NAME` picks the library: `redis` (node-redis's current release, the
// default) or `redis5` (the previous major, an npm alias).
'use strict';
const [sentinelsArg, name, key, seconds, libArg] = process.argv.slice(2);
const LIB = libArg && libArg.startsWith('lib=') ? libArg.slice(4) : 'redis';
const { createSentinel } = require(LIB);
const sentinelRootNodes = sentinelsArg.split(',').map((a) => {
  const i = a.lastIndexOf(':');
  return { host: a.slice(0, i), port: Number(a.slice(i + 1)) };
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const line = (text) => process.stdout.write(text.replace(/\n/g, ' ') + '\n');

async function main() {
  line(`version node-redis ${require(`${LIB}/package.json`).version}`);
  line(`runtime Node.js ${process.versions.node}`);
  const sentinel = createSentinel({ name, sentinelRootNodes });
  sentinel.on('error', (e) => line(`trace ${Date.now()} error ${e.message}`));
  if (process.env.NR_TRACE) {
    // node-redis's own trace of what the sentinel client does, one line each.
    sentinel.setTracer({ push: (msg) => line(`trace ${Date.now()} ${msg}`) });
  }
  for (;;) {
    try {
      await sentinel.connect();
      break;
    } catch (e) {
      line(`err 0 ${Date.now()} connect: ${e.message}`);
      await sleep(100);
    }
  }
  const end = Date.now() + Number(seconds) * 1000;
  let seq = 0;
  while (Date.now() < end) {
    try {
      await sentinel.rPush(key, String(seq));
      const node = sentinel.getMasterNode();
      line(`ack ${seq} ${Date.now()} ${node ? node.port : 0}`);
      seq += 1;
    } catch (e) {
      line(`err ${seq} ${Date.now()} ${e.message}`);
    }
    await sleep(15);
  }
  process.exit(0);
}

process.on('SIGTERM', () => process.exit(0));
main().catch((e) => {
  line(`err -1 ${Date.now()} crash: ${e}`);
  process.exit(1);
});
