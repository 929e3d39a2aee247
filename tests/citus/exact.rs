//! Exact limits across instances and shards.

use serde_json::{json, Value};

use crate::common::{check, login, remaining, unique};
use crate::{admitted, fire, fire_answered, three_instances, ALGORITHMS};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn three_instances_on_one_key_admit_exactly_the_limit_for_every_algorithm() {
    let apps = three_instances().await;
    for algorithm in ALGORITHMS {
        let key = unique("hot");
        let body = json!({ "key": key, "limit": 25, "window": "1h", "algorithm": algorithm });
        let replies = fire(&apps, vec![body; 120]).await;
        assert_eq!(admitted(&replies), 25, "{algorithm}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn three_instances_admit_exactly_the_ip_limit_and_the_email_limit_across_shards() {
    let apps = three_instances().await;
    let ip = format!("10.{}.{}.{}", rand::random::<u8>(), rand::random::<u8>(), rand::random::<u8>());
    let bodies = (0..90).map(|_| login(&format!("{}@example.com", unique("u")), &ip)).collect();
    assert_eq!(admitted(&fire(&apps, bodies).await), 20, "the ip bucket's limit");
    let email = format!("{}@example.com", unique("victim"));
    let bodies = (0..120).map(|n| login(&email, &format!("198.51.{}.{}", n / 200, n % 200))).collect();
    assert_eq!(admitted(&fire(&apps, bodies).await), 50, "the email bucket's limit");
}

/// Checks of three buckets each (on different shards, mostly), many
/// denied by one bucket while the others had room: afterwards every bucket
/// holds exactly what the admitted checks took, so nothing a denied check
/// took was kept, and nothing was admitted past a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn checks_across_shards_stay_all_or_nothing_under_concurrency() {
    let apps = three_instances().await;
    let emails: Vec<String> = (0..4).map(|_| format!("{}@example.com", unique("e"))).collect();
    // Three /64s (an IPv6 value's group) no earlier run on the cluster had.
    let (net, sub) = (rand::random::<u16>(), rand::random::<u16>());
    let ips: Vec<String> = (0..3).map(|i| format!("2001:db8:{net:x}:{:x}::1", sub.wrapping_add(i))).collect();
    let bodies: Vec<Value> = (0..240).map(|n| login(&emails[n % 4], &ips[(n / 4) % 3])).collect();
    let replies = fire_answered(&apps, bodies).await;
    let taken = |f: &dyn Fn(&Value) -> bool| {
        replies.iter().filter(|(allowed, body, _)| *allowed && f(body)).count() as u64
    };
    // What each admitted check with `email` was told of its email bucket:
    // one write each tells each a different figure.
    let told = |email: &str| {
        let mine = replies.iter().filter(|(allowed, b, _)| *allowed && b["identifiers"]["email"] == email);
        mine.map(|(_, _, answer)| remaining(answer, "email")).collect::<Vec<_>>()
    };
    for email in &emails {
        for ip in &ips {
            let peek = check(
                &apps[0],
                json!({ "policy": "login", "cost": 0,
                "identifiers": { "email": email, "ip": ip } }),
            )
            .await;
            let same_email = |b: &Value| b["identifiers"]["email"] == email.as_str();
            let same_ip = |b: &Value| b["identifiers"]["ip"] == ip.as_str();
            assert_eq!(peek.body["store"], "postgres", "the peek read the shards: {}", peek.body);
            let taken_pair = taken(&|b| same_email(b) && same_ip(b));
            assert_eq!(remaining(&peek.body, "email_ip"), 5 - taken_pair, "{}", peek.body);
            assert_eq!(
                remaining(&peek.body, "email"),
                50 - taken(&same_email),
                "{} told {:?}",
                peek.body,
                told(email)
            );
            assert_eq!(remaining(&peek.body, "ip"), 20 - taken(&same_ip), "{}", peek.body);
        }
    }
}

/// The top list in Citus mode: a plain table of the coordinator, never
/// distributed, whose rows sum every instance's denials exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Citus cluster: scripts/test --citus"]
async fn the_top_list_sums_three_instances_denials_in_a_table_of_the_coordinator() {
    let apps = three_instances().await;
    let key = unique("denied");
    let body = json!({ "key": key, "limit": 5, "window": "1h" });
    assert_eq!(admitted(&fire(&apps, vec![body; 20]).await), 5);
    for app in &apps {
        app.top.flush().await.expect("each instance writes its counts");
    }
    let pool = crate::direct(&crate::cluster().0).await;
    let (distributed,): (bool,) = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = 'pglimit_denials'::regclass)",
    )
    .fetch_one(&pool)
    .await
    .expect("citus metadata");
    assert!(!distributed, "pglimit_denials stays a table of the coordinator");
    let (denials,): (Option<i64>,) =
        sqlx::query_as("SELECT sum(count)::bigint FROM pglimit_denials WHERE key = $1")
            .bind(crate::common::adhoc_key(&key).as_slice())
            .fetch_one(&pool)
            .await
            .expect("the top list's table");
    assert_eq!(denials, Some(15));
}
