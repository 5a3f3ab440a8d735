//! The walls between the rooms that the compiler cannot see (docs/architecture.md): the fronts
//! (`http/`, `sqs/`, `push/`, `inspect/`) stand side by side, none naming another; `web/`, under
//! the HTTP fronts, names no front; neither touches `zk/`, the ground under the core. The few
//! crossings still standing are listed here, each with the work that removes it: a new crossing
//! fails, and so does a listed one that is gone (the list says what is left, no more).

use std::path::{Path, PathBuf};

/// The fronts: each translates its wire onto the queue core, and knows no other front.
const FRONTS: [&str; 4] = ["http", "sqs", "push", "inspect"];

/// Crossings that stand: (file under `src/`, the module it names), each with what removes it.
const STANDING: &[(&str, &str)] = &[
    // `zkq inspect` opens its own session (a CLI run, not a sidecar's).
    ("inspect/mod.rs", "crate::zk"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files_under(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Every module of this crate a file names outside comments (`crate::zk`, `crate::http`, ...).
fn named_modules(text: &str) -> Vec<String> {
    let mut named = Vec::new();
    for line in text.lines().filter(|line| !line.trim_start().starts_with("//")) {
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            let preceded = rest[..at].chars().next_back().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            if !preceded && end > 0 {
                named.push(format!("crate::{}", &after[..end]));
            }
            rest = &after[end..];
        }
    }
    named.sort();
    named.dedup();
    named
}

/// Every crossing of the walls: (file under `src/`, the module it names that its room may not).
fn crossings() -> Vec<(String, String)> {
    let root = src();
    let mut files = Vec::new();
    for room in FRONTS.iter().chain(["web"].iter()) {
        files_under(&root.join(room), &mut files);
    }
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&root).expect("under src").to_string_lossy().replace('\\', "/");
        let room = relative.split('/').next().unwrap_or_default().to_owned();
        let text = std::fs::read_to_string(&file).expect("a source file");
        for module in named_modules(&text) {
            let name = module.trim_start_matches("crate::");
            let other_front = FRONTS.contains(&name) && name != room;
            let front_from_web = room == "web" && FRONTS.contains(&name);
            if other_front || front_from_web || name == "zk" {
                found.push((relative.clone(), module));
            }
        }
    }
    found.sort();
    found
}

#[test]
fn the_fronts_and_web_cross_no_wall_but_the_standing_ones() {
    let found = crossings();
    let new: Vec<_> =
        found.iter().filter(|(file, module)| !STANDING.contains(&(file.as_str(), module.as_str()))).collect();
    assert!(
        new.is_empty(),
        "a front names another front or crate::zk, or web/ names a front or crate::zk: {new:?}; \
         go through the core (docs/architecture.md)"
    );
    let gone: Vec<_> =
        STANDING.iter().filter(|(file, module)| !found.iter().any(|(f, m)| f == file && m == module)).collect();
    assert!(gone.is_empty(), "these crossings are gone: remove them from STANDING in src/tidy.rs: {gone:?}");
}

#[test]
fn web_names_no_front_and_push_takes_its_headers_from_web() {
    let found = crossings();
    assert!(found.iter().all(|(file, _)| !file.starts_with("web/")), "{found:?}");
    assert!(found.iter().all(|(file, _)| !file.starts_with("push/")), "{found:?}");
}

#[test]
fn named_modules_reads_paths_and_skips_comments() {
    let text = "use crate::zk::{Zk};\n// crate::http in a comment\nlet x = crate::web::headers::X; super_crate::no\n";
    assert_eq!(named_modules(text), ["crate::web", "crate::zk"]);
}

/// Every function of `text` longer than `limit` lines: (its name, its length). A function runs
/// from its `fn` line to the first line after it that closes at the same indentation.
fn long_functions(text: &str, limit: usize) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let after_fn = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn ", "async fn ", "pub async fn "]
            .iter()
            .chain(["pub(crate) async fn ", "pub(super) async fn "].iter())
            .find_map(|prefix| code.strip_prefix(prefix));
        // A one-line function or a declaration without a body closes on its own line.
        let Some(after_fn) = after_fn.filter(|_| !code.ends_with('}') && !code.ends_with(';')) else { continue };
        let name: String = after_fn.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let close = format!("{indent}}}");
        if let Some(end) = lines.iter().skip(at + 1).position(|l| *l == close) {
            let length = end + 2;
            if length > limit {
                long.push((name, length));
            }
        }
    }
    long
}

/// How long a file and a function of `src/` may grow before they are split (docs/architecture.md).
const MAX_FILE_LINES: usize = 800;
const MAX_FUNCTION_LINES: usize = 180;

#[test]
fn no_file_or_function_outgrows_what_a_reader_holds_at_once() {
    let mut files = Vec::new();
    files_under(&src(), &mut files);
    let mut over = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let relative = file.strip_prefix(src()).expect("under src").to_string_lossy().into_owned();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            over.push(format!("{relative}: {lines} lines"));
        }
        for (name, length) in long_functions(&text, MAX_FUNCTION_LINES) {
            over.push(format!("{relative}: fn {name}, {length} lines"));
        }
    }
    assert!(
        over.is_empty(),
        "split these (files up to {MAX_FILE_LINES} lines, functions up to {MAX_FUNCTION_LINES}): {over:?}"
    );
}

#[test]
fn long_functions_measures_from_the_fn_line_to_its_closing_brace() {
    let text =
        "impl A {\n    fn small() {}\n    pub(crate) async fn big(&self) {\n        one();\n        two();\n    }\n}\n";
    assert_eq!(long_functions(text, 3), vec![("big".to_owned(), 4)]);
    assert!(long_functions(text, 4).is_empty());
}
