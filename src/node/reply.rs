//! Replies read in place: a pipeline's replies are one buffer and where each ends
//! ([`Replies`]); a reply is a view of its bytes ([`Reply`]), an array's items are read as
//! they are iterated ([`Items`]) and a record's fields are found by name ([`Record`]), nothing
//! copied. The redis crate builds every reply into a tree of values, one allocation for each
//! string: `SENTINEL MASTERS` is some 40 strings for every master, and at 1,000 masters
//! building and freeing those trees was most of an idle polestar's CPU (bench/README.md,
//! "Scale").
//!
//! [`Scan`] checks the bytes as they arrive, resumably (a large reply in many reads is looked
//! at once), and refuses what is not RESP (RESP2, and RESP3's types other than pushes and
//! attributes), nested deeper than [`MAX_DEPTH`] or with a line longer than [`MAX_LINE`]; its
//! caller bounds the bytes. What it accepted is read back without a failure path that can
//! panic.

use std::borrow::Cow;

use redis::Value;

/// Arrays within arrays, at most: `SENTINEL MASTERS` is two deep.
pub const MAX_DEPTH: usize = 8;

/// The longest line: a header, or a status or error (Sentinel's are a line of prose). A
/// stream without a line end is refused here, not searched again at every read.
const MAX_LINE: usize = 64 * 1024;

/// Why bytes are no reply.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    #[error("reply nested deeper than {MAX_DEPTH}")]
    TooDeep,
}

/// Where the replies in a buffer end, found as the buffer fills: the state of the reply being
/// scanned is kept between calls.
#[derive(Debug, Default)]
pub struct Scan {
    /// Where the next unchecked element starts.
    pos: usize,
    /// For each open array, how many of its items are still to come.
    open: Vec<u64>,
}

impl Scan {
    /// The end of the next complete reply in `buf` (which holds what the earlier calls saw,
    /// and more), or `None` when it is not all there yet.
    pub fn next(&mut self, buf: &[u8]) -> Result<Option<usize>, ReplyError> {
        loop {
            let Some(h) = header(buf, self.pos)? else { return Ok(None) };
            match h.shape {
                Shape::Line | Shape::Blob(None) | Shape::Aggregate(0) => self.pos = h.body,
                Shape::Blob(Some(len)) => {
                    let end = h.body.checked_add(len).ok_or(ReplyError::Protocol("length"))?;
                    if buf.len() < end.saturating_add(2) {
                        return Ok(None);
                    }
                    if &buf[end..end + 2] != b"\r\n" {
                        return Err(ReplyError::Protocol("bulk string not ended by CRLF"));
                    }
                    self.pos = end + 2;
                }
                Shape::Aggregate(items) => {
                    if self.open.len() >= MAX_DEPTH {
                        return Err(ReplyError::TooDeep);
                    }
                    self.open.push(items);
                    self.pos = h.body;
                    continue;
                }
            }
            // One element is complete: it closes every array it was the last item of.
            loop {
                match self.open.last_mut() {
                    None => return Ok(Some(self.pos)),
                    Some(left) if *left > 1 => {
                        *left -= 1;
                        break;
                    }
                    Some(_) => {
                        self.open.pop();
                    }
                }
            }
        }
    }

    /// How many bytes of `buf` the complete replies found so far and the partial one take.
    pub fn scanned(&self) -> usize {
        self.pos
    }
}

/// What follows a header line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Nothing: the line is the element (status, error, integer, RESP3's null, boolean,
    /// double, big number).
    Line,
    /// That many bytes and a CRLF (`None`: RESP2's null bulk string).
    Blob(Option<usize>),
    /// That many elements (an array, and RESP3's set; a map's pairs count twice). RESP2's
    /// null array has none.
    Aggregate(u64),
}

/// A header line: its type byte, what follows it and where that starts.
struct Header<'a> {
    kind: u8,
    line: &'a [u8],
    shape: Shape,
    body: usize,
}

/// The header line at `at`; `None` when the line is not all there. A server asked without
/// `HELLO` speaks RESP2; RESP3's scalars and aggregates are read too (a proxy or a test
/// server may send them), but not its pushes and attributes, which a connection without
/// subscriptions has no use for.
fn header(buf: &[u8], at: usize) -> Result<Option<Header<'_>>, ReplyError> {
    let Some(rest) = buf.get(at..) else { return Ok(None) };
    let Some(&kind) = rest.first() else { return Ok(None) };
    let window = &rest[..rest.len().min(MAX_LINE + 1)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        return match rest.len() > MAX_LINE {
            true => Err(ReplyError::Protocol("line too long")),
            false => Ok(None),
        };
    };
    if rest.len() < cr + 2 {
        return Ok(None);
    }
    if rest[cr + 1] != b'\n' {
        return Err(ReplyError::Protocol("line not ended by CRLF"));
    }
    // `cr` is 0 when the element starts with its line end ("\r\n"): no type byte at all. (It
    // was sliced as `1..0`, and two bytes from any peer panicked the task reading them.)
    let Some(line) = rest.get(1..cr) else {
        return Err(ReplyError::Protocol("unknown reply type"));
    };
    let length = || {
        let n = number(line).ok_or(ReplyError::Protocol("not a number"))?;
        match n {
            -1 => Ok(None),
            n => u64::try_from(n).map(Some).map_err(|_| ReplyError::Protocol("negative length")),
        }
    };
    let shape = match kind {
        b'+' | b'-' | b'_' | b'#' | b',' | b'(' => Shape::Line,
        b':' => number(line).map(|_| Shape::Line).ok_or(ReplyError::Protocol("not a number"))?,
        b'$' | b'=' | b'!' => {
            let len = length()?.map(usize::try_from).transpose();
            Shape::Blob(len.map_err(|_| ReplyError::Protocol("length"))?)
        }
        b'*' | b'~' => Shape::Aggregate(length()?.unwrap_or(0)),
        b'%' => {
            let pairs = length()?.unwrap_or(0);
            Shape::Aggregate(pairs.checked_mul(2).ok_or(ReplyError::Protocol("length"))?)
        }
        _ => return Err(ReplyError::Protocol("unknown reply type")),
    };
    Ok(Some(Header { kind, line, shape, body: at + cr + 2 }))
}

/// A header's decimal integer.
fn number(line: &[u8]) -> Option<i64> {
    let (negative, digits) = match line.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if negative { -n } else { n })
}

/// A pipeline's replies: the bytes, and where each reply ends.
#[derive(Debug, Default)]
pub struct Replies {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Replies {
    /// `buf` holds the replies that end at `ends`, as [`Scan`] found them.
    pub fn new(buf: Vec<u8>, ends: Vec<usize>) -> Self {
        Self { buf, ends }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Every reply, in order.
    pub fn iter(&self) -> impl Iterator<Item = Reply<'_>> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(start, &end)| {
            let bytes = self.buf.get(start..end).unwrap_or_default();
            read(bytes, 0).map_or(Reply::Nil, |(reply, _)| reply)
        })
    }
}

/// One reply, a view of the buffer that holds it.
#[derive(Clone, Copy, Debug)]
pub enum Reply<'a> {
    Status(&'a [u8]),
    Error(&'a [u8]),
    Int(i64),
    Bulk(&'a [u8]),
    Nil,
    Array(Items<'a>),
}

impl<'a> Reply<'a> {
    /// A status or a bulk string that is UTF-8.
    pub fn text(&self) -> Option<&'a str> {
        match self {
            Self::Status(b) | Self::Bulk(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The text a field's value reads as: a string, or an integer's digits.
    pub fn field_text(&self) -> Option<Cow<'a, str>> {
        match self {
            Self::Int(i) => Some(Cow::Owned(i.to_string())),
            other => other.text().map(Cow::Borrowed),
        }
    }

    /// An array's items; nothing for any other reply.
    pub fn items(&self) -> Items<'a> {
        match self {
            Self::Array(items) => *items,
            _ => Items::EMPTY,
        }
    }

    /// A record: an array of field names and values, in pairs.
    pub fn record(&self) -> Option<Record<'a>> {
        let Self::Array(items) = self else { return None };
        if items.left % 2 != 0 {
            return None;
        }
        let mut items = *items;
        let mut pairs = Vec::with_capacity(items.left / 2);
        while let (Some(k), Some(v)) = (items.next(), items.next()) {
            // A field whose name is no text is skipped, as `sentinel::message` reads records.
            if let Some(k) = k.text() {
                pairs.push((k, v));
            }
        }
        Some(Record(pairs))
    }

    /// The same reply as the redis crate's value, for the small replies read by code that
    /// reads values.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Status(s) => Value::SimpleString(String::from_utf8_lossy(s).into_owned()),
            Self::Error(e) => Value::SimpleString(String::from_utf8_lossy(e).into_owned()),
            Self::Int(i) => Value::Int(*i),
            Self::Bulk(b) => Value::BulkString(b.to_vec()),
            Self::Nil => Value::Nil,
            Self::Array(items) => Value::Array(items.map(|r| r.to_value()).collect()),
        }
    }
}

/// The items of an array, read one by one.
#[derive(Clone, Copy, Debug)]
pub struct Items<'a> {
    buf: &'a [u8],
    pos: usize,
    left: usize,
}

impl Items<'_> {
    const EMPTY: Items<'static> = Items { buf: &[], pos: 0, left: 0 };
}

impl<'a> Iterator for Items<'a> {
    type Item = Reply<'a>;

    fn next(&mut self) -> Option<Reply<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (reply, end) = read(self.buf, self.pos)?;
        self.pos = end;
        Some(reply)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// The element at `at` of bytes [`Scan`] accepted, and where it ends; `None` only for bytes
/// it did not accept.
fn read(buf: &[u8], at: usize) -> Option<(Reply<'_>, usize)> {
    let h = header(buf, at).ok()??;
    Some(match (h.kind, h.shape) {
        (b'+' | b'#' | b',' | b'(', _) => (Reply::Status(h.line), h.body),
        (b'-', _) => (Reply::Error(h.line), h.body),
        (b':', _) => (Reply::Int(number(h.line)?), h.body),
        (_, Shape::Blob(Some(len))) => {
            let end = h.body.checked_add(len)?;
            let blob = buf.get(h.body..end)?;
            let reply = match h.kind {
                b'!' => Reply::Error(blob),
                // A verbatim string's first four bytes name its format (`txt:`).
                b'=' => Reply::Bulk(blob.get(4..).unwrap_or_default()),
                _ => Reply::Bulk(blob),
            };
            (reply, end.checked_add(2)?)
        }
        (_, Shape::Aggregate(n)) if h.kind != b'*' || !h.line.starts_with(b"-") => {
            let left = usize::try_from(n).ok()?;
            let end = skip(buf, h.body, left, MAX_DEPTH)?;
            (Reply::Array(Items { buf, pos: h.body, left }), end)
        }
        _ => (Reply::Nil, h.body),
    })
}

/// Where `count` elements from `at` end.
fn skip(buf: &[u8], mut at: usize, count: usize, depth: usize) -> Option<usize> {
    for _ in 0..count {
        let h = header(buf, at).ok()??;
        at = match h.shape {
            Shape::Blob(Some(len)) => h.body.checked_add(len)?.checked_add(2)?,
            Shape::Aggregate(n) if n > 0 => {
                skip(buf, h.body, usize::try_from(n).ok()?, depth.checked_sub(1)?)?
            }
            _ => h.body,
        };
    }
    Some(at)
}

/// A record's fields, in the order given, found by name.
#[derive(Debug)]
pub struct Record<'a>(Vec<(&'a str, Reply<'a>)>);

impl<'a> Record<'a> {
    /// The value of the first field called `name`.
    pub fn get(&self, name: &str) -> Option<&Reply<'a>> {
        self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    /// Scans `input` fed in pieces of `step` bytes: the replies, or the first error.
    fn scan_in_steps(input: &[u8], step: usize) -> Result<Replies, ReplyError> {
        let (mut scan, mut ends, mut buf) = (Scan::default(), Vec::new(), Vec::new());
        for piece in input.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(end) = scan.next(&buf)? {
                ends.push(end);
            }
        }
        Ok(Replies::new(buf, ends))
    }

    const MASTERS: &[u8] =
        b"*2\r\n*4\r\n$4\r\nname\r\n$2\r\nm1\r\n$12\r\nconfig-epoch\r\n$1\r\n7\r\n\
        *6\r\n$4\r\nname\r\n$2\r\nm2\r\n:3\r\n$1\r\nx\r\n$5\r\nflags\r\n$0\r\n\r\n";

    #[test]
    fn a_reply_in_any_number_of_pieces_reads_the_same() {
        let whole = [MASTERS, b"+OK\r\n-ERR no\r\n:42\r\n$-1\r\n*-1\r\n*0\r\n"].concat();
        for step in [1, 2, 3, 7, 64, whole.len()] {
            let replies = scan_in_steps(&whole, step).expect("valid");
            assert_eq!(replies.len(), 7, "in steps of {step}");
            let values: Vec<Value> = replies.iter().map(|r| r.to_value()).collect();
            assert_eq!(values[1], Value::SimpleString("OK".into()));
            assert_eq!(values[2], Value::SimpleString("ERR no".into()));
            assert!(matches!(replies.iter().nth(2), Some(Reply::Error(b"ERR no"))));
            assert_eq!(values[3], Value::Int(42));
            assert_eq!(values[4..6], [Value::Nil, Value::Nil]);
            assert_eq!(values[6], Value::Array(vec![]));
        }
    }

    #[test]
    fn records_are_read_in_place() {
        let replies = scan_in_steps(MASTERS, 5).expect("valid");
        let masters = replies.iter().next().expect("one reply");
        let records: Vec<Record<'_>> = masters.items().filter_map(|r| r.record()).collect();
        assert_eq!(records.len(), 2);
        let text =
            |r: &Record<'_>, f: &str| r.get(f).and_then(|v| v.field_text()).map(String::from);
        assert_eq!(text(&records[0], "name").as_deref(), Some("m1"));
        assert_eq!(text(&records[0], "config-epoch").as_deref(), Some("7"));
        assert_eq!(text(&records[0], "flags"), None);
        // A field named by no text is skipped; an empty value is empty.
        assert_eq!(text(&records[1], "name").as_deref(), Some("m2"));
        assert_eq!(text(&records[1], "flags").as_deref(), Some(""));
        assert!(records[1].get("3").is_none());
        assert!(Reply::Bulk(b"x").record().is_none());
    }

    /// RESP3, which a server asked without `HELLO` should not send, reads as its RESP2 kin.
    #[test]
    fn resp3_reads_as_resp2() {
        let input =
            b"%2\r\n+a\r\n:1\r\n+b\r\n_\r\n=8\r\ntxt:abcd\r\n#t\r\n~1\r\n,1.5\r\n!5\r\nERR x\r\n";
        let replies = scan_in_steps(input, 4).expect("valid");
        let got: Vec<Value> = replies.iter().map(|r| r.to_value()).collect();
        let status = |s: &str| Value::SimpleString(s.into());
        assert_eq!(got[0], Value::Array(vec![status("a"), Value::Int(1), status("b"), Value::Nil]));
        assert_eq!(
            got[1..4],
            [Value::BulkString(b"abcd".to_vec()), status("t"), Value::Array(vec![status("1.5")])]
        );
        assert!(matches!(replies.iter().nth(4), Some(Reply::Error(b"ERR x"))));
        let record = replies.iter().next().and_then(|r| r.record()).expect("a map is a record");
        assert_eq!(record.get("a").and_then(|v| v.field_text()).as_deref(), Some("1"));
        assert!(matches!(record.get("b"), Some(Reply::Nil)));
    }

    #[test]
    fn what_is_not_resp_is_refused() {
        let refused = |input: &[u8]| scan_in_steps(input, 3).err();
        assert_eq!(
            refused(b">2\r\n+a\r\n+b\r\n"),
            Some(ReplyError::Protocol("unknown reply type"))
        );
        assert_eq!(
            refused(b"|1\r\n+a\r\n+b\r\n"),
            Some(ReplyError::Protocol("unknown reply type"))
        );
        assert_eq!(
            refused(b"$3\r\nabcd\r\n"),
            Some(ReplyError::Protocol("bulk string not ended by CRLF"))
        );
        assert_eq!(refused(b":12x\r\n"), Some(ReplyError::Protocol("not a number")));
        assert_eq!(refused(b"*-2\r\n"), Some(ReplyError::Protocol("negative length")));
        assert_eq!(refused(b":-\r\n"), Some(ReplyError::Protocol("not a number")));
        assert_eq!(
            refused(b":99999999999999999999\r\n"),
            Some(ReplyError::Protocol("not a number"))
        );
        assert_eq!(refused(b"+a\rb\n"), Some(ReplyError::Protocol("line not ended by CRLF")));
        let endless = vec![b'+'; MAX_LINE + 1];
        assert_eq!(refused(&endless), Some(ReplyError::Protocol("line too long")));
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert_eq!(refused(deep.as_bytes()), Some(ReplyError::TooDeep));
        let deepest = "*1\r\n".repeat(MAX_DEPTH) + ":1\r\n";
        assert_eq!(scan_in_steps(deepest.as_bytes(), 2).map(|r| r.len()), Ok(1));
    }

    /// An element that starts with its line end has no type byte: refused, where it panicked
    /// (a fourth configured Sentinel answering `\r\n` ended the daemon within seconds).
    #[test]
    fn two_bytes_crlf_are_refused_not_a_panic() {
        for input in [&b"\r\n"[..], b"*2\r\n+a\r\n\r\n", b"\r\n\r\n", b"+OK\r\n\r\n"] {
            let refused = scan_in_steps(input, 1).err();
            assert_eq!(refused, Some(ReplyError::Protocol("unknown reply type")), "{input:?}");
        }
        assert!(read(b"\r\n", 0).is_none());
    }

    #[test]
    fn an_incomplete_reply_waits_for_more() {
        let mut scan = Scan::default();
        let cut = &MASTERS[..MASTERS.len() - 1];
        assert_eq!(scan.next(cut), Ok(None));
        assert_eq!(scan.next(MASTERS), Ok(Some(MASTERS.len())));
        // A huge announced length holds nothing: it waits (the caller bounds the bytes).
        assert_eq!(Scan::default().next(b"$9223372036854775807\r\nab"), Ok(None));
        assert_eq!(Scan::default().next(b"*9223372036854775807\r\n:1\r\n"), Ok(None));
    }
}
