//! One `iptables-save` rule line into a [`Rule`]: shell-like words, then the options
//! kube-proxy's chains use.

use std::net::IpAddr;

use super::{Rule, err};
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

/// Options that take one value; every other option's value, if any, is skipped as an
/// ordinary word.
fn takes_value(word: &str) -> bool {
    matches!(
        word,
        "-d" | "--destination"
            | "-p"
            | "--protocol"
            | "--dport"
            | "--destination-port"
            | "-j"
            | "--jump"
            | "-g"
            | "--goto"
            | "--comment"
            | "--probability"
            | "--to-destination"
            | "--dst-type"
    )
}

pub(super) fn parse_rule(words: &[String], line: usize) -> Result<(String, Rule), RulesError> {
    let chain = words
        .get(1)
        .ok_or_else(|| err(line, "-A without a chain name"))?
        .clone();
    let mut rule = Rule {
        line,
        ..Rule::default()
    };
    let mut negate = false;
    let mut index = 2;
    while index < words.len() {
        let word = words[index].as_str();
        if word == "!" {
            negate = true;
            index += 1;
            continue;
        }
        if takes_value(word) {
            let value = words.get(index + 1).ok_or_else(|| {
                err(
                    line,
                    format!("option {word} has no value (truncated dump?)"),
                )
            })?;
            apply_option(&mut rule, word, value.clone(), negate)?;
            index += 2;
        } else {
            if word == "--rcheck" {
                rule.rcheck = true;
            }
            index += 1;
        }
        negate = false;
    }
    Ok((chain, rule))
}

/// Records one option's value; a negated match (`! -d ...`) selects nothing we model.
fn apply_option(
    rule: &mut Rule,
    word: &str,
    value: String,
    negate: bool,
) -> Result<(), RulesError> {
    match word {
        "-d" | "--destination" if !negate => rule.dst = Some(parse_cidr(&value, rule.line)?),
        "-p" | "--protocol" if !negate => rule.proto = Some(value),
        "--dport" | "--destination-port" if !negate => rule.dport = Some(value),
        "-j" | "--jump" | "-g" | "--goto" => rule.jump = Some(value),
        "--comment" => rule.comment = Some(value),
        "--probability" => rule.probability = Some(value),
        "--to-destination" => rule.to_destination = Some(value),
        "--dst-type" if !negate => rule.dst_local = value == "LOCAL",
        _ => {}
    }
    Ok(())
}

fn parse_cidr(text: &str, line: usize) -> Result<(IpAddr, u8), RulesError> {
    let (ip, prefix) = match text.split_once('/') {
        Some((ip, prefix)) => (ip, Some(prefix)),
        None => (text, None),
    };
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| err(line, format!("-d {text}: not an IP address")))?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        Some(prefix) => prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= full)
            .ok_or_else(|| err(line, format!("-d {text}: bad prefix length")))?,
        None => full,
    };
    Ok((ip, prefix))
}
