//! What the partition logs of one thread tell the metrics: how long appends and fdatasyncs take and how
//! many batches each fdatasync made durable (the group commit's yield).
//!
//! The handles live in a thread-local, registered once by [`register_thread`] with the labels the
//! thread's owner chooses (the broker's shard): recording is then a few atomic operations on handles of
//! this thread alone, with no lookup and no lock. A thread that never registers records nothing, and
//! neither does any thread when no `metrics` recorder is installed.

use std::cell::OnceCell;
use std::time::Duration;

use metrics::{Counter, Histogram, Label};

pub const APPEND_SECONDS: &str = "shardlog_log_append_seconds";
pub const FDATASYNC_SECONDS: &str = "shardlog_log_fdatasync_seconds";
pub const FDATASYNCS: &str = "shardlog_log_fdatasyncs_total";
pub const BATCHES_PER_FDATASYNC: &str = "shardlog_log_batches_per_fdatasync";
pub const WRITTEN_BYTES: &str = "shardlog_log_written_bytes_total";

struct Handles {
    append_seconds: Histogram,
    fdatasync_seconds_file: Histogram,
    fdatasync_seconds_device: Histogram,
    /// Per kind: an fdatasync of one log's file, or a device flush shared by the thread's logs.
    fdatasyncs_file: Counter,
    fdatasyncs_device: Counter,
    batches_per_fdatasync_file: Histogram,
    batches_per_fdatasync_device: Histogram,
    /// Direct writes of appended data: from the in-memory tail's own blocks, and copied into write buffers.
    written_from_tail: Counter,
    written_copied: Counter,
}

thread_local! {
    static HANDLES: OnceCell<Handles> = const { OnceCell::new() };
}

/// Registers this thread's handles under `labels`; a second call on the same thread changes nothing.
pub fn register_thread(labels: Vec<Label>) {
    metrics::describe_histogram!(APPEND_SECONDS, metrics::Unit::Seconds, "appending one batch to a partition log");
    metrics::describe_histogram!(
        FDATASYNC_SECONDS,
        metrics::Unit::Seconds,
        "one fdatasync of a partition log, or one device flush shared by the shard's logs"
    );
    metrics::describe_counter!(FDATASYNCS, "fdatasyncs of partition logs and device flushes shared by them");
    metrics::describe_histogram!(
        BATCHES_PER_FDATASYNC,
        "batches one fdatasync or device flush made durable, all partitions' together (group commit)"
    );
    metrics::describe_counter!(
        WRITTEN_BYTES,
        metrics::Unit::Bytes,
        "bytes of appended data written to partition logs with direct I/O, by where the write took them from"
    );
    HANDLES.with(|handles| {
        handles.get_or_init(|| Handles {
            append_seconds: metrics::histogram!(APPEND_SECONDS, labels.clone()),
            fdatasync_seconds_file: metrics::histogram!(FDATASYNC_SECONDS, with_label(&labels, "sync", "file")),
            fdatasync_seconds_device: metrics::histogram!(FDATASYNC_SECONDS, with_label(&labels, "sync", "device")),
            fdatasyncs_file: metrics::counter!(FDATASYNCS, with_label(&labels, "sync", "file")),
            fdatasyncs_device: metrics::counter!(FDATASYNCS, with_label(&labels, "sync", "device")),
            batches_per_fdatasync_file: metrics::histogram!(BATCHES_PER_FDATASYNC, with_label(&labels, "sync", "file")),
            batches_per_fdatasync_device: metrics::histogram!(
                BATCHES_PER_FDATASYNC,
                with_label(&labels, "sync", "device")
            ),
            written_from_tail: metrics::counter!(WRITTEN_BYTES, with_label(&labels, "from", "tail")),
            written_copied: metrics::counter!(WRITTEN_BYTES, with_label(&labels, "from", "copy")),
        });
    });
}

fn with_label(labels: &[Label], key: &'static str, value: &'static str) -> Vec<Label> {
    let mut labels = labels.to_vec();
    labels.push(Label::new(key, value));
    labels
}

fn with(record: impl FnOnce(&Handles)) {
    HANDLES.with(|handles| {
        if let Some(handles) = handles.get() {
            record(handles);
        }
    });
}

pub(crate) fn appended(took: Duration) {
    with(|h| h.append_seconds.record(took.as_secs_f64()));
}

/// What made appends durable: an fdatasync of one log's file, or a device flush shared by many.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sync {
    File,
    Device,
}

pub(crate) fn synced(sync: Sync, took: Duration, batches: u64) {
    with(|h| {
        let (seconds, count, per) = match sync {
            Sync::File => (&h.fdatasync_seconds_file, &h.fdatasyncs_file, &h.batches_per_fdatasync_file),
            Sync::Device => (&h.fdatasync_seconds_device, &h.fdatasyncs_device, &h.batches_per_fdatasync_device),
        };
        seconds.record(took.as_secs_f64());
        count.increment(1);
        per.record(batches as f64);
    });
}

/// A write-out's direct writes: `from_tail` bytes written from the tail's own blocks, `copied` bytes copied
/// into write buffers first.
pub(crate) fn written(from_tail: u64, copied: u64) {
    with(|h| {
        h.written_from_tail.increment(from_tail);
        h.written_copied.increment(copied);
    });
}
