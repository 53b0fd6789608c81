//! A minimal Server-Sent Events reader: enough for polestar's own `/v1/events/stream`.
//!
//! It keeps `event:`, `id:` and `data:` (a `masters` event carries the masters themselves) and
//! ignores the rest; comments (keep-alives) are reported as such so that the idle watchdog sees
//! the stream is alive.

/// One dispatched item of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A complete event (`event:` kind, default `message`; its `data:` lines joined by `\n`).
    Event { kind: String, id: Option<String>, data: String },
    /// A comment line (`: ...`), which the server sends as keep-alive.
    KeepAlive,
}

/// Buffers bytes across chunks and yields complete items.
#[derive(Default)]
pub struct Reader {
    buffer: Vec<u8>,
    kind: Option<String>,
    id: Option<String>,
    /// The data lines so far, each followed by `\n` (`None`: no data line yet).
    data: Option<String>,
}

/// A line, or an event's data, longer than this is not from a polestar; the stream is
/// abandoned. A `masters` event holds what `GET /v1/masters` may (4 MiB), on one line.
pub const MAX_LINE: usize = (4 << 20) + (64 << 10);

#[derive(Debug, thiserror::Error)]
#[error("the event stream sent a line or an event longer than {MAX_LINE} bytes")]
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
            items.extend(self.line(line.trim_end_matches('\r'))?);
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

    fn line(&mut self, line: &str) -> Result<Option<Item>, LineTooLong> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line.starts_with(':') {
            return Ok(Some(Item::KeepAlive));
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.kind = Some(value.to_string()),
            "id" => self.id = Some(value.to_string()),
            "data" => {
                let data = self.data.get_or_insert_with(String::new);
                if data.len() + value.len() > MAX_LINE {
                    return Err(LineTooLong);
                }
                data.push_str(value);
                data.push('\n');
            }
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<Item> {
        let kind = self.kind.take();
        let id = self.id.take();
        let mut data = self.data.take()?;
        data.pop();
        Some(Item::Event { kind: kind.unwrap_or_else(|| "message".into()), id, data })
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
        let data = "{\"a\":1}".to_string();
        assert_eq!(
            items,
            [Item::Event { kind: "switch".into(), id: Some("7".into()), data }, Item::KeepAlive]
        );
    }

    #[test]
    fn crlf_and_events_without_data() {
        let mut r = Reader::default();
        let items = r.feed(b"event: x\r\n\r\ndata:y\r\n\r\n").expect("short");
        assert_eq!(items, [Item::Event { kind: "message".into(), id: None, data: "y".into() }]);
    }

    #[test]
    fn data_lines_are_joined_and_bounded() {
        let mut r = Reader::default();
        let items = r.feed(b"event: masters\ndata: a\ndata:\ndata: b\n\n").expect("short");
        assert_eq!(
            items,
            [Item::Event { kind: "masters".into(), id: None, data: "a\n\nb".into() }]
        );
        // Short lines that add up past the limit are refused as one long line would be.
        let mut r = Reader::default();
        let line = format!("data: {}\n", "x".repeat(1 << 20));
        let refused = (0..5).any(|_| r.feed(line.as_bytes()).is_err());
        assert!(refused, "4 MiB of data lines in one event");
    }

    #[test]
    fn an_endless_line_is_an_error() {
        let mut r = Reader::default();
        assert!(r.feed(&vec![b'a'; MAX_LINE + 1]).is_err());
    }
}
