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
    assert_eq!(config.drain.grace, Duration::from_millis(1500));
}

#[test]
fn minimal_config_gets_defaults() {
    let config = parse("sentinels: {addresses: ['127.0.0.1:26379']}").expect("valid");
    assert_eq!(config.masters, None);
    assert_eq!(config.dns, None);
    assert!(config.drain.enabled);
    assert_eq!(config.drain.grace, Duration::from_millis(1500));
    assert_eq!(config.drain.interval, Duration::from_millis(250));
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
    assert!(parse("upstream: http://127.0.0.1:8053").is_ok());
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
    let certs = crate::lab::tls::Certs::generate(dir.path()).expect("openssl makes certificates");
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
