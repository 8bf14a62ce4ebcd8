//! Text read from the node, made printable where it enters observer: pod names (UTS
//! hostnames, which a pod with `CAP_SYS_ADMIN` sets to anything, and the runtime's
//! bundle annotations), Service names (kube-proxy's rule comments and chain names), the
//! node's hostname, and the messages that quote any of them. Every sink (the log, the
//! live view, `summary`, `rules`, the metrics, stderr) then gets text that a terminal
//! prints as it is, with no escape sequence to run: JSON escaping protects the log's
//! syntax, but `jq -r` or `cat` of it would still hand the terminal an `ESC [ 2 J`.

/// The longest name kept, in bytes: Kubernetes names (DNS subdomains) are at most 253.
pub const NAME_BYTES: usize = 253;

/// The longest message kept, in bytes (a warning or error quoting the node's text).
pub const MESSAGE_BYTES: usize = 1024;

/// Marks text cut at its bound.
const CUT: char = '…';

/// `text` as printable text of at most `max_bytes` bytes (at least 3, the marker's
/// length): each control character (C0, DEL, C1) as `\xNN` (ASCII) or `\u{NN}`, each
/// invisible character that reorders or hides text (bidirectional overrides and
/// isolates, zero-width characters, line and paragraph separators, the BOM) as
/// `\u{NNNN}`; past the bound, cut after the last whole character or escape that leaves
/// room for `…`. Printable text within the bound is returned as it is, without a copy, so
/// text made printable once (a name, then a warning quoting it) is never escaped twice.
/// A backslash stays a backslash: a hostname that spells `\x1b` out reads like one that
/// held an escape character, and neither can do anything to a terminal.
pub fn printable(text: String, max_bytes: usize) -> String {
    if text.len() <= max_bytes && !text.chars().any(needs_escape) {
        return text;
    }
    let mut out = String::with_capacity(text.len().min(max_bytes));
    // The length after the last whole character or escape that leaves room for `CUT`.
    let mut fits = 0;
    for c in text.chars() {
        if out.len() + CUT.len_utf8() <= max_bytes {
            fits = out.len();
        }
        push_escaped(&mut out, c);
        if out.len() > max_bytes {
            out.truncate(fits);
            out.push(CUT);
            return out;
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c.is_control() || is_invisible(c)
}

/// Format characters (Unicode category Cf) and separators that change how text around
/// them is shown without showing themselves.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

fn push_escaped(out: &mut String, c: char) {
    use std::fmt::Write as _;
    if c.is_ascii_control() {
        let _ = write!(out, "\\x{:02x}", c as u32);
    } else if needs_escape(c) {
        let _ = write!(out, "\\u{{{:x}}}", c as u32);
    } else {
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> String {
        printable(text.to_owned(), NAME_BYTES)
    }

    #[test]
    fn terminal_escapes_become_text() {
        assert_eq!(name("\u{1b}[2Jevil"), "\\x1b[2Jevil");
        assert_eq!(
            name("a\tb\r\nc\u{7}\u{0}\u{7f}"),
            "a\\x09b\\x0d\\x0ac\\x07\\x00\\x7f"
        );
        // C1 controls: U+009B is a one-character CSI on some terminals.
        assert_eq!(name("x\u{9b}2J"), "x\\u{9b}2J");
        assert_eq!(name("a\\x1b"), "a\\x1b", "a backslash stays");
    }

    #[test]
    fn invisible_characters_that_reorder_or_hide_text_become_text() {
        assert_eq!(
            name("pod\u{202e}gnp.exe\u{200b}\u{2066}\u{feff}"),
            "pod\\u{202e}gnp.exe\\u{200b}\\u{2066}\\u{feff}"
        );
    }

    #[test]
    fn printable_text_is_kept_as_it_is_without_a_copy() {
        for text in [
            "shop/checkout:http",
            "checkout-5f6d8-abcde",
            "",
            "café-ünïcode-名前",
        ] {
            let owned = text.to_owned();
            let pointer = owned.as_ptr();
            let kept = printable(owned, NAME_BYTES);
            assert_eq!(kept, text);
            assert_eq!(kept.as_ptr(), pointer);
        }
        let longest = "a".repeat(NAME_BYTES);
        assert_eq!(name(&longest), longest);
    }

    #[test]
    fn long_text_is_cut_with_a_marker_never_inside_an_escape_or_character() {
        let cut = name(&"a".repeat(NAME_BYTES + 1));
        assert_eq!(cut, format!("{}…", "a".repeat(NAME_BYTES - 3)));
        assert_eq!(cut.len(), NAME_BYTES);
        // An escape that no longer fits with the marker is left out whole.
        let text = format!("{}\u{1b}\u{1b}", "a".repeat(NAME_BYTES - 5));
        assert_eq!(name(&text), format!("{}…", "a".repeat(NAME_BYTES - 5)));
        // Multi-byte characters are never split.
        let cut = name(&"é".repeat(200));
        assert!(cut.len() <= NAME_BYTES && cut.ends_with('…'), "{cut}");
        assert_eq!(
            cut.chars().filter(|c| *c == 'é').count(),
            (NAME_BYTES - 3) / 2
        );
        // A huge annotation costs no more than its bound.
        let huge = printable("\u{1b}".repeat(1 << 20), MESSAGE_BYTES);
        assert!(huge.len() <= MESSAGE_BYTES && huge.starts_with("\\x1b\\x1b"));
    }

    #[test]
    fn printable_text_stays_as_it_is() {
        for text in ["\u{1b}[2J", "a\u{202e}b", &"\u{1b}".repeat(300)] {
            let once = name(text);
            assert_eq!(name(&once), once);
            assert_eq!(printable(once.clone(), MESSAGE_BYTES), once);
        }
    }

    #[test]
    fn every_output_is_free_of_control_and_invisible_characters() {
        let all: String = (0..0x3000u32).filter_map(char::from_u32).collect();
        for chunk in all.chars().collect::<Vec<_>>().chunks(97) {
            let text: String = chunk.iter().collect();
            let out = printable(text, MESSAGE_BYTES);
            assert!(
                !out.chars().any(|c| c.is_control() || is_invisible(c)),
                "{out:?}"
            );
            assert!(out.len() <= MESSAGE_BYTES);
        }
    }
}
