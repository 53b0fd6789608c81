//! An honest DNS and HTTP client beside the crowd (the fan-out must not stall DNS or HTTP): every
//! [`INTERVAL`] one UDP query for the master's name and one `GET /v1/masters/{name}/primary` on a
//! kept-alive connection, each timed, on a thread and a runtime of their own at normal priority
//! (the crowd's own threads are reniced), so a probe waits on polestar, not on the crowd's readers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{Instant, timeout};

/// Between two probes of one kind.
const INTERVAL: Duration = Duration::from_millis(2);
/// A probe not answered within this is lost.
const LOST: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dns,
    Http,
}

/// One probe: when it was sent (Unix ms) and how long its answer took (ms), `None` if lost.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    pub kind: Kind,
    pub sent: f64,
    pub latency: Option<f64>,
}

/// What the probes ask.
pub struct Target {
    pub dns: SocketAddr,
    /// The master's DNS name, e.g. `mymaster.redis.internal.`.
    pub name: String,
    pub http: SocketAddr,
    pub master: String,
}

/// The probing thread; [`Prober::finish`] stops it and returns every probe.
pub struct Prober {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Probe>>,
    /// The thread's id, which the crowd leaves at normal priority.
    pub tid: i32,
}

impl Prober {
    pub fn start(target: Target) -> anyhow::Result<Prober> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("probe".into()).spawn(move || {
            let _ = tid_tx.send(nix::unistd::gettid().as_raw());
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let Ok(runtime) = runtime else { return Vec::new() };
            runtime.block_on(run(target, stopping))
        })?;
        let tid = tid_rx.recv()?;
        Ok(Prober { stop, thread, tid })
    }

    pub fn finish(self) -> Vec<Probe> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

async fn run(target: Target, stop: Arc<AtomicBool>) -> Vec<Probe> {
    let target = Arc::new(target);
    let dns = tokio::spawn(probe_dns(target.clone(), stop.clone()));
    let http = tokio::spawn(probe_http(target, stop));
    let mut all = dns.await.unwrap_or_default();
    all.extend(http.await.unwrap_or_default());
    all
}

fn now_ms() -> f64 {
    super::now_ms()
}

async fn probe_dns(target: Arc<Target>, stop: Arc<AtomicBool>) -> Vec<Probe> {
    let mut probes = Vec::new();
    let Ok(socket) = UdpSocket::bind("127.0.0.1:0").await else { return probes };
    let mut id: u16 = 0;
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::Relaxed) {
        id = id.wrapping_add(1);
        let (sent, started) = (now_ms(), Instant::now());
        let mut latency = None;
        if socket.send_to(&query(id, &target.name), target.dns).await.is_ok() {
            let answer = async {
                loop {
                    let n = socket.recv(&mut buf).await?;
                    // An answer with records to this query (a late one to an earlier is skipped).
                    if n > 12 && buf[..2] == id.to_be_bytes() {
                        return std::io::Result::Ok(buf[3] & 0x0f == 0 && buf[7] > 0);
                    }
                }
            };
            if let Ok(Ok(true)) = timeout(LOST, answer).await {
                latency = Some(started.elapsed().as_secs_f64() * 1e3);
            }
        }
        probes.push(Probe { kind: Kind::Dns, sent, latency });
        tokio::time::sleep(INTERVAL).await;
    }
    probes
}

/// A query for `name`'s A record, without recursion.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

async fn probe_http(target: Arc<Target>, stop: Arc<AtomicBool>) -> Vec<Probe> {
    let mut probes = Vec::new();
    let request =
        format!("GET /v1/masters/{}/primary HTTP/1.1\r\nhost: polestar\r\n\r\n", target.master);
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let (sent, started) = (now_ms(), Instant::now());
        let answered = timeout(LOST, primary(&mut conn, target.http, request.as_bytes())).await;
        let latency = match answered {
            Ok(Ok(())) => Some(started.elapsed().as_secs_f64() * 1e3),
            _ => {
                conn = None;
                None
            }
        };
        probes.push(Probe { kind: Kind::Http, sent, latency });
        tokio::time::sleep(INTERVAL).await;
    }
    probes
}

/// One `GET .../primary` on the kept-alive connection (opened if there is none), answered 200.
async fn primary(
    conn: &mut Option<TcpStream>,
    http: SocketAddr,
    request: &[u8],
) -> anyhow::Result<()> {
    if conn.is_none() {
        let s = TcpStream::connect(http).await?;
        s.set_nodelay(true)?;
        *conn = Some(s);
    }
    let Some(s) = conn.as_mut() else { anyhow::bail!("no connection") };
    s.write_all(request).await?;
    let mut buf = Vec::with_capacity(512);
    let (head, _) = super::read_head(s, &mut buf).await?;
    super::status_ok(&buf[..head])?;
    let length = super::header(&buf[..head], "content-length").and_then(|l| l.parse().ok());
    let length: usize = length.unwrap_or(0);
    let mut chunk = [0u8; 512];
    while buf.len() < head + length {
        let n = s.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "closed in the body");
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

/// p50, p99, max and lost of the probes of `kind` sent in `[from, to)` (Unix ms).
pub fn summary(probes: &[Probe], kind: Kind, from: f64, to: f64) -> String {
    let sent: Vec<&Probe> =
        probes.iter().filter(|p| p.kind == kind && p.sent >= from && p.sent < to).collect();
    let mut lat: Vec<f64> = sent.iter().filter_map(|p| p.latency).collect();
    lat.sort_by(f64::total_cmp);
    let lost = sent.len() - lat.len();
    format!(
        "{} probes: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, lost {lost}",
        sent.len(),
        super::pct(&lat, 50),
        super::pct(&lat, 99),
        lat.last().copied().unwrap_or(f64::NAN),
    )
}
