# bench/ab's AB_SLOW line: the slowest 0.1% of a measurement's checks, from
# pglimit's GET /admin/slow-checks (the input), given wrk's request count
# ($requests) and the line's head ($head). bench/report/src/slow.rs computes the
# same for bench/run: keep the two alike.
#
# 0.1% is $requests / 1000 rounded up; fewer when the log kept fewer (its
# capacity, said on the line). Per phase, the median (the lower one of an
# even count) and the max in ms; "dominated" counts the checks whose largest
# phase was each (a tie goes to the earlier of queue, call, rest).

def ms: . / 10 | round / 100;
def median: sort | .[(length - 1) / 2 | floor];
def phase($field): map(.[$field]) | "\(median | ms)/\(max | ms)";
def dominant: [.queue_us, .call_us, .rest_us] as $v | ["queue", "call", "rest"][$v | index($v | max)];

(($requests / 1000) | ceil) as $want
| .capacity as $capacity
| .checks[:$want] as $top
| ($top | length) as $n
| if $n == 0 then "\($head)  slow: the log held no check"
  else
    ($top | map(dominant)) as $dominant
    | def count($phase): $dominant | map(select(. == $phase)) | length;
    "\($head)  slowest \($n) of \($requests)"
    + (if $want > $capacity then " (capped at the log's \($capacity) of \($want))"
       elif $n < $want then " (the log held \($n) of \($want))"
       else "" end)
    + "  ms p50/max: total=\($top | phase("total_us"))  queue=\($top | phase("queue_us"))"
    + "  call=\($top | phase("call_us"))  rest=\($top | phase("rest_us"))"
    + "  dominated: queue=\(count("queue")) call=\(count("call")) rest=\(count("rest"))"
  end
