//! The HTTP API and the CLI client in-process: a real listener on port 0, a topology written by
//! the test (standing in for the Sentinel side), a fake `Control`, and reqwest as the client.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use polestar::client;
use polestar::control::{BoxFuture, Control, ControlError};
use polestar::events::{EventLog, Kind};
use polestar::http::{self, Api};
use polestar::topology::{self, Master, MasterState, Node, Publisher, Replica, SentinelCounts};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "s3cret-token";

/// What the fake Sentinel side answers to a failover request.
#[derive(Clone, Copy)]
enum Reply {
    Accept,
    Refuse,
    Unreachable,
}

struct FakeControl {
    reply: Mutex<Reply>,
    calls: Mutex<Vec<String>>,
}

impl Control for FakeControl {
    fn failover<'a>(&'a self, master: &'a str) -> BoxFuture<'a, Result<String, ControlError>> {
        Box::pin(async move {
            self.calls.lock().expect("not poisoned").push(master.to_owned());
            let sentinel = "127.0.0.1:26379".to_owned();
            match *self.reply.lock().expect("not poisoned") {
                Reply::Accept => Ok(sentinel),
                Reply::Refuse => Err(ControlError::Refused { sentinel, message: "INPROG".into() }),
                Reply::Unreachable => Err(ControlError::Unreachable("all down".into())),
            }
        })
    }
}

/// A served API; shuts the server down when dropped.
struct Server {
    url: String,
    publisher: Publisher,
    events: Arc<EventLog>,
    control: Arc<FakeControl>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    client: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The global recorder's handle: counters recorded with the `metrics` macros only show there.
fn metrics_handle() -> polestar::metrics::Handle {
    static HANDLE: OnceLock<polestar::metrics::Handle> = OnceLock::new();
    HANDLE.get_or_init(polestar::metrics::install).clone()
}

async fn start(admin_token: Option<&str>) -> Server {
    let (publisher, reader) = topology::channel();
    let events = Arc::new(EventLog::new());
    let reply = Mutex::new(Reply::Accept);
    let control = Arc::new(FakeControl { reply, calls: Mutex::new(vec![]) });
    let api = Api {
        topology: reader,
        events: events.clone(),
        admin_token: http::fixed_token(admin_token.map(polestar::config::Secret::new)),
        agent_token: http::fixed_token(None),
        control: control.clone(),
        metrics: metrics_handle(),
        drain: None,
        readiness: polestar::readiness::nothing(),
        tls: http::fixed_tls(None),
    };
    let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
    let listener = http::bind(addr).await.expect("port 0 is always free");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(http::serve(listener, api, shutdown.clone()));
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("ok");
    Server { url, publisher, events, control, shutdown, server, client }
}

fn master(name: &str, primary: Option<&str>, epoch: Option<u64>) -> Master {
    let node = |addr: &str| {
        let addr: SocketAddr = addr.parse().expect("test addresses are valid");
        Node { ip: addr.ip(), port: addr.port(), hostname: None }
    };
    Master {
        withdrawn: None,
        provisional: false,
        name: name.into(),
        label: topology::label_for(name),
        primary: primary.map(node),
        epoch,
        since: primary.map(|_| SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
        state: if primary.is_some() { MasterState::Ok } else { MasterState::Unknown },
        replicas: vec![Replica {
            ip: [10, 0, 0, 2].into(),
            port: 6379,
            hostname: None,
            healthy: true,
            down: false,
        }],
        sentinels: SentinelCounts {
            configured: 3,
            reachable: 3,
            agreeing: 3,
            ..Default::default()
        },
    }
}

impl Server {
    fn publish(&self, masters: Vec<Master>, source_reachable: bool) {
        self.publisher.publish(masters, source_reachable);
    }

    fn publish_one(&self, primary: Option<&str>, epoch: Option<u64>) {
        self.publish(vec![master("mymaster", primary, epoch)], true);
    }

    /// How many hold the topology: the API's own reader, and one more per request waiting for
    /// an epoch (a long-poll, a waiting failover) once its floor is taken.
    fn topology_readers(&self) -> usize {
        self.publisher.readers()
    }

    /// Until one more request waits on the topology than `before` readers: a publication
    /// after this wakes it (a fixed sleep raced a slow client on a busy machine).
    async fn until_waiting(&self, before: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.topology_readers() <= before {
            assert!(Instant::now() < deadline, "the request never waited on the topology");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let response = self.client.get(format!("{}{path}", self.url)).send().await;
        let response = response.expect("the server answers");
        (response.status(), response.text().await.expect("a body"))
    }

    async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let (status, body) = self.get(path).await;
        (status, serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body:?}")))
    }

    async fn post(&self, path: &str, token: Option<&str>) -> (StatusCode, Value) {
        let mut request = self.client.post(format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        (status, response.json().await.expect("a JSON body"))
    }
}

fn error_of(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_else(|| panic!("no error field in {body}"))
}

#[tokio::test]
async fn lists_masters_sorted_with_the_documented_fields() {
    let server = start(None).await;
    let b = master("b-master", Some("10.0.0.9:6380"), Some(2));
    server.publish(vec![b, master("a_master", Some("10.0.0.1:6379"), Some(7))], true);
    let (status, body) = server.get_json("/v1/masters").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> =
        body.as_array().expect("an array").iter().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(names, ["a_master", "b-master"]);
    assert_eq!(body[0], one_master_json());
}

fn one_master_json() -> Value {
    json!({
        "name": "a_master", "dns_name": "a-master",
        "primary": {"ip": "10.0.0.1", "port": 6379, "hostname": null},
        "epoch": 7, "since": "2023-11-14T22:13:20.000Z", "state": "ok",
        "replicas": [{"ip": "10.0.0.2", "port": 6379, "healthy": true}],
        "sentinels": {"configured": 3, "reachable": 3, "agreeing": 3, "discovered": []},
    })
}

#[tokio::test]
async fn one_master_has_the_documented_fields() {
    let server = start(None).await;
    server.publish(vec![master("a_master", Some("10.0.0.1:6379"), Some(7))], true);
    let (status, body) = server.get_json("/v1/masters/a_master").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, one_master_json());
}

#[tokio::test]
async fn an_unconfirmed_master_has_a_null_primary() {
    let server = start(None).await;
    server.publish_one(None, None);
    let (_, body) = server.get_json("/v1/masters/mymaster").await;
    assert_eq!(body["primary"], Value::Null);
    assert_eq!(body["since"], Value::Null);
    assert_eq!(body["state"], "unknown");
}

#[tokio::test]
async fn unknown_masters_and_routes_are_json_errors() {
    let server = start(Some(TOKEN)).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    for path in ["/v1/masters/nope", "/v1/masters/nope/primary", "/v1/nothing", "/nothing"] {
        let (status, body) = server.get_json(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(!error_of(&body).is_empty());
    }
    let (status, body) = server.post("/v1/masters/nope/failover", Some(TOKEN)).await;
    assert_eq!((status, error_of(&body)), (StatusCode::NOT_FOUND, "no master named \"nope\""));
    let (status, body) = server.post("/v1/masters", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(!error_of(&body).is_empty());
}

#[tokio::test]
async fn bad_query_values_are_400_json_naming_the_parameter() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let cases = [
        ("/v1/masters/mymaster?wait=fast", "wait:"),
        ("/v1/masters/mymaster?wait=1s&after=x", "after:"),
        ("/v1/masters/mymaster/primary?is=garbage", "is:"),
        ("/v1/masters/mymaster/primary?is=10.0.0.1:99999", "is:"),
        ("/v1/events?since=yesterday", "since:"),
        ("/v1/events/stream?since=-1", "since:"),
    ];
    for (path, prefix) in cases {
        let (status, body) = server.get_json(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert!(error_of(&body).starts_with(prefix), "{path}: {body}");
    }
}

#[tokio::test]
async fn primary_is_plain_text_and_is_answers_200_or_503() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let response = server.client.get(format!("{}/v1/masters/mymaster/primary", server.url));
    let response = response.send().await.expect("answers");
    let content_type = response.headers().get("content-type").cloned();
    assert!(content_type.is_some_and(|c| c.as_bytes().starts_with(b"text/plain")));
    assert_eq!(response.text().await.ok().as_deref(), Some("10.0.0.1:6379"));
    let (status, _) = server.get("/v1/masters/mymaster/primary?is=10.0.0.1:6379").await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = server.get_json("/v1/masters/mymaster/primary?is=10.0.0.2:6379").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(error_of(&body).contains("10.0.0.1:6379"));
}

#[tokio::test]
async fn an_ipv6_primary_is_bracketed() {
    let server = start(None).await;
    server.publish_one(Some("[::1]:6379"), Some(1));
    assert_eq!(server.get("/v1/masters/mymaster/primary").await.1, "[::1]:6379");
    let (status, _) = server.get("/v1/masters/mymaster/primary?is=[::1]:6379").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn primary_is_503_while_unknown() {
    let server = start(None).await;
    server.publish_one(None, None);
    let (status, body) = server.get_json("/v1/masters/mymaster/primary").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_of(&body), "mymaster has no confirmed primary");
    let (status, _) = server.get_json("/v1/masters/mymaster/primary?is=10.0.0.1:6379").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn a_long_poll_wakes_as_soon_as_a_higher_epoch_is_published() {
    let server = Arc::new(start(None).await);
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let poller = server.clone();
    let readers = server.topology_readers();
    let poll = tokio::spawn(async move {
        let answer = poller.get_json("/v1/masters/mymaster?wait=30s&after=1").await;
        (answer, Instant::now())
    });
    server.until_waiting(readers).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "the long-poll answered before the epoch moved");
    server.publish_one(Some("10.0.0.1:6379"), Some(1)); // a change that is not a new epoch
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!poll.is_finished(), "the long-poll answered without a new epoch");
    let published = Instant::now();
    server.publish_one(Some("10.0.0.2:6379"), Some(2));
    let ((status, body), answered) = poll.await.expect("the poll task does not panic");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["epoch"].as_u64(), body["primary"]["ip"].as_str()),
        (Some(2), Some("10.0.0.2"))
    );
    let latency = answered.duration_since(published);
    assert!(latency < Duration::from_secs(2), "took {latency:?}");
}

#[tokio::test]
async fn a_long_poll_without_after_waits_for_the_next_epoch() {
    let server = Arc::new(start(None).await);
    server.publish_one(Some("10.0.0.1:6379"), Some(5));
    let poller = server.clone();
    let readers = server.topology_readers();
    let poll = tokio::spawn(async move { poller.get_json("/v1/masters/mymaster?wait=30s").await });
    server.until_waiting(readers).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!poll.is_finished());
    server.publish_one(Some("10.0.0.2:6379"), Some(6));
    let (_, body) =
        tokio::time::timeout(Duration::from_secs(2), poll).await.expect("woke").expect("ok");
    assert_eq!(body["epoch"], 6);
}

#[tokio::test]
async fn a_long_poll_that_is_already_satisfied_answers_at_once() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(5));
    let started = Instant::now();
    let (_, body) = server.get_json("/v1/masters/mymaster?wait=30s&after=4").await;
    assert_eq!(body["epoch"], 5);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_long_poll_times_out_with_the_current_state() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(3));
    let started = Instant::now();
    let (status, body) = server.get_json("/v1/masters/mymaster?wait=200ms&after=3").await;
    let elapsed = started.elapsed();
    assert_eq!((status, body["epoch"].as_u64()), (StatusCode::OK, Some(3)));
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn events_are_listed_after_since() {
    let server = start(None).await;
    let first = server.events.push(Kind::SentinelUp, None, json!({"sentinel": "127.0.0.1:26379"}));
    let second = server.events.push(Kind::Switch, Some("mymaster"), json!({"epoch": 2}));
    let (status, body) = server.get_json("/v1/events").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_array().map(Vec::len), Some(2));
    let (_, body) = server.get_json(&format!("/v1/events?since={first}")).await;
    assert_eq!(body[0]["id"], second);
    assert_eq!(
        (body[0]["kind"].as_str(), body[0]["master"].as_str()),
        (Some("switch"), Some("mymaster"))
    );
    assert_eq!(body[0]["epoch"], 2);
}

/// Reads the stream until one whole SSE event (ended by a blank line) has arrived.
async fn next_sse_event(response: &mut reqwest::Response, buffer: &mut String) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if event.lines().all(|l| l.starts_with(':')) {
                continue; // a keep-alive comment
            }
            return event;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, response.chunk()).await;
        let chunk = chunk.expect("an event in time").expect("the stream is open").expect("data");
        buffer.push_str(std::str::from_utf8(&chunk).expect("SSE is UTF-8"));
    }
}

#[tokio::test]
async fn the_event_stream_delivers_live_events_and_resumes_with_last_event_id() {
    let server = start(None).await;
    let old = server.events.push(Kind::Ok, None, Value::Null);
    let url = format!("{}/v1/events/stream", server.url);
    let mut stream =
        server.client.get(&url).timeout(Duration::from_secs(30)).send().await.expect("open");
    assert_eq!(stream.status(), StatusCode::OK);
    let content_type = stream.headers().get("content-type").cloned();
    assert_eq!(content_type.as_ref().and_then(|c| c.to_str().ok()), Some("text/event-stream"));
    let switch = server.events.push(Kind::Switch, Some("mymaster"), json!({"epoch": 2}));
    let mut buffer = String::new();
    let event = next_sse_event(&mut stream, &mut buffer).await;
    assert!(
        event.contains(&format!("id: {switch}\n")) || event.contains(&format!("id:{switch}\n")),
        "{event}"
    );
    assert!(event.contains("event: switch") || event.contains("event:switch"), "{event}");
    assert!(event.contains("\"epoch\":2"), "{event}");
    assert!(!event.contains(&old.to_string()), "an event from before the stream was sent: {event}");
    drop(stream);

    let missed = server.events.push(Kind::Stale, None, Value::Null);
    let request = server.client.get(&url).header("Last-Event-ID", switch.to_string());
    let mut resumed = request.timeout(Duration::from_secs(30)).send().await.expect("open");
    let mut buffer = String::new();
    let event = next_sse_event(&mut resumed, &mut buffer).await;
    assert!(event.contains(&missed.to_string()) && event.contains("stale"), "{event}");
}

/// The `data` of a `masters` event, and whether `event` is one.
fn masters_of(event: &str) -> Option<polestar::http::view::MastersEvent> {
    let mut lines = event.lines();
    (lines.next()? == "event: masters").then_some(())?;
    let data = lines.next()?.strip_prefix("data: ")?;
    Some(serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {event}")))
}

fn primary_port(event: &polestar::http::view::MastersEvent, master: &str) -> Option<u16> {
    Some(event.masters.iter().find(|m| m.name == master)?.primary.as_ref()?.port)
}

/// docs/decisions.md D30: the stream carries the masters when asked, so that an agent needs no
/// request per change: every master first, then only what changed (after the version sent
/// before), and with `only` no other event.
#[tokio::test]
async fn the_event_stream_carries_the_masters_when_asked() {
    let server = start(None).await;
    server.publish(
        vec![
            master("mymaster", Some("10.0.0.1:6379"), Some(1)),
            master("other", Some("10.0.0.5:6379"), Some(1)),
        ],
        true,
    );
    let url = format!("{}/v1/events/stream?masters=only", server.url);
    let stream = server.client.get(&url).timeout(Duration::from_secs(30)).send().await;
    let mut stream = stream.expect("open");
    assert_eq!(stream.status(), StatusCode::OK);
    let feed = stream.headers().get("polestar-masters").and_then(|v| v.to_str().ok());
    assert_eq!(feed, Some("1"));
    let mut buffer = String::new();
    let first = next_sse_event(&mut stream, &mut buffer).await;
    let full = masters_of(&first).unwrap_or_else(|| panic!("not a masters event: {first}"));
    assert_eq!(full.after, None, "{first}");
    assert_eq!(full.masters.len(), 2, "{first}");
    assert_eq!(primary_port(&full, "mymaster"), Some(6379));
    // As `GET /v1/masters` renders them.
    let (_, list) = server.get_json("/v1/masters").await;
    assert_eq!(serde_json::to_value(&full.masters).expect("plain data"), list);

    server.events.push(Kind::Switch, Some("mymaster"), json!({"epoch": 2}));
    server.publish(
        vec![
            master("mymaster", Some("10.0.0.1:6380"), Some(2)),
            master("other", Some("10.0.0.5:6379"), Some(1)),
        ],
        true,
    );
    let next = next_sse_event(&mut stream, &mut buffer).await;
    let change = masters_of(&next).unwrap_or_else(|| panic!("not a masters event: {next}"));
    assert_eq!(change.after, Some(full.version), "{next}");
    assert_eq!(change.masters.len(), 1, "only what changed: {next}");
    assert_eq!(primary_port(&change, "mymaster"), Some(6380));
    server.publish(vec![master("other", Some("10.0.0.5:6379"), Some(1))], true);
    let gone = masters_of(&next_sse_event(&mut stream, &mut buffer).await).expect("masters");
    assert_eq!((gone.after, gone.removed.clone()), (Some(change.version), vec!["mymaster".into()]));
    assert!(gone.masters.is_empty());
}

#[tokio::test]
async fn the_event_stream_carries_events_and_masters_with_also_and_refuses_other_values() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let url = format!("{}/v1/events/stream?masters=also", server.url);
    let stream = server.client.get(&url).timeout(Duration::from_secs(30)).send().await;
    let mut stream = stream.expect("open");
    let mut buffer = String::new();
    assert!(masters_of(&next_sse_event(&mut stream, &mut buffer).await).is_some());
    let switch = server.events.push(Kind::Switch, Some("mymaster"), json!({"epoch": 2}));
    let event = next_sse_event(&mut stream, &mut buffer).await;
    assert!(event.starts_with(&format!("id: {switch}\nevent: switch\ndata: ")), "{event}");

    let (status, body) = server.get_json("/v1/events/stream?masters=yes").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_of(&body).contains("masters"), "{body}");
    // Without the parameter, the stream is what it always was: no header, no masters.
    let plain = format!("{}/v1/events/stream", server.url);
    let plain = server.client.get(&plain).timeout(Duration::from_secs(30)).send().await;
    let plain = plain.expect("open");
    assert!(plain.headers().get("polestar-masters").is_none());
}

#[tokio::test]
async fn failover_is_403_without_a_configured_token() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let (status, body) = server.post("/v1/masters/mymaster/failover", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(error_of(&body).contains("admin_token_file"));
    assert!(server.control.calls.lock().expect("not poisoned").is_empty());
}

#[tokio::test]
async fn failover_is_401_with_a_missing_or_wrong_token() {
    let server = start(Some(TOKEN)).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    for token in [None, Some("wrong"), Some("s3cret-token-but-longer")] {
        let (status, _) = server.post("/v1/masters/mymaster/failover", token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
    }
    assert!(server.control.calls.lock().expect("not poisoned").is_empty());
}

#[tokio::test]
async fn failover_is_accepted_with_the_token() {
    let server = start(Some(TOKEN)).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let (status, body) = server.post("/v1/masters/mymaster/failover", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The switchover's own fields (lag, replicas waited for) come beside these.
    assert_eq!(body["sentinel"], json!("127.0.0.1:26379"));
    assert_eq!(body["epoch_before"], json!(1));
    assert_eq!(*server.control.calls.lock().expect("not poisoned"), ["mymaster"]);
    let kinds: Vec<Kind> = server.events.since(None).iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [Kind::FailoverRequested]);
}

#[tokio::test]
async fn failover_with_wait_returns_the_new_state_once_published() {
    let server = Arc::new(start(Some(TOKEN)).await);
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let caller = server.clone();
    let readers = server.topology_readers();
    let call = tokio::spawn(async move {
        caller.post("/v1/masters/mymaster/failover?wait=30s", Some(TOKEN)).await
    });
    server.until_waiting(readers).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!call.is_finished(), "answered before the new primary was published");
    server.publish_one(Some("10.0.0.2:6379"), Some(2));
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(2), call).await.expect("woke").expect("ok");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["epoch"].as_u64(), body["primary"]["ip"].as_str()),
        (Some(2), Some("10.0.0.2"))
    );
}

#[tokio::test]
async fn failover_with_wait_is_504_when_nothing_is_published() {
    let server = start(Some(TOKEN)).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let (status, body) = server.post("/v1/masters/mymaster/failover?wait=200ms", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert!(error_of(&body).contains("200ms"), "{body}");
}

#[tokio::test]
async fn sentinel_refusals_map_to_409_and_503() {
    let server = start(Some(TOKEN)).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    *server.control.reply.lock().expect("not poisoned") = Reply::Refuse;
    let (status, body) = server.post("/v1/masters/mymaster/failover", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(error_of(&body).contains("INPROG"));
    *server.control.reply.lock().expect("not poisoned") = Reply::Unreachable;
    let (status, _) = server.post("/v1/masters/mymaster/failover", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn drain_is_authorized_and_validates_its_body() {
    let server = start(Some(TOKEN)).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let (status, _) = server.post("/v1/masters/mymaster/drain", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = server.post("/v1/masters/mymaster/drain", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(error_of(&body).contains("node"), "{body}");
    let url = format!("{}/v1/masters/mymaster/drain", server.url);
    let send = |node: &'static str| {
        let body = json!({ "node": node });
        server.client.post(&url).bearer_auth(TOKEN).json(&body).send()
    };
    let response = send("not-an-address").await.expect("the server answers");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // This server has no drain coordinator: a valid request says so, as JSON.
    let response = send("10.0.0.1:6379").await.expect("the server answers");
    assert_eq!(response.status(), StatusCode::NOT_IMPLEMENTED);
    let body: Value = response.json().await.expect("a JSON body");
    assert_eq!(error_of(&body), "draining is not available");
}

#[tokio::test]
async fn readyz_lists_its_reasons_until_ready() {
    let server = start(None).await;
    let (status, body) = server.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reasons"], json!(["no Sentinel reachable", "no masters known yet"]));
    server.publish(vec![master("mymaster", None, None)], false);
    let (status, body) = server.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let reasons = ["no Sentinel reachable", "mymaster: no confirmed primary"];
    let expected = json!({"ready": false, "reasons": reasons});
    assert_eq!(body, expected);
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let (status, body) = server.get_json("/readyz").await;
    assert_eq!((status, body), (StatusCode::OK, json!({"ready": true, "reasons": []})));
    assert_eq!(server.get("/healthz").await.0, StatusCode::OK);
}

#[tokio::test]
async fn metrics_count_requests_by_route_template_and_code() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    server.get("/v1/masters/mymaster").await;
    server.get("/v1/masters/nope").await;
    server.get("/no/such/route").await;
    let (status, text) = server.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let has = |route: &str, code: &str| {
        text.lines().any(|l| {
            l.starts_with("polestar_http_requests_total{")
                && l.contains(&format!("route=\"{route}\""))
                && l.contains(&format!("code=\"{code}\""))
        })
    };
    assert!(has("/v1/masters/{name}", "200"), "{text}");
    assert!(has("/v1/masters/{name}", "404"), "{text}");
    assert!(has("unmatched", "404"), "{text}");
}

#[tokio::test]
async fn shutdown_ends_long_polls_and_streams_promptly() {
    let server = Arc::new(start(None).await);
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let url = format!("{}/v1/events/stream", server.url);
    let mut stream =
        server.client.get(&url).timeout(Duration::from_secs(30)).send().await.expect("open");
    let poller = server.clone();
    let readers = server.topology_readers();
    let poll = tokio::spawn(async move { poller.get_json("/v1/masters/mymaster?wait=60s").await });
    server.until_waiting(readers).await;
    let stopping = Instant::now();
    server.shutdown.cancel();
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(2), poll).await.expect("ended").expect("ok");
    assert_eq!((status, body["epoch"].as_u64()), (StatusCode::OK, Some(1)));
    let end = tokio::time::timeout(Duration::from_secs(2), stream.chunk()).await.expect("ended");
    assert!(matches!(end, Ok(None)), "{end:?}");
    let mut server = Arc::into_inner(server).expect("the poller has finished with it");
    let served = tokio::time::timeout(Duration::from_secs(2), &mut server.server).await;
    assert!(matches!(served, Ok(Ok(Ok(())))), "serve did not return cleanly: {served:?}");
    assert!(stopping.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn cli_status_lists_each_master_with_its_primary() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(4));
    let table = client::status_table(&server.url).await.expect("status works");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("MASTER") && lines[0].contains("SENTINELS"), "{table}");
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row, ["mymaster", "10.0.0.1:6379", "4", "ok", "1/1", "3/3"]);
    client::status(&server.url).await.expect("status prints");
}

#[tokio::test]
async fn cli_wait_prints_the_primary_once_the_epoch_moves() {
    let server = Arc::new(start(None).await);
    server.publish_one(Some("10.0.0.1:6379"), Some(4));
    let url = server.url.clone();
    let readers = server.topology_readers();
    let waiter = tokio::spawn(async move {
        client::wait_for_primary(&url, "mymaster", None, Duration::from_secs(10)).await
    });
    server.until_waiting(readers).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "wait returned before the epoch moved");
    server.publish_one(Some("10.0.0.2:6379"), Some(5));
    let primary = tokio::time::timeout(Duration::from_secs(2), waiter).await.expect("woke");
    let primary = primary.expect("no panic").expect("a primary");
    assert_eq!(primary.to_string(), "10.0.0.2:6379");
    let after = client::wait_for_primary(&server.url, "mymaster", Some(4), Duration::from_secs(1));
    assert_eq!(after.await.expect("already past 4").to_string(), "10.0.0.2:6379");
    client::wait(&server.url, "mymaster", Some(4), Duration::from_secs(1)).await.expect("prints");
}

#[tokio::test]
async fn cli_wait_fails_on_timeout_and_names_unknown_masters() {
    let server = start(None).await;
    server.publish_one(Some("10.0.0.1:6379"), Some(4));
    let started = Instant::now();
    let waited =
        client::wait_for_primary(&server.url, "mymaster", None, Duration::from_millis(300));
    let error = waited.await.expect_err("nothing moved").to_string();
    assert!(error.contains("timed out after 300ms") && error.contains("epoch 4"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let waited = client::wait_for_primary(&server.url, "nope", None, Duration::from_secs(1)).await;
    let error = waited.expect_err("unknown master").to_string();
    assert!(error.contains("404") && error.contains("no master named \"nope\""), "{error}");
    assert!(error.contains(&format!("{}/v1/masters/nope", server.url)), "{error}");
}

#[tokio::test]
async fn cli_failover_sends_the_token_and_waits_for_the_new_primary() {
    let server = Arc::new(start(Some(TOKEN)).await);
    server.publish_one(Some("10.0.0.1:6379"), Some(1));
    let refused = client::request_failover(&server.url, "mymaster", false, Some("bad".into()));
    let error = refused.await.expect_err("wrong token").to_string();
    assert!(error.contains("401") && error.contains("wrong bearer token"), "{error}");
    let accepted = client::request_failover(&server.url, "mymaster", false, Some(TOKEN.into()));
    assert!(matches!(accepted.await, Ok(client::Failover::Accepted { .. })));

    let url = server.url.clone();
    let readers = server.topology_readers();
    let call = tokio::spawn(async move {
        client::request_failover(&url, "mymaster", true, Some(TOKEN.into())).await
    });
    server.until_waiting(readers).await;
    server.publish_one(Some("10.0.0.2:6379"), Some(2));
    let done = tokio::time::timeout(Duration::from_secs(2), call).await.expect("woke");
    match done.expect("no panic").expect("failover done") {
        client::Failover::Done(state) => assert_eq!(state.epoch, Some(2)),
        other => panic!("expected the new state, got {other:?}"),
    }
}

#[tokio::test]
async fn cli_errors_name_an_unreachable_api() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    drop(listener);
    let error = client::status_table(&url).await.expect_err("nothing listens").to_string();
    assert!(
        error.starts_with(&format!("cannot reach polestar API at {url}/v1/masters: ")),
        "{error}"
    );
}
