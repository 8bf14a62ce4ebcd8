//! The house rules docs/design.md states, checked on the source tree (no root, no build
//! of anything): each room (a top-level module of `observer/src`) imports only the rooms
//! its row of design.md's table lists, the table has no circle, and no code file passes
//! 500 lines before its tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Imports that run against the table today, each with why and what removes it.
const KNOWN_EXCEPTIONS: &[(&str, &str)] = &[];

/// The most lines of code a file may have before its `#[cfg(test)]` (blank and
/// comment-only lines not counted).
const MAX_CODE_LINES: usize = 500;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Room -> rooms it may import, from the table under "### What each room may import".
fn table() -> BTreeMap<String, BTreeSet<String>> {
    let design = std::fs::read_to_string(workspace().join("docs/design.md")).unwrap();
    let rows = design
        .lines()
        .skip_while(|line| *line != "### What each room may import")
        .skip(1)
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'));
    let names = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|name| name.trim().trim_matches('`').to_owned())
            .filter(|name| !name.is_empty() && name != "nothing")
            .collect()
    };
    let table: BTreeMap<String, BTreeSet<String>> = rows
        .filter_map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
            let room = cells.first()?.trim().strip_prefix('`')?.strip_suffix('`')?;
            Some((room.to_owned(), names(cells.get(1)?)))
        })
        .collect();
    assert!(!table.is_empty(), "design.md has no table of rooms");
    table
}

/// The rooms `observer/src/lib.rs` declares.
fn rooms() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(workspace().join("observer/src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|line| line.trim().strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

/// Every `.rs` file under `dir`, leaving out build output and hidden directories.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// A line without its `//` comment (none of observer's strings hold `crate::` paths).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// The rooms a piece of code names: `crate::room` and `crate::{room::..., room, ...}`.
fn rooms_named(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut named = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            named.insert(ident(rest));
            continue;
        };
        // The group's top-level paths: each starts after `{` or a `,` at depth 0.
        let mut depth = 0;
        let mut start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => start = true,
                c if start && !c.is_whitespace() => {
                    named.insert(ident(&group[i..]));
                    start = false;
                }
                _ => {}
            }
        }
    }
    named
}

/// Which room a file of `observer/src` belongs to.
fn room_of(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_string_lossy();
    let room = name.strip_suffix(".rs").unwrap_or(&name);
    (room != "lib" && room != "main").then(|| room.to_owned())
}

#[test]
fn the_table_names_every_room_and_has_no_circle() {
    let table = table();
    let named: BTreeSet<String> = table.keys().cloned().collect();
    assert_eq!(named, rooms(), "design.md's table against lib.rs's modules");
    for (room, imports) in &table {
        for import in imports {
            assert!(
                table.contains_key(import),
                "{room} may import {import}: no such room"
            );
        }
    }
    // Depth-first from each room: reaching it again is a circle.
    for start in table.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&String> = table[start].iter().collect();
        while let Some(room) = stack.pop() {
            assert_ne!(
                room, start,
                "the table's imports run in a circle through {start}"
            );
            if seen.insert(room) {
                stack.extend(&table[room]);
            }
        }
    }
}

#[test]
fn no_room_imports_a_room_its_row_does_not_list() {
    let table = table();
    let src = workspace().join("observer/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    let mut excepted = BTreeSet::new();
    for file in &files {
        let Some(room) = room_of(&src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        let code: String = text.lines().map(|l| code(l).to_owned() + "\n").collect();
        for import in rooms_named(&code) {
            if import == room || import == "self" || import == "super" {
                continue;
            }
            if table[&room].contains(&import) {
                continue;
            }
            if KNOWN_EXCEPTIONS.contains(&(room.as_str(), import.as_str())) {
                excepted.insert((room.clone(), import));
                continue;
            }
            upward.push(format!("{} imports {import}", file.display()));
        }
    }
    assert!(
        upward.is_empty(),
        "imports the table forbids:\n{}",
        upward.join("\n")
    );
    // An exception no longer used is removed from the list.
    for (room, import) in KNOWN_EXCEPTIONS {
        assert!(
            excepted.contains(&(room.to_string(), import.to_string())),
            "{room} no longer imports {import}: remove the exception"
        );
    }
}

/// Lines of code before the first `#[cfg(test)]`, blank and comment-only lines left out.
fn code_lines(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .take_while(|line| !line.starts_with("#[cfg(test)]"))
        .filter(|line| !line.is_empty() && !line.starts_with("//"))
        .count()
}

#[test]
fn no_code_file_passes_500_lines() {
    let mut files = Vec::new();
    rust_files(&workspace(), &mut files);
    assert!(files.len() > 100, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = code_lines(&std::fs::read_to_string(file).unwrap());
            (lines > MAX_CODE_LINES).then(|| format!("{}: {lines}", file.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_CODE_LINES} lines of code:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checks_read_code_as_meant() {
    assert_eq!(
        rooms_named("use crate::{model::record::Recording, stats::{A, B}};\nuse crate::kernel::x;"),
        ["kernel", "model", "stats"].map(String::from).into()
    );
    assert_eq!(code("let a = 1; // crate::tui"), "let a = 1; ");
    assert_eq!(code_lines("a\n\n// c\n  /// d\nb\n#[cfg(test)]\nc\n"), 2);
}
