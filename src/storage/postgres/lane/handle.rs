//! The store's handles on its lanes ([`super`]): every lane's
//! connections opened together at start, each lane started as a task, and
//! jobs queued to them.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use tokio::sync::{mpsc, oneshot};

use super::{lane, Job, Task};
use crate::storage::postgres::layout::LaneTarget;
use crate::storage::postgres::session::Session;
use crate::storage::{Answer, Check, StoreError};

/// A lane's queue.
pub(in crate::storage::postgres) struct LaneHandle {
    queue: mpsc::Sender<Job>,
    /// The group (a worker's) whose checks this lane sends straight to its node.
    pub worker: Option<i32>,
}

impl LaneHandle {
    /// Starts a lane on each of `targets`, at most `depth` calls in flight
    /// each; returns them and the health connection.
    pub async fn start_all(
        session: &Arc<Session>,
        targets: Vec<LaneTarget>,
        depth: u32,
    ) -> Result<(Arc<[LaneHandle]>, PgConnection), sqlx::Error> {
        let (conns, health) = open(session, &targets).await?;
        let start = |(target, conns): (LaneTarget, _)| {
            let (queue, jobs) = mpsc::channel(1024);
            tokio::spawn(lane(Arc::clone(session), target.node, jobs, conns, depth as usize));
            LaneHandle { queue, worker: target.worker }
        };
        Ok((targets.into_iter().zip(conns).map(start).collect(), health))
    }

    /// Queues a job; returns where its answer will come.
    pub async fn enqueue(
        &self,
        batch: Check,
        now: Option<DateTime<Utc>>,
        task: Task,
    ) -> Result<oneshot::Receiver<Result<Answer, StoreError>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job { batch, now, task, queued: std::time::Instant::now(), reply };
        if self.queue.send(job).await.is_err() {
            return Err(StoreError::Unreachable("the postgres lanes have stopped".into()));
        }
        Ok(answer)
    }
}

/// The answer a lane sends to a job.
pub(in crate::storage::postgres) async fn answer(
    answer: oneshot::Receiver<Result<Answer, StoreError>>,
) -> Result<Answer, StoreError> {
    answer.await.unwrap_or_else(|_| Err(StoreError::Unreachable("a postgres lane stopped mid-check".into())))
}

/// Opens every lane's connections, and the health connection, now and
/// together: a burst on a cold start would otherwise queue behind a storm
/// of connection handshakes.
async fn open(
    session: &Arc<Session>,
    targets: &[LaneTarget],
) -> Result<(Vec<Vec<PgConnection>>, PgConnection), sqlx::Error> {
    let mut opening = tokio::task::JoinSet::new();
    let each = targets.iter().enumerate().flat_map(|(i, t)| std::iter::repeat_n((Some(i), t), t.width));
    for (lane, target) in each.chain([(None, &LaneTarget::default())]) {
        let (session, node) = (Arc::clone(session), target.node.clone());
        opening.spawn(async move {
            let opened = session.open_on(node.as_ref()).await;
            (lane, opened.map_err(|e| session.layout().unreachable(node.as_ref(), e)))
        });
    }
    let (mut conns, mut health) = (targets.iter().map(|_| Vec::new()).collect::<Vec<_>>(), None);
    while let Some(opened) = opening.join_next().await {
        match opened.map_err(|e| sqlx::Error::Protocol(format!("start-up failed: {e}")))? {
            (Some(lane), conn) => conns[lane].push(conn?),
            (None, conn) => health = Some(conn?),
        }
    }
    Ok((conns, health.ok_or_else(|| sqlx::Error::Protocol("no health connection".into()))?))
}
