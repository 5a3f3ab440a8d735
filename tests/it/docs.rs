//! The documentation holds together: every relative link in README.md, docs/ and the charts'
//! READMEs names a file that exists and, for a Markdown page, a heading that page has.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use zkq_testkit::repo_file;

/// The Markdown files whose links are checked.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo_file("README.md")];
    let mut pending = vec![repo_file("docs"), repo_file("helm")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`;
/// a repeated heading gets `-1`, `-2`… appended.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = Vec::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#').map(|h| h.trim_start_matches('#')) else { continue };
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        anchors.push(if *count == 0 { slug.clone() } else { format!("{slug}-{count}") });
        *count += 1;
    }
    anchors
}

/// The targets of the inline links `[text](target)` of `text`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in prose(text) {
        // Drop code spans: a `[x](y)` inside backticks is not a link.
        let outside_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside_code.as_str();
        while let Some(start) = rest.find("](") {
            rest = &rest[start + 2..];
            let Some(end) = rest.find(')') else { break };
            targets.push(rest[..end].split_whitespace().next().unwrap_or("").to_owned());
            rest = &rest[end..];
        }
    }
    targets
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let file = if path.is_empty() { page.clone() } else { page.parent().expect("dir").join(path) };
            if !file.exists() {
                broken.push(format!("{}: {target}: no such file", shown(&page)));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_none_or(|e| e != "md") {
                continue;
            }
            let linked = std::fs::read_to_string(&file).expect("read linked page");
            if !anchors(&linked).iter().any(|a| a == anchor) {
                broken.push(format!("{}: {target}: no heading with that anchor", shown(&page)));
            }
        }
    }
    assert!(checked > 50, "only {checked} links found: is the link parser broken?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

fn shown(page: &Path) -> String {
    page.strip_prefix(repo_file("")).unwrap_or(page).display().to_string()
}

#[test]
fn anchors_follow_github() {
    let text = "# zkq\n## Deep queues and `jute.maxbuffer`\n```sh\n# not a heading\n```\n## Faults: what a client sees\n## Idempotent puts\n### Idempotent puts\n";
    assert_eq!(
        anchors(text),
        ["zkq", "deep-queues-and-jutemaxbuffer", "faults-what-a-client-sees", "idempotent-puts", "idempotent-puts-1"]
    );
    assert_eq!(links("see [a](x.md#b) and `[c](d)` and [e](../f)"), ["x.md#b", "../f"]);
}
