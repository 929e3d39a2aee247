//! Accuracy of each algorithm against the exact sliding log.
//!
//! Replays deterministic request traces (a fixed seed) through the pure
//! algorithm model of `src/algorithm.rs` (the one the memory store runs and
//! the SQL mirrors), with a simulated clock, and compares every decision
//! with the exact sliding log's decision on the same stream. Each algorithm
//! keeps its own state, as it would in production, so a request it admits
//! wrongly also weighs on its later decisions.
//!
//! Run: `cargo run --release --example accuracy` (add `-- --quick` for a
//! smaller trace). Prints a Markdown report.

use pglimit::algorithm::{decide, Algorithm, Params, State};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const LIMIT: u64 = 50;
const WINDOW_US: i64 = 60_000_000;
const SECOND: f64 = 1_000_000.0;

/// How a client sends requests.
#[derive(Clone, Copy)]
enum Shape {
    /// Poisson arrivals at `rate` requests per second.
    Poisson { rate: f64 },
    /// Bursts of `size` requests at 20/s, separated by idle gaps of mean `gap_s`.
    Bursty { size: u32, gap_s: f64 },
}

struct Mix {
    name: &'static str,
    clients: usize,
    /// (share of clients, rate as a multiple of limit/window) for Poisson clients.
    poisson: &'static [(f64, f64, f64)],
    bursty_share: f64,
}

const MIXES: [Mix; 3] = [
    Mix {
        name: "mostly well-behaved (the shape of Cloudflare's measurement: few sources near their limit)",
        clients: 100_000,
        // share, lowest and highest multiple of the limit's rate
        poisson: &[(0.97, 0.01, 0.5), (0.02, 0.5, 1.5), (0.005, 1.5, 10.0)],
        bursty_share: 0.005,
    },
    Mix {
        name: "mixed: a tenth of clients near or over the limit, some bursty",
        clients: 20_000,
        poisson: &[(0.80, 0.02, 0.5), (0.10, 0.5, 1.2), (0.04, 1.2, 5.0)],
        bursty_share: 0.06,
    },
    Mix {
        name: "adversarial: every client hovers near the limit",
        clients: 5_000,
        poisson: &[(0.8, 0.8, 1.5)],
        bursty_share: 0.2,
    },
];

/// The sliding counter's estimate judged on the log's own history
/// (Cloudflare's method): same admitted requests, so only the estimate's
/// error shows, not the drift of two diverging histories.
#[derive(Default, Clone, Copy)]
struct EstimateTally {
    requests: u64,
    wrong: u64,
    /// The same, counting every request (denied ones too), as Cloudflare's
    /// limiter does; pglimit counts admitted requests only.
    wrong_counting_all: u64,
}

#[derive(Default, Clone, Copy)]
struct Tally {
    requests: u64,
    admitted: u64,
    false_allow: u64,
    false_deny: u64,
    worst_ratio: f64,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let duration_s = if quick { 600.0 } else { 3_600.0 };
    println!("# Accuracy against the exact sliding log\n");
    println!(
        "Limit {LIMIT} per {} s; {} simulated minutes per client; seed 42; command: \
         `cargo run --release --example accuracy{}`.\n",
        WINDOW_US / 1_000_000,
        duration_s / 60.0,
        if quick { " -- --quick" } else { "" }
    );
    for mix in &MIXES {
        let clients = if quick { mix.clients / 10 } else { mix.clients };
        report(mix, clients, duration_s);
    }
}

/// The window algorithms, each judged against the exact log; a
/// concurrency bucket limits what is in flight, not a rate.
const WINDOWS: [Algorithm; 4] =
    [Algorithm::FixedWindow, Algorithm::SlidingWindow, Algorithm::SlidingLog, Algorithm::TokenBucket];

fn report(mix: &Mix, clients: usize, duration_s: f64) {
    let mut rng = StdRng::seed_from_u64(42);
    let mut tallies = [Tally::default(); 4];
    let mut estimate = EstimateTally::default();
    for _ in 0..clients {
        let trace = arrivals(shape(mix, &mut rng), duration_s, &mut rng);
        let exact = replay(Algorithm::SlidingLog, &trace);
        judge_estimate(&mut estimate, &trace, &exact);
        for (i, algorithm) in WINDOWS.iter().enumerate() {
            let decisions =
                if *algorithm == Algorithm::SlidingLog { exact.clone() } else { replay(*algorithm, &trace) };
            tally(&mut tallies[i], &trace, &decisions, &exact);
        }
    }
    println!("## {} ({clients} clients, {} requests)\n", mix.name, tallies[0].requests);
    println!("| algorithm | admitted | decided unlike the log | wrongly allowed | wrongly denied | most admitted in any {} s, × limit |", WINDOW_US / 1_000_000);
    println!("|---|---:|---:|---:|---:|---:|");
    for (algorithm, t) in WINDOWS.iter().zip(&tallies) {
        let pct = |n: u64| 100.0 * n as f64 / t.requests.max(1) as f64;
        println!(
            "| {} | {} | {:.4}% | {:.4}% | {:.4}% | {:.2} |",
            algorithm.name(),
            t.admitted,
            pct(t.false_allow + t.false_deny),
            pct(t.false_allow),
            pct(t.false_deny),
            t.worst_ratio
        );
    }
    let share = 100.0 * estimate.wrong as f64 / estimate.requests.max(1) as f64;
    let share_all = 100.0 * estimate.wrong_counting_all as f64 / estimate.requests.max(1) as f64;
    println!(
        "\nSliding counter estimate judged on the exact log's own history (Cloudflare's method): \
         {} of {} requests decided unlike the log ({share:.4}%) counting admitted requests, as pglimit does; \
         {} ({share_all:.4}%) counting every request, as Cloudflare's limiter does.\n",
        estimate.wrong, estimate.requests, estimate.wrong_counting_all
    );
}

/// Replays the log's admitted history and, at each request, asks whether
/// the sliding counter's estimate from that same history would decide alike.
fn judge_estimate(t: &mut EstimateTally, trace: &[i64], exact: &[bool]) {
    let params =
        Params { algorithm: Algorithm::SlidingWindow, limit: LIMIT, window_us: WINDOW_US, calendar: None };
    let mut state: Option<State> = None;
    for (&now, &admitted) in trace.iter().zip(exact) {
        let estimate = decide(params, state.as_ref(), 1, now, admitted);
        t.requests += 1;
        t.wrong += u64::from(estimate.allowed != admitted);
        state = Some(estimate.next);
    }
    t.wrong_counting_all += counting_all_mismatches(trace);
}

/// Estimate and exact count over every request of the trace, admitted or not.
fn counting_all_mismatches(trace: &[i64]) -> u64 {
    let params =
        Params { algorithm: Algorithm::SlidingWindow, limit: LIMIT, window_us: WINDOW_US, calendar: None };
    let (mut state, mut left, mut wrong): (Option<State>, usize, u64) = (None, 0, 0);
    for (right, &now) in trace.iter().enumerate() {
        while trace[left] <= now - WINDOW_US {
            left += 1;
        }
        let exact_allows = ((right - left) as u64) < LIMIT;
        let estimate = decide(params, state.as_ref(), 1, now, true);
        wrong += u64::from(estimate.allowed != exact_allows);
        state = Some(estimate.next);
    }
    wrong
}

fn shape(mix: &Mix, rng: &mut StdRng) -> Shape {
    let limit_rate = LIMIT as f64 / (WINDOW_US as f64 / SECOND);
    let mut pick: f64 = rng.gen();
    if pick < mix.bursty_share {
        return Shape::Bursty {
            size: rng.gen_range(5..(3 * LIMIT as u32)),
            gap_s: rng.gen_range(20.0..300.0),
        };
    }
    pick -= mix.bursty_share;
    let total: f64 = mix.poisson.iter().map(|p| p.0).sum();
    for &(share, low, high) in mix.poisson {
        if pick < share / total * (1.0 - mix.bursty_share) {
            return Shape::Poisson { rate: limit_rate * rng.gen_range(low..high) };
        }
        pick -= share / total * (1.0 - mix.bursty_share);
    }
    Shape::Poisson { rate: limit_rate }
}

/// Arrival times in µs, from a client of `shape` over `duration_s`.
fn arrivals(shape: Shape, duration_s: f64, rng: &mut StdRng) -> Vec<i64> {
    let mut times = Vec::new();
    let start = 1_900_000_000.0 + rng.gen_range(0.0..60.0); // not aligned on a window
    let mut t = 0.0;
    let exp = |rng: &mut StdRng, mean: f64| -> f64 { -mean * (1.0 - rng.gen::<f64>()).ln() };
    while t < duration_s {
        match shape {
            Shape::Poisson { rate } => {
                t += exp(rng, 1.0 / rate);
                times.push(((start + t) * SECOND) as i64);
            }
            Shape::Bursty { size, gap_s } => {
                t += exp(rng, gap_s);
                for i in 0..size {
                    times.push(((start + t + f64::from(i) / 20.0) * SECOND) as i64);
                }
                t += f64::from(size) / 20.0;
            }
        }
    }
    times
}

fn replay(algorithm: Algorithm, trace: &[i64]) -> Vec<bool> {
    let params = Params { algorithm, limit: LIMIT, window_us: WINDOW_US, calendar: None };
    let mut state: Option<State> = None;
    trace
        .iter()
        .map(|&now| {
            let verdict = decide(params, state.as_ref(), 1, now, true);
            if verdict.allowed {
                state = Some(verdict.next);
            }
            verdict.allowed
        })
        .collect()
}

fn tally(t: &mut Tally, trace: &[i64], decisions: &[bool], exact: &[bool]) {
    t.requests += trace.len() as u64;
    for (&got, &want) in decisions.iter().zip(exact) {
        t.admitted += u64::from(got);
        t.false_allow += u64::from(got && !want);
        t.false_deny += u64::from(!got && want);
    }
    t.worst_ratio = t.worst_ratio.max(most_in_any_window(trace, decisions) as f64 / LIMIT as f64);
}

/// The most admitted requests in any window-long span (t - window, t].
fn most_in_any_window(trace: &[i64], decisions: &[bool]) -> usize {
    let admitted: Vec<i64> = trace.iter().zip(decisions).filter(|(_, &d)| d).map(|(&t, _)| t).collect();
    let (mut most, mut left) = (0, 0);
    for right in 0..admitted.len() {
        while admitted[left] <= admitted[right] - WINDOW_US {
            left += 1;
        }
        most = most.max(right - left + 1);
    }
    most
}
