//! Redis's glob (`PSUBSCRIBE` patterns: `*`, `?`, `[a-z]`, `[^...]`, `\x`) in time linear in
//! the pattern and the channel, whatever the pattern.
//!
//! A matcher that backtracks (Redis's own recursion, or one that remembers the last `*` and
//! retries from there) costs pattern × channel steps or worse on patterns like `*aaaa…ab` or
//! `*a*a*a…*b`. Here the pattern is cut at its stars into pieces of fixed length (every atom
//! takes one byte), and pieces are placed greedily: the first at the start of the channel, the
//! last at its end, each middle one at its leftmost place after the one before (leftmost is
//! never worse, since a star takes any run of bytes). The leftmost place of a piece is found
//! in one pass with a bit-parallel scan (shift-and: one bit per atom of the piece), so every
//! channel byte is looked at once per piece that is searched, and never again once a piece is
//! placed: `O(pattern + channel × ⌈piece / 64⌉)` word operations, linear for the pieces of up
//! to 64 atoms that real patterns have. [`matches_counting`] returns the count so tests can
//! hold it to that bound.

/// One position of a piece: the bytes it accepts.
#[derive(Debug)]
enum Atom {
    Byte(u8),
    /// `?`
    Any,
    /// `[...]`: inclusive ranges (a single byte is a range of one), or their complement.
    Class {
        negate: bool,
        ranges: Vec<(u8, u8)>,
    },
}

impl Atom {
    fn accepts(&self, c: u8, steps: &mut u64) -> bool {
        match self {
            Atom::Byte(b) => *b == c,
            Atom::Any => true,
            Atom::Class { negate, ranges } => {
                *steps += ranges.len() as u64;
                ranges.iter().any(|&(a, b)| (a..=b).contains(&c)) != *negate
            }
        }
    }
}

/// Whether `text` matches `pattern` as Redis's `stringmatchlen` would (case-sensitive).
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    matches_counting(pattern, text).0
}

/// [`matches`], and the steps it took (atoms parsed, bytes compared, words scanned).
pub fn matches_counting(pattern: &[u8], text: &[u8]) -> (bool, u64) {
    let mut steps = pattern.len() as u64;
    let pieces = split(pattern);
    let matched = place(&pieces, text, &mut steps);
    (matched, steps)
}

/// The pieces between the stars; one piece means there was no star.
fn split(pattern: &[u8]) -> Vec<Vec<Atom>> {
    let mut pieces = vec![Vec::new()];
    let mut p = 0;
    while p < pattern.len() {
        let (atom, next) = match pattern[p] {
            b'*' => {
                p += 1;
                // Consecutive stars are one star: a new piece only after the current one.
                if !pieces.last().is_some_and(Vec::is_empty) || pieces.len() == 1 {
                    pieces.push(Vec::new());
                }
                continue;
            }
            b'?' => (Atom::Any, p + 1),
            b'[' => class(pattern, p + 1),
            b'\\' if p + 1 < pattern.len() => (Atom::Byte(pattern[p + 1]), p + 2),
            b => (Atom::Byte(b), p + 1),
        };
        // Not empty: it starts as one piece and only ever grows.
        if let Some(piece) = pieces.last_mut() {
            piece.push(atom);
        }
        p = next;
    }
    pieces
}

/// The class starting after its `[` and where the pattern continues. As in Redis: `^` first
/// negates, `\x` is `x`, `a-z` is a range (either way round), and an unclosed class ends with
/// the pattern.
fn class(pattern: &[u8], mut p: usize) -> (Atom, usize) {
    let negate = pattern.get(p) == Some(&b'^');
    if negate {
        p += 1;
    }
    let mut ranges = Vec::new();
    while p < pattern.len() && pattern[p] != b']' {
        if pattern[p] == b'\\' && p + 1 < pattern.len() {
            ranges.push((pattern[p + 1], pattern[p + 1]));
            p += 2;
        } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' && pattern[p + 2] != b']' {
            let (a, b) = (pattern[p], pattern[p + 2]);
            ranges.push((a.min(b), a.max(b)));
            p += 3;
        } else {
            ranges.push((pattern[p], pattern[p]));
            p += 1;
        }
    }
    (Atom::Class { negate, ranges }, (p + 1).min(pattern.len()))
}

/// Places the pieces greedily (see the module doc).
fn place(pieces: &[Vec<Atom>], text: &[u8], steps: &mut u64) -> bool {
    let (first, rest) = pieces.split_first().expect("split returns at least one piece");
    let Some((last, middle)) = rest.split_last() else {
        return first.len() == text.len() && fits(first, text, steps);
    };
    if first.len() + last.len() > text.len() {
        return false;
    }
    let end = text.len() - last.len();
    if !fits(first, &text[..first.len()], steps) || !fits(last, &text[end..], steps) {
        return false;
    }
    let mut at = first.len();
    for piece in middle {
        match leftmost(piece, &text[at..end], steps) {
            Some(after) => at += after,
            None => return false,
        }
    }
    true
}

/// Whether `piece` matches all of `text` (of the same length).
fn fits(piece: &[Atom], text: &[u8], steps: &mut u64) -> bool {
    piece.iter().zip(text).all(|(atom, &c)| {
        *steps += 1;
        atom.accepts(c, steps)
    })
}

/// Where the leftmost occurrence of `piece` in `text` ends (exclusive), in one pass.
fn leftmost(piece: &[Atom], text: &[u8], steps: &mut u64) -> Option<usize> {
    let masks = Masks::new(piece, steps);
    let mut state = vec![0u64; masks.words];
    let mut mask = vec![0u64; masks.words];
    let top = piece.len() - 1;
    for (i, &c) in text.iter().enumerate() {
        *steps += masks.words as u64;
        masks.of(c, &mut mask);
        let mut carry = 1;
        for (word, m) in state.iter_mut().zip(&mask) {
            let next = (*word << 1) | carry;
            carry = *word >> 63;
            *word = next & m;
        }
        if state[top / 64] >> (top % 64) & 1 == 1 {
            return Some(i + 1);
        }
    }
    None
}

/// The shift-and masks of a piece: bit `i` of `of(c)` is set when atom `i` accepts `c`. Built
/// from the atoms (a class costs the bytes it names), not by testing 256 bytes per atom.
struct Masks {
    words: usize,
    /// Atoms that accept every byte except those in `except`: `?` and negated classes.
    any: Vec<u64>,
    /// Per byte: the atoms that name it (`accept`), and the negated classes that exclude it.
    accept: Vec<Vec<u64>>,
    except: Vec<Vec<u64>>,
    /// Index into `accept`/`except` per byte; `NONE` when no atom names the byte.
    slot: [u16; 256],
}

const NONE: u16 = u16::MAX;

impl Masks {
    fn new(piece: &[Atom], steps: &mut u64) -> Self {
        let words = piece.len().div_ceil(64);
        let mut masks = Masks {
            words,
            any: vec![0; words],
            accept: Vec::new(),
            except: Vec::new(),
            slot: [NONE; 256],
        };
        for (i, atom) in piece.iter().enumerate() {
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            match atom {
                Atom::Byte(b) => masks.row(*b).0[word] |= bit,
                Atom::Any => masks.any[word] |= bit,
                Atom::Class { negate, ranges } => {
                    if *negate {
                        masks.any[word] |= bit;
                    }
                    for &(a, b) in ranges {
                        *steps += u64::from(b - a) + 1;
                        for c in a..=b {
                            let (accept, except) = masks.row(c);
                            let row = if *negate { except } else { accept };
                            row[word] |= bit;
                        }
                    }
                }
            }
        }
        masks
    }

    /// The rows of byte `c`, made on first use.
    fn row(&mut self, c: u8) -> (&mut Vec<u64>, &mut Vec<u64>) {
        if self.slot[c as usize] == NONE {
            // At most 256 rows, so the index fits.
            self.slot[c as usize] = self.accept.len() as u16;
            self.accept.push(vec![0; self.words]);
            self.except.push(vec![0; self.words]);
        }
        let s = self.slot[c as usize] as usize;
        (&mut self.accept[s], &mut self.except[s])
    }

    /// Writes the mask of byte `c` into `out` (`words` long).
    fn of(&self, c: u8, out: &mut [u64]) {
        match self.slot[c as usize] {
            NONE => out.copy_from_slice(&self.any),
            s => {
                let (accept, except) = (&self.accept[s as usize], &self.except[s as usize]);
                let words = self.any.iter().zip(accept).zip(except);
                for (o, ((any, a), e)) in out.iter_mut().zip(words) {
                    *o = a | (any & !e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The matcher this module replaced (it remembers the last `*` and retries from there):
    /// the reference for what matches, and for what a backtracking matcher costs.
    fn backtracking(pattern: &[u8], text: &[u8], steps: &mut u64) -> bool {
        let (mut p, mut t) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            *steps += 1;
            if let Some(next) = old_step(pattern, p, text[t]) {
                if next == usize::MAX {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                p = next;
                t += 1;
                continue;
            }
            match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            }
        }
        pattern[p.min(pattern.len())..].iter().all(|&b| b == b'*')
    }

    fn old_step(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
        match *pattern.get(p)? {
            b'*' => Some(usize::MAX),
            b'?' => Some(p + 1),
            b'[' => {
                let (atom, next) = class(pattern, p + 1);
                atom.accepts(c, &mut 0).then_some(next)
            }
            b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
            b => (b == c).then_some(p + 1),
        }
    }

    #[test]
    fn globs_match_like_redis() {
        let table: &[(&str, &str, bool)] = &[
            ("*", "+switch-master", true),
            ("*", "", true),
            ("", "", true),
            ("", "x", false),
            ("+switch-*", "+switch-master", true),
            ("?sdown", "+sdown", true),
            ("?sdown", "sdown", false),
            ("[+-]sdown", "-sdown", true),
            ("[^x]sdown", "+sdown", true),
            ("[^+]sdown", "+sdown", false),
            ("*master", "+switch-master", true),
            ("*master*", "+switch-master", true),
            ("+sdown", "-sdown", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("a*b", "ac", false),
            ("ab*ba", "aba", false),
            ("ab*ba", "abba", true),
            ("a**b", "ab", true),
            ("\\*", "*", true),
            ("\\*", "x", false),
            ("\\", "\\", true),
            ("[a-c]", "b", true),
            ("[c-a]", "b", true),
            ("[a-c]", "d", false),
            ("[\\]]", "]", true),
            ("[a-]", "-", true),
            ("[abc", "b", true),
            ("[", "x", false),
            ("*[0-9]", "+odown7", true),
        ];
        for &(p, t, want) in table {
            assert_eq!(matches(p.as_bytes(), t.as_bytes()), want, "{p:?} against {t:?}");
        }
    }

    /// Regression (a hostile pattern): the matcher cost pattern × channel steps (or, recursing,
    /// worse).
    #[test]
    fn hostile_patterns_cost_linear_steps() {
        let channel = vec![b'a'; 10_000];
        let stars: Vec<u8> = b"*a".repeat(1000).into_iter().chain(*b"*b").collect();
        let mut long_piece = b"*".to_vec();
        long_piece.extend(std::iter::repeat_n(b'a', 60));
        long_piece.push(b'b');
        let classes: Vec<u8> = b"*[a-a]".repeat(50).into_iter().chain(*b"b").collect();
        for pattern in [stars, long_piece, classes] {
            let (matched, steps) = matches_counting(&pattern, &channel);
            assert!(!matched);
            let linear = 8 * (pattern.len() + channel.len()) as u64;
            assert!(steps <= linear, "{steps} steps > {linear} for {} bytes", pattern.len());
        }
        // The same channel against the 62-byte pattern cost the old matcher ~60 × 10,000.
        let mut old = 0;
        let pattern = [b"*".as_slice(), &[b'a'; 60], b"b"].concat();
        assert!(!backtracking(&pattern, &channel, &mut old));
        assert!(old > 500_000, "the reference backtracks ({old} steps)");
    }

    #[test]
    fn pieces_longer_than_a_word_are_found() {
        let piece = "ab".repeat(70);
        let pattern = format!("x*{piece}*y");
        assert!(matches(pattern.as_bytes(), format!("x--a{piece}--y").as_bytes()));
        assert!(!matches(
            pattern.as_bytes(),
            format!("x--a{}--y", &piece[..piece.len() - 1]).as_bytes()
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

        /// Same answers as the backtracking matcher on small alphabets, where they differ most.
        #[test]
        fn agrees_with_the_backtracking_matcher(
            pattern in "[ab*?\\[\\]^\\\\-]{0,10}",
            text in "[ab\\]^-]{0,10}",
        ) {
            let want = backtracking(pattern.as_bytes(), text.as_bytes(), &mut 0);
            prop_assert_eq!(matches(pattern.as_bytes(), text.as_bytes()), want);
        }

    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// And on pieces longer than one word of the scan.
        #[test]
        fn agrees_on_long_pieces(pattern in "[ab?]{60,150}\\*?[ab?]{0,150}", text in "[ab]{0,400}") {
            let want = backtracking(pattern.as_bytes(), text.as_bytes(), &mut 0);
            prop_assert_eq!(matches(pattern.as_bytes(), text.as_bytes()), want);
        }
    }
}
