//! The fair-DNAT model: exact tails against exact arithmetic, the bounds against the
//! exact values, and the three methods against each other.

use super::*;

const THIRDS: [f64; 3] = [1.0 / 3.0; 3];

fn mix(counts: &[(u64, u64)]) -> RequestMix {
    let mut mix = RequestMix::default();
    for &(requests, connections) in counts {
        for _ in 0..connections {
            mix.add(requests);
        }
    }
    mix
}

fn close(a: f64, b: f64, relative: f64) -> bool {
    (a - b).abs() <= relative * b.abs()
}

#[test]
fn binomial_tails_are_exact() {
    // P(Bin(n, p) >= k), from exact fractions (Python's `fractions`).
    for (n, p, k, expected) in [
        (30, 1.0 / 3.0, 15, 0.043_482_275_727_919_385),
        (600, 1.0 / 3.0, 360, 1.101_263_625_867_864_5e-40),
        (100, 0.1, 20, 0.001_978_560_865_771_231),
    ] {
        let tail = exact_tail(&RequestMix::uniform(n), 1, p);
        assert!(close(tail[k], expected, 1e-9), "{n} {p} {k}: {}", tail[k]);
        assert!(close(tail[0], 1.0, 1e-12));
    }
    // Request counts with a common divisor: W = 10 × Bin(30, 1/3).
    let dnat = FairDnat::new(&THIRDS, &mix(&[(10, 30)])).unwrap();
    assert_eq!(dnat.method(), Method::Exact);
    let Model::Marginals(groups) = dnat.model() else {
        panic!("exact")
    };
    assert!(close(
        groups[0].tail.at_least(150.0),
        0.043_482_275_727_919_385,
        1e-9
    ));
    assert!(close(
        groups[0].tail.at_least(141.0),
        0.043_482_275_727_919_385,
        1e-9
    ));
}

#[test]
fn the_convolution_stopped_at_a_threshold_gives_the_same_tail() {
    let keep_alive = mix(&[(2, 20), (4, 10), (10, 6), (60, 2)]);
    for p in [0.1, 1.0 / 3.0, 0.5] {
        let tail = exact_tail(&keep_alive, 2, p);
        for index in [1, 5, 40, 70, 100, tail.len() - 1] {
            let capped = capped_tail(&keep_alive, 2, p, index);
            assert!(
                close(capped, tail[index], 1e-9),
                "{p} {index}: {capped} {}",
                tail[index]
            );
        }
    }
}

#[test]
fn one_keep_alive_connection_usually_exceeds_any_limit_by_chance() {
    // 30 requests on one connection over three pods: a fair DNAT gives skew 3 always.
    let dnat = FairDnat::new(&THIRDS, &mix(&[(30, 1)])).unwrap();
    assert_eq!(dnat.p_value(3.0).value, 1.0);
    assert!(close(dnat.median(), 3.0, 1e-6), "{}", dnat.median());
    assert!(dnat.usually_above(1.5) && dnat.usually_above(2.9));
    assert!(!dnat.usually_above(3.0));
}

#[test]
fn an_even_spread_of_many_connections_is_within_chance_and_a_lopsided_one_is_not() {
    let dnat = FairDnat::new(&THIRDS, &RequestMix::uniform(600)).unwrap();
    // 360 of 600 on one pod: skew 1.8, p = 3 x 1.1e-40 (the union over pods).
    let p = dnat.p_value(1.8);
    assert!(
        close(p.value, 3.0 * 1.101_263_625_867_864_5e-40, 1e-6),
        "{p:?}"
    );
    assert_eq!(p.to_string(), "p < 1e-6");
    assert!(dnat.beyond_chance(1.8, 0.01));
    assert!(!dnat.beyond_chance(1.1, 0.01));
    assert!(!dnat.usually_above(1.5));
    // The median of the busiest of three Bin(600, 1/3) is about 1.06.
    assert!((1.03..1.09).contains(&dnat.median()), "{}", dnat.median());
}

#[test]
fn chernoff_is_never_below_the_exact_tail() {
    let keep_alive = mix(&[(1, 20), (2, 10), (5, 6), (30, 2)]);
    for (expected, mix) in [
        (THIRDS.to_vec(), keep_alive.clone()),
        (vec![0.1; 10], RequestMix::uniform(100)),
        (vec![0.5, 0.25, 0.25], keep_alive),
    ] {
        let dnat = FairDnat::new(&expected, &mix).unwrap();
        let Model::Marginals(groups) = dnat.model() else {
            panic!("exact")
        };
        for step in 0..40 {
            let skew = 1.0 + step as f64 * 0.1;
            let exact = Reach::of(dnat.tails(groups, skew)).upper;
            let bound = dnat.chernoff(skew);
            assert!(bound >= exact * (1.0 - 1e-9), "{skew}: {bound} < {exact}");
        }
    }
}

#[test]
fn simulation_agrees_with_the_exact_model() {
    let keep_alive = mix(&[(1, 40), (3, 20), (10, 8), (40, 2)]);
    let dnat = FairDnat::new(&[0.25; 4], &keep_alive).unwrap();
    let Model::Marginals(groups) = dnat.model() else {
        panic!("exact")
    };
    let simulated = dnat.simulate(4000);
    let median = simulated[simulated.len() / 2];
    // The exact median is taken from the lower bound, so at most the simulated one.
    assert!(dnat.median() <= median * 1.02, "{} {median}", dnat.median());
    assert!(dnat.median() >= median * 0.9, "{} {median}", dnat.median());
    for skew in [1.4, 1.6, 1.8] {
        let reached = simulated.iter().filter(|s| **s >= skew).count() as f64 / 4000.0;
        let (low, high) = (
            dnat.lower(groups, skew),
            Reach::of(dnat.tails(groups, skew)).upper,
        );
        assert!(
            reached >= low - 0.02 && reached <= high + 0.02,
            "{skew}: {reached} outside {low}..{high}"
        );
    }
    // The same connections get the same answer.
    assert_eq!(dnat.simulate(300), dnat.simulate(300));
}

#[test]
fn the_normal_approximation_agrees_with_the_exact_model_for_many_connections() {
    let many = mix(&[(1, 3000), (2, 2000), (3, 1000)]);
    let dnat = FairDnat::new(&[0.1; 10], &many).unwrap();
    assert_eq!(dnat.method(), Method::Normal);
    let exact = Tail::Exact {
        unit: 1,
        tail: exact_tail(&many, 1, 0.1),
    };
    let Model::Marginals(groups) = dnat.model() else {
        panic!("normal")
    };
    for w in [1000.0, 1100.0, 1150.0, 1200.0] {
        let (normal, exact) = (groups[0].tail.at_least(w), exact.at_least(w));
        assert!((normal - exact).abs() < 0.01, "{w}: {normal} {exact}");
    }
}

#[test]
fn many_connections_beyond_the_exact_budget_are_simulated() {
    // Few effective connections among many: one connection carries 44% of the requests,
    // 5,000 others 1 to 50 each.
    let mut heavy: Vec<(u64, u64)> = (1..=50).map(|r| (r, 100)).collect();
    heavy.push((100_000, 1));
    let dnat = FairDnat::new(&THIRDS, &mix(&heavy)).unwrap();
    assert_eq!(dnat.method(), Method::Simulated);
    // Its pod gets 44% plus a third of the rest: skew about 1.88, give or take little.
    assert!((1.8..2.0).contains(&dnat.median()), "{}", dnat.median());
    assert!(dnat.p_value(1.8).value > 0.5);
    let beyond = dnat.p_value(2.1);
    assert!(beyond.at_most && beyond.value < 0.001, "{beyond:?}");
    // The one-connection share of the model alone would say nothing like it.
    let light: Vec<(u64, u64)> = (1..=50).map(|r| (r, 100)).collect();
    let dnat = FairDnat::new(&THIRDS, &mix(&light)).unwrap();
    assert_eq!(dnat.method(), Method::Normal);
    assert!(dnat.median() < 1.05);
}

#[test]
fn p_values_read_as_people_write_them() {
    let p = |value, at_most| PValue { value, at_most }.to_string();
    assert_eq!(p(0.42, false), "p = 0.42");
    assert_eq!(p(0.031_42, false), "p = 0.031");
    assert_eq!(p(0.004_975, true), "p < 0.0050");
    assert_eq!(p(1.0, false), "p = 1.00");
    assert_eq!(p(3e-9, false), "p < 1e-6");
}

#[test]
fn request_mixes_say_how_concentrated_requests_are() {
    let keep_alive = mix(&[(30, 1), (0, 2)]);
    assert_eq!(keep_alive.busy().connections(), 1);
    assert_eq!(keep_alive.busiest_half(), (1, 30));
    assert_eq!(keep_alive.effective_connections(), 1.0);
    let even = RequestMix::uniform(10);
    assert_eq!(even.effective_connections(), 10.0);
    assert_eq!(even.busiest_half(), (5, 5));
    let mut mixed = mix(&[(10, 1), (1, 10)]);
    assert_eq!(mixed.busiest_half(), (1, 10));
    mixed.subtract(10);
    mixed.subtract(7);
    assert_eq!((mixed.connections(), mixed.requests()), (10, 10));
}
