//! What everyone says the primary is, every 100 ms, from the application host: each Sentinel
//! (`SENTINEL GET-MASTER-ADDR-BY-NAME`, the truth), the central polestar's DNS and HTTP, and the
//! agent's HTTP. The report compares them afterwards.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

use super::clients::{Find, locate, read_reply, resolve_a};
use crate::netns::{self, Host};

pub const PERIOD: Duration = Duration::from_millis(100);
const PROBE: Duration = Duration::from_millis(300);

#[derive(Clone, Debug)]
pub struct Sample {
    pub at: Instant,
    pub sentinels: Vec<Option<SocketAddr>>,
    pub dns: Option<IpAddr>,
    pub http: Option<SocketAddr>,
    pub agent: Option<SocketAddr>,
}

pub struct Targets {
    pub sentinels: Vec<SocketAddr>,
    pub master: String,
    pub dns: Find,
    pub http: Find,
    pub agent: Find,
}

pub type Samples = Arc<Mutex<Vec<Sample>>>;

/// Starts sampling in `host`'s namespace until `stop`.
pub fn start(host: &Host, targets: Targets, stop: CancellationToken) -> Samples {
    let samples: Samples = Arc::default();
    let out = samples.clone();
    drop(netns::in_ns(host, move || async move {
        let http = reqwest::Client::builder().timeout(PROBE).build()?;
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.is_cancelled() {
            tick.tick().await;
            let sample = sample(&http, &targets).await;
            out.lock().unwrap_or_else(|p| p.into_inner()).push(sample);
        }
        Ok(())
    }));
    samples
}

async fn sample(http: &reqwest::Client, t: &Targets) -> Sample {
    let at = Instant::now();
    let sentinels = futures::future::join_all(t.sentinels.iter().map(|s| ask(*s, &t.master)));
    let dns = async {
        let Find::Dns { server, name } = &t.dns else { return None };
        resolve_a(*server, name).await
    };
    let (sentinels, dns, http, agent) =
        tokio::join!(sentinels, dns, locate(http, &t.http), locate(http, &t.agent));
    Sample { at, sentinels, dns, http, agent }
}

/// One Sentinel's answer, or `None` if it does not answer within the probe time.
async fn ask(sentinel: SocketAddr, master: &str) -> Option<SocketAddr> {
    let reply = timeout(PROBE, async {
        let stream = TcpStream::connect(sentinel).await?;
        let mut stream = BufReader::new(stream);
        let cmd = format!(
            "*3\r\n$8\r\nSENTINEL\r\n$23\r\nget-master-addr-by-name\r\n${}\r\n{master}\r\n",
            master.len()
        );
        stream.get_mut().write_all(cmd.as_bytes()).await?;
        read_reply(&mut stream).await
    });
    let items = reply.await.ok()?.ok()?;
    let ip: IpAddr = items.first()?.parse().ok()?;
    Some(SocketAddr::new(ip, items.get(1)?.parse().ok()?))
}
