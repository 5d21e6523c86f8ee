//! The guide stays true to the code: the reference pages are what `pulse docs` makes now,
//! every link inside the book and the README leads somewhere, every `pulse` command the
//! book shows is one the command line accepts, the quick start runs as written, and the
//! README stays a front page.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pulse() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pulse"))
}

/// The book's pages, by path under `docs/src`.
fn pages() -> BTreeMap<String, String> {
    let src = root().join("docs/src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let name = path
                    .strip_prefix(&src)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.insert(name, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    out
}

/// The lines of `text` outside fenced code blocks, and the blocks (with the line before
/// each, which may mark it).
fn split_fences(text: &str) -> (Vec<&str>, Vec<(String, String)>) {
    let (mut prose, mut blocks) = (Vec::new(), Vec::new());
    let mut block: Option<(String, String)> = None;
    let mut before = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            match block.take() {
                Some(b) => blocks.push(b),
                None => {
                    let lang = line.trim_start().trim_start_matches('`').to_owned();
                    block = Some((format!("{before}\n{lang}"), String::new()));
                }
            }
            continue;
        }
        match &mut block {
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {
                prose.push(line);
                if !line.trim().is_empty() {
                    before = line.to_owned();
                }
            }
        }
    }
    (prose, blocks)
}

/// The anchors mdBook gives the headings of a page: lower case, spaces to dashes, other
/// punctuation dropped; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in split_fences(text).0 {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#').trim();
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the Markdown links `[text](target)` in `line`.
fn links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    out
}

/// What is wrong with the links of `text`, a file at `at` (relative to the repository).
fn broken_links(
    at: &Path,
    text: &str,
    anchors_of: &dyn Fn(&Path) -> Option<BTreeSet<String>>,
) -> Vec<String> {
    let mut broken = Vec::new();
    let dir = at.parent().unwrap_or(Path::new(""));
    for line in split_fences(text).0 {
        for target in links(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                at.to_path_buf()
            } else {
                normalise(&dir.join(file))
            };
            if !root().join(&path).exists() {
                broken.push(format!(
                    "{}: {target} (no {})",
                    at.display(),
                    path.display()
                ));
                continue;
            }
            if let Some(anchor) = anchor {
                match anchors_of(&path) {
                    Some(a) if a.contains(anchor) => {}
                    _ => broken.push(format!("{}: {target} (no heading #{anchor})", at.display())),
                }
            }
        }
    }
    broken
}

/// `a/b/../c` as `a/c`.
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn the_reference_pages_are_what_the_code_makes_now() {
    for (what, page) in [
        ("cli", "cli.md"),
        ("config", "configuration.md"),
        ("schema agent", "agent.schema.json"),
        ("schema schedules", "schedules.schema.json"),
        ("schema hooks", "hooks.schema.json"),
        ("schema webhooks", "webhooks.schema.json"),
        ("schema tools", "tools.schema.json"),
    ] {
        let made = pulse().arg("docs").args(what.split(' ')).output().unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        let path = root().join("docs/src/reference").join(page);
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == String::from_utf8_lossy(&made.stdout),
            "docs/src/reference/{page} is stale: run `cargo run --bin pulse -- docs {what} > docs/src/reference/{page}`"
        );
    }
}

#[test]
fn every_link_in_the_book_and_the_readme_leads_somewhere() {
    let pages = pages();
    let anchors_of = |path: &Path| -> Option<BTreeSet<String>> {
        std::fs::read_to_string(root().join(path))
            .ok()
            .map(|t| anchors(&t))
    };
    let mut broken = Vec::new();
    for (name, text) in &pages {
        broken.extend(broken_links(
            &Path::new("docs/src").join(name),
            text,
            &anchors_of,
        ));
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    broken.extend(broken_links(Path::new("README.md"), &readme, &anchors_of));
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));

    // Every page is in the table of contents, and every entry there is a page.
    let summary = &pages["SUMMARY.md"];
    let listed: BTreeSet<String> = split_fences(summary)
        .0
        .iter()
        .flat_map(|l| links(l))
        .collect();
    let unlisted: Vec<_> = pages
        .keys()
        .filter(|p| *p != "SUMMARY.md" && !listed.contains(*p))
        .collect();
    assert!(unlisted.is_empty(), "pages not in SUMMARY.md: {unlisted:?}");
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: the details belong in the book (docs/src)"
    );
    // The two commands: the test command is the one CI runs.
    assert!(readme.contains("\n./scripts/test.sh\n"));
    assert!(readme.contains("cargo run --release --bin pulse -- serve"));
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(ci.contains("exec ./scripts/test.sh"), "{ci}");
}

/// The `pulse` command lines of a shell block: continuation lines joined, comments cut,
/// the command taken out of `X=$(...)`, synopses (with `[`, `|` or `...`) left out.
fn command_lines(block: &str) -> Vec<String> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.trim_end();
        if let Some(start) = line.strip_suffix('\\') {
            current.push_str(start);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        joined.push(std::mem::take(&mut current));
    }
    let mut out = Vec::new();
    for line in joined {
        let mut line = line.trim().to_owned();
        if let Some(i) = line.find("$(pulse ") {
            line = line[i + 2..].to_owned();
            if let Some(end) = line.rfind(')') {
                line.truncate(end);
            }
        }
        if let Some(i) = line.find("| pulse ") {
            line = line[i + 2..].to_owned();
        }
        if let Some(rest) = line.strip_prefix("PULSE_STACK=pulse ") {
            line = rest.to_owned();
        }
        if !line.starts_with("pulse ") {
            continue;
        }
        if let Some(i) = line.find("  #").or_else(|| line.find(" # ")) {
            line.truncate(i);
        }
        for cut in [" | ", " > ", " && ", " &"] {
            if let Some(i) = line.find(cut) {
                line.truncate(i);
            }
        }
        if ["[", "...", "|", "<"].iter().any(|s| line.contains(s)) {
            continue;
        }
        out.push(line.trim().to_owned());
    }
    out
}

/// Splits a command line as the shell would, for the simple quoting the book uses.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, ' ') => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

#[test]
fn every_pulse_command_the_book_shows_is_accepted_by_the_command_line() {
    let mut commands = Vec::new();
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut texts: Vec<(String, String)> = pages().into_iter().collect();
    texts.push(("README.md".into(), readme));
    for (name, text) in &texts {
        if name.starts_with("reference/") {
            continue;
        }
        for (before, block) in split_fences(text).1 {
            let lang = before.lines().last().unwrap_or_default().trim();
            if !["sh", "bash", "shell"].contains(&lang) {
                continue;
            }
            for line in command_lines(&block) {
                let words: Vec<String> = shell_words(&line)
                    .into_iter()
                    .skip(1)
                    .map(|w| w.replace("$AGENT", "ag_01JDOCS"))
                    .collect();
                commands.push((format!("{name}: {line}"), words));
            }
        }
    }
    assert!(
        commands.len() > 80,
        "found only {} commands",
        commands.len()
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    let lines: Vec<&Vec<String>> = commands.iter().map(|(_, w)| w).collect();
    std::fs::write(file.path(), serde_json::to_string(&lines).unwrap()).unwrap();
    let checked = pulse()
        .args(["docs", "check"])
        .arg(file.path())
        .output()
        .unwrap();
    let refused = String::from_utf8_lossy(&checked.stdout);
    let failures: Vec<String> = refused
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(i, why)| format!("{}\n    {why}", commands[i.parse::<usize>().unwrap()].0))
        .collect();
    assert!(
        checked.status.success() && failures.is_empty(),
        "commands the book shows that pulse refuses:\n{}\n{}",
        failures.join("\n"),
        String::from_utf8_lossy(&checked.stderr)
    );
}

/// The blocks marked `<!-- transcript: NAME -->` on `page`, by name.
fn transcripts(page: &str) -> Vec<(String, String)> {
    split_fences(page)
        .1
        .into_iter()
        .filter_map(|(before, block)| {
            // The line before the fence, then the fence's language.
            let marker = before.lines().next()?;
            let name = marker
                .trim()
                .strip_prefix("<!-- transcript: ")?
                .strip_suffix(" -->")?;
            Some((name.to_owned(), block))
        })
        .collect()
}

/// Runs `block` with bash as a reader would type it, `pulse` being this build, in `dir`
/// on the database `db` with the offline model: its output, or why it failed.
fn run_block(block: &str, dir: &Path, db: &Path) -> Result<String, String> {
    // `pulse` is found on the PATH, so that `pulse serve &` is the server's own process
    // (a shell function run in the background would be a subshell, and killing it
    // would leave the server holding the output open). Background jobs end with the
    // script.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pulse"), bin.path().join("pulse")).unwrap();
    let path = std::env::join_paths(std::iter::once(bin.path().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let script = format!("set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{block}");
    let ran = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .current_dir(dir)
        .env("PULSE_DB", db)
        .env("PULSE_LLM_PROVIDER", "offline")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&ran.stdout).into_owned();
    if ran.status.success() {
        Ok(out)
    } else {
        Err(format!("{out}\n{}", String::from_utf8_lossy(&ran.stderr)))
    }
}

/// Every page's transcripts but the quick start's (which needs a server started for it;
/// below), each run as written on a fresh database: a flag renamed or a value no longer accepted
/// fails here, not for the reader.
#[test]
fn the_book_s_transcripts_run_as_written() {
    let mut ran = Vec::new();
    for (name, text) in pages() {
        for (transcript, block) in transcripts(&text) {
            if transcript == "quick-start" {
                continue;
            }
            let dir = tempfile::tempdir().unwrap();
            let db = dir.path().join("scratch.db");
            // Run as from the project's directory, whose examples a block may start.
            std::os::unix::fs::symlink(root().join("examples"), dir.path().join("examples"))
                .unwrap();
            // A block that starts `pulse serve` gets a free port for it.
            let free = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            let block = block.replace("127.0.0.1:8080", &free.to_string());
            let out = run_block(&block, dir.path(), &db).unwrap_or_else(|why| {
                panic!("{name}'s transcript {transcript:?} failed:\n{block}\n{why}")
            });
            if transcript == "local-mcp" {
                // The program spoke MCP: its tools were listed and kept.
                // The one it marks read-only is allowed; the other is asked.
                assert!(
                    out.contains("2 tools (add_note ask, find_notes allow)"),
                    "{out}"
                );
            }
            if transcript == "messages-api" {
                // The reply was written within the wait, not left queued.
                assert!(out.contains(r#""status":"done""#), "{out}");
            }
            if transcript == "agent-files" {
                // Planned, applied once, then nothing to do; the edit seen as drift;
                // the export the same as the store.
                for said in [
                    "scout (examples/agents/scout): create",
                    "applied: 1 agent created",
                    "scout (examples/agents/scout): no changes",
                    "  ~ interval: 2h -> 30m",
                    "scout (exported): no changes",
                ] {
                    assert!(out.contains(said), "{said} in {out}");
                }
            }
            if transcript == "signed-request" {
                // Accepted, and the event is in the agent's log.
                assert!(out.contains(r#""status":"accepted""#), "{out}");
                assert!(out.contains("DEPLOY_FINISHED"), "{out}");
            }
            ran.push(transcript);
        }
    }
    ran.sort();
    assert_eq!(
        ran,
        [
            "agent-files",
            "agents",
            "discord-access",
            "hooks",
            "local-mcp",
            "memories",
            "messages-api",
            "reminders",
            "retention",
            "signed-request",
            "webhooks"
        ],
        "the transcripts found"
    );
}

/// The quick start's second-terminal block, run as written against `pulse serve` in a
/// fresh directory (its tool on a free port instead of 8765).
#[test]
fn the_quick_start_runs_as_written() {
    let page = std::fs::read_to_string(root().join("docs/src/getting-started.md")).unwrap();
    let (_, block) = transcripts(&page)
        .into_iter()
        .find(|(name, _)| name == "quick-start")
        .expect("the quick start block is marked");
    assert!(
        block.starts_with("alias pulse=target/release/pulse\n"),
        "{block}"
    );
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let db = dir.path().join("pulse.db");
    let mut serve = pulse()
        .arg("serve")
        .env("PULSE_DB", &db)
        .env("PULSE_LISTEN", listen.to_string())
        .env("PULSE_HOOKS_ALLOW", "127.0.0.1/32")
        .env("PULSE_LLM_PROVIDER", "offline")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // As typed, but `pulse` is this build.
    let block = block
        .replacen("alias pulse=target/release/pulse\n", "", 1)
        .replace("8765", &port.to_string());
    let ran = run_block(&block, &root(), &db);
    let _ = serve.kill();
    let _ = serve.wait();
    let out = ran.unwrap_or_else(|why| panic!("the quick start failed:\n{why}"));
    // What it promises: echo ran, and the conversation has the message and a reply.
    assert!(out.contains("echo"), "{out}");
    assert!(out.contains("how are you?"), "{out}");
}

/// Security's worked signature, as a sender would check theirs against it: the digest
/// the page prints is one Pulse's verifier accepts for the secret, timestamp, delivery id
/// and body the page sets, and the request line sends the same digest.
#[test]
fn the_security_chapter_s_worked_signature_is_one_pulse_accepts() {
    use pulse_signatures::inbound::{Scheme, verify};
    use reqwest::header::{HeaderMap, HeaderValue};

    let page = std::fs::read_to_string(root().join("docs/src/security.md")).unwrap();
    let (_, block) = split_fences(&page)
        .1
        .into_iter()
        .find(|(_, b)| b.contains("openssl dgst"))
        .expect("the worked example");
    // `NAME=value   # comment`, quoted or not.
    let set = |name: &str| -> String {
        let line = block
            .lines()
            .find(|l| l.starts_with(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}= in:\n{block}"));
        let value = line[name.len() + 1..].split("  #").next().unwrap().trim();
        value.trim_matches('\'').to_owned()
    };
    let (secret, ts, delivery, body) = (set("SECRET"), set("TS"), set("DELIVERY"), set("BODY"));
    // The line after `openssl dgst` is the digest it prints.
    let lines: Vec<&str> = block.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("openssl dgst"))
        .unwrap();
    let digest = lines[at + 1].trim_start_matches("# ").trim();
    assert_eq!(digest.len(), 64, "a SHA-256 digest in hex: {digest:?}");
    let shown = block
        .split("X-Pulse-Signature: sha256=")
        .nth(1)
        .and_then(|s| s.split('…').next())
        .expect("the request line's signature");
    assert!(
        digest.starts_with(shown),
        "the request sends {shown}…, not {digest}"
    );

    let mut headers = HeaderMap::new();
    let header = |v: &str| HeaderValue::from_str(v).unwrap();
    headers.insert("x-pulse-timestamp", header(&ts));
    headers.insert("x-pulse-delivery", header(&delivery));
    headers.insert("x-pulse-signature", header(&format!("sha256={digest}")));
    let now: i64 = ts.parse().unwrap();
    let verified = verify(Scheme::Pulse, &[&secret], &headers, body.as_bytes(), now);
    assert!(
        verified.is_ok(),
        "Pulse refuses the worked example: {verified:?}"
    );
    // And a digest of anything else is refused: the check is not vacuous.
    headers.insert("x-pulse-timestamp", header(&(now + 1).to_string()));
    assert!(verify(Scheme::Pulse, &[&secret], &headers, body.as_bytes(), now).is_err());
}
