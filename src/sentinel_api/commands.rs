//! What each command answers (pure: a request, the connection's [`Session`] and a [`Context`]
//! of the published state in, replies out). The connection loop in `conn` does the I/O.
//!
//! Errors are Sentinel's own words where clients match on them (`NOAUTH`, `WRONGPASS`, `No such
//! master with that name`, a nil array for an unknown master's address); commands that would
//! change something are refused with an error that says where that is done instead.

use std::collections::BTreeSet;

use subtle::ConstantTimeEq;

use crate::config::{HostPort, Secret};
use crate::topology::{Master, Snapshot};

use super::resp::{Proto, Reply, Request};
use super::view;

/// Subscriptions (channels and patterns together) one connection may hold.
pub const MAX_SUBSCRIPTIONS: usize = 256;
/// Patterns one connection may hold: every one is matched against every channel published
/// (Sentinel-aware clients use one, `*`, or none).
pub const MAX_PATTERNS: usize = 16;
/// Bytes of the names of one connection's subscriptions, channels and patterns together
/// (Sentinel's channels are short): so a connection holds kilobytes, not 256 × 64 KiB.
pub const MAX_SUBSCRIPTION_BYTES: usize = 4096;

/// The published state a command is answered from, taken once per batch of requests.
pub struct Context<'a> {
    pub snapshot: &'a Snapshot,
    pub peers: &'a [HostPort],
    pub password: Option<&'a Secret>,
    pub server: &'a ServerInfo,
}

/// What `INFO` and `HELLO` say about this endpoint.
pub struct ServerInfo {
    pub run_id: String,
    pub port: u16,
    pub pid: u32,
    pub uptime_secs: u64,
    pub connected_clients: usize,
}

/// What one connection has said so far.
#[derive(Debug)]
pub struct Session {
    pub id: u64,
    pub proto: Proto,
    pub authenticated: bool,
    pub name: Option<String>,
    pub channels: BTreeSet<Vec<u8>>,
    pub patterns: BTreeSet<Vec<u8>>,
    /// Set by `QUIT`: the connection closes after this batch's replies.
    pub closing: bool,
}

impl Session {
    pub fn new(id: u64, password_required: bool) -> Self {
        Self {
            id,
            proto: Proto::Resp2,
            authenticated: !password_required,
            name: None,
            channels: BTreeSet::new(),
            patterns: BTreeSet::new(),
            closing: false,
        }
    }

    pub fn subscriptions(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }
}

/// The command's name for metrics: one of a fixed set (`SENTINEL` with its subcommand), so the
/// label stays bounded. Its length is that set, one name a line.
pub fn metric_name(request: &Request) -> &'static str {
    const KNOWN: [&str; 18] = [
        "ping",
        "sentinel",
        "auth",
        "hello",
        "role",
        "info",
        "client",
        "subscribe",
        "psubscribe",
        "unsubscribe",
        "punsubscribe",
        "quit",
        "reset",
        "echo",
        "command",
        "config",
        "publish",
        "shutdown",
    ];
    const SENTINEL: [&str; 10] = [
        "sentinel get-master-addr-by-name",
        "sentinel masters",
        "sentinel master",
        "sentinel replicas",
        "sentinel slaves",
        "sentinel sentinels",
        "sentinel ckquorum",
        "sentinel myid",
        "sentinel failover",
        "sentinel set",
    ];
    let word = |i: usize| request.get(i).map(|w| String::from_utf8_lossy(w).to_ascii_lowercase());
    let name = word(0).unwrap_or_default();
    if name == "sentinel" {
        let full = format!("sentinel {}", word(1).unwrap_or_default());
        return SENTINEL.into_iter().find(|k| *k == full).unwrap_or("sentinel other");
    }
    KNOWN.into_iter().find(|k| *k == name).unwrap_or("other")
}

/// Answers one request. Subscription commands answer one reply per channel, hence the `Vec`.
pub fn answer(request: &Request, session: &mut Session, ctx: &Context) -> Vec<Reply> {
    let Some(name) = request.first() else { return Vec::new() };
    let name = String::from_utf8_lossy(name).to_ascii_lowercase();
    let args = &request[1..];
    if !session.authenticated && !matches!(name.as_str(), "auth" | "hello" | "quit" | "reset") {
        return vec![Reply::error("NOAUTH Authentication required.")];
    }
    if session.subscriptions() > 0 && session.proto == Proto::Resp2 && !pubsub_allowed(&name) {
        return vec![Reply::error(format!(
            "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
             RESET are allowed in this context"
        ))];
    }
    match name.as_str() {
        "ping" => vec![ping(args, session)],
        "echo" if args.len() == 1 => vec![Reply::Bulk(args[0].clone())],
        "auth" => vec![auth(args, session, ctx)],
        "hello" => vec![hello(args, session, ctx)],
        "quit" => {
            session.closing = true;
            vec![Reply::ok()]
        }
        "reset" => {
            *session = Session::new(session.id, ctx.password.is_some());
            vec![Reply::Simple("RESET".into())]
        }
        "sentinel" => vec![sentinel(args, ctx)],
        "role" => vec![role(ctx.snapshot)],
        "info" => vec![Reply::bulk(info(args, ctx))],
        "client" => vec![client(args, session)],
        "command" => vec![Reply::Array(Vec::new())],
        "subscribe" | "psubscribe" => subscribe(&name, args, session),
        "unsubscribe" | "punsubscribe" => unsubscribe(&name, args, session),
        "config" | "publish" | "shutdown" | "failover" | "replicaof" | "slaveof" | "debug"
        | "acl" | "flushconfig" => vec![refused(&name)],
        _ => vec![unknown_command(&name, args)],
    }
}

fn pubsub_allowed(name: &str) -> bool {
    matches!(
        name,
        "subscribe" | "psubscribe" | "unsubscribe" | "punsubscribe" | "ping" | "quit" | "reset"
    )
}

fn ping(args: &[Vec<u8>], session: &Session) -> Reply {
    match (args, session.subscriptions() > 0 && session.proto == Proto::Resp2) {
        ([], false) => Reply::Simple("PONG".into()),
        ([msg], false) => Reply::Bulk(msg.clone()),
        ([], true) => Reply::Array(vec![Reply::bulk("pong"), Reply::bulk("")]),
        ([msg], true) => Reply::Array(vec![Reply::bulk("pong"), Reply::Bulk(msg.clone())]),
        _ => arity("ping"),
    }
}

fn arity(command: &str) -> Reply {
    Reply::error(format!("ERR wrong number of arguments for '{command}' command"))
}

fn unknown_command(name: &str, args: &[Vec<u8>]) -> Reply {
    let shown: Vec<String> =
        args.iter().take(8).map(|a| format!("'{}'", String::from_utf8_lossy(a))).collect();
    let name: String = name.chars().take(64).collect();
    Reply::error(format!(
        "ERR unknown command '{name}', with args beginning with: {}",
        shown.join(" ")
    ))
}

/// Writes and admin commands: polestar serves what the Sentinels publish and changes nothing
/// through this endpoint.
fn refused(what: &str) -> Reply {
    let what = what.to_ascii_uppercase();
    let hint = if what.ends_with("FAILOVER") {
        "for a planned failover use polestar's HTTP API (POST /v1/masters/{name}/failover, \
         with the admin token) or a Sentinel"
    } else {
        "change the configuration on the Sentinels themselves; polestar's HTTP API \
         (GET /v1/masters) shows what they publish"
    };
    Reply::error(format!(
        "ERR {what} is refused: polestar's Sentinel endpoint is read-only; {hint}"
    ))
}

fn auth(args: &[Vec<u8>], session: &mut Session, ctx: &Context) -> Reply {
    let (user, password) = match args {
        [password] => (None, password),
        [user, password] => (Some(user.as_slice()), password),
        _ => return arity("auth"),
    };
    match check_password(user, password, ctx.password) {
        Ok(()) => {
            session.authenticated = true;
            Reply::ok()
        }
        Err(e) => e,
    }
}

/// Only the `default` user exists, with `sentinel_api.password_file` as its password.
fn check_password(
    user: Option<&[u8]>,
    given: &[u8],
    expected: Option<&Secret>,
) -> Result<(), Reply> {
    let Some(expected) = expected else {
        return Err(Reply::error(
            "ERR AUTH <password> called without any password configured for the default user. \
             Are you sure your configuration is correct?",
        ));
    };
    let user_ok = user.is_none_or(|u| u == b"default");
    let password_ok: bool = expected.expose().as_bytes().ct_eq(given).into();
    if user_ok && password_ok {
        Ok(())
    } else {
        Err(Reply::error("WRONGPASS invalid username-password pair or user is disabled."))
    }
}

fn hello(args: &[Vec<u8>], session: &mut Session, ctx: &Context) -> Reply {
    let mut proto = session.proto;
    let mut rest = args;
    if let Some((version, tail)) = args.split_first() {
        proto = match version.as_slice() {
            b"2" => Proto::Resp2,
            b"3" => Proto::Resp3,
            _ => return Reply::error("NOPROTO unsupported protocol version"),
        };
        rest = tail;
    }
    let name = match hello_options(rest, session, ctx) {
        Ok(name) => name,
        Err(e) => return e,
    };
    if !session.authenticated {
        return Reply::error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and \
             select the RESP protocol version at the same time",
        );
    }
    session.proto = proto;
    if name.is_some() {
        session.name = name;
    }
    hello_reply(session)
}

/// `HELLO`'s options after the version: `AUTH` authenticates the session on the spot,
/// `SETNAME`'s name is returned for the session to take once `HELLO` succeeds.
fn hello_options(
    mut rest: &[Vec<u8>],
    session: &mut Session,
    ctx: &Context,
) -> Result<Option<String>, Reply> {
    let mut name = None;
    loop {
        match rest {
            [] => return Ok(name),
            [opt, user, password, tail @ ..] if opt.eq_ignore_ascii_case(b"auth") => {
                check_password(Some(user), password, ctx.password)?;
                session.authenticated = true;
                rest = tail;
            }
            [opt, client, tail @ ..] if opt.eq_ignore_ascii_case(b"setname") => {
                name = Some(client_name(client)?);
                rest = tail;
            }
            [opt, ..] => {
                let opt = String::from_utf8_lossy(opt);
                return Err(Reply::error(format!("ERR Syntax error in HELLO option '{opt}'")));
            }
        }
    }
}

/// What `HELLO` answers: the server, as Redis describes itself, in the session's protocol.
fn hello_reply(session: &Session) -> Reply {
    let version = if session.proto == Proto::Resp3 { 3 } else { 2 };
    Reply::Map(vec![
        (Reply::bulk("server"), Reply::bulk("redis")),
        (Reply::bulk("version"), Reply::bulk(REDIS_VERSION)),
        (Reply::bulk("proto"), Reply::Int(version)),
        (Reply::bulk("id"), Reply::Int(session.id as i64)),
        (Reply::bulk("mode"), Reply::bulk("sentinel")),
        (Reply::bulk("role"), Reply::bulk("master")),
        (Reply::bulk("modules"), Reply::Array(Vec::new())),
    ])
}

/// The Redis version this endpoint speaks for (clients gate features on it).
const REDIS_VERSION: &str = "7.0.0";

fn client_name(name: &[u8]) -> Result<String, Reply> {
    let valid = name.len() <= 256 && name.iter().all(|&b| (b'!'..=b'~').contains(&b));
    if !valid {
        return Err(Reply::error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(String::from_utf8_lossy(name).into_owned())
}

fn client(args: &[Vec<u8>], session: &mut Session) -> Reply {
    let sub = args.first().map(|s| String::from_utf8_lossy(s).to_ascii_lowercase());
    match (sub.as_deref(), args.len()) {
        (Some("setname"), 2) => match client_name(&args[1]) {
            Ok(name) => {
                session.name = (!name.is_empty()).then_some(name);
                Reply::ok()
            }
            Err(e) => e,
        },
        (Some("setinfo"), 3) => Reply::ok(),
        (Some("getname"), 1) => match &session.name {
            Some(name) => Reply::bulk(name),
            None => Reply::NilBulk,
        },
        (Some("id"), 1) => Reply::Int(session.id as i64),
        _ => {
            let sub = sub.unwrap_or_default();
            Reply::error(format!(
                "ERR unknown subcommand or wrong number of arguments for '{sub}'. Try CLIENT HELP."
            ))
        }
    }
}

fn subscribe(kind: &str, args: &[Vec<u8>], session: &mut Session) -> Vec<Reply> {
    if args.is_empty() {
        return vec![arity(kind)];
    }
    let mut out = Vec::with_capacity(args.len());
    for target in args {
        let known = session.channels.contains(target) || session.patterns.contains(target);
        if let Some(refused) = (!known).then(|| over_limit(kind, target, session)).flatten() {
            super::limit::hit(super::limit::Limit::Subscriptions);
            out.push(Reply::error(refused));
            break;
        }
        let set = if kind == "subscribe" { &mut session.channels } else { &mut session.patterns };
        set.insert(target.clone());
        let count = session.subscriptions() as i64;
        out.push(Reply::Push(vec![
            Reply::bulk(kind),
            Reply::Bulk(target.clone()),
            Reply::Int(count),
        ]));
    }
    out
}

/// Why one more subscription to `target` is refused, if it is.
fn over_limit(kind: &str, target: &[u8], session: &Session) -> Option<String> {
    let held: usize = session.channels.iter().chain(&session.patterns).map(Vec::len).sum();
    if session.subscriptions() >= MAX_SUBSCRIPTIONS {
        Some(format!("ERR too many subscriptions on one connection (at most {MAX_SUBSCRIPTIONS})"))
    } else if kind == "psubscribe" && session.patterns.len() >= MAX_PATTERNS {
        Some(format!("ERR too many patterns on one connection (at most {MAX_PATTERNS})"))
    } else if held + target.len() > MAX_SUBSCRIPTION_BYTES {
        Some(format!(
            "ERR too many subscription bytes on one connection (at most {MAX_SUBSCRIPTION_BYTES})"
        ))
    } else {
        None
    }
}

fn unsubscribe(kind: &str, args: &[Vec<u8>], session: &mut Session) -> Vec<Reply> {
    let patterns = kind == "punsubscribe";
    let set = if patterns { &session.patterns } else { &session.channels };
    let targets: Vec<Vec<u8>> =
        if args.is_empty() { set.iter().cloned().collect() } else { args.to_vec() };
    if targets.is_empty() {
        let count = session.subscriptions() as i64;
        return vec![Reply::Push(vec![Reply::bulk(kind), Reply::NilBulk, Reply::Int(count)])];
    }
    let mut out = Vec::with_capacity(targets.len());
    for target in targets {
        let set = if patterns { &mut session.patterns } else { &mut session.channels };
        set.remove(&target);
        let count = session.subscriptions() as i64;
        out.push(Reply::Push(vec![Reply::bulk(kind), Reply::Bulk(target), Reply::Int(count)]));
    }
    out
}

/// `SENTINEL <subcommand>`: one match over the subcommands answered, as long as that list.
fn sentinel(args: &[Vec<u8>], ctx: &Context) -> Reply {
    let Some(sub) = args.first() else { return arity("sentinel") };
    let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
    let rest = &args[1..];
    let named = |f: &dyn Fn(&Master) -> Reply| match rest {
        [name] => match ctx.snapshot.master(&String::from_utf8_lossy(name)) {
            Some(m) => f(m),
            None => no_such_master(),
        },
        _ => arity(&format!("sentinel|{sub}")),
    };
    match sub.as_str() {
        "get-master-addr-by-name" => match rest {
            [name] => master_addr(ctx.snapshot.master(&String::from_utf8_lossy(name))),
            _ => arity("sentinel|get-master-addr-by-name"),
        },
        "masters" if rest.is_empty() => Reply::Array(
            ctx.snapshot
                .masters
                .values()
                .filter_map(|m| Some(view::master(m, m.primary.as_ref()?, ctx.peers.len())))
                .collect(),
        ),
        "master" => named(&|m| match &m.primary {
            Some(p) => view::master(m, p, ctx.peers.len()),
            None => no_such_master(),
        }),
        "replicas" | "slaves" => named(&|m| {
            Reply::Array(m.replicas.iter().map(|r| view::replica(r, m.primary.as_ref())).collect())
        }),
        "sentinels" => named(&|_| Reply::Array(ctx.peers.iter().map(view::peer).collect())),
        "ckquorum" => named(&ckquorum),
        "myid" if rest.is_empty() => Reply::bulk(&ctx.server.run_id),
        "set"
        | "monitor"
        | "remove"
        | "failover"
        | "reset"
        | "flushconfig"
        | "config"
        | "simulate-failure"
        | "debug"
        | "is-master-down-by-addr"
        | "info-cache" => refused(&format!("SENTINEL {sub}")),
        "masters" | "myid" => arity(&format!("sentinel|{sub}")),
        _ => {
            let sub: String = sub.chars().take(64).collect();
            Reply::error(format!("ERR Unknown sentinel subcommand '{sub}'"))
        }
    }
}

fn no_such_master() -> Reply {
    Reply::error("ERR No such master with that name")
}

/// `[ip, port]`, or Sentinel's nil for a master it does not know (or has no primary for yet).
fn master_addr(master: Option<&std::sync::Arc<Master>>) -> Reply {
    match master.and_then(|m| m.primary.as_ref()) {
        Some(p) => Reply::Array(vec![Reply::bulk(view::host(p)), Reply::bulk(p.port.to_string())]),
        None => Reply::NilArray,
    }
}

/// Whether the configured Sentinels polestar reaches are a majority: what it needs to follow a
/// failover (it never authorizes one itself).
fn ckquorum(m: &Master) -> Reply {
    let c = &m.sentinels;
    let majority = c.configured / 2 + 1;
    if c.reachable >= majority {
        Reply::Simple(format!(
            "OK {} usable Sentinels. Quorum and failover authorization can be reached",
            c.reachable
        ))
    } else {
        Reply::error(format!(
            "NOQUORUM {} usable Sentinels of {} configured. Not enough available Sentinels to \
             reach the majority",
            c.reachable, c.configured
        ))
    }
}

fn role(snapshot: &Snapshot) -> Reply {
    let names = snapshot.masters.keys().map(Reply::bulk).collect();
    Reply::Array(vec![Reply::bulk("sentinel"), Reply::Array(names)])
}

fn info(args: &[Vec<u8>], ctx: &Context) -> String {
    let section = args.first().map(|s| String::from_utf8_lossy(s).to_ascii_lowercase());
    let all = matches!(section.as_deref(), None | Some("all" | "default" | "everything"));
    let wants = |name: &str| all || section.as_deref() == Some(name);
    let s = ctx.server;
    let mut out = String::new();
    if wants("server") {
        out.push_str(&format!(
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:sentinel\r\n\
             polestar_version:{}\r\nprocess_id:{}\r\nrun_id:{}\r\ntcp_port:{}\r\n\
             uptime_in_seconds:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            s.pid,
            s.run_id,
            s.port,
            s.uptime_secs
        ));
    }
    if wants("clients") {
        out.push_str(&format!("# Clients\r\nconnected_clients:{}\r\n\r\n", s.connected_clients));
    }
    if wants("sentinel") {
        out.push_str(&sentinel_info(ctx.snapshot));
    }
    out
}

fn sentinel_info(snapshot: &Snapshot) -> String {
    let mut out = format!(
        "# Sentinel\r\nsentinel_masters:{}\r\nsentinel_tilt:0\r\nsentinel_running_scripts:0\r\n\
         sentinel_scripts_queue_length:0\r\nsentinel_simulate_failure_flags:0\r\n",
        snapshot.masters.len()
    );
    for (i, m) in snapshot.masters.values().enumerate() {
        let (status, address) = match &m.primary {
            Some(p) if m.state != crate::topology::MasterState::Stale => ("ok", p.to_string()),
            Some(p) => ("sdown", p.to_string()),
            None => ("sdown", "?:0".to_string()),
        };
        out.push_str(&format!(
            "master{i}:name={},status={status},address={address},slaves={},sentinels={}\r\n",
            m.name,
            m.replicas.len(),
            m.sentinels.configured
        ));
    }
    out
}

#[cfg(test)]
mod tests;
