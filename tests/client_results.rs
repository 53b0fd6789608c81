//! The README's "Tested with" client table, generated from the client tests' runs (issue 21).
//!
//! `clients_netns::` and `clients_sentinel::` append one JSON row per client and run to
//! `target/client-results/*.jsonl` (client, version, path, fault, settings, time back, lost).
//! The ignored test `client_results::render_the_readme_table` renders them, grouped by client,
//! path, fault and settings (the range of times back over the runs, the writes lost in all), and
//! writes the table between the README's markers. The normal test checks that the README's
//! table is in that format and names every client the tests run. CI never rewrites the README.
//!
//! Rerun: the client tests (`clients_netns::`, `clients_sentinel::`, root), then
//! `cargo nextest run --locked --test tests --run-ignored only client_results::render_the_readme_table`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub const BEGIN: &str =
    "<!-- client-results:begin (generated: client_results::render_the_readme_table) -->";
pub const END: &str = "<!-- client-results:end -->";
const HEADER: &str =
    "| client | version | path | fault | time back | runs | acknowledged writes lost | settings |";
const RULE: &str = "|---|---|---|---|---|---|---|---|";

fn results_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/client-results")
}

fn readme() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")
}

/// Appends one row to `target/client-results/<file>` (a result lost to a full disk is only a
/// missing row).
pub fn append(file: &str, row: &Value) {
    let dir = results_dir();
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(file)) {
        use std::io::Write;
        let _ = writeln!(f, "{row}");
    }
}

/// One group of runs: the same client, version, path, fault and settings.
#[derive(Default)]
struct Group {
    /// Seconds back (from the event the row's `time` names); `None`: not back in the watch.
    backs: Vec<Option<f64>>,
    lost: Option<u64>,
    acked: u64,
}

type Key = (String, String, String, String, String);

fn text(row: &Value, field: &str) -> String {
    row[field].as_str().unwrap_or("?").to_string()
}

/// The time back of a row in seconds: `back_s` (from Sentinel's `+switch-master`, DNS rows) or
/// `back_ms` (from the promotion, Sentinel-endpoint rows).
fn back_of(row: &Value) -> Option<f64> {
    row["back_s"].as_f64().or_else(|| row["back_ms"].as_f64().map(|ms| ms / 1000.0))
}

/// The markdown table of `rows` (the JSON rows the client tests write), one line per group.
pub fn render(rows: &[Value]) -> String {
    let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
    for row in rows {
        let key = (
            text(row, "client"),
            text(row, "version"),
            text(row, "path"),
            text(row, "fault"),
            text(row, "settings"),
        );
        let group = groups.entry(key).or_default();
        group.backs.push(back_of(row));
        if let Some(lost) = row["lost"].as_u64() {
            group.lost = Some(group.lost.unwrap_or(0) + lost);
            group.acked += row["acked"].as_u64().unwrap_or(0);
        }
    }
    let mut out = format!("{HEADER}\n{RULE}\n");
    for ((client, version, path, fault, settings), g) in &groups {
        let lost = match g.lost {
            Some(lost) => format!("{lost} of {}", g.acked),
            None => "(reader)".to_string(),
        };
        out.push_str(&format!(
            "| {client} | {version} | {path} | {fault} | {} | {} | {lost} | {} |\n",
            range(&g.backs),
            g.backs.len(),
            settings.replace('|', "\\|"),
        ));
    }
    out
}

/// `a … b s` over the runs that came back, and how many did not.
fn range(backs: &[Option<f64>]) -> String {
    let back: Vec<f64> = backs.iter().flatten().copied().collect();
    let missing = backs.len() - back.len();
    let min = back.iter().copied().reduce(f64::min);
    let max = back.iter().copied().reduce(f64::max);
    let span = match (min, max) {
        (Some(a), Some(b)) if (a - b).abs() < 0.0005 => format!("{a:.2} s"),
        (Some(a), Some(b)) => format!("{a:.2} … {b:.2} s"),
        _ => String::new(),
    };
    match (span.is_empty(), missing) {
        (_, 0) => span,
        (true, n) => format!("not back ({n} runs)"),
        (false, n) => format!("{span}; {n} not back"),
    }
}

/// Every row in `target/client-results/*.jsonl`.
fn load_rows() -> Vec<Value> {
    let Ok(entries) = std::fs::read_dir(results_dir()) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

/// The README's text between the markers, or why there is none.
fn table_in(readme: &str) -> Result<&str, String> {
    let start = readme.find(BEGIN).ok_or("no begin marker")? + BEGIN.len();
    let len = readme[start..].find(END).ok_or("no end marker")?;
    Ok(readme[start..start + len].trim_matches('\n'))
}

/// Whether `table` is in [`render`]'s format: header, rule, rows of 8 cells.
fn check_format(table: &str) -> Result<(), String> {
    let mut lines = table.lines();
    if lines.next() != Some(HEADER) || lines.next() != Some(RULE) {
        return Err(format!("the header is not the generated one:\n{table}"));
    }
    for line in lines {
        let cells = line.replace("\\|", "").matches('|').count();
        if cells != 9 || !line.starts_with("| ") {
            return Err(format!("not a generated row: {line}"));
        }
    }
    Ok(())
}

/// Every client label the client tests run.
fn clients_tested() -> Vec<&'static str> {
    let dns = crate::clients_netns::APPS.iter().map(|a| a.label);
    let sentinel = crate::clients_sentinel::CLIENTS.iter().chain(&crate::clients_sentinel::WARNED);
    dns.chain(sentinel.map(|c| c.label)).collect()
}

#[test]
fn the_readme_client_table_is_generated_and_names_every_client_tested() {
    let readme = std::fs::read_to_string(readme()).expect("README.md");
    let table = table_in(&readme).unwrap_or_else(|e| panic!("README's Tested with table: {e}"));
    check_format(table).unwrap_or_else(|e| panic!("{e}"));
    let named: Vec<&str> =
        table.lines().skip(2).filter_map(|l| l.split(" | ").next()?.strip_prefix("| ")).collect();
    let missing: Vec<&str> = clients_tested().into_iter().filter(|c| !named.contains(c)).collect();
    assert!(
        missing.is_empty(),
        "the README's table has no row for {missing:?}: rerun them and render"
    );
}

#[test]
fn the_table_groups_runs_and_shows_ranges_losses_and_misses() {
    let row = |client: &str, back: Option<f64>, lost: Option<u64>| {
        serde_json::json!({"client": client, "version": "x 1", "path": "DNS", "fault": "planned",
            "settings": "a|b", "back_s": back, "lost": lost, "acked": lost.map(|_| 10)})
    };
    let rows = [
        row("w", Some(0.5), Some(0)),
        row("w", Some(-0.25), Some(1)),
        row("w", None, Some(0)),
        row("r", Some(0.1), None),
        serde_json::json!({"client": "s", "version": "y 2", "path": "endpoint", "fault": "planned",
            "settings": "d", "back_ms": 40, "lost": 0, "acked": 5}),
    ];
    let table = render(&rows);
    let want = format!(
        "{HEADER}\n{RULE}\n\
         | r | x 1 | DNS | planned | 0.10 s | 1 | (reader) | a\\|b |\n\
         | s | y 2 | endpoint | planned | 0.04 s | 1 | 0 of 5 | d |\n\
         | w | x 1 | DNS | planned | -0.25 … 0.50 s; 1 not back | 3 | 1 of 30 | a\\|b |\n"
    );
    assert_eq!(table, want);
    check_format(&table).expect("the rendered table passes its own check");
    assert!(check_format("| client | version |\n|---|---|\n").is_err());
    let bad = format!("{HEADER}\n{RULE}\n| w | x | y |\n");
    assert!(check_format(&bad).is_err());
}

/// Renders `target/client-results/*.jsonl` into the README between the markers.
#[test]
#[ignore = "rewrites README.md from target/client-results: run by hand after the client tests"]
fn render_the_readme_table() {
    let rows = load_rows();
    assert!(!rows.is_empty(), "no rows in {}: run the client tests first", results_dir().display());
    let path = readme();
    let text = std::fs::read_to_string(&path).expect("README.md");
    let start = text.find(BEGIN).expect("the begin marker") + BEGIN.len();
    let end = start + text[start..].find(END).expect("the end marker");
    let updated = format!("{}\n{}{}", &text[..start], render(&rows), &text[end..]);
    std::fs::write(&path, updated).expect("README.md written");
    eprintln!("{} rows rendered into {}", rows.len(), path.display());
}
