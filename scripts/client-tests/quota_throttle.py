"""A confluent-kafka (librdkafka) producer offering 10 MB/s under a 1 MB/s producer_byte_rate quota for its
client id, set beforehand with `shardlog quota set` by the Rust test (broker/tests/quotas.rs).

Checks what a user sees: librdkafka's statistics report throttle time from the broker, and the rate of
acknowledged bytes averages at most 1.1 MB/s, measured from one sampled window (the broker runs with
`quota.window.num=2`, 1 s samples) after the throttling began: until then the client may still be
spending the burst its window allowed. Also that the
producer really offered about ten times the quota (so the bound is the broker's doing, not the
producer's). Prints "ok" and the figures; exits non-zero on a failed check.

    python3 quota_throttle.py BOOTSTRAP TOPIC CLIENT_ID
"""

import json
import sys
import time

from confluent_kafka import Producer

bootstrap, topic, client_id = sys.argv[1:4]
QUOTA = 1024 * 1024
OFFERED = 10 * QUOTA
RUN = 12.0
# quota.window.num x quota.window.size.seconds of the test's broker.
WINDOW = 2.0
VALUE = b"q" * 1024

throttle_max_ms = 0
acked = []  # (monotonic time, bytes) of each acknowledged record
failed = []


def on_stats(text):
    global throttle_max_ms
    stats = json.loads(text)
    for broker in stats.get("brokers", {}).values():
        throttle_max_ms = max(throttle_max_ms, broker.get("throttle", {}).get("max", 0))


def on_delivery(err, msg):
    if err is not None:
        failed.append(str(err))
    else:
        acked.append((time.monotonic(), len(msg.value())))


producer = Producer(
    {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "statistics.interval.ms": 500,
        "stats_cb": on_stats,
        "linger.ms": 5,
    }
)

start = time.monotonic()
offered = 0
first_throttled = None
while time.monotonic() - start < RUN:
    # Offer OFFERED bytes per second: send until on schedule, then poll for callbacks.
    due = (time.monotonic() - start) * OFFERED
    while offered < due:
        try:
            producer.produce(topic, VALUE, on_delivery=on_delivery)
            offered += len(VALUE)
        except BufferError:
            break
    producer.poll(0.01)
    if first_throttled is None and throttle_max_ms > 0:
        first_throttled = time.monotonic()
end = time.monotonic()
# What is still queued past the run is not counted: the rate is of what was acknowledged within it.
producer.purge()
producer.flush(10)

errors = []
if failed and not all("purged" in f.lower() for f in failed):
    errors.append(f"deliveries failed: {sorted(set(f for f in failed if 'purged' not in f.lower()))[:3]}")
if first_throttled is None:
    errors.append("librdkafka's statistics never reported throttle time from the broker")
else:
    measured_from = first_throttled + WINDOW
    window = end - measured_from
    moved = sum(size for at, size in acked if measured_from <= at <= end)
    rate = moved / window if window > 0 else 0
    print(f"offered {offered / (end - start) / 1e6:.2f} MB/s; throttled from {first_throttled - start:.1f} s; "
          f"from {measured_from - start:.1f} s acknowledged {moved / 1e6:.2f} MB in {window:.1f} s = "
          f"{rate / 1e6:.3f} MB/s; "
          f"largest throttle_time_ms {throttle_max_ms}")
    if window < 5:
        errors.append(f"throttling began too late to measure ({first_throttled - start:.1f} s into a {RUN} s run)")
    if moved == 0:
        errors.append("nothing was acknowledged while throttled: the quota stopped the producer instead of pacing it")
    if rate > 1.1 * QUOTA:
        errors.append(f"acknowledged {rate:.0f} B/s once throttled, above 1.1 x the quota of {QUOTA} B/s")
    if offered < 5 * QUOTA * (end - start):
        errors.append(f"the producer offered only {offered} bytes in {end - start:.1f} s")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("ok")
