//! Property tests of the event-stream reader: whatever the upstream sends, and however the
//! network cuts it into chunks, the reader never panics, yields the same items for the same
//! bytes, and only gives up on a line longer than [`MAX_LINE`].
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use proptest::prelude::*;

use super::*;

fn cases(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(default), ..ProptestConfig::default() }
}

/// Stream text made of the pieces SSE is built from, plus noise.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            "event: switch\n",
            "id: 7\n",
            "data: {}\n",
            "data\n",
            ": keep-alive\n",
            "\n",
            "\r\n",
            "\r",
            "event:\n",
            "id\n",
            "retry: 10\n",
            "event: x\r\n",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..16),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|p| p.concat())
}

/// Feeds `bytes` cut at `cuts` (positions, any order); `None` when the reader gave up.
fn read(bytes: &[u8], cuts: &[usize]) -> Option<Vec<Item>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut reader = Reader::default();
    let mut items = Vec::new();
    let mut start = 0;
    for end in cuts.into_iter().chain([bytes.len()]) {
        items.extend(reader.feed(&bytes[start..end]).ok()?);
        start = end;
    }
    Some(items)
}

proptest! {
    #![proptest_config(cases(1000))]

    #[test]
    fn chunking_does_not_change_the_items(
        bytes in stream(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = read(&bytes, &[]).expect("short lines");
        let cut = read(&bytes, &cuts).expect("short lines");
        prop_assert_eq!(&whole, &cut);
        let events = whole.iter().filter(|i| matches!(i, Item::Event { .. })).count();
        let blank_lines = bytes.split(|b| *b == b'\n').count();
        prop_assert!(events <= blank_lines);
    }
}

#[test]
fn a_long_line_fed_byte_by_byte_is_refused_in_linear_time() {
    // The upstream may dribble a line one byte per read; the reader must neither take
    // quadratic time to look for its end nor buffer past MAX_LINE.
    let mut reader = Reader::default();
    let started = std::time::Instant::now();
    let chunk = [b'a'; 64];
    let mut refused = false;
    for _ in 0..(MAX_LINE / chunk.len() + 2) {
        if reader.feed(&chunk).is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused);
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
}

#[test]
fn many_lines_in_one_chunk_are_read_in_linear_time() {
    let chunk = b": k\n".repeat(200_000);
    let started = std::time::Instant::now();
    let items = Reader::default().feed(&chunk).unwrap();
    assert_eq!(items.len(), 200_000);
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
}
