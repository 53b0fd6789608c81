//! Where log lines go: stderr, through a bounded queue and one writer thread, so that a log
//! reader that goes away or stalls can never wedge the daemon.
//!
//! Found with `polestar demo 2>&1 | tee demo.log` and Ctrl-C: the SIGINT reached tee too, the
//! next log line (`shutting down`) hit a pipe with no reader, and tracing-subscriber's default
//! writer reported the `EPIPE` with `eprintln!`, which panics on the same closed stderr. The
//! panic ended the signal task before it cancelled the shutdown token, so nothing ever stopped.
//! The same happens to `polestar run` when journald (or any log pipe) goes away, and a reader
//! that stops reading blocks every task that logs once the pipe buffer is full.
//!
//! So here: an event is formatted into a buffer, queued without waiting (a full queue drops
//! the line and counts it), and written by a dedicated thread that ignores write errors.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// Lines that may wait for the writer thread; beyond this, lines are dropped.
const QUEUE: usize = 4096;

/// Counts shared by the queue's two ends.
#[derive(Default)]
struct Counts {
    queued: AtomicU64,
    /// Lines the writer thread has finished with (written, or failed to write).
    done: AtomicU64,
    dropped: AtomicU64,
}

/// The `MakeWriter` for `tracing_subscriber::fmt`; cloneable, cheap.
#[derive(Clone)]
pub struct LogOutput {
    /// The writer thread holds the receiver; it ends when every `LogOutput` is gone.
    tx: SyncSender<Vec<u8>>,
    counts: Arc<Counts>,
}

/// The process-wide output, for [`flush`] at exit.
static GLOBAL: OnceLock<LogOutput> = OnceLock::new();

impl LogOutput {
    /// Starts the writer thread over `sink` (stderr in the binary).
    pub fn spawn(sink: impl Write + Send + 'static) -> io::Result<Self> {
        let (tx, rx) = sync_channel(QUEUE);
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || write_lines(rx, sink, &shared))?;
        Ok(Self { tx, counts })
    }

    /// The output to stderr, registered for [`flush`].
    pub fn stderr() -> io::Result<Self> {
        let out = Self::spawn(io::stderr())?;
        let _ = GLOBAL.set(out.clone());
        Ok(out)
    }

    /// Lines dropped because the queue was full (the reader stalled).
    pub fn dropped(&self) -> u64 {
        self.counts.dropped.load(Ordering::Relaxed)
    }

    /// Waits until every queued line was handled, at most `timeout`.
    pub fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let queued = self.counts.queued.load(Ordering::Acquire);
        while self.counts.done.load(Ordering::Acquire) < queued && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn send(&self, line: Vec<u8>) {
        match self.tx.try_send(line) {
            Ok(()) => {
                self.counts.queued.fetch_add(1, Ordering::AcqRel);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Flushes the process-wide output (at exit; a stalled reader costs at most `timeout`).
pub fn flush(timeout: Duration) {
    if let Some(out) = GLOBAL.get() {
        out.flush(timeout);
    }
}

/// The writer thread: every error is ignored, a reader that went away only loses lines.
fn write_lines(rx: Receiver<Vec<u8>>, mut sink: impl Write, counts: &Counts) {
    while let Ok(line) = rx.recv() {
        let _ = sink.write_all(&line);
        let _ = sink.flush();
        counts.done.fetch_add(1, Ordering::AcqRel);
    }
}

/// One event's bytes; queued when tracing drops it after formatting the event.
pub struct Line {
    buf: Vec<u8>,
    out: LogOutput,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.out.send(std::mem::take(&mut self.buf));
        }
    }
}

impl<'a> MakeWriter<'a> for LogOutput {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { buf: Vec::with_capacity(256), out: self.clone() }
    }
}

/// Prints `text` to stdout, ignoring errors: `println!` panics when stdout is a pipe whose
/// reader went away, which must not stop a shutdown.
pub fn say(text: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A sink that fails every write, like a pipe whose reader died.
    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    /// A sink that blocks forever, like a pipe whose reader stopped reading.
    struct Stalled(Arc<Mutex<()>>);
    impl Write for Stalled {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            let _held = self.0.lock();
            std::thread::sleep(Duration::from_secs(3600));
            Ok(0)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_log_pipe_without_reader_neither_panics_nor_blocks_the_logger() {
        let out = LogOutput::spawn(Broken).expect("thread");
        for _ in 0..100 {
            let mut line = out.make_writer();
            line.write_all(b"shutting down\n").expect("buffered");
        }
        out.flush(Duration::from_secs(5));
        assert_eq!(out.counts.done.load(Ordering::Acquire), 100);
    }

    #[test]
    fn a_stalled_log_reader_costs_dropped_lines_not_a_blocked_caller() {
        let out = LogOutput::spawn(Stalled(Arc::default())).expect("thread");
        let start = Instant::now();
        for _ in 0..(QUEUE + 100) {
            let mut line = out.make_writer();
            line.write_all(b"x\n").expect("buffered");
        }
        assert!(start.elapsed() < Duration::from_secs(2), "logging blocked");
        assert!(out.dropped() >= 99, "dropped {}", out.dropped());
        let flushed = Instant::now();
        out.flush(Duration::from_millis(200));
        assert!(flushed.elapsed() < Duration::from_secs(2), "flush is bounded");
    }
}
