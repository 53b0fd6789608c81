//! Property tests of the reply scanner on raw bytes, as a Sentinel, a data node or anything
//! on a plaintext link may send them: RESP-shaped noise and mutations of valid replies, cut
//! into arbitrary reads. The scanner never panics, finds the same replies (or the same error)
//! however the bytes are cut, and every reply it accepted reads back, as values and as the
//! records polestar takes from Sentinels, without a panic. (Two bytes, `\r\n`, panicked it:
//! the noise below finds that within the default number of cases.)
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use proptest::prelude::*;

use super::*;
use crate::sentinel::message::MasterRecord;

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(default), ..ProptestConfig::default() }
}

/// Bytes made of the pieces RESP is built from (every type byte, line ends whole and
/// split, lengths odd and huge, a verbatim string's format), plus noise.
fn noise() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        4 => prop::sample::select(vec![
            "*", "$", "%", "~", ":", "+", "-", "_", "#", ",", "(", "=", "!", ">", "|",
            "\r\n", "\r\n", "\r", "\n", "-1", "0", "1", "2", "3", "12", "txt:", "OK",
            "99999999999999999999", "9223372036854775807", "-9223372036854775808",
            "name", "flags", "ip", "port", "config-epoch", "127.0.0.1", "6379",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    prop::collection::vec(piece, 0..48).prop_map(|p| p.concat())
}

/// A reply tree to encode: what a RESP2 server sends.
#[derive(Clone, Debug)]
enum Tree {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Tree>),
}

fn tree() -> impl Strategy<Value = Tree> {
    let line = "[^\r\n]{0,12}";
    let leaf = prop_oneof![
        line.prop_map(Tree::Status),
        line.prop_map(Tree::Error),
        any::<i64>().prop_map(Tree::Int),
        prop::collection::vec(any::<u8>(), 0..24).prop_map(Tree::Bulk),
        Just(Tree::Nil),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| prop::collection::vec(inner, 0..6).prop_map(Tree::Array))
}

fn encode(t: &Tree, out: &mut Vec<u8>) {
    match t {
        Tree::Status(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
        Tree::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
        Tree::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
        Tree::Bulk(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
            out.extend_from_slice(b"\r\n");
        }
        Tree::Nil => out.extend_from_slice(b"$-1\r\n"),
        Tree::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            items.iter().for_each(|i| encode(i, out));
        }
    }
}

/// The value [`Reply::to_value`] gives for what `t` encodes.
fn expected(t: &Tree) -> Value {
    match t {
        Tree::Status(s) | Tree::Error(s) => Value::SimpleString(s.clone()),
        Tree::Int(i) => Value::Int(*i),
        Tree::Bulk(b) => Value::BulkString(b.clone()),
        Tree::Nil => Value::Nil,
        Tree::Array(items) => Value::Array(items.iter().map(expected).collect()),
    }
}

/// Valid replies with one of: a byte changed, a cut, `\r\n` put anywhere, or a byte dropped.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    let replies = prop::collection::vec(tree(), 1..4).prop_map(|trees| {
        let mut out = Vec::new();
        trees.iter().for_each(|t| encode(t, &mut out));
        out
    });
    (replies, any::<usize>(), any::<u8>(), 0..4u8).prop_map(|(mut bytes, at, byte, how)| {
        let at = at % (bytes.len() + 1);
        match how {
            0 if at < bytes.len() => bytes[at] = byte,
            1 => bytes.truncate(at),
            2 => bytes.splice(at..at, *b"\r\n").for_each(drop),
            _ if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => {}
        }
        bytes
    })
}

/// The ends of the replies in `bytes` fed as cut at `cuts`, and the error that stopped the
/// scan, if any.
fn scan(bytes: &[u8], cuts: &[usize]) -> (Vec<usize>, Option<ReplyError>) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let (mut scan, mut ends) = (Scan::default(), Vec::new());
    for end in cuts.into_iter().chain([bytes.len()]) {
        loop {
            match scan.next(&bytes[..end]) {
                Ok(Some(found)) => ends.push(found),
                Ok(None) => break,
                Err(e) => return (ends, Some(e)),
            }
        }
    }
    (ends, None)
}

/// Reads everything a reply offers, the way polestar's readers do; returns how many
/// replies it walked (so the work is not optimised away).
fn walk(reply: Reply<'_>, depth: usize) -> usize {
    let _ = (reply.text(), reply.field_text(), reply.to_value());
    if let Some(record) = reply.record() {
        let _ = (record.get("name"), record.get("flags"));
        let _ = MasterRecord::from_record(&record);
        let _ = crate::readiness::parse::master_record(&record);
    }
    let items: usize = match depth {
        0 => 0,
        _ => reply.items().map(|r| walk(r, depth - 1)).sum(),
    };
    1 + items
}

fn check_bytes(bytes: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
    let whole = scan(bytes, &[]);
    let cut = scan(bytes, cuts);
    prop_assert_eq!(&whole, &cut, "the same replies however the bytes are cut");
    let (ends, _) = whole;
    prop_assert!(ends.windows(2).all(|w| w[0] < w[1]), "each reply ends after the last");
    let scanned = ends.last().copied().unwrap_or(0);
    let replies = Replies::new(bytes[..scanned].to_vec(), ends.clone());
    prop_assert_eq!(replies.iter().count(), ends.len());
    for reply in replies.iter() {
        walk(reply, MAX_DEPTH + 1);
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn noise_never_panics_and_reads_the_same_in_any_reads(
        bytes in noise(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        check_bytes(&bytes, &cuts)?;
    }

    #[test]
    fn mutated_replies_never_panic_and_read_the_same_in_any_reads(
        bytes in mutated(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        check_bytes(&bytes, &cuts)?;
    }

    #[test]
    fn valid_replies_read_back_as_sent(
        trees in prop::collection::vec(tree(), 1..4),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut bytes = Vec::new();
        let mut ends = Vec::new();
        for t in &trees {
            encode(t, &mut bytes);
            ends.push(bytes.len());
        }
        prop_assert_eq!(scan(&bytes, &cuts), (ends.clone(), None));
        let replies = Replies::new(bytes, ends);
        let got: Vec<Value> = replies.iter().map(|r| r.to_value()).collect();
        let want: Vec<Value> = trees.iter().map(expected).collect();
        prop_assert_eq!(got, want);
    }
}
