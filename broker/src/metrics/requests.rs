//! Per shard: Kafka requests by API (count, latency, errors by code), records and bytes produced and
//! fetched. The handles are registered once per shard thread and kept in a thread-local (see the parent
//! module); an API's or error's handles are registered the first time it is seen on the shard.

use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, ResponseKind};
use metrics::{Counter, Histogram, Label};

const REQUESTS: &str = "shardlog_kafka_requests_total";
const REQUEST_SECONDS: &str = "shardlog_kafka_request_seconds";
const ERRORS: &str = "shardlog_kafka_errors_total";
const PRODUCED_RECORDS: &str = "shardlog_produce_records_total";
const PRODUCED_BYTES: &str = "shardlog_produce_bytes_total";
const FETCHED_RECORDS: &str = "shardlog_fetch_records_total";
const FETCHED_BYTES: &str = "shardlog_fetch_bytes_total";
const READAHEAD_STARTED: &str = "shardlog_fetch_readahead_started_total";
const READAHEAD_USED: &str = "shardlog_fetch_readahead_used_total";
const FETCHES_HELD: &str = "shardlog_fetch_held_total";
const QUOTA_THROTTLED: &str = "shardlog_quota_throttled_total";
const QUOTA_THROTTLE_MS: &str = "shardlog_quota_throttle_ms_total";

struct ShardHandles {
    shard: String,
    /// By API key: requests answered, and how long each took from its frame's arrival to its answer.
    requests: RefCell<HashMap<i16, (Counter, Histogram)>>,
    /// By API key and error code.
    errors: RefCell<HashMap<(i16, i16), Counter>>,
    produced_records: Counter,
    produced_bytes: Counter,
    fetched_records: Counter,
    fetched_bytes: Counter,
    readahead_started: Counter,
    readahead_used: Counter,
    /// Fetches held for `fetch.min.bytes`, answered early and expired at `max.wait.ms`.
    held_answered: Counter,
    held_expired: Counter,
}

thread_local! {
    static SHARD: OnceCell<ShardHandles> = const { OnceCell::new() };
}

/// Registers the calling shard thread's handles (and its storage's, see [`shardlog_storage::metrics`]).
pub fn register_shard(shard: usize) {
    describe();
    let label = shard.to_string();
    shardlog_storage::metrics::register_thread(vec![Label::new("shard", label.clone())]);
    SHARD.with(|cell| {
        cell.get_or_init(|| ShardHandles {
            produced_records: metrics::counter!(PRODUCED_RECORDS, "shard" => label.clone()),
            produced_bytes: metrics::counter!(PRODUCED_BYTES, "shard" => label.clone()),
            fetched_records: metrics::counter!(FETCHED_RECORDS, "shard" => label.clone()),
            fetched_bytes: metrics::counter!(FETCHED_BYTES, "shard" => label.clone()),
            readahead_started: metrics::counter!(READAHEAD_STARTED, "shard" => label.clone()),
            readahead_used: metrics::counter!(READAHEAD_USED, "shard" => label.clone()),
            held_answered: metrics::counter!(FETCHES_HELD, "shard" => label.clone(), "outcome" => "answered"),
            held_expired: metrics::counter!(FETCHES_HELD, "shard" => label.clone(), "outcome" => "expired"),
            shard: label,
            requests: RefCell::default(),
            errors: RefCell::default(),
        });
    });
}

fn describe() {
    metrics::describe_counter!(REQUESTS, "Kafka requests answered, by API");
    metrics::describe_histogram!(
        REQUEST_SECONDS,
        metrics::Unit::Seconds,
        "Kafka requests from their arrival to their answer, by API (a Fetch's max.wait.ms included)"
    );
    metrics::describe_counter!(ERRORS, "error codes in Kafka answers, by API and error (per partition or topic)");
    metrics::describe_counter!(PRODUCED_RECORDS, "records appended by produce requests (a retried duplicate not)");
    metrics::describe_counter!(
        PRODUCED_BYTES,
        "record batch bytes appended by produce requests (a retried duplicate not)"
    );
    metrics::describe_counter!(FETCHED_RECORDS, "records in the answers to Fetch requests (whole batches)");
    metrics::describe_counter!(FETCHED_BYTES, "record batch bytes in the answers to Fetch requests");
    metrics::describe_counter!(
        READAHEAD_STARTED,
        "reads of a partition's next range started for a consumer catching up (shard.fetch.readahead.bytes)"
    );
    metrics::describe_counter!(READAHEAD_USED, "reads made ahead that a consumer's next fetch took");
    metrics::describe_counter!(
        QUOTA_THROTTLED,
        "throttles for client quotas, by quota: produce (producer_byte_rate), fetch (consumer_byte_rate) and \
         request (request_percentage) mute the connection; connection_creation closes a connection over its IP's connection_creation_rate \
         late, or holds the listener at max.connection.creation.rate"
    );
    metrics::describe_counter!(QUOTA_THROTTLE_MS, "milliseconds of throttle given for client quotas, by quota");
    metrics::describe_counter!(
        FETCHES_HELD,
        "Fetches held until fetch.min.bytes were there (Kafka's delayed fetches), by how they ended: answered \
         once enough arrived (or an error), or expired at max.wait.ms"
    );
}

/// A request throttled for a client quota (`quota`: produce, fetch or request) for `throttle`.
pub fn quota_throttled(quota: &'static str, throttle: Duration) {
    metrics::counter!(QUOTA_THROTTLED, "quota" => quota).increment(1);
    metrics::counter!(QUOTA_THROTTLE_MS, "quota" => quota).increment(throttle.as_millis() as u64);
}

fn with(record: impl FnOnce(&ShardHandles)) {
    SHARD.with(|cell| {
        if let Some(handles) = cell.get() {
            record(handles);
        }
    });
}

/// A request answered after `took`: counted, timed, and the error codes of its answer counted.
pub fn observe_request(api: ApiKey, took: Duration, answer: Option<&ResponseKind>) {
    with(|h| {
        let key = api as i16;
        let mut requests = h.requests.borrow_mut();
        let (count, latency) = requests.entry(key).or_insert_with(|| {
            let labels = [("shard", h.shard.clone()), ("api", format!("{api:?}"))];
            (metrics::counter!(REQUESTS, &labels), metrics::histogram!(REQUEST_SECONDS, &labels))
        });
        count.increment(1);
        latency.record(took.as_secs_f64());
        drop(requests);
        if let Some(ResponseKind::Fetch(fetch)) = answer {
            // Counted from the answer sent, once: a fetch held for fetch.min.bytes reads its partitions
            // again and again before it answers.
            for records in fetch.responses.iter().flat_map(|t| &t.partitions).filter_map(|p| p.records.as_ref()) {
                h.fetched_bytes.increment(records.len() as u64);
                h.fetched_records.increment(records_in(records));
            }
        }
        if let Some(answer) = answer {
            error_codes(answer, &mut |code| {
                if code != 0 {
                    let mut errors = h.errors.borrow_mut();
                    let counter = errors.entry((key, code)).or_insert_with(|| {
                        let labels = [
                            ("shard", h.shard.clone()),
                            ("api", format!("{api:?}")),
                            ("error", super::error_name(code)),
                        ];
                        metrics::counter!(ERRORS, &labels)
                    });
                    counter.increment(1);
                }
            });
        }
    });
}

/// A read ahead was started (`used`: false), or a fetch took one (`used`: true).
pub fn read_ahead(used: bool) {
    with(|h| if used { h.readahead_used.increment(1) } else { h.readahead_started.increment(1) });
}

/// A fetch held for `fetch.min.bytes` ended: answered once enough arrived, or `expired` at `max.wait.ms`.
pub fn fetch_held(expired: bool) {
    with(|h| if expired { h.held_expired.increment(1) } else { h.held_answered.increment(1) });
}

/// A produce's batch of `records` records in `bytes` bytes appended (not a retried duplicate).
pub fn produced(records: u64, bytes: u64) {
    with(|h| {
        h.produced_records.increment(records);
        h.produced_bytes.increment(bytes);
    });
}

/// The records the whole v2 batches in `bytes` hold (by their headers' record counts; a partial batch
/// at the end is not counted).
fn records_in(mut bytes: &[u8]) -> u64 {
    const LENGTH_AT: usize = 8;
    const COUNT_AT: usize = 57;
    let mut records = 0;
    while bytes.len() >= COUNT_AT + 4 {
        let length = i32::from_be_bytes(bytes[LENGTH_AT..LENGTH_AT + 4].try_into().expect("4 bytes"));
        let total = 12usize.saturating_add(usize::try_from(length).unwrap_or(0));
        if total < COUNT_AT + 4 || total > bytes.len() {
            break;
        }
        let count = i32::from_be_bytes(bytes[COUNT_AT..COUNT_AT + 4].try_into().expect("4 bytes"));
        records += u64::try_from(count).unwrap_or(0);
        bytes = &bytes[total..];
    }
    records
}

/// Calls `each` with every error code of an answer: the top-level one and each topic's or partition's.
/// APIs not listed here are counted and timed but their codes are not looked at.
fn error_codes(answer: &ResponseKind, each: &mut impl FnMut(i16)) {
    match answer {
        ResponseKind::Produce(r) => {
            r.responses.iter().flat_map(|t| &t.partition_responses).for_each(|p| each(p.error_code));
        }
        ResponseKind::Fetch(r) => {
            each(r.error_code);
            r.responses.iter().flat_map(|t| &t.partitions).for_each(|p| each(p.error_code));
        }
        ResponseKind::ListOffsets(r) => r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| each(p.error_code)),
        ResponseKind::Metadata(r) => r.topics.iter().for_each(|t| each(t.error_code)),
        ResponseKind::OffsetCommit(r) => r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| each(p.error_code)),
        ResponseKind::TxnOffsetCommit(r) => {
            r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| each(p.error_code))
        }
        ResponseKind::OffsetFetch(r) => {
            each(r.error_code);
            r.groups.iter().for_each(|g| each(g.error_code));
        }
        ResponseKind::FindCoordinator(r) => {
            each(r.error_code);
            r.coordinators.iter().for_each(|c| each(c.error_code));
        }
        ResponseKind::CreateTopics(r) => r.topics.iter().for_each(|t| each(t.error_code)),
        ResponseKind::DeleteTopics(r) => r.responses.iter().for_each(|t| each(t.error_code)),
        ResponseKind::DeleteRecords(r) => r.topics.iter().flat_map(|t| &t.partitions).for_each(|p| each(p.error_code)),
        ResponseKind::JoinGroup(r) => each(r.error_code),
        ResponseKind::SyncGroup(r) => each(r.error_code),
        ResponseKind::Heartbeat(r) => each(r.error_code),
        ResponseKind::LeaveGroup(r) => each(r.error_code),
        ResponseKind::InitProducerId(r) => each(r.error_code),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: i32, body: usize) -> Vec<u8> {
        let mut b = vec![0u8; 61 + body];
        let length = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&length.to_be_bytes());
        b[57..61].copy_from_slice(&records.to_be_bytes());
        b
    }

    #[test]
    fn records_are_counted_from_whole_batches_only() {
        let mut bytes = batch(3, 10);
        bytes.extend(batch(5, 0));
        assert_eq!(records_in(&bytes), 8);
        let whole = bytes.len();
        bytes.extend(&batch(7, 40)[..50]);
        assert_eq!(records_in(&bytes), 8, "a partial batch at the end is not counted");
        assert_eq!(records_in(&bytes[..whole - 1]), 3);
        assert_eq!(records_in(&[]), 0);
    }
}
