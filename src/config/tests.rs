use super::*;

fn parse(text: &str) -> Result<Config, Vec<String>> {
    Config::parse(text, Path::new("/nonexistent")).map_err(|e| match e {
        ParseError::Yaml(m) => vec![m],
        ParseError::Invalid(p) => p,
    })
}

#[test]
fn example_config_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/polestar.yaml");
    let config = Config::load(&path).expect("the example config is valid");
    let sentinels = config.sentinels().expect("the example uses Sentinels");
    assert_eq!(sentinels.addresses.len(), 3);
    assert_eq!(config.label_of("mymaster"), "cache");
    let dns = config.dns.expect("the example serves DNS");
    assert_eq!(dns.zone, "redis.internal.");
    assert_eq!(config.drain.grace, Duration::from_millis(2500));
    let api = config.sentinel_api.expect("the example serves the Sentinel API");
    assert_eq!(api.max_connections, sentinel_api::DEFAULT_MAX_CONNECTIONS);
    assert!(api.peers.is_empty() && api.password.is_none());
}

#[test]
fn sentinel_api_problems_are_listed_with_their_paths() {
    let problems = parse(
        "sentinels: {addresses: ['127.0.0.1:26379']}\n\
         sentinel_api: {listen: ['nope'], peers: ['x:0'], max_connections: 0, idle_timeout: 0s, \
         password_file: /nonexistent/pass, colour: blue}",
    )
    .expect_err("invalid");
    let text = problems.join("\n");
    for path in [
        "sentinel_api.listen[0]",
        "sentinel_api.peers[0]",
        "sentinel_api.max_connections",
        "sentinel_api.idle_timeout",
        "sentinel_api.password_file",
        "sentinel_api.colour",
    ] {
        assert!(text.contains(path), "{path} in {text}");
    }
    let ok = parse(
        "sentinels: {addresses: ['127.0.0.1:26379']}\n\
         sentinel_api: {listen: ['0.0.0.0:26380'], peers: ['10.0.0.2:26380', 'ps-b:26380']}",
    )
    .expect("valid");
    let api = ok.sentinel_api.expect("the section");
    assert_eq!(api.peers.len(), 2);
    assert_eq!(api.idle_timeout, sentinel_api::DEFAULT_IDLE_TIMEOUT);
}

#[test]
fn minimal_config_gets_defaults() {
    let config = parse("sentinels: {addresses: ['127.0.0.1:26379']}").expect("valid");
    assert_eq!(config.masters, None);
    assert_eq!(config.dns, None);
    assert!(config.drain.enabled);
    // dns.ttl (1 s) + 1.5 s: resolvers that count whole seconds still name the old primary.
    assert_eq!(config.drain.grace, Duration::from_millis(2500));
    assert_eq!(config.drain.interval, Duration::from_millis(250));
    assert_eq!(config.drain.window, Duration::from_secs(60));
    assert_eq!(config.drain.rate, 2000);
    assert_eq!(config.label_of("My_Master"), "my-master");
}

#[test]
fn every_problem_is_listed_with_its_path() {
    let problems = parse(
        "sentinels: {addresses: ['nope', '127.0.0.1:26379'], colour: blue}\n\
         bogus: 1\n\
         dns: {listen: ['127.0.0.1:53'], zone: 'a..b', ttl: fast}\n\
         drain: {rate: 0, interval: 0s}\n\
         http: {listen: 'x'}\n",
    )
    .expect_err("invalid");
    let expect = [
        "sentinels.addresses[0]:",
        "sentinels.colour: unknown field",
        "bogus: unknown field",
        "dns.zone:",
        "dns.ttl:",
        "drain.rate: must be > 0",
        "drain.interval: must be > 0",
        "http.listen:",
    ];
    for want in expect {
        assert!(problems.iter().any(|p| p.starts_with(want)), "{want} not in {problems:#?}");
    }
}

#[test]
fn a_drain_interval_over_five_seconds_is_refused_with_its_path() {
    let text = "sentinels: {addresses: ['127.0.0.1:26379']}\ndrain: {interval: 6s}\n";
    let problems = parse(text).expect_err("invalid");
    assert!(problems.iter().any(|p| p == "drain.interval: must be at most 5s"), "{problems:?}");
    let text = "sentinels: {addresses: ['127.0.0.1:26379']}\ndrain: {interval: 5s}\n";
    assert_eq!(parse(text).expect("valid").drain.interval, Duration::from_secs(5));
}

#[test]
fn label_clash_is_an_error() {
    let problems = parse(
        "sentinels: {addresses: ['127.0.0.1:26379']}\n\
         masters: [{name: a_b}, {name: a-b}]\n",
    )
    .expect_err("clash");
    assert!(problems.iter().any(|p| p.contains("already used")), "{problems:?}");
}

#[test]
fn sentinels_or_upstream_exactly_one() {
    assert!(
        parse("upstream: http://127.0.0.1:8053\ndns: {listen: ['127.0.0.1:53'], zone: x.}").is_ok()
    );
    assert!(parse("{}").is_err());
    let both = "sentinels: {addresses: ['127.0.0.1:1']}\nupstream: http://127.0.0.1:8053";
    assert!(parse(both).is_err());
    assert!(parse("upstream: ftp://x").is_err());
}

#[test]
fn secrets_are_read_and_hidden() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("token"), "s3cret\n").expect("write");
    let text = "sentinels: {addresses: ['h.example:26379']}\nhttp: {listen: '127.0.0.1:0', admin_token_file: token}";
    let config = Config::parse(text, dir.path()).expect("valid");
    let token = config.http.and_then(|h| h.admin_token).expect("token read");
    assert_eq!(token.expose(), "s3cret");
    assert!(!format!("{token:?}").contains("s3cret"));
    let missing = parse("sentinels: {addresses: ['127.0.0.1:1'], password_file: /no/such}");
    assert!(
        missing.expect_err("missing").iter().any(|p| p.starts_with("sentinels.password_file:"))
    );
}

#[test]
fn host_port_forms() {
    assert_eq!(
        HostPort::parse("10.0.0.1:26379").map(|h| h.to_string()),
        Ok("10.0.0.1:26379".into())
    );
    assert_eq!(HostPort::parse("[::1]:26379").map(|h| h.to_string()), Ok("[::1]:26379".into()));
    assert!(HostPort::parse("sentinel-1.internal:26379").is_ok());
    for bad in ["", "host", "host:", ":1", "host:99999", "a b:1"] {
        assert!(HostPort::parse(bad).is_err(), "{bad}");
    }
}

/// Found by a new user: `polestar check` said `sentinels.addresses[0]: "bad" is not host:port`
/// and then `sentinels.addresses: must list at least one Sentinel`; `http.listen: "x" is not
/// ip:port` and then `http.listen: missing`. One problem, one line.
#[test]
fn check_reported_one_bad_value_twice() {
    let cases = [
        ("sentinels: {addresses: [bad]}", "sentinels.addresses"),
        ("sentinels: {addresses: ['127.0.0.1:1']}\nhttp: {listen: x}", "http.listen"),
        ("sentinels: {addresses: ['127.0.0.1:1']}\ndns: {listen: [x], zone: a.}", "dns.listen"),
        (
            "sentinels: {addresses: ['127.0.0.1:1']}\ndns: {listen: ['127.0.0.1:53'], zone: '-'}",
            "dns.zone",
        ),
        ("sentinels: {addresses: ['127.0.0.1:1']}\nmasters: [{name: [1]}]", "masters[0].name"),
        ("sentinels: {addresses: 7}", "sentinels.addresses"),
    ];
    for (yaml, path) in cases {
        let problems = parse(yaml).expect_err(yaml);
        let about: Vec<&String> = problems.iter().filter(|p| p.starts_with(path)).collect();
        assert_eq!(about.len(), 1, "{yaml}: {problems:#?}");
    }
    // Absent and empty are still reported, once.
    let empty = parse("sentinels: {addresses: []}").expect_err("empty");
    assert_eq!(empty, vec!["sentinels.addresses: must list at least one Sentinel".to_string()]);
    let missing =
        parse("sentinels: {addresses: ['127.0.0.1:1']}\nhttp: {}").expect_err("no listen");
    assert_eq!(missing, vec!["http.listen: missing".to_string()]);
}

fn parse_in(dir: &Path, text: &str) -> Result<Config, Vec<String>> {
    Config::parse(text, dir).map_err(|e| match e {
        ParseError::Yaml(m) => vec![m],
        ParseError::Invalid(p) => p,
    })
}

#[test]
fn nodes_tls_defaults_to_sentinels_tls_and_a_bad_pem_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("ca.pem"), "not a certificate\n").expect("write");
    let text = "sentinels: {addresses: ['127.0.0.1:26379'], tls: {enabled: true, ca_file: ca.pem}}";
    let problems = parse_in(dir.path(), text).expect_err("the CA is no PEM");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("sentinels.tls: "), "{problems:?}");
    assert!(problems[0].contains("ca.pem: no PEM certificate"), "{problems:?}");

    // No ca_file: the system roots; nodes inherit the Sentinels' TLS unless they say otherwise.
    let text = "sentinels: {addresses: ['127.0.0.1:26379'], tls: {enabled: true}}";
    let config = parse_in(dir.path(), text).expect("valid");
    assert!(config.nodes.tls.enabled);
    let text = "sentinels: {addresses: ['127.0.0.1:26379'], tls: {enabled: true}}\n\
                nodes: {username: u, tls: {enabled: false}}";
    let config = parse_in(dir.path(), text).expect("valid");
    assert!(!config.nodes.tls.enabled);
}

#[test]
fn a_server_key_that_does_not_match_its_certificate_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = polestar_lab::tls::Certs::generate(dir.path()).expect("openssl makes certificates");
    let text = format!(
        "sentinels: {{addresses: ['127.0.0.1:26379']}}\n\
         http: {{listen: '127.0.0.1:0', tls: {{cert_file: {}, key_file: {}}}}}",
        certs.node_cert.display(),
        certs.client_key.display()
    );
    let problems = parse_in(dir.path(), &text).expect_err("mismatched key");
    assert!(problems[0].starts_with("http.tls: "), "{problems:?}");
    assert!(problems[0].contains("do not go together"), "{problems:?}");
}

/// A Sentinel endpoint reachable beyond loopback without a password is warned about (docs/trust.md,
/// "Sentinel-endpoint clients").
#[test]
fn a_sentinel_api_beyond_loopback_without_a_password_is_a_warning() {
    let text = |listen: &str| {
        format!(
            "sentinels: {{addresses: ['127.0.0.1:1']}}\nsentinel_api: {{listen: ['{listen}']}}\n"
        )
    };
    let open = Config::parse(&text("0.0.0.0:26379"), Path::new("/")).expect("valid");
    assert!(open.warnings.iter().any(|w| w.contains("without a password")), "{:?}", open.warnings);
    let local = Config::parse(&text("127.0.0.1:26379"), Path::new("/")).expect("valid");
    assert!(local.warnings.is_empty(), "{:?}", local.warnings);
}

/// Regression (docs/decisions.md D26): an agent sent its token over plain http, and swept sockets
/// on answers anyone on the path could forge; `check` accepted both.
#[test]
fn an_http_upstream_with_a_token_or_sweep_remote_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("agent.token"), "t0ken\n").expect("write");
    let load = |text: &str| Config::parse(text, dir.path());
    let token = "upstream: {urls: ['https://10.0.0.5:8053', 'http://10.0.0.6:8053'], \
                 token_file: agent.token";
    let refused = [
        (format!("{token}}}"), "upstream.urls[1]: \"http://10.0.0.6:8053\" is plain http"),
        ("upstream: http://10.0.0.5:8053\nsweep: {remote: true}".into(), "sweep.remote"),
        (
            "upstream: {urls: ['http://10.0.0.5:8053']}\nsweep: {remote: true}".into(),
            "upstream.urls[0]",
        ),
    ];
    for (text, want) in refused {
        let Err(ParseError::Invalid(problems)) = load(&text) else { panic!("accepted: {text}") };
        assert!(problems.iter().any(|p| p.contains(want)), "{want}: {problems:?}");
        assert!(problems.iter().any(|p| p.contains("upstream.allow_plaintext")), "{problems:?}");
    }
    let accepted = [
        format!("{token}, allow_plaintext: true}}\nhttp: {{listen: '127.0.0.1:0'}}"),
        "upstream: {urls: ['http://10.0.0.5:8053'], allow_plaintext: true}\nsweep: {remote: true}"
            .into(),
        "upstream: {urls: ['https://10.0.0.5:8053'], token_file: agent.token}\nsweep: {remote: true}"
            .into(),
        "upstream: http://10.0.0.5:8053\nhttp: {listen: '127.0.0.1:0'}".into(),
        "upstream: http://10.0.0.5:8053\nsweep: {local_ports: [6379]}".into(),
    ];
    for text in accepted {
        assert!(load(&text).is_ok(), "{text}: {:?}", load(&text).err());
    }
}

/// Every shipped example loads, and says what it does (the file names the shape).
#[test]
fn every_example_says_what_it_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/examples");
    let secrets = tempfile::tempdir().expect("temp dir");
    let pass = secrets.path().join("sentinel-api.pass");
    std::fs::write(&pass, "s3cret\n").expect("write");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    for (name, want) in [
        ("dns-only.yaml", "serves DNS for redis.internal. on 10.0.0.5:53; drains"),
        ("http-only.yaml", "serves HTTP on 10.0.0.6:8053; drains"),
        ("sentinel-endpoint.yaml", "serves the Sentinel protocol on 10.0.0.7:26379; drains"),
        (
            "node-sweeper.yaml",
            "follows 3 Sentinel(s) (every master they monitor); sweeps local port 6379",
        ),
        ("agent-sentinels.yaml", "(mymaster); aborts this host's sockets to old primaries"),
    ] {
        let text = std::fs::read_to_string(dir.join(name)).expect("an example");
        let text = text.replace("/etc/polestar/", &format!("{}/", secrets.path().display()));
        let config =
            Config::parse(&text, secrets.path()).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let summary = config.summary();
        assert!(summary.contains(want), "{name}: {summary}");
        assert!(config.warnings.is_empty(), "{name}: {:?}", config.warnings);
    }
}

/// A configuration that would start and serve no one is refused, each section that cannot act
/// named; one that only drains, or has an idle `sweep` beside a real duty, is warned about.
#[test]
fn a_configuration_that_does_nothing_is_refused_with_every_reason() {
    let refused = [
        (
            "upstream: http://10.0.0.5:8053",
            vec!["(top level): follows its upstreams and does nothing"],
        ),
        ("upstream: http://10.0.0.5:8053\nsweep: {}", vec!["sweep: sweeps nothing", "(top level)"]),
        (
            "sentinels: {addresses: ['127.0.0.1:1']}\ndrain: {enabled: false}\nsweep: {remote: false}",
            vec![
                "sweep: sweeps nothing",
                "drain.enabled: false",
                "(top level): follows the Sentinels",
            ],
        ),
        (
            "sentinels: {addresses: ['127.0.0.1:1']}\ndns: {listen: ['127.0.0.1:53']}",
            vec!["dns.zone: missing"],
        ),
        ("{}", vec!["sentinels: missing"]),
    ];
    for (text, wants) in refused {
        let problems = parse(text).expect_err(text);
        for want in wants {
            assert!(problems.iter().any(|p| p.starts_with(want)), "{want:?} in {problems:?}");
        }
    }
    let drains_only = parse("sentinels: {addresses: ['127.0.0.1:1']}").expect("it drains");
    assert!(drains_only.warnings.iter().any(|w| w.contains("publishes the primary nowhere")));
    let idle =
        parse("sentinels: {addresses: ['127.0.0.1:1']}\nhttp: {listen: '127.0.0.1:0'}\nsweep: {}")
            .expect("it serves HTTP");
    assert!(
        idle.warnings.iter().any(|w| w.starts_with("sweep: sweeps nothing")),
        "{:?}",
        idle.warnings
    );
    assert!(!idle.summary().contains("sweeps"), "{}", idle.summary());
}

/// Issue 36, item 4: an agent token equal to the admin token was accepted, so every agent (and
/// every host it runs on) could fail over, drain and hand off.
#[test]
fn an_agent_token_equal_to_the_admin_token_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (file, token) in [("admin", "s3cret"), ("agent", "s3cret\n"), ("other", "agents-only")] {
        std::fs::write(dir.path().join(file), token).expect("write");
    }
    let with = |agent: &str| {
        format!(
            "sentinels: {{addresses: ['127.0.0.1:26379']}}\n\
             http: {{listen: '127.0.0.1:0', admin_token_file: admin, agent_token_file: {agent}}}"
        )
    };
    let problems = parse_in(dir.path(), &with("agent")).expect_err("the same token");
    assert!(
        problems.iter().any(|p| p.starts_with("http.agent_token_file: holds the same token")),
        "{problems:?}"
    );
    parse_in(dir.path(), &with("other")).expect("tokens of their own");
}

/// Issue 36, item 4: a Sentinel address or an upstream URL listed twice counted twice towards
/// a majority (two entries of one Sentinel out of three made its word alone a majority).
#[test]
fn a_sentinel_or_an_upstream_listed_twice_is_refused_with_its_path() {
    #[rustfmt::skip]
    let table: Vec<(&str, &str, Vec<&str>)> = vec![
        ("the same address", "sentinels: {addresses: ['10.0.0.1:26379', '10.0.0.2:26379', '10.0.0.1:26379']}",
            vec!["sentinels.addresses[2]: \"10.0.0.1:26379\" is already sentinels.addresses[0]"]),
        ("a host name in another case", "sentinels: {addresses: ['s1.example:26379', 'S1.EXAMPLE:26379']}",
            vec!["sentinels.addresses[1]: \"S1.EXAMPLE:26379\" is already sentinels.addresses[0]"]),
        ("three times: two problems", "sentinels: {addresses: ['10.0.0.1:1', '10.0.0.1:1', '10.0.0.1:1']}",
            vec!["sentinels.addresses[1]:", "sentinels.addresses[2]: \"10.0.0.1:1\" is already sentinels.addresses[0]"]),
        ("the same URL with a trailing slash", "upstream: {urls: ['http://10.0.0.5:8053', 'http://10.0.0.5:8053/']}\ndns: {listen: ['127.0.0.1:0'], zone: redis.test.}",
            vec!["upstream.urls[1]: \"http://10.0.0.5:8053\" is already upstream.urls[0]"]),
        ("the same host and port over the other scheme", "upstream: {urls: ['https://ps.example:8053', 'http://PS.example:8053']}\ndns: {listen: ['127.0.0.1:0'], zone: redis.test.}",
            vec!["upstream.urls[1]:"]),
    ];
    for (case, text, want) in table {
        let problems = parse(text).expect_err(case);
        for w in want {
            assert!(problems.iter().any(|p| p.starts_with(w)), "{case}: {w} in {problems:?}");
        }
        assert!(
            problems.iter().all(|p| p.ends_with("counts once towards a majority")),
            "{case}: {problems:?}"
        );
    }
    for ok in [
        "sentinels: {addresses: ['10.0.0.1:26379', '10.0.0.1:26380']}",
        "upstream: {urls: ['http://10.0.0.5:8053', 'http://10.0.0.6:8053']}\ndns: {listen: ['127.0.0.1:0'], zone: redis.test.}",
    ] {
        parse(ok).expect(ok);
    }
}
