//! Property tests of the loader: arbitrary text and structured mutations of the example config
//! (`conf/polestar.yaml`) never panic, every rejection lists at least one problem and every
//! problem names its path, and whatever is accepted holds the invariants the daemon relies on
//! without checking again (durations that `Instant` arithmetic survives, a positive rate...).
//!
//! Bounded for CI by `PROPTEST_CASES` (default below); see `bench/README.md` for long runs.
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::time::Duration;

use proptest::prelude::*;
use serde_yaml::{Mapping, Value};

use super::*;

const EXAMPLE: &str = include_str!("../../conf/polestar.yaml");

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(default), ..ProptestConfig::default() }
}

/// A directory with a readable secret, so `*_file` keys can also succeed.
fn base() -> &'static Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), "s3cret\n").unwrap();
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        dir
    })
    .path()
}

/// The checks every outcome of `Config::parse` must pass.
fn check(text: &str) {
    match Config::parse(text, base()) {
        Ok(config) => accepted(&config),
        Err(ParseError::Yaml(message)) => assert!(!message.is_empty()),
        Err(ParseError::Invalid(problems)) => {
            assert!(!problems.is_empty(), "rejected without a problem: {text:?}");
            for p in &problems {
                let (path, message) = p.split_once(": ").unwrap_or_else(|| panic!("{p:?}"));
                assert!(!path.is_empty() && !message.is_empty(), "no path in {p:?}");
            }
        }
    }
}

/// What the rest of polestar takes for granted about a loaded config.
fn accepted(config: &Config) {
    let year = duration::MAX;
    let d = &config.drain;
    for (what, value) in [("grace", d.grace), ("interval", d.interval), ("window", d.window)] {
        // The default grace is the TTL + 1.5 s.
        let limit = year + Duration::from_secs(2);
        assert!(!value.is_zero() && value <= limit, "drain.{what} = {value:?} accepted");
        // What the drain does with it at every failover: must not overflow.
        let _ = std::time::Instant::now() + value;
    }
    assert!(d.rate >= 1);
    if let Some(dns) = &config.dns {
        assert!(!dns.listen.is_empty());
        assert!(dns.ttl >= Duration::from_secs(1) && dns.ttl <= year, "ttl {:?}", dns.ttl);
        assert!(dns.zone.ends_with('.'));
        crate::dns::zone::ZoneSettings::from_config(dns).unwrap();
    }
    match &config.source {
        Source::Sentinels(s) => assert!(!s.addresses.is_empty()),
        Source::Upstream(u) => assert!(u.urls.iter().all(|url| url.starts_with("http"))),
    }
    let _ = config.summary();
}

/// Keys the loader knows, so mutations hit real fields as well as unknown ones.
const PATHS: &[&str] = &[
    "sentinels",
    "sentinels.addresses",
    "sentinels.username",
    "sentinels.password_file",
    "sentinels.tls",
    "sentinels.tls.enabled",
    "sentinels.tls.ca_file",
    "sentinels.tls.cert_file",
    "masters",
    "nodes",
    "nodes.username",
    "nodes.password_file",
    "nodes.tls",
    "dns",
    "dns.listen",
    "dns.zone",
    "dns.ttl",
    "dns.nameservers",
    "dns.transfer_allow",
    "dns.notify",
    "dns.rate_limit",
    "dns.rate_limit_slip",
    "http",
    "http.listen",
    "http.admin_token_file",
    "drain",
    "drain.enabled",
    "drain.grace",
    "drain.interval",
    "drain.window",
    "drain.rate",
    "drain.spare",
    "drain.spare.names",
    "drain.spare.users",
    "drain.spare.cidrs",
    "sweep",
    "sweep.local_ports",
    "sweep.remote",
    "upstream",
    "upstream.urls",
    "upstream.ca_file",
    "upstream.token_file",
    "upstream.allow_plaintext",
    "bogus",
    "drain.bogus",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|n| Value::Number(n.into())),
        (any::<u64>(), prop::sample::select(vec!["ms", "s", "m", "h", "", " s", "x"]))
            .prop_map(|(n, u)| Value::String(format!("{n}{u}"))),
        (0u32..100_000, prop::sample::select(vec!["ms", "s", "m", "h"]))
            .prop_map(|(n, u)| Value::String(format!("{n}{u}"))),
        prop::sample::select(vec![
            "127.0.0.1:0",
            "[::1]:53",
            "host.example:26379",
            "10.0.0.0/8",
            "http://127.0.0.1:8053",
            "http://[::1]:1/",
            "redis.internal.",
            "secret",
            "empty",
            "/no/such/file",
            "a..b",
            "-",
            "",
        ])
        .prop_map(|s| Value::String(s.to_string())),
        ".{0,40}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Sequence),
            prop::collection::vec(("[a-z_]{1,12}", inner), 0..4).prop_map(|kv| {
                Value::Mapping(kv.into_iter().map(|(k, v)| (Value::String(k), v)).collect())
            }),
        ]
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Set(&'static str, Value),
    Remove(&'static str),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let path = prop::sample::select(PATHS);
    prop_oneof![
        3 => (path.clone(), value()).prop_map(|(p, v)| Mutation::Set(p, v)),
        1 => path.prop_map(Mutation::Remove),
    ]
}

/// The mapping at `path` (created on the way when `create`), as a mutable reference.
fn parent<'v>(root: &'v mut Value, path: &[&str], create: bool) -> Option<&'v mut Mapping> {
    let mut node = root;
    for key in path {
        if create && !matches!(node, Value::Mapping(_)) {
            *node = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(map) = node else { return None };
        let key = Value::String(key.to_string());
        if create && !map.contains_key(&key) {
            map.insert(key.clone(), Value::Mapping(Mapping::new()));
        }
        node = map.get_mut(&key)?;
    }
    if create && !matches!(node, Value::Mapping(_)) {
        *node = Value::Mapping(Mapping::new());
    }
    match node {
        Value::Mapping(map) => Some(map),
        _ => None,
    }
}

fn apply(root: &mut Value, mutation: &Mutation) {
    let (path, set) = match mutation {
        Mutation::Set(p, v) => (*p, Some(v.clone())),
        Mutation::Remove(p) => (*p, None),
    };
    let segments: Vec<&str> = path.split('.').collect();
    let (last, rest) = segments.split_last().unwrap();
    let key = Value::String(last.to_string());
    match set {
        Some(v) => {
            parent(root, rest, true).unwrap().insert(key, v);
        }
        None => {
            if let Some(map) = parent(root, rest, false) {
                map.remove(&key);
            }
        }
    }
}

#[test]
fn the_example_passes_the_checks() {
    check(EXAMPLE);
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        check(&text);
    }

    #[test]
    fn yaml_ish_text_never_panics(
        lines in prop::collection::vec(
            (prop::sample::select(PATHS), "[ \\-:\\[\\]{}a-z0-9.,'\"/]{0,30}"), 0..8)
    ) {
        let text: String = lines
            .iter()
            .map(|(path, rest)| {
                let depth = path.matches('.').count();
                let key = path.rsplit('.').next().unwrap_or(path);
                format!("{}{key}: {rest}\n", "  ".repeat(depth))
            })
            .collect();
        check(&text);
    }

    #[test]
    fn mutations_of_the_example_never_panic_and_name_their_paths(
        mutations in prop::collection::vec(mutation(), 1..6)
    ) {
        let mut root: Value = serde_yaml::from_str(EXAMPLE).unwrap();
        for m in &mutations {
            apply(&mut root, m);
        }
        let text = serde_yaml::to_string(&root).unwrap();
        check(&text);
    }
}

#[test]
fn durations_too_long_for_instant_arithmetic_are_rejected() {
    // Found by `mutations_of_the_example_never_panic_and_name_their_paths`: these were
    // accepted, and the drain then panicked adding the grace to an `Instant` at a failover.
    let head = "sentinels: {addresses: ['127.0.0.1:26379']}\n";
    for field in ["grace", "interval", "window"] {
        let text = format!("{head}drain: {{{field}: 5000000000000h}}\n");
        let problems = match Config::parse(&text, base()) {
            Err(ParseError::Invalid(p)) => p,
            other => panic!("{field}: {other:?}"),
        };
        assert!(problems.iter().any(|p| p.starts_with(&format!("drain.{field}:"))), "{problems:?}");
    }
    let text = format!("{head}dns: {{listen: ['127.0.0.1:0'], zone: z., ttl: 5000000000000h}}\n");
    assert!(matches!(Config::parse(&text, base()), Err(ParseError::Invalid(_))));
}

#[test]
fn a_zone_or_nameserver_the_dns_server_refuses_is_a_config_problem() {
    // Found by a long run of `mutations_of_the_example_never_panic_and_name_their_paths`:
    // `nameservers: ["-"]` passed `polestar check`, then `run` failed to start DNS with it.
    let head = "sentinels: {addresses: ['127.0.0.1:26379']}\n";
    for (key, dns) in [
        ("dns.nameservers[0]", "{listen: ['127.0.0.1:0'], zone: z., nameservers: ['-']}"),
        ("dns.zone", "{listen: ['127.0.0.1:0'], zone: '-.'}"),
    ] {
        let problems = match Config::parse(&format!("{head}dns: {dns}\n"), base()) {
            Err(ParseError::Invalid(p)) => p,
            other => panic!("{dns}: {other:?}"),
        };
        assert!(problems.iter().any(|p| p.starts_with(&format!("{key}:"))), "{problems:?}");
    }
}
