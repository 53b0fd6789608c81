//! A Lettuce-like client: one persistent connection to the primary that polestar names, no read
//! timeout, reconnect (asking polestar again) only on a socket error. It records every success
//! with the node that served it, so a test can tell when it is writing to the new primary.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::Host;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `INCR` every 50 ms.
    Writer,
    /// `PING`, then `BLPOP <key> 0`, forever (a blocked reader).
    Blocked,
}

#[derive(Default)]
pub struct Log {
    pub ok: Mutex<Vec<(SystemTime, SocketAddr)>>,
    pub errors: Mutex<Vec<(SystemTime, String)>>,
}

impl Log {
    /// The first success on a node other than `old` at or after `after`.
    pub fn first_ok_elsewhere(
        &self,
        old: SocketAddr,
        after: SystemTime,
    ) -> Option<(SystemTime, SocketAddr)> {
        let ok = self.ok.lock().unwrap_or_else(|p| p.into_inner());
        ok.iter().find(|(t, a)| *a != old && *t >= after).copied()
    }

    pub fn last_ok(&self) -> Option<(SystemTime, SocketAddr)> {
        self.ok.lock().unwrap_or_else(|p| p.into_inner()).last().copied()
    }

    pub fn error_count(&self) -> usize {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn ok(&self, addr: SocketAddr) {
        self.ok.lock().unwrap_or_else(|p| p.into_inner()).push((SystemTime::now(), addr));
    }

    fn error(&self, e: String) {
        self.errors.lock().unwrap_or_else(|p| p.into_inner()).push((SystemTime::now(), e));
    }
}

/// Starts the client in `app`'s namespace; it runs until `stop`.
pub fn start(app: &Host, discover: String, mode: Mode, stop: CancellationToken) -> Arc<Log> {
    let log = Arc::new(Log::default());
    let log2 = log.clone();
    drop(super::in_ns(app, move || async move {
        run(&discover, mode, &log2, &stop).await;
        Ok(())
    }));
    log
}

async fn run(discover: &str, mode: Mode, log: &Log, stop: &CancellationToken) {
    let http =
        reqwest::Client::builder().timeout(Duration::from_secs(1)).build().unwrap_or_default();
    while !stop.is_cancelled() {
        let Some(primary) = ask(&http, discover).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let session = async {
            let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(primary))
                .await
                .map_err(|_| std::io::Error::other("connect timed out"))??;
            serve(stream, primary, mode, log).await
        };
        let result = tokio::select! {
            r = session => r,
            _ = stop.cancelled() => return,
        };
        if let Err(e) = result {
            log.error(format!("{primary}: {e}"));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn ask(http: &reqwest::Client, url: &str) -> Option<SocketAddr> {
    let response = http.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()?.trim().parse().ok()
}

async fn serve(stream: TcpStream, addr: SocketAddr, mode: Mode, log: &Log) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        match mode {
            Mode::Writer => {
                command(&mut stream, "*2\r\n$4\r\nINCR\r\n$7\r\ncounter\r\n", 1).await?;
                log.ok(addr);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Mode::Blocked => {
                command(&mut stream, "*1\r\n$4\r\nPING\r\n", 1).await?;
                log.ok(addr);
                command(&mut stream, "*3\r\n$5\r\nBLPOP\r\n$5\r\nqueue\r\n$1\r\n0\r\n", 5).await?;
            }
        }
    }
}

/// Sends a command and reads `lines` reply lines, with no timeout (as the clients that hang).
async fn command(
    stream: &mut BufReader<TcpStream>,
    cmd: &str,
    lines: usize,
) -> std::io::Result<()> {
    stream.get_mut().write_all(cmd.as_bytes()).await?;
    for _ in 0..lines {
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        if line.starts_with('-') {
            return Err(std::io::Error::other(line.trim().to_string()));
        }
    }
    Ok(())
}
