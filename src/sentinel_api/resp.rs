//! RESP on the wire: requests in (multibulk or inline), replies out (RESP2 or RESP3).
//!
//! The parser never panics and never buffers without bound: every length it reads is checked
//! against [`Limits`] before anything is allocated for it, and an incomplete request is a value
//! (`Ok(None)`: read more), not an error. What it cannot accept is a [`ProtocolError`], which
//! the connection answers with `-ERR Protocol error: ...` and closes, as Redis does.

/// One request: the command name and its arguments, as the client sent them.
pub type Request = Vec<Vec<u8>>;

/// The hard limits of one request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Arguments of one multibulk request (the command name included).
    pub max_args: usize,
    /// Bytes of one argument.
    pub max_bulk: usize,
    /// Bytes of one inline request line.
    pub max_inline: usize,
    /// Bytes of one request in all, taken and still unparsed.
    pub max_request: usize,
}

/// Sentinel commands are short: a name, a subcommand, a master name. The largest a client
/// has reason to send is one `SUBSCRIBE` of every channel it may hold (256 names of 4 KiB in
/// all, [`super::commands::MAX_SUBSCRIPTION_BYTES`]): about 7 KiB.
pub const LIMITS: Limits =
    Limits { max_args: 1024, max_bulk: 8 * 1024, max_inline: 16 * 1024, max_request: 16 * 1024 };

/// Before a connection authenticates (when a password is set) it can only say `AUTH`,
/// `HELLO`, `QUIT` or `RESET`: a few short arguments (Redis allows 10 arguments before AUTH).
pub const UNAUTHENTICATED: Limits =
    Limits { max_args: 10, max_bulk: 4096, max_inline: 4096, max_request: 8192 };

/// The longest header line (`*<n>` or `$<n>`) accepted: an i64 and the type byte.
const MAX_HEADER: usize = 24;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid multibulk length")]
    MultibulkLength,
    #[error("invalid bulk length")]
    BulkLength,
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    #[error("bulk argument not followed by CRLF")]
    MissingCrlf,
    #[error("too big inline request")]
    InlineTooLong,
    #[error("unbalanced quotes in request")]
    Quotes,
    /// More than [`Limits::max_request`] of one request, taken and buffered.
    #[error("request too large")]
    TooLarge,
}

impl ProtocolError {
    /// Whether a [`Limits`] was exceeded (rather than the bytes being no RESP).
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            Self::MultibulkLength | Self::BulkLength | Self::InlineTooLong | Self::TooLarge
        )
    }
}

/// A resumable parser: it keeps what it took of a request that is not complete yet, so the
/// next read continues where the last one stopped instead of parsing the input from the start
/// (a 1 MiB request arriving in 16 KiB reads is looked at once, not 64 times).
#[derive(Debug, Default)]
pub struct Parser {
    partial: Partial,
}

#[derive(Debug, Default)]
enum Partial {
    /// Between requests.
    #[default]
    Start,
    /// An inline line whose first `scanned` bytes hold no newline.
    Inline { scanned: usize },
    /// A multibulk request: the arguments taken (`held` bytes), how many are still to come,
    /// and the length of the next one once its `$` header was taken.
    Multibulk { args: Request, left: usize, bulk: Option<usize>, held: usize },
}

impl Parser {
    /// Takes what it can of `buf` (the input it has not consumed yet): the bytes it consumed
    /// (the caller drops them; they are never shown again) and the request when it is
    /// complete. An empty request (`*0`, a blank inline line) is `Some(vec![])`.
    pub fn next(
        &mut self,
        buf: &[u8],
        limits: &Limits,
    ) -> Result<(usize, Option<Request>), ProtocolError> {
        let result = match &mut self.partial {
            Partial::Start => match buf.first() {
                None => return Ok((0, None)),
                Some(b'*') => return self.start_multibulk(buf, limits),
                Some(_) => inline(buf, 0, limits),
            },
            Partial::Inline { scanned } => inline(buf, *scanned, limits),
            Partial::Multibulk { .. } => return self.continue_multibulk(buf, 0, limits),
        }?;
        match result {
            Line::Complete(words, used) => {
                self.partial = Partial::Start;
                Ok((used, Some(words)))
            }
            Line::Scanned(scanned) => {
                self.partial = Partial::Inline { scanned };
                Ok((0, None))
            }
        }
    }

    /// Bytes of the request in progress that the parser holds (the arguments it took).
    pub fn held(&self) -> usize {
        match self.partial {
            Partial::Multibulk { held, .. } => held,
            _ => 0,
        }
    }

    fn start_multibulk(
        &mut self,
        buf: &[u8],
        limits: &Limits,
    ) -> Result<(usize, Option<Request>), ProtocolError> {
        let Some((count, pos)) = header(buf, 0, ProtocolError::MultibulkLength)? else {
            return Ok((0, None));
        };
        if count <= 0 {
            return Ok((pos, Some(Vec::new())));
        }
        if count as u64 > limits.max_args as u64 {
            return Err(ProtocolError::MultibulkLength);
        }
        let left = count as usize;
        let args = Vec::with_capacity(left.min(16));
        self.partial = Partial::Multibulk { args, left, bulk: None, held: 0 };
        self.continue_multibulk(buf, pos, limits)
    }

    /// Takes arguments from `buf[pos..]` until the request is complete or the input ends.
    fn continue_multibulk(
        &mut self,
        buf: &[u8],
        mut pos: usize,
        limits: &Limits,
    ) -> Result<(usize, Option<Request>), ProtocolError> {
        let Partial::Multibulk { args, left, bulk, held } = &mut self.partial else {
            return Ok((pos, None));
        };
        while *left > 0 {
            let Some(len) = *bulk else {
                let Some((len, start)) = bulk_header(buf, pos, *held, limits)? else {
                    return Ok((pos, None));
                };
                *bulk = Some(len);
                pos = start;
                continue;
            };
            let Some(tail) = buf.get(pos + len..pos + len + 2) else { return Ok((pos, None)) };
            if tail != b"\r\n" {
                return Err(ProtocolError::MissingCrlf);
            }
            args.push(buf[pos..pos + len].to_vec());
            *held += len;
            pos += len + 2;
            *left -= 1;
            *bulk = None;
        }
        let request = std::mem::take(args);
        self.partial = Partial::Start;
        Ok((pos, Some(request)))
    }
}

/// The first complete request in `buf` and how many bytes it took; `Ok(None)` when `buf`
/// holds only part of one. An empty request (`*0`, a blank inline line) is `Some(vec![])`.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Option<(Request, usize)>, ProtocolError> {
    let mut parser = Parser::default();
    match parser.next(buf, limits)? {
        (used, Some(request)) => Ok(Some((request, used))),
        (_, None) => Ok(None),
    }
}

/// The `$<len>\r\n` of a request's next argument at `pos`: its length and where its data
/// starts (`None`: not all here yet), refused past the limits as soon as it is announced
/// (`held`: what the request holds so far), however fast the rest would arrive.
fn bulk_header(
    buf: &[u8],
    pos: usize,
    held: usize,
    limits: &Limits,
) -> Result<Option<(usize, usize)>, ProtocolError> {
    match buf.get(pos) {
        None => return Ok(None),
        Some(b'$') => {}
        Some(&other) => return Err(ProtocolError::ExpectedBulk(other as char)),
    }
    let Some((len, start)) = header(buf, pos, ProtocolError::BulkLength)? else {
        return Ok(None);
    };
    if len < 0 || len as u64 > limits.max_bulk as u64 {
        return Err(ProtocolError::BulkLength);
    }
    if held + len as usize > limits.max_request {
        return Err(ProtocolError::TooLarge);
    }
    Ok(Some((len as usize, start)))
}

/// The integer of the header line at `at` (after its type byte) and where the line ends.
fn header(
    buf: &[u8],
    at: usize,
    invalid: ProtocolError,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let rest = &buf[at + 1..];
    let window = &rest[..rest.len().min(MAX_HEADER)];
    let Some(cr) = window.iter().position(|&b| b == b'\r') else {
        return if rest.len() >= MAX_HEADER { Err(invalid) } else { Ok(None) };
    };
    match rest.get(cr + 1) {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => return Err(invalid),
    }
    let text = std::str::from_utf8(&rest[..cr]).map_err(|_| invalid.clone())?;
    let n: i64 = text.parse().map_err(|_| invalid)?;
    Ok(Some((n, at + 1 + cr + 2)))
}

/// An inline line: complete (its words and the bytes it took), or how far it was scanned.
enum Line {
    Complete(Request, usize),
    Scanned(usize),
}

/// A line of words separated by blanks, with Redis's double and single quotes; the search
/// for its newline starts at `scanned`.
fn inline(buf: &[u8], scanned: usize, limits: &Limits) -> Result<Line, ProtocolError> {
    let window = &buf[..buf.len().min(limits.max_inline + 2)];
    let from = scanned.min(window.len());
    let Some(nl) = window[from..].iter().position(|&b| b == b'\n').map(|i| from + i) else {
        return if buf.len() > limits.max_inline {
            Err(ProtocolError::InlineTooLong)
        } else {
            Ok(Line::Scanned(window.len()))
        };
    };
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    if line.len() > limits.max_inline {
        return Err(ProtocolError::InlineTooLong);
    }
    let words = split_words(line)?;
    if words.len() > limits.max_args {
        return Err(ProtocolError::MultibulkLength);
    }
    Ok(Line::Complete(words, nl + 1))
}

fn split_words(line: &[u8]) -> Result<Vec<Vec<u8>>, ProtocolError> {
    let mut words = Vec::new();
    let mut i = 0;
    while i < line.len() {
        if line[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let mut word = Vec::new();
        let mut quote = None;
        while i < line.len() {
            let b = line[i];
            match quote {
                None if b.is_ascii_whitespace() => break,
                None if b == b'"' || b == b'\'' => quote = Some(b),
                Some(q) if b == q => quote = None,
                Some(b'"') if b == b'\\' && i + 1 < line.len() => {
                    i += 1;
                    word.push(line[i]);
                }
                _ => word.push(b),
            }
            i += 1;
        }
        if quote.is_some() {
            return Err(ProtocolError::Quotes);
        }
        words.push(word);
    }
    Ok(words)
}

/// Which protocol a connection speaks: RESP2 until `HELLO 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Resp2,
    Resp3,
}

/// A reply, encoded for the connection's protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    /// The whole line after `-`, code included (`ERR ...`, `NOAUTH ...`).
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    /// `$-1` (RESP3 `_`).
    NilBulk,
    /// `*-1` (RESP3 `_`): what Sentinel answers for an unknown master's address.
    NilArray,
    Array(Vec<Reply>),
    /// RESP3 `%`; a flat array of keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `>` (pub/sub messages); an array in RESP2.
    Push(Vec<Reply>),
}

impl Reply {
    pub fn ok() -> Self {
        Self::Simple("OK".into())
    }

    pub fn error(text: impl Into<String>) -> Self {
        Self::Error(text.into())
    }

    pub fn bulk(text: impl AsRef<[u8]>) -> Self {
        Self::Bulk(text.as_ref().to_vec())
    }

    /// A map whose keys and values are all strings (Sentinel's `SENTINEL MASTER` and kin).
    pub fn fields<K: AsRef<str>, V: AsRef<str>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        let pairs = pairs.into_iter();
        Self::Map(pairs.map(|(k, v)| (Self::bulk(k.as_ref()), Self::bulk(v.as_ref()))).collect())
    }

    pub fn encode(&self, proto: Proto, out: &mut Vec<u8>) {
        match self {
            Self::Simple(s) => line(out, b'+', s),
            Self::Error(s) => line(out, b'-', s),
            Self::Int(n) => line(out, b':', &n.to_string()),
            Self::Bulk(b) => encode_bulk(b, out),
            Self::NilBulk if proto == Proto::Resp3 => out.extend_from_slice(b"_\r\n"),
            Self::NilBulk => out.extend_from_slice(b"$-1\r\n"),
            Self::NilArray if proto == Proto::Resp3 => out.extend_from_slice(b"_\r\n"),
            Self::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Self::Array(items) => aggregate(out, b'*', items, proto),
            Self::Push(items) if proto == Proto::Resp3 => aggregate(out, b'>', items, proto),
            Self::Push(items) => aggregate(out, b'*', items, proto),
            Self::Map(pairs) => {
                let (kind, len) = if proto == Proto::Resp3 {
                    (b'%', pairs.len())
                } else {
                    (b'*', pairs.len() * 2)
                };
                line(out, kind, &len.to_string());
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
        }
    }
}

fn aggregate(out: &mut Vec<u8>, kind: u8, items: &[Reply], proto: Proto) {
    line(out, kind, &items.len().to_string());
    for item in items {
        item.encode(proto, out);
    }
}

/// A bulk string (the same in RESP2 and RESP3), appended to `out` without a [`Reply`].
pub fn encode_bulk(bytes: &[u8], out: &mut Vec<u8>) {
    line(out, b'$', &bytes.len().to_string());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A one-line reply; CR and LF (which would end it early) become spaces.
fn line(out: &mut Vec<u8>, kind: u8, text: &str) {
    out.push(kind);
    out.extend(text.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on purpose
mod tests {
    use super::*;

    fn one(input: &[u8]) -> Result<Option<(Request, usize)>, ProtocolError> {
        parse(input, &LIMITS)
    }

    fn words(args: &[&str]) -> Request {
        args.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn multibulk_requests_parse_and_report_their_length() {
        let input = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*1\r\n";
        assert_eq!(one(input), Ok(Some((words(&["PING", "hi"]), 22))));
        for end in 0..22 {
            assert_eq!(one(&input[..end]), Ok(None), "a prefix of {end} bytes is incomplete");
        }
    }

    #[test]
    fn inline_requests_split_on_blanks_and_honour_quotes() {
        let input = b"SENTINEL  get-master-addr-by-name \"my master\"\r\nPING";
        let (args, used) = one(input).unwrap().unwrap();
        assert_eq!(args, words(&["SENTINEL", "get-master-addr-by-name", "my master"]));
        assert_eq!(used, 47);
        assert_eq!(one(b"PING\n"), Ok(Some((words(&["PING"]), 5))));
        assert_eq!(one(b"\r\n"), Ok(Some((vec![], 2))));
        assert_eq!(one(b"ECHO \"x\r\n"), Err(ProtocolError::Quotes));
    }

    #[test]
    fn limits_are_errors_not_allocations() {
        assert_eq!(one(b"*9999999999\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(one(b"*1\r\n$99999999\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(one(b"*1\r\n$-5\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(one(b"*1\r\n+PING\r\n"), Err(ProtocolError::ExpectedBulk('+')));
        assert_eq!(one(b"*1\r\n$4\r\nPINGxx"), Err(ProtocolError::MissingCrlf));
        assert_eq!(one(b"*12345678901234567890123456789"), Err(ProtocolError::MultibulkLength));
        assert_eq!(one(b"*x\r\n"), Err(ProtocolError::MultibulkLength));
        let long = vec![b'a'; LIMITS.max_inline + 1];
        assert_eq!(one(&long), Err(ProtocolError::InlineTooLong));
        assert_eq!(one(&long[..LIMITS.max_inline]), Ok(None));
        // Arguments that add up past max_request are refused at the header that says so, even
        // when the whole request is already there.
        let bulk = format!("$8000\r\n{}\r\n", "z".repeat(8000));
        let three = format!("*3\r\n{}", bulk.repeat(3));
        assert_eq!(one(three.as_bytes()), Err(ProtocolError::TooLarge));
        let two = format!("*2\r\n{}", bulk.repeat(2));
        assert!(matches!(one(two.as_bytes()), Ok(Some(_))), "16,000 bytes fit in 16 KiB");
    }

    /// Regression: the input was parsed again from the start after every read.
    #[test]
    fn a_request_split_across_reads_is_taken_as_it_arrives() {
        let mut parser = Parser::default();
        let bulk = vec![b'x'; 8_000];
        let wire = [b"*2\r\n$4\r\nECHO\r\n$8000\r\n".as_slice(), &bulk, b"\r\n"].concat();
        let mut input = Vec::new();
        let mut taken = 0;
        for chunk in wire.chunks(1000) {
            input.extend_from_slice(chunk);
            let (used, request) = parser.next(&input, &LIMITS).expect("a well-formed request");
            input.drain(..used);
            taken += used;
            if let Some(request) = request {
                assert_eq!(request, vec![b"ECHO".to_vec(), bulk.clone()]);
                assert_eq!((taken, input.len()), (wire.len(), 0));
                return;
            }
            // The headers and the first argument are taken at once; only the unfinished
            // argument waits in the input.
            assert_eq!(taken, 21, "the headers are taken as they arrive");
            assert_eq!(parser.held(), 4);
        }
        panic!("the request never completed");
    }

    #[test]
    fn an_inline_line_is_scanned_once() {
        let mut parser = Parser::default();
        assert_eq!(parser.next(b"PIN", &LIMITS), Ok((0, None)));
        assert!(matches!(parser.partial, Partial::Inline { scanned: 3 }));
        assert_eq!(parser.next(b"PING\r\n", &LIMITS), Ok((6, Some(words(&["PING"])))));
    }

    #[test]
    fn unauthenticated_requests_are_small() {
        let auth = b"*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n";
        assert!(parse(auth, &UNAUTHENTICATED).unwrap().is_some());
        let many = b"*11\r\n";
        assert_eq!(parse(many, &UNAUTHENTICATED), Err(ProtocolError::MultibulkLength));
        let big = b"*2\r\n$4\r\nAUTH\r\n$4097\r\n";
        assert_eq!(parse(big, &UNAUTHENTICATED), Err(ProtocolError::BulkLength));
        assert_eq!(parse(big, &LIMITS), Ok(None));
    }

    #[test]
    fn replies_encode_per_protocol() {
        let encode = |r: Reply, p| {
            let mut out = Vec::new();
            r.encode(p, &mut out);
            String::from_utf8(out).unwrap()
        };
        let map = Reply::fields([("ip", "127.0.0.1")]);
        assert_eq!(encode(map.clone(), Proto::Resp2), "*2\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n");
        assert_eq!(encode(map, Proto::Resp3), "%1\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n");
        assert_eq!(encode(Reply::NilArray, Proto::Resp2), "*-1\r\n");
        assert_eq!(encode(Reply::NilArray, Proto::Resp3), "_\r\n");
        assert_eq!(encode(Reply::Push(vec![Reply::Int(1)]), Proto::Resp3), ">1\r\n:1\r\n");
        assert_eq!(encode(Reply::error("ERR a\r\nb"), Proto::Resp2), "-ERR a  b\r\n");
    }
}

#[cfg(test)]
mod fuzz {
    //! Whatever arrives, the parser answers without panicking, never claims more bytes than it
    //! was given, and a request it accepts encodes back to itself.
    use super::*;
    use proptest::prelude::*;

    fn config() -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
        ProptestConfig { cases: cases.unwrap_or(2000), ..ProptestConfig::default() }
    }

    fn encode_request(args: &[Vec<u8>]) -> Vec<u8> {
        let items = args.iter().map(|a| Reply::Bulk(a.clone())).collect();
        let mut out = Vec::new();
        Reply::Array(items).encode(Proto::Resp2, &mut out);
        out
    }

    /// The requests a [`Parser`] takes from `wire` fed in reads of `sizes` (cycled), and the
    /// error that ended it, if any.
    fn feed(
        wire: &[u8],
        sizes: &[usize],
        limits: &Limits,
    ) -> (Vec<Request>, Option<ProtocolError>) {
        let mut parser = Parser::default();
        let (mut input, mut got, mut fed) = (Vec::new(), Vec::new(), 0);
        for size in sizes.iter().cycle() {
            if fed == wire.len() {
                break;
            }
            let end = (fed + size).min(wire.len());
            input.extend_from_slice(&wire[fed..end]);
            fed = end;
            loop {
                match parser.next(&input, limits) {
                    Ok((used, request)) => {
                        assert!(used <= input.len(), "consumed more than it was given");
                        input.drain(..used);
                        match request {
                            Some(r) => got.push(r),
                            None => break,
                        }
                    }
                    Err(e) => return (got, Some(e)),
                }
            }
        }
        (got, None)
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let small = Limits { max_args: 4, max_bulk: 16, max_inline: 64, max_request: 128 };
            for limits in [LIMITS, small] {
                if let Ok(Some((_, used))) = parse(&bytes, &limits) {
                    prop_assert!(used > 0 && used <= bytes.len());
                }
            }
        }

        #[test]
        fn resp_shaped_noise_never_panics(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(b"*".to_vec()), Just(b"$".to_vec()), Just(b"\r\n".to_vec()),
                    Just(b"-1".to_vec()), Just(b"99999999999999999999".to_vec()),
                    "[0-9]{1,3}".prop_map(String::into_bytes),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ],
                0..24,
            )
        ) {
            let bytes = parts.concat();
            if let Ok(Some((_, used))) = parse(&bytes, &LIMITS) {
                prop_assert!(used > 0 && used <= bytes.len());
            }
        }

        #[test]
        fn encoded_requests_round_trip(
            args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8),
            split in 0usize..400,
        ) {
            let wire = encode_request(&args);
            prop_assert_eq!(parse(&wire, &LIMITS), Ok(Some((args.clone(), wire.len()))));
            let cut = split.min(wire.len() - 1);
            prop_assert_eq!(parse(&wire[..cut], &LIMITS), Ok(None));
        }

        /// Raw bytes through the resumable parser, however a client's writes are cut: the
        /// same requests, and the same error, as when they arrive at once.
        #[test]
        fn noise_fed_in_pieces_reads_as_a_whole(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(b"*".to_vec()), Just(b"$".to_vec()), Just(b"\r\n".to_vec()),
                    Just(b"\n".to_vec()), Just(b"\r".to_vec()), Just(b"\"".to_vec()),
                    Just(b"-1".to_vec()), Just(b"PING ".to_vec()),
                    "[0-9]{1,3}".prop_map(String::into_bytes),
                    proptest::collection::vec(any::<u8>(), 0..8),
                ],
                0..32,
            ),
            sizes in proptest::collection::vec(1usize..30, 1..64),
        ) {
            let bytes = parts.concat();
            let small = Limits { max_args: 4, max_bulk: 16, max_inline: 64, max_request: 128 };
            for limits in [LIMITS, small] {
                let whole = feed(&bytes, &[bytes.len().max(1)], &limits);
                prop_assert_eq!(&feed(&bytes, &sizes, &limits), &whole);
            }
        }

        #[test]
        fn requests_fed_in_pieces_parse_as_a_whole(
            args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8),
            sizes in proptest::collection::vec(1usize..30, 1..64),
        ) {
            let wire = [encode_request(&args), b"PING x\r\n".to_vec()].concat();
            let (got, error) = feed(&wire, &sizes, &LIMITS);
            prop_assert_eq!(error, None, "a well-formed request");
            let ping = vec![b"PING".to_vec(), b"x".to_vec()];
            prop_assert_eq!(got, vec![args, ping]);
        }
    }
}
