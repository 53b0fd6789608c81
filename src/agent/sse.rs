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
        // The buffered bytes hold no newline (they were searched before): look in the chunk
        // only, and cut the consumed lines off once, so a line dribbled in small chunks or
        // thousands of lines in one chunk cost linear time.
        let mut buffer = std::mem::take(&mut self.buffer);
        let mut start = 0;
        let mut from = buffer.len();
        buffer.extend_from_slice(chunk);
        let mut items = Vec::new();
        while let Some(offset) = buffer.get(from..).and_then(|b| b.iter().position(|&b| b == b'\n'))
        {
            let end = from + offset;
            let line = String::from_utf8_lossy(buffer.get(start..end).unwrap_or_default());
            items.extend(self.line(line.trim_end_matches('\r')));
            start = end + 1;
            from = start;
        }
        buffer.drain(..start);
        self.buffer = buffer;
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
mod fuzz;

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
