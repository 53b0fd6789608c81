//! The "Tested with" tables of docs/tested.md, generated from the client tests' runs.
//!
//! `clients_netns::` and `clients_sentinel::` append one JSON row per client and run to
//! `target/client-results/*.jsonl` (client, version, runtime, server, resolver, path, fault,
//! settings, time back, lost). The ignored test `client_results::render_the_readme_table`
//! renders them into docs/tested.md between two pairs of markers: the results, grouped by client,
//! path, fault and settings (the range of times back over the runs, the writes lost in all),
//! and the components those runs used (each library with its runtime, the servers, the
//! resolver). The normal test checks what it can without running a client: both tables are in
//! the generated format, every client the tests run has a row with its settings, and every
//! library version in them is the one `tests/clients/package.json` and `requirements.txt` pin
//! (a pin bumped without a rerun fails). CI never rewrites the page.
//!
//! Rerun: the client tests (`clients_netns::`, `clients_sentinel::`, root), then
//! `cargo nextest run --locked --test tests --run-ignored only client_results::render_the_readme_table`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

pub const BEGIN: &str =
    "<!-- client-results:begin (generated: client_results::render_the_readme_table) -->";
pub const END: &str = "<!-- client-results:end -->";
pub const VERSIONS_BEGIN: &str =
    "<!-- client-versions:begin (generated: client_results::render_the_readme_table) -->";
pub const VERSIONS_END: &str = "<!-- client-versions:end -->";
const VERSIONS_HEADER: &str = "| component | version | runtime | paths |";
const VERSIONS_RULE: &str = "|---|---|---|---|";
const HEADER: &str =
    "| client | version | path | fault | time back | runs | acknowledged writes lost | settings |";
const RULE: &str = "|---|---|---|---|---|---|---|---|";

fn results_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/client-results")
}

fn readme() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/tested.md")
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
        (true, 1) => "not back (1 run)".to_string(),
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

/// The page's text between `begin` and `end`, or why there is none.
fn between<'a>(readme: &'a str, begin: &str, end: &str) -> Result<&'a str, String> {
    let start = readme.find(begin).ok_or(format!("no marker {begin}"))? + begin.len();
    let len = readme[start..].find(end).ok_or(format!("no marker {end}"))?;
    Ok(readme[start..start + len].trim_matches('\n'))
}

/// `text` with `begin`..`end` replaced by `table`.
fn replace_between(text: &str, begin: &str, end: &str, table: &str) -> String {
    let start = text.find(begin).expect("the begin marker") + begin.len();
    let stop = start + text[start..].find(end).expect("the end marker");
    format!("{}\n{table}{}", &text[..start], &text[stop..])
}

/// The components the runs used, one line each: every library (its versions, the runtimes it
/// ran on, the paths it was tested through), the servers and the resolver.
pub fn render_versions(rows: &[Value]) -> String {
    #[derive(Default)]
    struct Seen {
        versions: BTreeSet<String>,
        runtimes: BTreeSet<String>,
        paths: BTreeSet<String>,
    }
    // Sorted by kind (libraries, servers, resolver), then by name.
    let mut seen: BTreeMap<(u8, String), Seen> = BTreeMap::new();
    let mut note = |kind: u8, named: &str, runtime: &str, path: String| {
        let (name, version) = named.split_once(' ').unwrap_or((named, "?"));
        let entry = seen.entry((kind, name.to_string())).or_default();
        entry.versions.insert(version.to_string());
        entry.runtimes.insert(runtime.to_string());
        entry.paths.insert(path);
    };
    for row in rows {
        let path = text(row, "path");
        note(0, &text(row, "version"), &text(row, "runtime"), path.clone());
        note(1, &text(row, "server"), "data nodes and Sentinels", path.clone());
        if let Some(resolver) = row["resolver"].as_str() {
            note(2, resolver, "the application host's system resolver", path);
        }
    }
    let join =
        |set: &BTreeSet<String>, sep: &str| set.iter().cloned().collect::<Vec<_>>().join(sep);
    let mut out = format!("{VERSIONS_HEADER}\n{VERSIONS_RULE}\n");
    for ((_, name), s) in &seen {
        out.push_str(&format!(
            "| {name} | {} | {} | {} |\n",
            join(&s.versions, ", "),
            join(&s.runtimes, ", "),
            join(&s.paths, "; "),
        ));
    }
    out
}

/// `Redis 7.0.15` or `Valkey 8.1.8` from a node's `INFO server`.
pub fn server_version(info: &str) -> String {
    let field = |name: &str| {
        info.lines().find_map(|l| l.trim().strip_prefix(name)).map(|v| v.trim().to_string())
    };
    match (field("valkey_version:"), field("redis_version:")) {
        (Some(v), _) => format!("Valkey {v}"),
        (None, Some(v)) => format!("Redis {v}"),
        (None, None) => "? ?".to_string(),
    }
}

/// `unbound 1.17.1`, from `unbound -V`.
pub fn unbound_version() -> String {
    let out = std::process::Command::new("unbound").arg("-V").output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let version = text.lines().find_map(|l| l.strip_prefix("Version ")).unwrap_or("?");
    format!("unbound {}", version.trim())
}

/// The versions `tests/clients/package.json` and `requirements.txt` pin, by the library names
/// the clients print (`ioredis`, `node-redis`, `redis-py`, `valkey-glide`).
fn pins() -> BTreeMap<String, BTreeSet<String>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients");
    let package = std::fs::read_to_string(dir.join("package.json")).expect("package.json");
    let package: Value = serde_json::from_str(&package).expect("package.json is JSON");
    // `"ioredis5": "npm:ioredis@5.8.2"`: an alias of a previous major.
    let npm = |name: &str| {
        let pin = package["dependencies"][name].as_str()?;
        Some(pin.rsplit_once('@').map_or(pin, |(_, v)| v).to_string())
    };
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).expect("requirements");
    let (requirements, previous) = (read("requirements.txt"), read("requirements-previous.txt"));
    let pip = |text: &str, name: &str| {
        text.lines().find_map(|l| l.trim().strip_prefix(&format!("{name}=="))).map(String::from)
    };
    let pinned = [
        ("ioredis", npm("ioredis")),
        ("ioredis", npm("ioredis5")),
        ("iovalkey", npm("iovalkey")),
        ("node-redis", npm("redis")),
        ("node-redis", npm("redis5")),
        ("redis-py", pip(&requirements, "redis")),
        ("redis-py", pip(&previous, "redis")),
        ("valkey-py", pip(&requirements, "valkey")),
        ("valkey-glide", pip(&requirements, "valkey-glide")),
    ];
    let mut pins: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (lib, version) in pinned {
        if let Some(version) = version {
            pins.entry(lib.to_string()).or_default().insert(version);
        }
    }
    pins
}

/// The client libraries the tests pin (a version of one of them that no pin names is stale).
const LIBRARIES: [&str; 6] =
    ["ioredis", "iovalkey", "node-redis", "redis-py", "valkey-py", "valkey-glide"];

/// The cells of a generated table's rows (escaped `|` kept inside their cell).
fn cells(table: &str) -> Vec<Vec<String>> {
    let rows = table.lines().skip(2);
    rows.map(|l| {
        let l = l.replace("\\|", "\u{1}");
        let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split('|').map(|c| c.trim().replace('\u{1}', "|")).collect()
    })
    .collect()
}

/// Every library version the two tables name that is not the pinned one.
fn unpinned(
    results: &str,
    versions: &str,
    pins: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut named: Vec<(String, String)> = Vec::new();
    for row in cells(results) {
        if let Some((lib, v)) = row.get(1).and_then(|c| c.split_once(' ')) {
            named.push((lib.to_string(), v.to_string()));
        }
    }
    for row in cells(versions) {
        if let (Some(lib), Some(vs)) = (row.first(), row.get(1)) {
            named.extend(vs.split(", ").map(|v| (lib.clone(), v.to_string())));
        }
    }
    named
        .into_iter()
        .filter(|(lib, v)| match pins.get(lib) {
            Some(pinned) => !pinned.contains(v),
            // Not a client library (a server, the resolver): nothing pins it here.
            None => LIBRARIES.contains(&lib.as_str()),
        })
        .map(|(lib, v)| {
            let pinned = pins.get(&lib).map(|p| p.iter().cloned().collect::<Vec<_>>().join(", "));
            format!("{lib} {v} (pinned: {})", pinned.as_deref().unwrap_or("none"))
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Whether `table` has `header`, `rule`, then rows of `cells` cells.
fn check_format(table: &str, header: &str, rule: &str, cells: usize) -> Result<(), String> {
    let mut lines = table.lines();
    if lines.next() != Some(header) || lines.next() != Some(rule) {
        return Err(format!("the header is not the generated one:\n{table}"));
    }
    for line in lines {
        let bars = line.replace("\\|", "").matches('|').count();
        if bars != cells + 1 || !line.starts_with("| ") {
            return Err(format!("not a generated row: {line}"));
        }
    }
    Ok(())
}

fn check_results(table: &str) -> Result<(), String> {
    check_format(table, HEADER, RULE, 8)
}

fn check_versions(table: &str) -> Result<(), String> {
    check_format(table, VERSIONS_HEADER, VERSIONS_RULE, 4)
}

/// Every client the client tests run: its label and its settings.
fn clients_tested() -> Vec<(&'static str, &'static str)> {
    let dns = crate::clients_netns::APPS.iter().chain(&crate::clients_netns::PREVIOUS);
    let dns = dns.map(|a| (a.label, a.settings));
    let sentinel = crate::clients_sentinel::CLIENTS.iter().chain(&crate::clients_sentinel::WARNED);
    dns.chain(sentinel.map(|c| (c.label, c.settings))).collect()
}

/// The tested clients that no row of `table` names with their settings.
fn missing_from(table: &str) -> Vec<String> {
    let rows = cells(table);
    let has = |label: &str, settings: &str| {
        rows.iter().any(|r| {
            r.first().is_some_and(|c| c == label) && r.get(7).is_some_and(|c| c == settings)
        })
    };
    let missing = clients_tested().into_iter().filter(|(l, s)| !has(l, s));
    missing.map(|(l, s)| format!("{l} ({s})")).collect::<BTreeSet<_>>().into_iter().collect()
}

#[test]
fn the_readme_client_tables_are_generated_name_every_client_tested_and_the_pinned_versions() {
    let readme = std::fs::read_to_string(readme()).expect("docs/tested.md");
    let results = between(&readme, BEGIN, END).unwrap_or_else(|e| panic!("docs/tested.md: {e}"));
    check_results(results).unwrap_or_else(|e| panic!("{e}"));
    let versions = between(&readme, VERSIONS_BEGIN, VERSIONS_END)
        .unwrap_or_else(|e| panic!("docs/tested.md: {e}"));
    check_versions(versions).unwrap_or_else(|e| panic!("{e}"));
    let missing = missing_from(results);
    assert!(
        missing.is_empty(),
        "docs/tested.md's table has no row for {missing:?} with those settings: rerun them and render"
    );
    let unpinned = unpinned(results, versions, &pins());
    assert!(
        unpinned.is_empty(),
        "docs/tested.md's tables name versions the tests do not pin: {unpinned:?}: rerun and render"
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
    check_results(&table).expect("the rendered table passes its own check");
    assert!(check_results("| client | version |\n|---|---|\n").is_err());
    let bad = format!("{HEADER}\n{RULE}\n| w | x | y |\n");
    assert!(check_results(&bad).is_err());
    let cells = cells(&table);
    assert_eq!(cells[0][7], "a|b", "an escaped bar stays in its cell");
}

#[test]
fn the_component_table_lists_libraries_servers_and_resolver_and_checks_pins() {
    let row = |client: &str, version: &str, runtime: &str, path: &str, resolver: Option<&str>| {
        serde_json::json!({"client": client, "version": version, "runtime": runtime,
            "server": "Redis 7.0.15", "resolver": resolver, "path": path})
    };
    let rows = [
        row("a", "ioredis 5.8.2", "Node.js 20.1", "DNS", Some("unbound 1.17.1")),
        row("b", "ioredis 5.8.2", "Node.js 20.1", "endpoint", None),
        row("c", "redis-py 6.4.0", "Python 3.11", "endpoint", None),
        serde_json::json!({"client": "d", "version": "redis-py 6.4.0", "runtime": "Python 3.11",
            "server": "Valkey 8.1.8", "path": "DNS"}),
    ];
    let table = render_versions(&rows);
    let want = format!(
        "{VERSIONS_HEADER}\n{VERSIONS_RULE}\n\
         | ioredis | 5.8.2 | Node.js 20.1 | DNS; endpoint |\n\
         | redis-py | 6.4.0 | Python 3.11 | DNS; endpoint |\n\
         | Redis | 7.0.15 | data nodes and Sentinels | DNS; endpoint |\n\
         | Valkey | 8.1.8 | data nodes and Sentinels | DNS |\n\
         | unbound | 1.17.1 | the application host's system resolver | DNS |\n"
    );
    assert_eq!(table, want);
    check_versions(&table).expect("the rendered table passes its own check");
    let pins = BTreeMap::from([
        ("ioredis".to_string(), BTreeSet::from(["5.8.2".to_string(), "6.1.0".to_string()])),
        ("redis-py".to_string(), BTreeSet::from(["6.4.1".to_string()])),
    ]);
    let results =
        format!("{HEADER}\n{RULE}\n| a | node-redis 5.9.0 | p | f | 1 s | 1 | 0 of 1 | s |\n");
    assert_eq!(
        unpinned(&results, &table, &pins),
        ["node-redis 5.9.0 (pinned: none)", "redis-py 6.4.0 (pinned: 6.4.1)"]
    );
    assert_eq!(
        server_version("# Server\r\nredis_version:7.2.4\r\nvalkey_version:8.1.8\r\n"),
        "Valkey 8.1.8"
    );
    assert_eq!(server_version("redis_version:7.0.15\r\n"), "Redis 7.0.15");
}

/// Renders `target/client-results/*.jsonl` into docs/tested.md between the markers.
#[test]
#[ignore = "rewrites docs/tested.md from target/client-results: run by hand after the client tests"]
fn render_the_readme_table() {
    let rows = load_rows();
    assert!(!rows.is_empty(), "no rows in {}: run the client tests first", results_dir().display());
    let path = readme();
    let text = std::fs::read_to_string(&path).expect("docs/tested.md");
    let text = replace_between(&text, BEGIN, END, &render(&rows));
    let text = replace_between(&text, VERSIONS_BEGIN, VERSIONS_END, &render_versions(&rows));
    std::fs::write(&path, text).expect("docs/tested.md written");
    eprintln!("{} rows rendered into {}", rows.len(), path.display());
}
