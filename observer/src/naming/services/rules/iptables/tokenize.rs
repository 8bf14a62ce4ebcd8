//! One `iptables-save` rule line into shell-like words, honouring iptables-save's
//! quoting.

use super::err;
use crate::naming::services::rules::RulesError;

const UNTERMINATED: &str = "unterminated quoted string (truncated dump?)";

/// Splits a rule line like a shell would for iptables-save's quoting: double quotes
/// group words, and `\"` / `\\` escape inside them.
pub(super) fn tokenize(text: &str, line: usize) -> Result<Vec<String>, RulesError> {
    let mut words = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(words);
        }
        let mut word = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() {
                break;
            }
            chars.next();
            if c == '"' {
                read_quoted(&mut chars, &mut word, line)?;
            } else {
                word.push(c);
            }
        }
        words.push(word);
    }
}

/// The rest of a quoted string, after its opening quote, up to and including the closing one.
fn read_quoted(
    chars: &mut impl Iterator<Item = char>,
    word: &mut String,
    line: usize,
) -> Result<(), RulesError> {
    loop {
        match chars.next() {
            None => return Err(err(line, UNTERMINATED)),
            Some('"') => return Ok(()),
            Some('\\') => match chars.next() {
                Some(escaped) => word.push(escaped),
                None => return Err(err(line, UNTERMINATED)),
            },
            Some(other) => word.push(other),
        }
    }
}
