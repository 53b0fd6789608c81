//! A minimal Server-Sent Events reader: enough for polestar's own `/v1/events/stream`.
//!
//! Only the event name matters to the agent (it re-reads the full state on every event), so
//! this keeps `event:` and `id:` and ignores the rest; comments (keep-alives) are reported as
//! such so that the idle watchdog sees the stream is alive.

/// One dispatched item of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A complete event (`event:` kind, default `message`).
    Event { kind: String, id: Option<String> },
    /// A comment line (`: ...`), which the server sends as keep-alive.
    KeepAlive,
}

/// Buffers bytes across chunks and yields complete items.
#[derive(Default)]
pub struct Reader {
    buffer: Vec<u8>,
    kind: Option<String>,
    id: Option<String>,
    has_data: bool,
}

/// A line longer than this is not from a polestar; the stream is abandoned.
const MAX_LINE: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
#[error("the event stream sent a line longer than {MAX_LINE} bytes")]
pub struct LineTooLong;

impl Reader {
    /// Feeds one chunk; returns the items it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Item>, LineTooLong> {
        self.buffer.extend_from_slice(chunk);
        let mut items = Vec::new();
        while let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            items.extend(self.line(line));
        }
        if self.buffer.len() > MAX_LINE {
            return Err(LineTooLong);
        }
        Ok(items)
    }

    fn line(&mut self, line: &str) -> Option<Item> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line.starts_with(':') {
            return Some(Item::KeepAlive);
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value).to_string();
        match field {
            "event" => self.kind = Some(value),
            "id" => self.id = Some(value),
            "data" => self.has_data = true,
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<Item> {
        let kind = self.kind.take();
        let id = self.id.take();
        if !std::mem::take(&mut self.has_data) {
            return None;
        }
        Some(Item::Event { kind: kind.unwrap_or_else(|| "message".into()), id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_are_reassembled() {
        let mut r = Reader::default();
        assert!(r.feed(b"id: 7\nevent: swi").expect("short").is_empty());
        let items = r.feed(b"tch\ndata: {\"a\":1}\n\n: keep-alive\n").expect("short");
        assert_eq!(
            items,
            [Item::Event { kind: "switch".into(), id: Some("7".into()) }, Item::KeepAlive]
        );
    }

    #[test]
    fn crlf_and_events_without_data() {
        let mut r = Reader::default();
        let items = r.feed(b"event: x\r\n\r\ndata:y\r\n\r\n").expect("short");
        assert_eq!(items, [Item::Event { kind: "message".into(), id: None }]);
    }

    #[test]
    fn an_endless_line_is_an_error() {
        let mut r = Reader::default();
        assert!(r.feed(&vec![b'a'; MAX_LINE + 1]).is_err());
    }
}
