//! The status page in real headless Chromium: it renders the master from the API, connects to
//! the event stream, and shows a failover without being reloaded. Chromium is driven over the
//! DevTools protocol; a screenshot is left in `target/status-page/` for people to look at.

use crate::common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

const CHROMIUM: &str = "chromium";
/// The flags a headless Chromium needs in a container, and none of its background traffic.
const FLAGS: [&str; 9] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
];

/// A headless Chromium with its own profile directory, killed on drop.
struct Browser {
    child: Child,
    profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let profile = tempfile::tempdir().expect("a profile directory");
        let child = Command::new(CHROMIUM)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(["--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"])
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium runs (bash tests/deps.sh installs it)");
        Browser { child, profile }
    }

    /// The DevTools port, from the `DevToolsActivePort` file Chromium writes once it listens.
    async fn port(&self) -> u16 {
        let file = self.profile.path().join("DevToolsActivePort");
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if let Some(port) = text.lines().next().and_then(|l| l.trim().parse().ok()) {
                return port;
            }
            assert!(Instant::now() < end, "chromium wrote no DevToolsActivePort");
            sleep(POLL).await;
        }
    }

    /// A DevTools session on the browser's first page.
    async fn page(&self) -> Page {
        let list = format!("http://127.0.0.1:{}/json/list", self.port().await);
        let end = Instant::now() + Duration::from_secs(30);
        let url = loop {
            let targets: Value = match reqwest::get(&list).await {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(_) => Value::Null,
            };
            let page = targets.as_array().into_iter().flatten().find(|t| t["type"] == "page");
            if let Some(url) = page.and_then(|p| p["webSocketDebuggerUrl"].as_str()) {
                break url.to_string();
            }
            assert!(Instant::now() < end, "no page target in {list}: {targets}");
            sleep(POLL).await;
        };
        let (socket, _) = tokio_tungstenite::connect_async(url).await.expect("the DevTools socket");
        Page { socket, next_id: 1 }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One DevTools session: commands with ids, answers matched by id, events skipped.
struct Page {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Page {
    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({ "id": id, "method": method, "params": params });
        self.socket.send(Message::text(request.to_string())).await?;
        while let Some(message) = self.socket.next().await {
            let Message::Text(text) = message? else { continue };
            let answer: Value = serde_json::from_str(&text)?;
            if answer["id"] == id {
                anyhow::ensure!(answer["error"].is_null(), "{method}: {}", answer["error"]);
                return Ok(answer["result"].clone());
            }
        }
        anyhow::bail!("the DevTools socket closed")
    }

    /// The value of a JavaScript expression in the page.
    async fn eval(&mut self, expression: &str) -> anyhow::Result<Value> {
        let params = json!({ "expression": expression, "returnByValue": true });
        let result = self.call("Runtime.evaluate", params).await?;
        anyhow::ensure!(result["exceptionDetails"].is_null(), "{expression}: {result}");
        Ok(result["result"]["value"].clone())
    }

    /// Polls `expression` until it is `true`; its last value in the panic otherwise.
    async fn wait_true(&mut self, env: &Env, deadline: Duration, expression: &str) {
        let end = Instant::now() + deadline;
        loop {
            let value = self.eval(expression).await;
            if matches!(value, Ok(Value::Bool(true))) {
                return;
            }
            if Instant::now() > end {
                let dom = self.eval("document.body.outerHTML").await.unwrap_or_default();
                env.fail(&format!("page: {expression} is {value:?} after {deadline:?}\n{dom}"));
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    async fn screenshot(&mut self, name: &str) -> PathBuf {
        use base64::Engine as _;
        let shot = self.call("Page.captureScreenshot", json!({ "format": "png" })).await;
        let data = shot.expect("a screenshot")["data"].as_str().unwrap_or_default().to_string();
        let png = base64::engine::general_purpose::STANDARD.decode(data).expect("base64 PNG");
        let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.parent().unwrap_or(tmp).join("status-page");
        std::fs::create_dir_all(&dir).expect("the screenshot directory");
        let path = dir.join(name);
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }
}

/// The `data-primary` of the master's card.
fn shown_primary(master: &str) -> String {
    format!("document.querySelector('article[data-master=\"{master}\"]')?.dataset.primary")
}

#[tokio::test]
async fn the_status_page_shows_a_failover_live() {
    let env = Env::start().await;
    env.wait_reachable(3, STARTUP).await;
    let master = env.master_name();
    let old = primary_of(&env.master().await.expect("master")).expect("a primary");
    check_headers(&env).await;
    let browser = Browser::start();
    let mut page = browser.page().await;
    page.call("Page.navigate", json!({ "url": env.ps.url("/") })).await.expect("navigate");
    let card = shown_primary(&master);
    page.wait_true(&env, STARTUP, &format!("{card} === '{old}'")).await;
    page.wait_true(&env, STARTUP, "document.body.dataset.live === '1'").await;
    // The readiness verdict is on the card (refreshed every 5 s).
    let verdict = format!(
        "document.querySelector('article[data-master=\"{master}\"] dd.failover')?.textContent"
    );
    page.wait_true(&env, STARTUP, &format!("{verdict} === 'possible'")).await;
    page.eval("window.sameDocument = true").await.expect("mark the document");

    let new = env.failover().await;
    // The card shows the new primary and the switch arrived over the event stream, in the same
    // document (a reload would have dropped the mark).
    page.wait_true(&env, FAILOVER, &format!("{card} === '{new}'")).await;
    let switch = format!(
        "[...document.querySelectorAll('#timeline li[data-kind=\"switch\"][data-via=\"stream\"]')]\
         .some(li => li.textContent.includes('{new}'))"
    );
    page.wait_true(&env, FAILOVER, &switch).await;
    page.wait_true(&env, STARTUP, "window.sameDocument === true").await;
    let events = page.eval("Number(document.body.dataset.sseEvents)").await.expect("counter");
    assert!(events.as_u64().unwrap_or(0) >= 1, "events over the stream: {events}");
    env.wait_state("ok", FAILOVER).await;
    page.wait_true(&env, FAILOVER, "document.querySelector('.state').textContent === 'ok'").await;
    page.wait_true(&env, STARTUP, &format!("{verdict} === 'possible'")).await;

    let shot = page.screenshot("after-failover.png").await;
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000, "{} is {size} bytes", shot.display());
    println!("screenshot: {}", shot.display());
}

/// A master that cannot fail over shows it on its card: the failover line turns `bad` and reads
/// `not possible: <reason>: <detail>` (every replica at `replica-priority 0` here), and reads
/// `possible` again after the cure, without a reload.
#[tokio::test]
async fn the_status_page_shows_a_readiness_blocker_with_its_reason() {
    let env = Env::start().await;
    env.wait_reachable(3, STARTUP).await;
    let master = env.master_name();
    let browser = Browser::start();
    let mut page = browser.page().await;
    page.call("Page.navigate", json!({ "url": env.ps.url("/") })).await.expect("navigate");
    let line = format!("document.querySelector('article[data-master=\"{master}\"] dd.failover')");
    page.wait_true(&env, STARTUP, &format!("{line}?.textContent === 'possible'")).await;
    page.eval("window.sameDocument = true").await.expect("mark the document");

    set_replica_priority(&env, "0").await;
    // Sentinel refreshes a replica's INFO every 10 s, the page its masters every 5 s.
    let shown = format!(
        "{line}?.classList.contains('bad') && {line}.textContent.startsWith('not possible: no_promotable_replica: ') && {line}.textContent.includes('has replica-priority 0')"
    );
    page.wait_true(&env, Duration::from_secs(40), &shown).await;
    let text = page.eval(&format!("{line}.textContent")).await.expect("the failover line");
    println!("status page: {text}");
    let shot = page.screenshot("readiness-blocker.png").await;
    println!("screenshot: {}", shot.display());

    set_replica_priority(&env, "100").await;
    let possible =
        format!("{line}?.textContent === 'possible' && !{line}.classList.contains('bad')");
    page.wait_true(&env, Duration::from_secs(40), &possible).await;
    page.wait_true(&env, STARTUP, "window.sameDocument === true").await;
}

/// `CONFIG SET replica-priority` on every replica of the lab.
async fn set_replica_priority(env: &Env, priority: &str) {
    let primary = env.lab.primary().await.expect("the primary");
    for node in env.lab.node_addrs().into_iter().filter(|n| *n != primary) {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("replica-priority").arg(priority);
        let set = polestar_lab::query::<String>(node, &cmd).await;
        set.unwrap_or_else(|e| env.fail(&format!("CONFIG SET replica-priority: {e:#}")));
    }
}

/// `GET /` is HTML that may load nothing from elsewhere.
async fn check_headers(env: &Env) {
    let response = reqwest::get(env.ps.url("/")).await.expect("GET /");
    assert_eq!(response.status(), 200);
    let header = |name: &str| {
        let value = response.headers().get(name).map(|v| v.to_str().unwrap_or_default());
        value.unwrap_or_default().to_string()
    };
    assert!(header("content-type").starts_with("text/html"), "{}", header("content-type"));
    let csp = header("content-security-policy");
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
}
