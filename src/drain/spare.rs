//! Which clients of a node a drain leaves alone, and why.
//!
//! Built in: the infrastructure's connections (Sentinel's, polestar's own and replication
//! links, the one rule of [`crate::node::infrastructure`]) and the connection doing the
//! killing. Configured: `drain.spare` names and users (exact, or a prefix with a trailing `*`)
//! and CIDRs of the client's address.

use std::fmt;

use ipnet::IpNet;

use crate::config;
use crate::node::clients::ClientInfo;
use crate::node::infrastructure::Infrastructure;

/// Why a client was spared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SpareReason {
    /// The connection doing the killing.
    Own,
    Polestar,
    Sentinel,
    Replication,
    Name,
    User,
    Cidr,
}

impl SpareReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Own => "own",
            Self::Polestar => "polestar",
            Self::Sentinel => "sentinel",
            Self::Replication => "replication",
            Self::Name => "name",
            Self::User => "user",
            Self::Cidr => "cidr",
        }
    }
}

impl fmt::Display for SpareReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The spare rules of one configuration.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    names: Vec<Pattern>,
    users: Vec<Pattern>,
    cidrs: Vec<IpNet>,
}

impl Rules {
    pub fn new(spare: &config::Spare) -> Self {
        Self {
            names: spare.names.iter().map(|n| Pattern::new(n)).collect(),
            users: spare.users.iter().map(|u| Pattern::new(u)).collect(),
            cidrs: spare.cidrs.clone(),
        }
    }

    /// `Some(reason)` when `client` must not be killed by the connection with id `own_id`.
    pub fn spare(&self, client: &ClientInfo, own_id: u64) -> Option<SpareReason> {
        if client.id == own_id {
            return Some(SpareReason::Own);
        }
        builtin(client).or_else(|| self.configured(client))
    }

    fn configured(&self, client: &ClientInfo) -> Option<SpareReason> {
        if !client.name.is_empty() && self.names.iter().any(|p| p.matches(&client.name)) {
            return Some(SpareReason::Name);
        }
        if self.users.iter().any(|p| p.matches(&client.user)) {
            return Some(SpareReason::User);
        }
        let ip = client.addr.map(|a| a.ip())?;
        self.cidrs.iter().any(|c| c.contains(&ip)).then_some(SpareReason::Cidr)
    }
}

fn builtin(client: &ClientInfo) -> Option<SpareReason> {
    client.infrastructure().map(|whose| match whose {
        Infrastructure::Polestar => SpareReason::Polestar,
        Infrastructure::Sentinel => SpareReason::Sentinel,
        Infrastructure::Replication => SpareReason::Replication,
    })
}

/// An exact string, or a prefix when written with a trailing `*`.
#[derive(Clone, Debug)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn new(text: &str) -> Self {
        match text.strip_suffix('*') {
            Some(prefix) => Self::Prefix(prefix.to_string()),
            None => Self::Exact(text.to_string()),
        }
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Self::Exact(s) => value == s,
            Self::Prefix(p) => value.starts_with(p.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::clients::parse_line;

    fn rules(names: &[&str], users: &[&str], cidrs: &[&str]) -> Rules {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Rules::new(&config::Spare {
            names: owned(names),
            users: owned(users),
            cidrs: cidrs.iter().map(|c| c.parse().expect("test CIDR")).collect(),
        })
    }

    fn verdict(rules: &Rules, line: &str) -> Option<SpareReason> {
        rules.spare(&parse_line(line).expect("test line"), 1)
    }

    #[test]
    fn ordinary_clients_are_killed() {
        let r = rules(&["keep"], &["ops"], &["10.0.0.0/8"]);
        for line in [
            "id=5 addr=192.168.1.2:4000 name= flags=N user=default cmd=get",
            "id=6 addr=192.168.1.2:4001 name=worker flags=b user=app cmd=blpop",
            "id=7 addr=192.168.1.2:4002 name=keeper flags=P user=app cmd=subscribe",
            "id=8 addr=/tmp/redis.sock:0 flags=U user=app cmd=xread",
        ] {
            assert_eq!(verdict(&r, line), None, "{line}");
        }
    }

    #[test]
    fn builtin_spares() {
        let r = Rules::default();
        let cases = [
            ("id=1 name= flags=N", SpareReason::Own),
            ("id=2 name=polestar flags=N", SpareReason::Polestar),
            ("id=2 name=polestar-drain flags=N", SpareReason::Polestar),
            ("id=2 name= lib-name=polestar flags=N", SpareReason::Polestar),
            ("id=3 name=sentinel-1a2b3c4d-cmd flags=N", SpareReason::Sentinel),
            ("id=3 name=sentinel-1a2b3c4d-pubsub flags=P", SpareReason::Sentinel),
            ("id=4 flags=S cmd=replconf", SpareReason::Replication),
            ("id=4 flags=M cmd=ping", SpareReason::Replication),
            ("id=4 flags=N cmd=psync", SpareReason::Replication),
            ("id=4 flags=N cmd=SYNC", SpareReason::Replication),
        ];
        for (line, reason) in cases {
            assert_eq!(verdict(&r, line), Some(reason), "{line}");
        }
    }

    #[test]
    fn configured_names_users_and_prefixes() {
        let r = rules(&["keep", "batch-*"], &["ops", "svc-*"], &[]);
        assert_eq!(verdict(&r, "id=9 name=keep"), Some(SpareReason::Name));
        assert_eq!(verdict(&r, "id=9 name=keeper"), None);
        assert_eq!(verdict(&r, "id=9 name=batch-7"), Some(SpareReason::Name));
        assert_eq!(verdict(&r, "id=9 user=ops"), Some(SpareReason::User));
        assert_eq!(verdict(&r, "id=9 user=svc-a"), Some(SpareReason::User));
        assert_eq!(verdict(&r, "id=9 user=opsx"), None);
    }

    #[test]
    fn an_empty_name_never_matches_a_name_rule() {
        let r = rules(&["*"], &[], &[]);
        assert_eq!(verdict(&r, "id=9 name="), None);
        assert_eq!(verdict(&r, "id=9 name=x"), Some(SpareReason::Name));
    }

    #[test]
    fn cidrs_match_the_client_address() {
        let r = rules(&[], &[], &["10.1.0.0/16", "fd00::/8", "192.0.2.7/32"]);
        assert_eq!(verdict(&r, "id=9 addr=10.1.2.3:5000"), Some(SpareReason::Cidr));
        assert_eq!(verdict(&r, "id=9 addr=10.2.0.1:5000"), None);
        assert_eq!(verdict(&r, "id=9 addr=[fd12::1]:5000"), Some(SpareReason::Cidr));
        assert_eq!(verdict(&r, "id=9 addr=[fe80::1]:5000"), None);
        assert_eq!(verdict(&r, "id=9 addr=192.0.2.7:1"), Some(SpareReason::Cidr));
        assert_eq!(verdict(&r, "id=9 addr=/tmp/redis.sock:0"), None);
        assert_eq!(verdict(&r, "id=9 laddr=10.1.0.1:6379"), None);
    }
}
