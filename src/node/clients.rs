//! `CLIENT LIST` turned into typed records: the one reading of it, for the drain (whom to
//! kill) and the node-side sweep (whom to spare, [`super::infrastructure`]).
//!
//! The reply is one line per client of space-separated `key=value` fields. Which fields exist
//! depends on the server version (`ssub` since 7.0, `lib-name` since 7.2, Valkey adds its own),
//! so unknown keys are ignored and missing ones take a neutral default. Only `id` is required:
//! without it a client cannot be killed, so such a line is counted as unreadable and skipped.
//! Nothing here trusts the node: an odd line is skipped, never a panic.

use std::net::SocketAddr;
use std::time::Duration;

/// One client connection as the node reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientInfo {
    pub id: u64,
    /// The client's address; `None` for Unix sockets and anything that is not `ip:port`.
    pub addr: Option<SocketAddr>,
    /// The node's address the client is connected to.
    pub laddr: Option<SocketAddr>,
    /// Set by `CLIENT SETNAME`; empty when unnamed.
    pub name: String,
    /// How long the connection has existed (whole seconds, rounded down by the server);
    /// `None` when the line has no readable `age`.
    pub age: Option<Duration>,
    pub idle: Duration,
    pub flags: Flags,
    pub db: u32,
    pub user: String,
    /// The last command, lower case, with its subcommand after `|` (`client|list`).
    pub cmd: String,
    /// Set by `CLIENT SETINFO LIB-NAME` (Redis 7.2+, Valkey); empty otherwise.
    pub lib_name: String,
}

/// The `flags` field: one letter per property (`N` normal, `P` pub/sub, `S` replica,
/// `M` master, `b` blocked, `x` in MULTI, `O` monitor, `A` closing...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flags(pub String);

impl Flags {
    pub fn has(&self, flag: char) -> bool {
        self.0.contains(flag)
    }
}

impl ClientInfo {
    /// The command name without its subcommand, lower case (`client` for `client|list`).
    pub fn command(&self) -> &str {
        self.cmd.split('|').next().unwrap_or("")
    }

    /// Whether the last command changes data (see [`WRITE_COMMANDS`]).
    pub fn last_command_writes(&self) -> bool {
        WRITE_COMMANDS.binary_search(&self.command()).is_ok()
    }

    /// Waiting on the server: in a blocking command, or held by `CLIENT PAUSE`.
    pub fn blocked(&self) -> bool {
        self.flags.has('b')
    }
}

/// Commands that change data (Redis 7.x and Valkey 8 `write` flag, plus `exec`, `eval`,
/// `evalsha` and `fcall`, which may write), lower case. A client whose last command is one of
/// them, on a node that is no longer the primary, got `READONLY`: it holds a stale address.
/// An unknown command counts as a read: a wrongly spared writer is caught when it writes a
/// known command, a wrongly killed reader would lose its connection for nothing.
const WRITE_COMMANDS: &[&str] = &[
    "append",
    "bitfield",
    "bitop",
    "blmove",
    "blmpop",
    "blpop",
    "brpop",
    "brpoplpush",
    "bzmpop",
    "bzpopmax",
    "bzpopmin",
    "copy",
    "decr",
    "decrby",
    "del",
    "eval",
    "evalsha",
    "exec",
    "expire",
    "expireat",
    "fcall",
    "flushall",
    "flushdb",
    "geoadd",
    "georadius",
    "georadiusbymember",
    "geosearchstore",
    "getdel",
    "getex",
    "getset",
    "hdel",
    "hexpire",
    "hexpireat",
    "hgetdel",
    "hgetex",
    "hincrby",
    "hincrbyfloat",
    "hmset",
    "hpersist",
    "hpexpire",
    "hpexpireat",
    "hset",
    "hsetex",
    "hsetnx",
    "incr",
    "incrby",
    "incrbyfloat",
    "linsert",
    "lmove",
    "lmpop",
    "lpop",
    "lpush",
    "lpushx",
    "lrem",
    "lset",
    "ltrim",
    "migrate",
    "move",
    "mset",
    "msetnx",
    "persist",
    "pexpire",
    "pexpireat",
    "pfadd",
    "pfmerge",
    "psetex",
    "rename",
    "renamenx",
    "restore",
    "rpop",
    "rpoplpush",
    "rpush",
    "rpushx",
    "sadd",
    "sdiffstore",
    "set",
    "setbit",
    "setex",
    "setnx",
    "setrange",
    "sinterstore",
    "smove",
    "sort",
    "spop",
    "srem",
    "sunionstore",
    "swapdb",
    "unlink",
    "xack",
    "xadd",
    "xautoclaim",
    "xclaim",
    "xdel",
    "xgroup",
    "xsetid",
    "xtrim",
    "zadd",
    "zdiffstore",
    "zincrby",
    "zinterstore",
    "zmpop",
    "zpopmax",
    "zpopmin",
    "zrangestore",
    "zrem",
    "zremrangebylex",
    "zremrangebyrank",
    "zremrangebyscore",
    "zunionstore",
];

/// Why a line of `CLIENT LIST` could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("no id field")]
    MissingId,
    #[error("id {0:?} is not a number")]
    BadId(String),
}

/// Every readable client of a `CLIENT LIST` reply, and how many lines were unreadable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientList {
    pub clients: Vec<ClientInfo>,
    pub unreadable: usize,
}

/// Parses a whole `CLIENT LIST` reply; blank lines are ignored.
pub fn parse_list(text: &str) -> ClientList {
    let mut list = ClientList::default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match parse_line(line) {
            Ok(client) => list.clients.push(client),
            Err(_) => list.unreadable += 1,
        }
    }
    list
}

/// Parses one line; fields without `=` and unknown keys are ignored.
pub fn parse_line(line: &str) -> Result<ClientInfo, LineError> {
    let mut client = ClientInfo::default();
    let mut id = None;
    for (key, value) in line.split_ascii_whitespace().filter_map(|f| f.split_once('=')) {
        match key {
            "id" => id = Some(value.parse().map_err(|_| LineError::BadId(value.to_string()))?),
            _ => set_field(&mut client, key, value),
        }
    }
    client.id = id.ok_or(LineError::MissingId)?;
    Ok(client)
}

fn set_field(client: &mut ClientInfo, key: &str, value: &str) {
    match key {
        "addr" => client.addr = value.parse().ok(),
        "laddr" => client.laddr = value.parse().ok(),
        "name" => client.name = value.to_string(),
        "age" => client.age = value.parse().ok().map(Duration::from_secs),
        "idle" => client.idle = seconds(value),
        "flags" => client.flags = Flags(value.to_string()),
        "db" => client.db = value.parse().unwrap_or(0),
        "user" => client.user = value.to_string(),
        "cmd" => client.cmd = value.to_ascii_lowercase(),
        "lib-name" => client.lib_name = value.to_string(),
        _ => {}
    }
}

/// A whole number of seconds; anything unreadable counts as zero (the youngest possible).
fn seconds(value: &str) -> Duration {
    Duration::from_secs(value.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const REDIS_70: &str = "id=3 addr=127.0.0.1:52555 laddr=127.0.0.1:6379 fd=8 name= age=12 \
        idle=3 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 qbuf=26 qbuf-free=20448 argv-mem=10 \
        multi-mem=0 rbs=1024 rbp=0 obl=0 oll=0 omem=0 tot-mem=22426 events=r cmd=client|list \
        user=default redir=-1 resp=2";

    #[test]
    fn reads_a_redis_7_0_line() {
        let c = parse_line(REDIS_70).expect("valid line");
        assert_eq!(c.id, 3);
        assert_eq!(c.addr, Some("127.0.0.1:52555".parse().expect("literal")));
        assert_eq!(c.laddr, Some("127.0.0.1:6379".parse().expect("literal")));
        assert_eq!(c.name, "");
        assert_eq!(c.age, Some(Duration::from_secs(12)));
        assert_eq!(c.idle, Duration::from_secs(3));
        assert!(c.flags.has('N'));
        assert_eq!(c.user, "default");
        assert_eq!(c.cmd, "client|list");
        assert_eq!(c.command(), "client");
        assert_eq!(c.lib_name, "");
    }

    #[test]
    fn reads_lib_name_ipv6_and_names_with_equals() {
        let line = "id=18446744073709551615 addr=[::1]:40000 laddr=[::1]:6379 name=app=1 \
                    age=0 flags=P db=3 cmd=SUBSCRIBE user=app lib-name=polestar lib-ver=0.1.0";
        let c = parse_line(line).expect("valid line");
        assert_eq!(c.id, u64::MAX);
        assert_eq!(c.addr, Some("[::1]:40000".parse().expect("literal")));
        assert_eq!(c.name, "app=1");
        assert_eq!(c.db, 3);
        assert_eq!(c.cmd, "subscribe");
        assert_eq!(c.lib_name, "polestar");
    }

    #[test]
    fn unix_socket_clients_have_no_address() {
        let c = parse_line("id=7 addr=/tmp/redis.sock:0 laddr=/tmp/redis.sock:0 flags=U")
            .expect("valid line");
        assert_eq!(c.addr, None);
        assert!(c.flags.has('U'));
    }

    #[test]
    fn lines_without_a_usable_id_are_counted_not_fatal() {
        assert_eq!(parse_line("addr=1.2.3.4:5 name=x"), Err(LineError::MissingId));
        assert_eq!(parse_line("id=-1 name=x"), Err(LineError::BadId("-1".into())));
        let list = parse_list(&format!("{REDIS_70}\r\n\r\ngarbage\nid=x\nid=4 age=zz\n"));
        assert_eq!(list.clients.len(), 2);
        assert_eq!(list.unreadable, 2);
        assert_eq!(list.clients[1].age, None);
    }

    #[test]
    fn the_write_commands_are_sorted_and_lower_case() {
        assert!(WRITE_COMMANDS.windows(2).all(|w| w[0] < w[1]));
        assert!(WRITE_COMMANDS.iter().all(|c| *c == c.to_ascii_lowercase()));
    }

    #[test]
    fn writers_are_told_from_readers() {
        let last = |cmd: &str| parse_line(&format!("id=1 cmd={cmd}")).expect("valid line");
        for cmd in ["set", "INCR", "rpush", "exec", "xgroup|create", "blpop"] {
            assert!(last(cmd).last_command_writes(), "{cmd}");
        }
        for cmd in ["get", "mget", "ping", "client|info", "subscribe", "NULL", "", "eval_ro"] {
            assert!(!last(cmd).last_command_writes(), "{cmd}");
        }
        assert!(parse_line("id=1 flags=b").expect("valid").blocked());
        assert!(!parse_line("id=1 flags=N").expect("valid").blocked());
    }

    #[test]
    fn odd_input_never_panics() {
        let samples = [
            "",
            "=",
            "==",
            "id=",
            "id==1",
            "id=1 =x age=-5 idle=99999999999999999999999 addr=[::1 laddr=:::",
            "id=1 flags= cmd= name",
            "\u{0}\u{ffff} id=2 é=ü",
        ];
        for s in samples {
            let _ = parse_line(s);
            let _ = parse_list(s);
        }
        let long = "x=y ".repeat(100_000) + "id=9";
        assert_eq!(parse_line(&long).map(|c| c.id), Ok(9));
    }
}
