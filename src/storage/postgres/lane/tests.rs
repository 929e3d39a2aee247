//! When a lane's next batch goes: at once, or after gathering.

use super::*;

fn waiting(n: usize) -> Waiting {
    let jobs = (0..n)
        .map(|_| Job {
            batch: Check {
                buckets: Vec::new(),
                cost: 1,
                fallback: crate::storage::MemoryFallback::Refuse,
                lease: None,
            },
            now: None,
            task: Task::Check,
            queued: Instant::now(),
            reply: oneshot::channel().0,
        })
        .collect();
    Waiting { jobs }
}

#[test]
fn a_call_that_answered_one_check_with_none_waiting_makes_the_next_go_at_once() {
    assert_eq!(Linger::after(1, 0, Instant::now()), None);
    assert_eq!(Linger::after(0, 1, Instant::now()), None);
}

#[test]
fn after_a_call_of_a_few_checks_the_next_waits_for_as_many_as_were_in_play() {
    let now = Instant::now();
    let linger = Linger::after(2, 1, now).expect("a gathering");
    assert_eq!(linger, Linger { until: now + LINGER_FOR, target: 3 });
    assert!(linger.holds(now, &waiting(2)));
    assert!(!linger.holds(now, &waiting(3)), "all are back: go");
    assert!(!linger.holds(now + LINGER_FOR, &waiting(1)), "no check waits longer than LINGER_FOR");
}

#[test]
fn under_load_calls_fill_without_waiting() {
    assert!(Linger::after(LINGER_UP_TO, 0, Instant::now()).is_some());
    assert_eq!(Linger::after(LINGER_UP_TO, 1, Instant::now()), None);
    assert_eq!(Linger::after(30, 20, Instant::now()), None);
}
