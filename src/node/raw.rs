//! A plain RESP connection whose replies are read in place ([`super::reply`]): for the
//! questions whose answers are large, a Sentinel's `SENTINEL MASTERS` above all (some 40
//! strings for every master it monitors). Same transport as every other connection
//! ([`super::conn`]: connect timeout, keepalive, `TCP_USER_TIMEOUT`, TLS as configured), `AUTH`
//! when a password is set, and a deadline on every exchange. No pub/sub, no `HELLO`: the server
//! answers in RESP2, one reply per command, in order.
//!
//! Any failure (the deadline, a closed or broken socket, bytes that are no RESP, replies
//! larger than [`MAX_REPLIES`]) leaves the connection unusable: every later call fails, and
//! its owner opens a new one.

use redis::RedisResult;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::timeout;

use super::conn::{failure, tcp_stream, tls_stream};
use super::reply::{Replies, Reply, ReplyError, Scan};
use super::{CONNECT_TIMEOUT, Endpoint, RESPONSE_TIMEOUT};
use crate::log_every::LogEvery;

/// The most one exchange's replies may take: `SENTINEL MASTERS` is about 0.7 KB a master.
pub const MAX_REPLIES: usize = 64 << 20;

/// How much a read asks for at a time.
const READ_CHUNK: usize = 64 << 10;

trait Stream: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> Stream for T {}

pub struct RawConn {
    stream: Box<dyn Stream>,
    endpoint: Endpoint,
    name: String,
    /// An exchange failed (or was abandoned half way): the stream is out of step.
    broken: bool,
}

/// Why an exchange failed, and whether the server had closed the connection before it (the
/// peer gone before any reply: asking again on a new connection may succeed).
struct Failed {
    error: redis::RedisError,
    closed_idle: bool,
}

impl Failed {
    fn other(error: redis::RedisError) -> Self {
        Self { error, closed_idle: false }
    }
}

impl RawConn {
    /// Connects, authenticates and names the connection `name` (`CLIENT SETNAME`, so that
    /// `CLIENT LIST` shows whose it is and drains spare it), in one exchange within
    /// [`CONNECT_TIMEOUT`]. A refused name is no failure (an ACL may deny `CLIENT`); a refused
    /// `AUTH` is. A failure is recorded for `/readyz` as [`super::connect`]'s are.
    pub async fn open(endpoint: &Endpoint, name: &str) -> RedisResult<Self> {
        let opened = match timeout(CONNECT_TIMEOUT, Self::open_now(endpoint, name)).await {
            Ok(opened) => opened,
            Err(_) => {
                Err(failure(endpoint, "connect", format!("no answer within {CONNECT_TIMEOUT:?}")))
            }
        };
        crate::reach::record(&endpoint.name(), opened.as_ref().err());
        opened
    }

    async fn open_now(endpoint: &Endpoint, name: &str) -> RedisResult<Self> {
        let stream: Box<dyn Stream> = match endpoint.auth.tls.enabled {
            true => Box::new(tls_stream(endpoint).await?),
            false => Box::new(tcp_stream(endpoint).await?),
        };
        let mut conn =
            Self { stream, endpoint: endpoint.clone(), name: name.to_string(), broken: false };
        let auth = endpoint.auth.password.as_ref().map(|password| {
            let mut auth = vec!["AUTH"];
            auth.extend(endpoint.auth.username.as_deref());
            auth.push(password.expose());
            auth
        });
        let authenticating = auth.is_some();
        let commands: Vec<Vec<&str>> =
            auth.into_iter().chain([vec!["CLIENT", "SETNAME", name]]).collect();
        let replies = conn.ask_once(&commands).await.map_err(|f| f.error)?;
        match replies.iter().next() {
            Some(Reply::Error(e)) if authenticating => {
                Err(failure(&conn.endpoint, "AUTH", String::from_utf8_lossy(e).into_owned()))
            }
            _ => Ok(conn),
        }
    }

    /// Sends `commands` at once and reads one reply to each within [`RESPONSE_TIMEOUT`]. A
    /// command the server refuses has its error as its reply. For questions only: when the
    /// server had closed the connection while it was idle (a `timeout` in its config, a
    /// restart), they are asked again once on a new connection.
    pub async fn ask(&mut self, commands: &[Vec<&str>]) -> RedisResult<Replies> {
        match self.ask_once(commands).await {
            Ok(replies) => Ok(replies),
            Err(Failed { closed_idle: true, .. }) => {
                *self = Self::open(&self.endpoint, &self.name).await?;
                self.ask_once(commands).await.map_err(|f| f.error)
            }
            Err(failed) => Err(failed.error),
        }
    }

    async fn ask_once(&mut self, commands: &[Vec<&str>]) -> Result<Replies, Failed> {
        if self.broken {
            return Err(Failed::other(
                self.fail("exchange", "the connection failed before".into()),
            ));
        }
        self.broken = true;
        let exchange = timeout(RESPONSE_TIMEOUT, self.exchange(commands)).await;
        let replies = exchange.unwrap_or_else(|_| {
            let late = format!("no answer within {RESPONSE_TIMEOUT:?}");
            Err(Failed::other(self.fail("exchange", late)))
        })?;
        self.broken = false;
        Ok(replies)
    }

    async fn exchange(&mut self, commands: &[Vec<&str>]) -> Result<Replies, Failed> {
        let sent = match self.stream.write_all(&encode(commands)).await {
            Ok(()) => self.stream.flush().await,
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            return Err(Failed {
                closed_idle: closed(&e),
                error: self.fail("send", e.to_string()),
            });
        }
        let (mut buf, mut ends, mut scan) = (Vec::new(), Vec::new(), Scan::default());
        while ends.len() < commands.len() {
            if buf.len() >= MAX_REPLIES {
                let long = format!("replies longer than {MAX_REPLIES} bytes");
                return Err(Failed::other(self.fail("read", long)));
            }
            buf.reserve(READ_CHUNK);
            let read = self.stream.read_buf(&mut buf).await;
            let closed_idle = buf.is_empty() && read.as_ref().map_or_else(closed, |n| *n == 0);
            match read {
                Ok(0) => {
                    let error = self.fail("read", "connection closed".into());
                    return Err(Failed { error, closed_idle });
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(Failed { error: self.fail("read", e.to_string()), closed_idle });
                }
            }
            while ends.len() < commands.len() {
                match scan.next(&buf) {
                    Ok(Some(end)) => ends.push(end),
                    Ok(None) => break,
                    Err(e) => return Err(Failed::other(self.bad_reply(e))),
                }
            }
        }
        // Nothing was asked for past the last reply: a server that sends more is out of step.
        if buf.len() > scan.scanned() {
            return Err(Failed::other(self.fail("read", "more replies than commands".into())));
        }
        Ok(Replies::new(buf, ends))
    }

    /// A reply that is no RESP: the exchange's failure, counted, and logged once per interval
    /// (a hostile peer answers every question so, and each one is a new connection).
    fn bad_reply(&self, e: ReplyError) -> redis::RedisError {
        static EVERY: LogEvery = LogEvery::new();
        metrics::counter!(crate::metrics::BAD_REPLIES).increment(1);
        if let Some(hits) = EVERY.hit(std::time::Instant::now()) {
            let peer = self.endpoint.name();
            tracing::warn!(%peer, hits, "a peer answered what is no RESP: {e}");
        }
        self.fail("read", e.to_string())
    }

    fn fail(&self, stage: &'static str, detail: String) -> redis::RedisError {
        failure(&self.endpoint, stage, detail)
    }
}

/// Whether `e` says the peer closed the connection.
fn closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted)
}

/// The commands as RESP arrays of bulk strings, packed by the redis crate.
fn encode(commands: &[Vec<&str>]) -> Vec<u8> {
    let mut out = Vec::new();
    for command in commands {
        let mut cmd = redis::Cmd::new();
        for arg in command {
            cmd.arg(*arg);
        }
        cmd.write_packed_command(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::io::AsyncBufReadExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::config::{Auth, Secret};

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let out = encode(&[vec!["SENTINEL", "MASTERS"], vec!["AUTH", "p w"]]);
        let want = b"*2\r\n$8\r\nSENTINEL\r\n$7\r\nMASTERS\r\n*2\r\n$4\r\nAUTH\r\n$3\r\np w\r\n";
        assert_eq!(out, want);
    }

    /// A server on loopback: it answers the opening exchange (the naming, `CLIENT SETNAME t`,
    /// after `AUTH u p` when `auth` has a password) with `opened`, reads `lines` request lines,
    /// then has `answer` write to the client; the endpoint to reach it.
    async fn server<F, Fut>(auth: Auth, opened: &'static [u8], lines: usize, answer: F) -> Endpoint
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("bound").port();
        let opening = words(3) * if auth.password.is_some() { 2 } else { 1 };
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut reader = tokio::io::BufReader::new(&mut stream);
            let mut line = String::new();
            for _ in 0..opening {
                line.clear();
                reader.read_line(&mut line).await.expect("an opening line");
            }
            reader.get_mut().write_all(opened).await.expect("opened");
            for _ in 0..lines {
                line.clear();
                reader.read_line(&mut line).await.expect("a request line");
            }
            answer(stream).await;
        });
        Endpoint::new("127.0.0.1", port, &auth)
    }

    fn words(n: usize) -> usize {
        // `*n` and a `$len` and a word line per argument.
        1 + 2 * n
    }

    #[tokio::test]
    async fn replies_arriving_in_pieces_are_read_in_order() {
        // A refused name is no failure.
        let endpoint =
            server(Auth::default(), b"-ERR denied\r\n", 2 * words(2), |mut s| async move {
                for piece in [&b"*2\r\n$1\r\na"[..], b"\r\n:7\r\n", b"-ERR no such", b" master\r\n"]
                {
                    s.write_all(piece).await.expect("write");
                    s.flush().await.expect("flush");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
        let mut conn = RawConn::open(&endpoint, "t").await.expect("open");
        let replies = conn.ask(&[vec!["A", "b"], vec!["C", "d"]]).await.expect("replies");
        let values: Vec<redis::Value> = replies.iter().map(|r| r.to_value()).collect();
        let a = redis::Value::BulkString(b"a".to_vec());
        assert_eq!(values[0], redis::Value::Array(vec![a, redis::Value::Int(7)]));
        assert!(matches!(replies.iter().nth(1), Some(Reply::Error(b"ERR no such master"))));
    }

    #[tokio::test]
    async fn a_refused_password_fails_the_open_naming_the_endpoint() {
        let auth = Auth {
            username: Some("u".into()),
            password: Some(Secret::new("p")),
            ..Auth::default()
        };
        let refused = b"-WRONGPASS invalid username-password pair\r\n-NOAUTH\r\n";
        let endpoint = server(auth, refused, 0, |s| async move {
            let _held = s;
            tokio::time::sleep(Duration::from_secs(5)).await;
        })
        .await;
        let Err(e) = RawConn::open(&endpoint, "t").await else { panic!("a refused AUTH opened") };
        let e = e.to_string();
        assert!(e.contains("WRONGPASS") && e.contains(&endpoint.name()), "{e}");
    }

    #[tokio::test]
    async fn bytes_that_are_no_resp_break_the_connection_for_good() {
        for (answer, why) in [
            (&b">2\r\n+a\r\n+b\r\n"[..], "unknown reply type"),
            (b"+OK\r\n+extra\r\n", "more replies than commands"),
            (b"$3\r\nabcd\r\n", "not ended by CRLF"),
        ] {
            let endpoint = server(Auth::default(), b"+OK\r\n", words(1), move |mut s| async move {
                let _ = s.write_all(answer).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            })
            .await;
            let mut conn = RawConn::open(&endpoint, "t").await.expect("open");
            let e = conn.ask(&[vec!["PING"]]).await.expect_err("refused").to_string();
            assert!(e.contains(why), "{e}");
            let again = conn.ask(&[vec!["PING"]]).await.expect_err("broken").to_string();
            assert!(again.contains("failed before"), "{again}");
        }
    }

    /// A server that closes idle connections (`timeout` in its config): the question is asked
    /// again on a new connection, once.
    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_opened_again() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("bound").port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let n = count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut reader = tokio::io::BufReader::new(&mut stream);
                    let mut line = String::new();
                    for _ in 0..words(3) {
                        reader.read_line(&mut line).await.expect("the naming");
                    }
                    reader.get_mut().write_all(b"+OK\r\n").await.expect("named");
                    if n == 0 {
                        return; // Closed while idle.
                    }
                    for _ in 0..words(1) {
                        reader.read_line(&mut line).await.expect("a request line");
                    }
                    reader.get_mut().write_all(b"+PONG\r\n").await.expect("answered");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                });
            }
        });
        let endpoint = Endpoint::new("127.0.0.1", port, &Auth::default());
        let mut conn = RawConn::open(&endpoint, "t").await.expect("open");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let replies = conn.ask(&[vec!["PING"]]).await.expect("asked again");
        assert!(matches!(replies.iter().next(), Some(Reply::Status(b"PONG"))));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_server_that_stalls_or_floods_is_given_up() {
        let endpoint = server(Auth::default(), b"+OK\r\n", words(1), |s| async move {
            let _held = s;
            tokio::time::sleep(Duration::from_secs(10)).await;
        })
        .await;
        let mut conn = RawConn::open(&endpoint, "t").await.expect("open");
        let started = std::time::Instant::now();
        let e = conn.ask(&[vec!["PING"]]).await.expect_err("stalled").to_string();
        assert!(e.contains("no answer within"), "{e}");
        assert!(started.elapsed() < RESPONSE_TIMEOUT * 3, "{:?}", started.elapsed());
        // A bulk string longer than the bound: read up to the bound, then dropped.
        let endpoint = server(Auth::default(), b"+OK\r\n", words(1), |mut s| async move {
            let _ = s.write_all(format!("${}\r\n", MAX_REPLIES * 2).as_bytes()).await;
            let chunk = vec![b'x'; 1 << 20];
            for _ in 0..(MAX_REPLIES >> 20) + 8 {
                if s.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        })
        .await;
        let mut conn = RawConn::open(&endpoint, "t").await.expect("open");
        let e = conn.ask(&[vec!["PING"]]).await.expect_err("flooded").to_string();
        assert!(e.contains("replies longer than"), "{e}");
    }
}
