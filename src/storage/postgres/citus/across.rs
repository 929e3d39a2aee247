//! A check whose buckets are on several workers: each worker's part sent on
//! that worker's lane, all at once; if any part is denied or fails, the
//! parts that took their cost give it back before the check is answered, so
//! the check stays all or nothing without a transaction across nodes.

use chrono::{DateTime, Utc};

use super::parts::{merge, WorkerCheck};
use crate::storage::postgres::lane::{self, LaneHandle, Task};
use crate::storage::{Answer, Check, StoreError};

/// Decides `check`, split into `parts`, on `lanes` (at least one).
pub(in crate::storage::postgres) async fn submit(
    lanes: &[LaneHandle],
    parts: Vec<WorkerCheck>,
    check: &Check,
    now: Option<DateTime<Utc>>,
) -> Result<Answer, StoreError> {
    if lanes.is_empty() {
        return Err(StoreError::Unreachable("no postgres lanes".into()));
    }
    // A worker's checks on lanes of their own: one call per worker per batch.
    // A worker that joined after start-up is reached through another
    // node, which delegates the call onward.
    let lane_of = |part: &WorkerCheck| {
        let direct = lanes.iter().find(|lane| lane.worker == Some(part.worker));
        direct.unwrap_or(&lanes[part.worker.unsigned_abs() as usize % lanes.len()])
    };
    let mut pending = Vec::with_capacity(parts.len());
    for part in &parts {
        pending.push(lane_of(part).enqueue(part.batch.clone(), now, Task::Check).await);
    }
    let mut answers = Vec::with_capacity(parts.len());
    for sent in pending {
        answers.push(match sent {
            Ok(answer) => lane::answer(answer).await,
            Err(e) => Err(e),
        });
    }
    let whole = answers.iter().all(|a| a.as_ref().is_ok_and(Answer::allowed));
    let took: Vec<bool> = answers.iter().map(|a| !whole && a.as_ref().is_ok_and(Answer::allowed)).collect();
    let given_back = parts.iter().zip(&answers).zip(&took).filter(|(_, &t)| t);
    give_back(
        given_back.filter_map(|((part, answer), _)| Some((lane_of(part), part, answer.as_ref().ok()?))),
    )
    .await;
    let answers = answers.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(merge(check, &parts, answers, &took))
}

/// Refunds, on each part's lane, what the part took, as its answer says.
async fn give_back<'a>(taken: impl Iterator<Item = (&'a LaneHandle, &'a WorkerCheck, &'a Answer)>) {
    let mut refunds = Vec::new();
    for (lane, part, answer) in taken {
        let task = Task::Refund(answer.clone());
        refunds.push(lane.enqueue(part.batch.clone(), None, task).await);
    }
    for refund in refunds {
        if let Err(e) = async { lane::answer(refund?).await }.await {
            // What was not given back stays counted: a bucket may deny
            // early until its window ends, never admit too much.
            tracing::warn!(error = %e, "Citus: a refund failed");
        }
    }
}
