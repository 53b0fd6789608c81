// An application client as people write it: ioredis with its defaults, connecting by name
// through the system resolver (getaddrinfo), one write every 10-20 ms. Driven by
// tests/clients_netns.rs; every line on stdout is one JSON event.
//
//   node failover_ioredis.js writer HOST PORT NAME [disconnect50]
//                                    RPUSH acked:NAME <seq>, logs each reply
//   node failover_ioredis.js blpop  HOST PORT NAME
//                                    one connection pushes jobs:NAME every 10-20 ms, another
//                                    BLPOPs them (timeout 0)
//
// `disconnect50`: `disconnectTimeout: 50` (ioredis's default is 2000 ms: how long a connection
// it closes itself may wait for the peer's FIN before it is destroyed).
//
// `lib=NAME` (anywhere among the arguments) picks the library: `ioredis` (the current release,
// the default), `ioredis5` (the previous major, an npm alias) or `iovalkey` (Valkey's fork, the
// same API).
"use strict";
const argv = process.argv.slice(2);
const libArg = argv.find((a) => a.startsWith("lib="));
const LIB = libArg ? libArg.slice(4) : "ioredis";
const Redis = require(LIB);

const [mode, host, port, name, variant] = argv.filter((a) => !a.startsWith("lib="));
const options = variant === "disconnect50" ? { disconnectTimeout: 50 } : {};
const log = (event) => process.stdout.write(JSON.stringify({ t: Date.now(), ...event }) + "\n");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const pace = () => sleep(10 + Math.random() * 10);

function connect(role) {
  const r = new Redis({ host, port: Number(port), ...options });
  r.on("error", (e) => log({ ev: "error", role, err: String(e.message).slice(0, 200) }));
  r.on("connect", () => log({ ev: "connect", role, peer: peer(r) }));
  return r;
}

function peer(r) {
  const s = r.stream;
  return s && s.remoteAddress ? `${s.remoteAddress}:${s.remotePort}` : null;
}

async function writer() {
  const r = connect("writer");
  for (let seq = 1; ; seq++) {
    try {
      await r.rpush(`acked:${name}`, seq);
      log({ ev: "ok", seq, peer: peer(r) });
    } catch (e) {
      log({ ev: "fail", seq, err: String(e.message).slice(0, 200) });
    }
    await pace();
  }
}

async function blpop() {
  const pusher = connect("pusher");
  const blocker = connect("blocker");
  (async () => {
    for (let seq = 1; ; seq++) {
      await pusher.rpush(`jobs:${name}`, seq).catch(() => {});
      await pace();
    }
  })();
  for (;;) {
    try {
      const popped = await blocker.blpop(`jobs:${name}`, 0);
      log({ ev: "ok", seq: Number(popped && popped[1]), peer: peer(blocker) });
    } catch (e) {
      log({ ev: "fail", err: String(e.message).slice(0, 200) });
      await pace();
    }
  }
}

process.on("SIGTERM", () => process.exit(0));
const runtime = `Node.js ${process.versions.node}`;
const pkg = require(`${LIB}/package.json`);
log({ ev: "start", mode, lib: pkg.name, version: pkg.version, runtime });
(mode === "blpop" ? blpop() : writer()).catch((e) => {
  log({ ev: "crash", err: String(e) });
  process.exit(1);
});
