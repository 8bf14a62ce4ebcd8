//! Chance or cause: what a fair DNAT of the same connections would give.
//!
//! The fair model: each connection that carried requests keeps its request count and
//! goes to backend j with probability e_j / Σe (e_j: the rules' expected shares),
//! independently of the others. Its skew is max_j (W_j / R) / e_j, W_j the requests the
//! model gives backend j and R all of them, as [`crate::stats`] defines skew.
//!
//! T(s) = P(a fair DNAT gives skew >= s) comes from the distribution of each W_j:
//! - exactly: a binomial when every connection carried as many requests, else the
//!   convolution of one binomial per request count, while that costs at most
//!   `EXACT_BUDGET` steps;
//! - by the normal approximation when requests ride at least `NORMAL_FROM` effective
//!   connections (no connection then weighs enough to matter alone);
//! - otherwise by simulating the model `SIMULATIONS` times from a fixed seed, so that the
//!   same connections always get the same answer.
//!
//! From the per-backend tails t_j, T(s) is bracketed: 1 - Π(1 - t_j) <= T(s) <= Σ t_j
//! (the W_j are negatively associated: what one backend gets, the others do not). The
//! p-value is the upper end (never smaller than the truth, and within T² of it); the
//! median is taken from the lower end, so "a fair DNAT gives skew x or more half the
//! time" holds as said. A Chernoff bound, cheap and never below T(s), answers first when
//! it settles a question alone.

use std::cell::OnceCell;

use super::mix::RequestMix;

/// Steps (a binomial term times a support point) the exact convolution may take.
const EXACT_BUDGET: u64 = 4_000_000;
/// Effective connections from which the normal approximation is used.
const NORMAL_FROM: f64 = 2_000.0;
/// Simulated DNATs of the model (fewer for very many connections, see `simulations`).
const SIMULATIONS: u64 = 4_000;
/// Connections assigned per verdict by simulation, at most (beyond it, fewer runs).
const SIMULATION_BUDGET: u64 = 8_000_000;
/// Simulations never go below this many runs (p-values down to 1/201 stay possible).
const MIN_SIMULATIONS: u64 = 200;
const SEED: u64 = 0x6f62_7365_7276_6572;
/// Skews are ratios of floats: two that differ by less than this much are one.
const TOLERANCE: f64 = 1e-9;

/// How T(s) was computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    Exact,
    Normal,
    Simulated,
}

/// A p-value: `at_most` when only a bound is known (`p < value`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct PValue {
    pub value: f64,
    pub at_most: bool,
}

impl std::fmt::Display for PValue {
    /// `p < 1e-6`, `p = 0.0031`, `p = 0.42`, `p < 0.005`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.value < 1e-6 {
            return f.write_str("p < 1e-6");
        }
        let relation = if self.at_most { "<" } else { "=" };
        let digits = if self.value >= 0.1 {
            2
        } else {
            // Two significant digits.
            (1 - self.value.log10().floor() as i32) as usize
        };
        write!(f, "p {relation} {:.*}", digits, self.value)
    }
}

/// A fair DNAT of one Service's busy connections over its endpoints.
pub struct FairDnat {
    /// Expected shares of the endpoints (positive), as the rules state them.
    expected: Vec<f64>,
    /// The same, as probabilities (summing to 1).
    probs: Vec<f64>,
    /// Connections that carried requests.
    mix: RequestMix,
    requests: u64,
    model: OnceCell<Model>,
}

/// Backends with the same probability, whose W_j have one distribution.
struct Group {
    prob: f64,
    /// Their expected shares (within `TOLERANCE` of each other's probability).
    expected: Vec<f64>,
    tail: Tail,
}

enum Tail {
    /// P(W >= unit·i) for i = 0..=R/unit (`unit`: the request counts' greatest common
    /// divisor, so that W only takes multiples of it).
    Exact {
        unit: u64,
        tail: Vec<f64>,
    },
    Normal {
        mean: f64,
        sd: f64,
    },
}

enum Model {
    Marginals(Vec<Group>),
    /// Simulated skews, ascending.
    Simulated(Vec<f64>),
}

impl FairDnat {
    /// `expected`: the endpoints' expected shares (those not above 0 are left out);
    /// `mix`: the connections to them. `None` without requests or endpoints.
    pub fn new(expected: &[f64], mix: &RequestMix) -> Option<FairDnat> {
        let expected: Vec<f64> = expected.iter().copied().filter(|e| *e > 0.0).collect();
        let mix = mix.busy();
        let requests = mix.requests();
        let sum: f64 = expected.iter().sum();
        if requests == 0 || expected.is_empty() || !sum.is_finite() {
            return None;
        }
        Some(FairDnat {
            probs: expected.iter().map(|e| e / sum).collect(),
            expected,
            mix,
            requests,
            model: OnceCell::new(),
        })
    }

    pub fn connections(&self) -> u64 {
        self.mix.connections()
    }

    pub fn backends(&self) -> usize {
        self.expected.len()
    }

    pub fn method(&self) -> Method {
        match self.model() {
            Model::Simulated(_) => Method::Simulated,
            Model::Marginals(groups) => match groups.first().map(|g| &g.tail) {
                Some(Tail::Normal { .. }) => Method::Normal,
                _ => Method::Exact,
            },
        }
    }

    /// The requests backend j must get for skew `s`.
    fn needed(&self, expected: f64, skew: f64) -> f64 {
        skew * expected * self.requests as f64
    }

    /// A bound never below T(`skew`), from the Chernoff bound of each backend (cheap).
    pub fn chernoff(&self, skew: f64) -> f64 {
        let mut last: Option<(f64, f64, f64)> = None;
        let mut bound = 0.0;
        for (&e, &p) in self.expected.iter().zip(&self.probs) {
            let w = self.needed(e, skew);
            // Endpoints with the same share (the usual case) have the same bound.
            let b = match last {
                Some((lp, lw, lb)) if lp == p && lw == w => lb,
                _ => chernoff(&self.mix, p, w),
            };
            last = Some((p, w, b));
            bound += b;
        }
        bound.min(1.0)
    }

    /// The p-value of an observed skew: the chance that a fair DNAT of these connections
    /// gives `skew` or more.
    pub fn p_value(&self, skew: f64) -> PValue {
        let reach = self.reach(skew);
        // Only a simulation's floor (no simulated DNAT reached it) needs the bound.
        let chernoff = if reach.floor {
            self.chernoff(skew)
        } else {
            1.0
        };
        if chernoff < reach.upper {
            PValue {
                value: chernoff,
                at_most: true,
            }
        } else {
            PValue {
                value: reach.upper,
                at_most: reach.floor,
            }
        }
    }

    /// Whether the skew is beyond chance: its p-value at most `alpha`; the cheap bound
    /// answers alone when it can.
    pub fn beyond_chance(&self, skew: f64, alpha: f64) -> bool {
        self.chernoff(skew) <= alpha || self.reach(skew).upper <= alpha
    }

    /// Whether a fair DNAT of these connections gives more than `limit` at least half
    /// the time: then no DNAT can be trusted to stay under it.
    pub fn usually_above(&self, limit: f64) -> bool {
        let above = limit * (1.0 + 1e-6);
        self.chernoff(above) >= 0.5 && self.reach(above).lower >= 0.5
    }

    /// Bounds on T(`skew`): from the exact tails at this one skew when they are cheap
    /// (a convolution that stops counting at the threshold), else from the model.
    fn reach(&self, skew: f64) -> Reach {
        if self.model.get().is_none()
            && let Some(reach) = self.capped(skew)
        {
            return reach;
        }
        match self.model() {
            Model::Marginals(groups) => Reach::of(self.tails(groups, skew)),
            Model::Simulated(skews) => {
                let reached =
                    skews.len() - skews.partition_point(|s| *s < skew * (1.0 - TOLERANCE));
                let value = (reached as f64 + 1.0) / (skews.len() as f64 + 1.0);
                Reach {
                    lower: value,
                    upper: value,
                    floor: reached == 0,
                }
            }
        }
    }

    /// `reach` from exact tails at `skew` only, when that costs at most `EXACT_BUDGET`.
    fn capped(&self, skew: f64) -> Option<Reach> {
        let unit = self.mix.iter().fold(0, |g, (r, _)| gcd(g, r));
        let top = self.requests / unit;
        let index = |e: f64| {
            let w = self.needed(e, skew) / unit as f64;
            (w - TOLERANCE * w.max(1.0)).ceil().max(0.0) as u64
        };
        let highest = self.expected.iter().map(|e| index(*e)).max()?.min(top + 1);
        if exact_cost(&self.mix, unit, highest) > EXACT_BUDGET {
            return None;
        }
        let mut last: Option<(f64, u64, f64)> = None;
        let tails: Vec<f64> = self
            .expected
            .iter()
            .zip(&self.probs)
            .map(|(&e, &p)| {
                let i = index(e);
                let t = match last {
                    Some((lp, li, lt)) if lp == p && li == i => lt,
                    _ if i == 0 => 1.0,
                    _ if i > top => 0.0,
                    _ => capped_tail(&self.mix, unit, p, i as usize),
                };
                last = Some((p, i, t));
                t
            })
            .collect();
        Some(Reach::of(tails.into_iter()))
    }

    /// A skew that a fair DNAT of these connections reaches or exceeds at least half the
    /// time (the median, from below).
    pub fn median(&self) -> f64 {
        match self.model() {
            Model::Simulated(skews) => skews[skews.len() / 2],
            Model::Marginals(groups) => {
                let (mut low, mut high) = (0.0, self.highest() * (1.0 + TOLERANCE));
                for _ in 0..100 {
                    let mid = (low + high) / 2.0;
                    if self.lower(groups, mid) >= 0.5 {
                        low = mid;
                    } else {
                        high = mid;
                    }
                }
                low
            }
        }
    }

    /// The highest skew possible: everything on the smallest share.
    fn highest(&self) -> f64 {
        self.expected.iter().map(|e| 1.0 / e).fold(0.0, f64::max)
    }

    fn tails(&self, groups: &[Group], skew: f64) -> impl Iterator<Item = f64> {
        groups.iter().flat_map(move |group| {
            group
                .expected
                .iter()
                .map(move |&e| group.tail.at_least(self.needed(e, skew)))
        })
    }

    fn lower(&self, groups: &[Group], skew: f64) -> f64 {
        Reach::of(self.tails(groups, skew)).lower
    }

    fn model(&self) -> &Model {
        self.model.get_or_init(|| self.build())
    }

    fn build(&self) -> Model {
        let n = self.mix.connections();
        let unit = self.mix.iter().fold(0, |g, (r, _)| gcd(g, r));
        let exact = exact_cost(&self.mix, unit, u64::MAX) <= EXACT_BUDGET;
        let normal = self.mix.effective_connections() >= NORMAL_FROM;
        if !exact && !normal {
            let runs = (SIMULATION_BUDGET / n).clamp(MIN_SIMULATIONS, SIMULATIONS);
            return Model::Simulated(self.simulate(runs));
        }
        let mut groups: Vec<Group> = Vec::new();
        for (&e, &p) in self.expected.iter().zip(&self.probs) {
            match groups
                .iter_mut()
                .find(|g| (g.prob - p).abs() <= TOLERANCE * p)
            {
                Some(group) => group.expected.push(e),
                None => groups.push(Group {
                    prob: p,
                    expected: vec![e],
                    tail: if exact {
                        Tail::Exact {
                            unit,
                            tail: exact_tail(&self.mix, unit, p),
                        }
                    } else {
                        let squares: f64 = self
                            .mix
                            .iter()
                            .map(|(r, m)| (r as f64).powi(2) * m as f64)
                            .sum();
                        Tail::Normal {
                            mean: p * self.requests as f64,
                            sd: (p * (1.0 - p) * squares).sqrt(),
                        }
                    },
                }),
            }
        }
        Model::Marginals(groups)
    }

    /// The skews of `runs` fair DNATs, ascending.
    fn simulate(&self, runs: u64) -> Vec<f64> {
        let mut rng = SplitMix64(SEED);
        let mut cumulative: Vec<f64> = self
            .probs
            .iter()
            .scan(0.0, |sum, p| {
                *sum += p;
                Some(*sum)
            })
            .collect();
        if let Some(last) = cumulative.last_mut() {
            *last = f64::INFINITY;
        }
        let total = self.requests as f64;
        let mut got = vec![0u64; self.probs.len()];
        let mut skews: Vec<f64> = (0..runs)
            .map(|_| {
                got.fill(0);
                for (r, m) in self.mix.iter() {
                    for _ in 0..m {
                        let u = rng.unit();
                        got[cumulative.partition_point(|c| *c <= u)] += r;
                    }
                }
                got.iter()
                    .zip(&self.expected)
                    .map(|(w, e)| *w as f64 / total / e)
                    .fold(0.0, f64::max)
            })
            .collect();
        skews.sort_by(f64::total_cmp);
        skews
    }
}

impl Tail {
    /// P(W >= w).
    fn at_least(&self, w: f64) -> f64 {
        match self {
            Tail::Exact { unit, tail } => {
                let w = w / *unit as f64;
                let index = (w - TOLERANCE * w.max(1.0)).ceil();
                if index <= 0.0 {
                    1.0
                } else if index >= tail.len() as f64 {
                    0.0
                } else {
                    tail[index as usize]
                }
            }
            Tail::Normal { mean, sd } => upper_normal((w - mean) / sd),
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The steps of `exact_tail` (or of `capped_tail` at `cap`): each binomial's terms times
/// the support so far.
fn exact_cost(mix: &RequestMix, unit: u64, cap: u64) -> u64 {
    let (mut support, mut cost) = (1u64, 0u64);
    for (r, m) in mix.iter() {
        cost = cost.saturating_add(support.saturating_mul(m + 1));
        support = support
            .saturating_add((r / unit).saturating_mul(m))
            .min(cap.saturating_add(1));
    }
    cost
}

/// P(W >= unit·index) exactly, W as in `exact_tail`: the convolution keeps the support
/// below `index` apart and all mass at or above it as one state.
fn capped_tail(mix: &RequestMix, unit: u64, p: f64, index: usize) -> f64 {
    let mut pmf = vec![0.0; index + 1];
    pmf[0] = 1.0;
    let mut top = 0;
    for (r, m) in mix.iter() {
        let terms = binomial(m, p);
        let mut from = terms.clone();
        for x in (0..from.len().saturating_sub(1)).rev() {
            from[x] += from[x + 1];
        }
        let r = (r / unit) as usize;
        let mut next = vec![0.0; index + 1];
        next[index] = pmf[index];
        // The support so far, without the state at `index` (carried over above).
        let below = top.min(index) + usize::from(top < index);
        for (i, &a) in pmf[..below].iter().enumerate() {
            if a < 1e-300 {
                continue;
            }
            for (x, &b) in terms.iter().enumerate() {
                let j = i + r * x;
                if j >= index {
                    next[index] += a * from[x];
                    break;
                }
                next[j] += a * b;
            }
        }
        top = (top + r * m as usize).min(index);
        pmf = next;
    }
    pmf[index]
}

/// Bounds on T(s) from the per-backend tails (see the module doc).
struct Reach {
    lower: f64,
    upper: f64,
    /// Simulated, and no simulated DNAT reached it: `upper` is the smallest p possible.
    floor: bool,
}

impl Reach {
    fn of(tails: impl Iterator<Item = f64>) -> Reach {
        let (mut sum, mut none) = (0.0, 1.0);
        for t in tails {
            sum += t;
            none *= 1.0 - t;
        }
        Reach {
            lower: 1.0 - none,
            // Shares that sum to 1 up to rounding make a certainty read 0.9999999999999999.
            upper: if sum > 1.0 - TOLERANCE { 1.0 } else { sum },
            floor: false,
        }
    }
}

/// P(W >= unit·i) for i = 0..=R/unit, W the requests a backend of probability `p` gets:
/// the convolution of one binomial per request count, summed from the top (so that
/// tiny tails keep their digits).
fn exact_tail(mix: &RequestMix, unit: u64, p: f64) -> Vec<f64> {
    let mut pmf = vec![1.0];
    for (r, m) in mix.iter() {
        let terms = binomial(m, p);
        let r = (r / unit) as usize;
        let mut next = vec![0.0; pmf.len() + r * (terms.len() - 1)];
        for (i, &a) in pmf.iter().enumerate() {
            if a < 1e-300 {
                continue;
            }
            for (x, &b) in terms.iter().enumerate() {
                next[i + r * x] += a * b;
            }
        }
        pmf = next;
    }
    let mut tail = vec![0.0; pmf.len()];
    let mut sum = 0.0;
    for (w, mass) in pmf.iter().enumerate().rev() {
        sum += mass;
        tail[w] = sum.min(1.0);
    }
    tail
}

/// The binomial(m, p) probabilities of 0..=m, computed in logs (no underflow of (1-p)^m
/// for large m).
fn binomial(m: u64, p: f64) -> Vec<f64> {
    if p >= 1.0 {
        let mut terms = vec![0.0; m as usize + 1];
        terms[m as usize] = 1.0;
        return terms;
    }
    let odds = (p / (1.0 - p)).ln();
    let mut log = m as f64 * (-p).ln_1p();
    let mut terms = Vec::with_capacity(m as usize + 1);
    for x in 0..=m {
        terms.push(log.exp());
        log += ((m - x) as f64 / (x + 1) as f64).ln() + odds;
    }
    terms
}

/// Chernoff's bound on P(W >= w) for a backend of probability `p`: min over θ >= 0 of
/// e^(-θw) E[e^(θW)], E[e^(θW)] = Π_r (1 - p + p e^(θr))^m.
fn chernoff(mix: &RequestMix, p: f64, w: f64) -> f64 {
    let total = mix.requests() as f64;
    if w <= p * total {
        return 1.0;
    }
    if w > total * (1.0 + TOLERANCE) {
        return 0.0;
    }
    // log E[e^(θW)] - θw and its slope, without overflow for large θr.
    let value = |theta: f64| -> (f64, f64) {
        let (mut log_mgf, mut mean) = (0.0, 0.0);
        for (r, m) in mix.iter() {
            let tr = theta * r as f64;
            let (m, r) = (m as f64, r as f64);
            log_mgf += m * (tr + (p + (1.0 - p) * (-tr).exp()).ln());
            mean += m * r / (1.0 + (1.0 - p) / p * (-tr).exp());
        }
        (log_mgf - theta * w, mean - w)
    };
    // The slope rises from p·R - w < 0: find where it crosses 0 (or go far right).
    let (mut low, mut high) = (0.0, 1.0 / mix.busiest().max(1) as f64);
    while value(high).1 < 0.0 && high < 1e6 {
        low = high;
        high *= 2.0;
    }
    for _ in 0..80 {
        let mid = (low + high) / 2.0;
        if value(mid).1 < 0.0 {
            low = mid;
        } else {
            high = mid;
        }
    }
    value(high).0.exp().min(1.0)
}

/// P(Z >= z) for a standard normal Z (Numerical Recipes' erfc, relative error < 1.2e-7).
fn upper_normal(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let poly = -x * x - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 {
        erfc / 2.0
    } else {
        1.0 - erfc / 2.0
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): small, fast, and the same numbers everywhere.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
#[path = "tests/chance.rs"]
mod tests;
