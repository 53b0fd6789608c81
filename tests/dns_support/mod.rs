//! Harness for the DNS component tests: a served topology on port 0 and small raw DNS clients.
#![allow(clippy::unwrap_used, dead_code)] // test support: fail loudly; not every test uses all

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use polestar::config;
use polestar::dns::{Listeners, serve};
use polestar::topology::{self, Master, MasterState, Node, Replica, SentinelCounts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, UdpSocket};
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

pub const ZONE: &str = "redis.internal.";
const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Proto {
    Udp,
    Tcp,
}

pub fn dns_config() -> config::Dns {
    config::Dns {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        zone: ZONE.into(),
        ttl: Duration::from_secs(1),
        nameservers: vec!["ns1.redis.internal.".into()],
        transfer_allow: vec!["127.0.0.1/32".parse().unwrap()],
        notify: vec![],
        rate_limit: config::DEFAULT_RATE_LIMIT,
        replica_max_lag: None,
        rate_limit_slip: config::DEFAULT_SLIP,
    }
}

pub struct Server {
    pub addr: SocketAddr,
    publisher: topology::Publisher,
    shutdown: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Server {
    pub async fn start(tweak: impl FnOnce(&mut config::Dns)) -> Self {
        let mut cfg = dns_config();
        tweak(&mut cfg);
        let listeners = Listeners::bind(&cfg).await.unwrap();
        let addr = listeners.local_addrs()[0];
        let (publisher, reader) = topology::channel();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(listeners, cfg, reader, shutdown.clone()));
        Self { addr, publisher, shutdown, task: Some(task) }
    }

    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let result = timeout(Duration::from_secs(5), self.task.take().unwrap()).await;
        result.expect("serve stops when cancelled").unwrap().unwrap();
    }

    /// Publishes a snapshot with these masters and waits until DNS serves it (the serial moves).
    pub async fn publish(&self, masters: Vec<Master>) {
        let before = self.serial().await;
        self.send(masters);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.serial().await == before {
            assert!(Instant::now() < deadline, "the zone did not change");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Publishes a snapshot that should not change any record, and gives it time to be seen.
    pub async fn publish_quiet(&self, masters: Vec<Master>) {
        self.send(masters);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    fn send(&self, masters: Vec<Master>) {
        self.publisher.publish(masters, true);
    }

    pub async fn serial(&self) -> u32 {
        soa_of(&self.ask(Proto::Udp, ZONE, RecordType::SOA).await).serial
    }

    pub async fn ask(&self, proto: Proto, qname: &str, rtype: RecordType) -> Message {
        self.exchange(proto, &query(qname, rtype)).await
    }

    pub async fn exchange(&self, proto: Proto, msg: &Message) -> Message {
        parse(&self.exchange_raw(proto, msg).await)
    }

    pub async fn exchange_raw(&self, proto: Proto, msg: &Message) -> Vec<u8> {
        let bytes = msg.to_vec().unwrap();
        match proto {
            Proto::Udp => self.exchange_bytes(&bytes).await,
            Proto::Tcp => tcp_exchange(self.addr, &bytes).await,
        }
    }

    /// One UDP datagram out, its answer back.
    pub async fn exchange_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.send_to(bytes, self.addr).await.unwrap();
        let mut buf = vec![0u8; 65535];
        let len =
            timeout(ANSWER_TIMEOUT, socket.recv(&mut buf)).await.expect("no UDP answer").unwrap();
        buf.truncate(len);
        buf
    }

    /// A zone transfer over TCP from the address `from`: every message until the closing SOA
    /// (or an error, or a lone up-to-date SOA).
    pub async fn transfer(&self, from: SocketAddr, msg: &Message) -> Vec<Message> {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(from).unwrap();
        let mut stream = socket.connect(self.addr).await.unwrap();
        write_framed(&mut stream, &msg.to_vec().unwrap()).await;
        let mut messages = Vec::new();
        let mut soas = 0;
        while soas < 2 {
            let wait =
                if messages.is_empty() { ANSWER_TIMEOUT } else { Duration::from_millis(500) };
            let Ok(bytes) = timeout(wait, read_framed(&mut stream)).await else { break };
            let reply = parse(&bytes.unwrap());
            soas += reply.answers.iter().filter(|r| r.record_type() == RecordType::SOA).count();
            let done = reply.metadata.response_code != hickory_proto::op::ResponseCode::NoError;
            messages.push(reply);
            if done {
                break;
            }
        }
        assert!(!messages.is_empty(), "no answer to the transfer");
        messages
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn tcp_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    write_framed(&mut stream, bytes).await;
    timeout(ANSWER_TIMEOUT, read_framed(&mut stream)).await.expect("no TCP answer").unwrap()
}

async fn write_framed(stream: &mut tokio::net::TcpStream, bytes: &[u8]) {
    let len = u16::try_from(bytes.len()).unwrap().to_be_bytes();
    stream.write_all(&[&len[..], bytes].concat()).await.unwrap();
}

async fn read_framed(stream: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

/// One question to the DNS server at `addr` (a running daemon's listener) over UDP, its answer.
pub async fn ask_udp(addr: SocketAddr, qname: &str, rtype: RecordType) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(&query(qname, rtype).to_vec().unwrap(), addr).await.unwrap();
    let mut buf = vec![0u8; 65535];
    let len = timeout(ANSWER_TIMEOUT, socket.recv(&mut buf)).await.expect("no UDP answer").unwrap();
    parse(&buf[..len])
}

pub fn query(qname: &str, rtype: RecordType) -> Message {
    let mut msg = Message::query();
    msg.add_query(Query::query(name(qname), rtype));
    msg
}

pub fn parse(bytes: &[u8]) -> Message {
    Message::from_vec(bytes).unwrap()
}

pub fn name(text: &str) -> Name {
    Name::from_ascii(text).unwrap()
}

pub fn rdata(msg: &Message) -> Vec<RData> {
    assert_eq!(msg.metadata.response_code, hickory_proto::op::ResponseCode::NoError, "{msg:?}");
    msg.answers.iter().map(|r| r.data.clone()).collect()
}

pub fn texts(msg: &Message) -> Vec<String> {
    let mut texts: Vec<String> = rdata(msg).iter().map(ToString::to_string).collect();
    texts.sort();
    texts
}

pub fn assert_nodata(msg: &Message) {
    assert_eq!(msg.metadata.response_code, hickory_proto::op::ResponseCode::NoError, "{msg:?}");
    assert!(msg.answers.is_empty(), "NODATA has no answers: {msg:?}");
    assert!(msg.metadata.authoritative);
    assert_eq!(msg.authorities.len(), 1);
    assert_eq!(msg.authorities[0].record_type(), RecordType::SOA, "SOA in authority for NODATA");
}

pub fn soa_of(msg: &Message) -> SOA {
    msg.answers
        .iter()
        .find_map(|r| match &r.data {
            RData::SOA(soa) => Some(soa.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no SOA in {msg:?}"))
}

pub fn soa_record(serial: u32) -> Record {
    let soa = SOA::new(name(ZONE), name("hostmaster.redis.internal."), serial, 60, 10, 3600, 1);
    Record::from_rdata(name(ZONE), 1, RData::SOA(soa))
}

pub fn serial_gt(a: u32, b: u32) -> bool {
    polestar::dns::zone::serial_gt(a, b)
}

pub fn master(label: &str, primary: Option<(&str, u16)>, replicas: &[(&str, bool)]) -> Master {
    let node = |ip: &str, port| Node { ip: ip.parse().unwrap(), port, hostname: None };
    let replica = |(ip, healthy): &(&str, bool)| Replica {
        ip: ip.parse().unwrap(),
        port: 6379,
        hostname: None,
        healthy: *healthy,
        down: !*healthy,
    };
    Master {
        withdrawn: None,
        provisional: false,
        name: label.to_string(),
        label: label.to_string(),
        primary: primary.map(|(ip, port)| node(ip, port)),
        epoch: Some(1),
        since: None,
        state: if primary.is_some() { MasterState::Ok } else { MasterState::Unknown },
        replicas: replicas.iter().map(replica).collect(),
        sentinels: SentinelCounts::default(),
    }
}

/// A small deterministic PRNG (xorshift64*): reproducible garbage without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

pub struct GarbageReport {
    /// Answers received to datagrams with the QR bit set or fewer than 12 bytes.
    pub qr_answered: usize,
}

/// Sends `count` malformed datagrams: random bytes, truncated and bit-flipped copies of a valid
/// query, runts, and valid queries with the QR bit set (which must never be answered).
pub async fn send_garbage(addr: SocketAddr, valid: &[u8], count: usize) -> GarbageReport {
    let noise = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let reflect = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut rng = Rng::new(0x5eed);
    for i in 0..count {
        let (socket, packet) = match i % 5 {
            0 => (&noise, {
                let n = rng.below(700);
                rng.bytes(n)
            }),
            1 => (&noise, valid[..rng.below(valid.len())].to_vec()),
            2 => {
                let mut p = valid.to_vec();
                let at = rng.below(p.len());
                p[at] ^= 1 << rng.below(8);
                (&noise, p)
            }
            3 => (&reflect, {
                let n = rng.below(12);
                rng.bytes(n)
            }),
            _ => {
                let mut p = valid.to_vec();
                p[2] |= 0x80; // QR: a response
                (&reflect, p)
            }
        };
        let _ = socket.send_to(&packet, addr).await;
        if i % 200 == 0 {
            tokio::task::yield_now().await; // let the server drain its socket
        }
    }
    let mut buf = [0u8; 1500];
    let mut qr_answered = 0;
    while timeout(Duration::from_millis(300), reflect.recv(&mut buf)).await.is_ok() {
        qr_answered += 1;
    }
    GarbageReport { qr_answered }
}

/// Opens `count` TCP connections that send garbage (bad lengths, random bodies, half frames).
pub async fn tcp_garbage(addr: SocketAddr, valid: &[u8], count: usize) {
    let mut rng = Rng::new(0xbad);
    for i in 0..count {
        let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else { continue };
        let body = match i % 3 {
            0 => {
                let n = rng.below(300);
                rng.bytes(n)
            }
            1 => [&[0xff, 0xff][..], &rng.bytes(50)].concat(),
            _ => [&(valid.len() as u16).to_be_bytes()[..], &valid[..valid.len() / 2]].concat(),
        };
        let _ = stream.write_all(&body).await;
    }
}

pub async fn dig(addr: SocketAddr, args: &[&str]) -> String {
    let out = tokio::process::Command::new("dig")
        .args([format!("@{}", addr.ip()), "-p".into(), addr.port().to_string()])
        .args(["+tries=1", "+time=3"])
        .args(args)
        .output()
        .await
        .expect("dig is installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub async fn recv_notify(socket: &UdpSocket) -> (Message, SocketAddr) {
    let mut buf = [0u8; 1500];
    let (len, from) = timeout(Duration::from_secs(4), socket.recv_from(&mut buf))
        .await
        .expect("no NOTIFY")
        .unwrap();
    let msg = parse(&buf[..len]);
    assert_eq!(msg.metadata.op_code, OpCode::Notify);
    assert_eq!(msg.metadata.message_type, MessageType::Query);
    (msg, from)
}

pub async fn ack(socket: &UdpSocket, notify: &Message, to: SocketAddr) {
    let mut reply = Message::new(notify.metadata.id, MessageType::Response, OpCode::Notify);
    reply.add_queries(notify.queries.clone());
    socket.send_to(&reply.to_vec().unwrap(), to).await.unwrap();
}

/// A knotd secondary of `zone`, in a temporary directory on loopback.
pub struct Knot {
    pub addr: SocketAddr,
    zone: String,
    dir: tempfile::TempDir,
}

pub struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Knot {
    /// Its address (known before polestar starts, which must NOTIFY it); `None` without knotd.
    pub fn prepare(zone: &str) -> Option<Self> {
        let knotd = ["/usr/sbin/knotd", "/usr/bin/knotd"].iter().any(|p| PathBuf::from(p).exists());
        if !knotd {
            return None;
        }
        let port = polestar_lab::free_service_port().expect("a port for knotd");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Some(Self { addr, zone: zone.to_string(), dir: tempfile::tempdir().unwrap() })
    }

    pub fn start(&self, primary: SocketAddr) -> Running {
        let dir = self.dir.path().display();
        let conf = format!(
            "server:\n  rundir: \"{dir}\"\n  listen: 127.0.0.1@{port}\n\
             log:\n  - target: stderr\n    any: info\n\
             database:\n  storage: \"{dir}\"\n\
             remote:\n  - id: polestar\n    address: {ip}@{pport}\n\
             acl:\n  - id: polestar_notify\n    address: {ip}\n    action: notify\n\
             template:\n  - id: default\n    storage: \"{dir}\"\n\
             zone:\n  - domain: {zone}\n    master: polestar\n    acl: polestar_notify\n",
            zone = self.zone,
            port = self.addr.port(),
            ip = primary.ip(),
            pport = primary.port(),
        );
        let path = self.dir.path().join("knot.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new("knotd")
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("knotd.log")).unwrap())
            .spawn()
            .expect("knotd starts");
        Running(child)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("knotd.log")).unwrap_or_default()
    }

    /// Polls knotd until `qname` A answers `expected`, or fails with knotd's log.
    pub async fn wait_for(
        &self,
        _primary: SocketAddr,
        qname: &str,
        expected: &str,
        within: Duration,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let out = dig(self.addr, &["+short", qname, "A"]).await;
            if out.trim() == expected {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "knotd answers {out:?} for {qname}, not {expected}; its log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
