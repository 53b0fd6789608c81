// An application client as people write it: node-redis with its defaults, connecting by name
// through the system resolver (getaddrinfo), one write every 10-20 ms. Driven by
// tests/clients_netns.rs; every line on stdout is one JSON event.
//
//   node failover_node_redis.js writer HOST PORT NAME [lib=redis|redis5]
//                                    RPUSH acked:NAME <seq>, logs each reply
//
// `lib=` picks node-redis's current release (`redis`, the default) or its previous major
// (`redis5`, an npm alias). node-redis keeps its socket private: the address each write went
// to is the one of the last socket it opened (it holds one connection), seen by wrapping
// `net.createConnection`.
"use strict";
const net = require("node:net");

const argv = process.argv.slice(2);
const libArg = argv.find((a) => a.startsWith("lib="));
const LIB = libArg ? libArg.slice(4) : "redis";
const [mode, host, port, name] = argv.filter((a) => !a.startsWith("lib="));

let socket = null;
const createConnection = net.createConnection;
net.createConnection = function (...args) {
  socket = createConnection.apply(this, args);
  return socket;
};
const { createClient } = require(LIB);

const log = (event) => process.stdout.write(JSON.stringify({ t: Date.now(), ...event }) + "\n");
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const pace = () => sleep(10 + Math.random() * 10);
const peer = () =>
  socket && socket.remoteAddress ? `${socket.remoteAddress}:${socket.remotePort}` : null;

async function writer() {
  const client = createClient({ socket: { host, port: Number(port) } });
  client.on("error", (e) => log({ ev: "error", err: String(e.message).slice(0, 200) }));
  client.on("connect", () => log({ ev: "connect", peer: peer() }));
  await client.connect();
  for (let seq = 1; ; seq++) {
    try {
      await client.rPush(`acked:${name}`, String(seq));
      log({ ev: "ok", seq, peer: peer() });
    } catch (e) {
      log({ ev: "fail", seq, err: String(e.message).slice(0, 200) });
    }
    await pace();
  }
}

process.on("SIGTERM", () => process.exit(0));
const runtime = `Node.js ${process.versions.node}`;
const pkg = require(`${LIB}/package.json`);
log({ ev: "start", mode, lib: "node-redis", version: pkg.version, runtime });
writer().catch((e) => {
  log({ ev: "crash", err: String(e) });
  process.exit(1);
});
