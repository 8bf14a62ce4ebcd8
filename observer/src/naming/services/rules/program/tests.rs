//! The evaluator on small hand-made programs (every layout fixture is tested in
//! `rules::tests`).

use super::eval::{Daddr, Packet, Target};
use super::frontends::{Plan, TCP};
use super::*;

fn dnat_rule(addr: [u8; 4], port: u16) -> Rule {
    Rule {
        stmts: vec![Stmt::Dnat {
            addr: Expr::Const(addr.to_vec()),
            port: Some(Expr::Const(port.to_be_bytes().to_vec())),
        }],
        ..Rule::default()
    }
}

#[test]
fn numgen_map_lookups_split_connections_evenly() {
    let mut program = Program::new(Family::V4);
    let map = Set::new(
        (0u32..3)
            .map(|n| Element {
                key: n.to_ne_bytes().to_vec(),
                key_end: None,
                data: Some(Data::Value(vec![10, 0, 0, n as u8 + 1, 0, 80, 0, 0])),
                comment: None,
            })
            .collect(),
    );
    let lookup = Expr::Lookup {
        key: Box::new(Expr::Numgen {
            modulus: 4,
            offset: 0,
        }),
        map: SetRef::Inline(Arc::new(map)),
    };
    program.chains.insert(
        "prerouting".to_owned(),
        Chain {
            base: Some(Base {
                kind: ChainType::Nat,
                hook: Hook::Prerouting,
                priority: -100,
            }),
            rules: vec![
                Rule {
                    stmts: vec![Stmt::Dnat {
                        addr: Expr::Slice {
                            of: Box::new(lookup.clone()),
                            offset: 0,
                            len: 4,
                        },
                        port: Some(Expr::Slice {
                            of: Box::new(lookup),
                            offset: 4,
                            len: 2,
                        }),
                    }],
                    ..Rule::default()
                },
                // Number 3 has no element: that quarter falls through to here.
                dnat_rule([10, 0, 0, 9], 8080),
            ],
        },
    );
    let plan = Plan::new(&[&program]);
    let branches = plan.run(Packet {
        daddr: Daddr::Addr("10.96.0.1".parse().unwrap()),
        proto: TCP,
        dport: 80,
    });
    let mut got: Vec<(String, f64)> = branches
        .iter()
        .map(|b| match &b.target {
            Target::Dnat(to) => (to.to_string(), b.probability),
            other => (format!("{other:?}"), b.probability),
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        [
            ("10.0.0.1:80".to_owned(), 0.25),
            ("10.0.0.2:80".to_owned(), 0.25),
            ("10.0.0.3:80".to_owned(), 0.25),
            ("10.0.0.9:8080".to_owned(), 0.25),
        ]
    );
}
