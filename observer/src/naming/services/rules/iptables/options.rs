//! An `-A CHAIN ...` rule's options into the program's statements: addresses,
//! protocol and ports, and the match modules kube-proxy uses (`comment`, `statistic`,
//! `recent`, `addrtype`, `mark`, `conntrack`); then its target (`-j`/`-g`: a chain,
//! `DNAT`, `REJECT`, `DROP`, `ACCEPT`, `RETURN`, marks and logs). A module observer does
//! not model becomes an opaque match, which the evaluator splits on and names.

use std::net::{IpAddr, SocketAddr};

use super::err;
use crate::naming::services::rules::RulesError;
use crate::naming::services::rules::program::{
    Bytes, CT_STATE_NEW, CmpOp, Cond, Expr, Family, Field, RTN_LOCAL, Rule, Stmt, Verdict,
};

/// Options that must have a value: one at the end of a line means a cut dump.
const NEEDS_VALUE: [&str; 14] = [
    "-s",
    "-d",
    "-p",
    "--dport",
    "--sport",
    "-j",
    "-g",
    "--comment",
    "--probability",
    "--to-destination",
    "--dst-type",
    "--src-type",
    "--mark",
    "--ctstate",
];

/// One option with its values and whether `!` preceded it.
struct Opt<'a> {
    name: &'a str,
    values: Vec<&'a str>,
    negated: bool,
}

/// The chain and rule of one `-A` line's words.
pub(super) fn parse_rule(
    family: Family,
    words: &[String],
    line: usize,
) -> Result<(String, Rule), RulesError> {
    let chain = words
        .get(1)
        .ok_or_else(|| err(line, "-A without a chain name"))?
        .clone();
    let options = options(&words[2..], line)?;
    let mut rule = Rule {
        origin: format!("iptables-save line {line}"),
        ..Rule::default()
    };
    let mut target: Option<(&str, bool)> = None;
    let mut target_options: Vec<&Opt<'_>> = Vec::new();
    let mut statistic_mode = "random";
    for opt in &options {
        if target.is_some() {
            target_options.push(opt);
            continue;
        }
        let value = opt.values.first().copied().unwrap_or_default();
        let negated = opt.negated;
        let stmt = match opt.name {
            "-j" | "--jump" => {
                target = Some((value, false));
                continue;
            }
            "-g" | "--goto" => {
                target = Some((value, true));
                continue;
            }
            "-m" | "--match" => continue,
            "--comment" => {
                rule.comment = Some(value.to_owned());
                continue;
            }
            "-s" | "--source" => addr_match(family, Field::Saddr, value, negated, line)?,
            "-d" | "--destination" => addr_match(family, Field::Daddr, value, negated, line)?,
            "-p" | "--protocol" => cmp(
                Expr::Field(Field::L4Proto),
                negated,
                vec![proto(value, line)?],
            ),
            "--dport" | "--destination-port" => port_match(Field::Dport, value, negated, line)?,
            "--sport" | "--source-port" => port_match(Field::Sport, value, negated, line)?,
            "--mode" => {
                statistic_mode = if value == "nth" { "nth" } else { "random" };
                continue;
            }
            "--probability" if statistic_mode == "random" => {
                Cond::Probability(probability(value, line)?)
            }
            // Every Nth connection: over connections, 1/N of them.
            "--every" => match value.parse::<u32>() {
                Ok(n) if n > 0 => Cond::Probability(1.0 / f64::from(n)),
                _ => Cond::Opaque(format!("--every {value}")),
            },
            "--packet" => continue,
            "--rcheck" | "--update" => Cond::Recent { seconds: None },
            "--seconds" => {
                // Belongs to the `recent` check just before it.
                if let Some(Stmt::Match(Cond::Recent { seconds })) = rule.stmts.last_mut() {
                    *seconds = value.parse().ok();
                }
                continue;
            }
            // `recent --set`: bookkeeping for affinity; `--name`, `--mask`, `--rsource`,
            // `--reap`: its parameters.
            "--set" | "--name" | "--mask" | "--rsource" | "--rdest" | "--reap" | "--rttl" => {
                continue;
            }
            "--dst-type" => addr_type(false, value, negated),
            "--src-type" => addr_type(true, value, negated),
            "--mark" => mark(value, negated, line)?,
            "--ctstate" | "--state" => ct_state(value, negated),
            "--nfacct-name" => continue,
            _ => Cond::Opaque(text(opt)),
        };
        rule.stmts.push(Stmt::Match(stmt));
    }
    let Some((target, goto)) = target else {
        return Ok((chain, rule));
    };
    rule.stmts
        .extend(target_stmts(family, target, goto, &target_options, line)?);
    Ok((chain, rule))
}

fn options(words: &[String], line: usize) -> Result<Vec<Opt<'_>>, RulesError> {
    let mut out = Vec::new();
    let mut negated = false;
    let mut index = 0;
    while index < words.len() {
        let word = words[index].as_str();
        index += 1;
        if word == "!" {
            negated = true;
            continue;
        }
        let mut values = Vec::new();
        while let Some(next) = words.get(index) {
            if next == "!" || (next.starts_with('-') && next.len() > 1 && !is_number(next)) {
                break;
            }
            values.push(next.as_str());
            index += 1;
        }
        if values.is_empty() && NEEDS_VALUE.contains(&word) {
            return Err(err(
                line,
                format!("option {word} has no value (truncated dump?)"),
            ));
        }
        out.push(Opt {
            name: word,
            values,
            negated,
        });
        negated = false;
    }
    Ok(out)
}

fn is_number(word: &str) -> bool {
    word[1..].chars().all(|c| c.is_ascii_digit() || c == '.')
}

fn text(opt: &Opt<'_>) -> String {
    let mut out = String::new();
    if opt.negated {
        out.push_str("! ");
    }
    out.push_str(opt.name);
    for value in &opt.values {
        out.push(' ');
        out.push_str(value);
    }
    out
}

fn cmp(left: Expr, negated: bool, right: Bytes) -> Cond {
    Cond::Cmp {
        left,
        op: if negated { CmpOp::Ne } else { CmpOp::Eq },
        right,
    }
}

/// `-s`/`-d ADDR[/LEN]`.
fn addr_match(
    family: Family,
    field: Field,
    text: &str,
    negated: bool,
    line: usize,
) -> Result<Cond, RulesError> {
    let (ip, prefix) = cidr(text, line)?;
    if Family::of(ip) != family {
        return Err(err(
            line,
            format!("{text}: not an address of this table's family"),
        ));
    }
    let bytes = crate::naming::services::rules::program::eval::octets(ip);
    let full = bytes.len() * 8;
    if usize::from(prefix) == full {
        return Ok(cmp(Expr::Field(field), negated, bytes));
    }
    let (low, high) = prefix_range(&bytes, usize::from(prefix));
    Ok(Cond::Range {
        left: Expr::Field(field),
        low,
        high,
        negated,
    })
}

fn prefix_range(addr: &[u8], prefix: usize) -> (Bytes, Bytes) {
    let mut low = addr.to_vec();
    let mut high = addr.to_vec();
    for (i, (l, h)) in low.iter_mut().zip(high.iter_mut()).enumerate() {
        let keep = prefix.saturating_sub(i * 8).min(8);
        let mask = if keep == 0 { 0 } else { 0xffu8 << (8 - keep) };
        *l &= mask;
        *h |= !mask;
    }
    (low, high)
}

fn cidr(text: &str, line: usize) -> Result<(IpAddr, u8), RulesError> {
    let (ip, prefix) = match text.split_once('/') {
        Some((ip, prefix)) => (ip, Some(prefix)),
        None => (text, None),
    };
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| err(line, format!("{text}: not an IP address")))?;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        // iptables-save prints a mask as dotted quads for non-prefix masks: not modeled.
        Some(prefix) => prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= full)
            .ok_or_else(|| err(line, format!("{text}: bad prefix length")))?,
        None => full,
    };
    Ok((ip, prefix))
}

fn proto(text: &str, line: usize) -> Result<u8, RulesError> {
    Ok(match text {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" => 1,
        "ipv6-icmp" | "icmpv6" => 58,
        other => other
            .parse()
            .map_err(|_| err(line, format!("-p {other}: not a protocol")))?,
    })
}

/// `--dport N` or `--dport A:B`.
fn port_match(field: Field, text: &str, negated: bool, line: usize) -> Result<Cond, RulesError> {
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| err(line, format!("--dport {text}: not a port number")))
    };
    Ok(match text.split_once(':') {
        Some((low, high)) => Cond::Range {
            left: Expr::Field(field),
            low: port(low)?.to_be_bytes().to_vec(),
            high: port(high)?.to_be_bytes().to_vec(),
            negated,
        },
        None => cmp(
            Expr::Field(field),
            negated,
            port(text)?.to_be_bytes().to_vec(),
        ),
    })
}

fn probability(text: &str, line: usize) -> Result<f64, RulesError> {
    text.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=1.0).contains(p))
        .ok_or_else(|| err(line, format!("--probability {text}: not a probability")))
}

/// `-m addrtype --dst-type LOCAL` (or `--src-type`).
fn addr_type(source: bool, value: &str, negated: bool) -> Cond {
    match value {
        "LOCAL" => cmp(
            Expr::FibType { source },
            negated,
            RTN_LOCAL.to_ne_bytes().to_vec(),
        ),
        other => Cond::Opaque(format!(
            "--{}-type {other}",
            if source { "src" } else { "dst" }
        )),
    }
}

/// `-m mark --mark VALUE[/MASK]`.
fn mark(text: &str, negated: bool, line: usize) -> Result<Cond, RulesError> {
    let number = |t: &str| {
        let parsed = match t.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => t.parse(),
        };
        parsed.map_err(|_| err(line, format!("--mark {text}: not a mark")))
    };
    let (value, mask) = match text.split_once('/') {
        Some((value, mask)) => (number(value)?, number(mask)?),
        None => (number(text)?, u32::MAX),
    };
    Ok(cmp(
        Expr::Bitwise {
            of: Box::new(Expr::Mark),
            mask: mask.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        },
        negated,
        value.to_ne_bytes().to_vec(),
    ))
}

/// `-m conntrack --ctstate A,B`: any of these states. SNAT and DNAT are not states of a
/// connection's first packet before NAT.
fn ct_state(text: &str, negated: bool) -> Cond {
    let mut mask = 0u32;
    for state in text.split(',') {
        mask |= match state {
            "INVALID" => 1,
            "ESTABLISHED" => 2,
            "RELATED" => 4,
            "NEW" => CT_STATE_NEW,
            "UNTRACKED" => 64,
            _ => 0,
        };
    }
    Cond::Cmp {
        left: Expr::Bitwise {
            of: Box::new(Expr::CtState),
            mask: mask.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        },
        op: if negated { CmpOp::Eq } else { CmpOp::Ne },
        right: vec![0; 4],
    }
}

/// The target's statements.
fn target_stmts(
    family: Family,
    target: &str,
    goto: bool,
    options: &[&Opt<'_>],
    line: usize,
) -> Result<Vec<Stmt>, RulesError> {
    let option = |name: &str| {
        options
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.values.first().copied())
    };
    Ok(match target {
        "ACCEPT" => vec![Stmt::Verdict(Verdict::Accept)],
        "DROP" => vec![Stmt::Verdict(Verdict::Drop)],
        "REJECT" => vec![Stmt::Verdict(Verdict::Reject)],
        "RETURN" => vec![Stmt::Verdict(Verdict::Return)],
        "MASQUERADE" | "SNAT" => vec![Stmt::Verdict(Verdict::Accept)],
        "MARK" | "CONNMARK" | "LOG" | "NFLOG" | "NOTRACK" | "CT" | "TRACE" => vec![Stmt::Inert],
        "DNAT" => match option("--to-destination") {
            Some(to) => vec![dnat(family, to, line)?],
            None => vec![Stmt::Opaque("-j DNAT without --to-destination".to_owned())],
        },
        chain if goto => vec![Stmt::Verdict(Verdict::Goto(chain.to_owned()))],
        chain => vec![Stmt::Verdict(Verdict::Jump(chain.to_owned()))],
    })
}

/// `--to-destination IP:PORT`, `[IP6]:PORT` or `IP`; ranges (Docker's `A-B:P-Q`) are
/// not followed.
fn dnat(family: Family, to: &str, line: usize) -> Result<Stmt, RulesError> {
    if let Ok(socket) = to.parse::<SocketAddr>() {
        if Family::of(socket.ip()) != family {
            return Err(err(
                line,
                format!("--to-destination {to}: another address family"),
            ));
        }
        return Ok(Stmt::Dnat {
            addr: Expr::Const(crate::naming::services::rules::program::eval::octets(
                socket.ip(),
            )),
            port: Some(Expr::Const(socket.port().to_be_bytes().to_vec())),
        });
    }
    if let Ok(ip) = to.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
        return Ok(Stmt::Dnat {
            addr: Expr::Const(crate::naming::services::rules::program::eval::octets(ip)),
            port: None,
        });
    }
    if to.contains('-') {
        return Ok(Stmt::Opaque(format!("-j DNAT --to-destination {to}")));
    }
    Err(err(line, format!("--to-destination {to}: not ip:port")))
}
