//! A voter's durable Raft log and vote.
//!
//! Files in the voter's directory:
//! - `raft-log`: records appended one after another, each a peer-protocol frame (header, CRC32C, rkyv
//!   body; see `docs/peer-protocol.md`): an entry, "truncate from index", or "purged up to log id".
//!   Replaying them in order gives the log. A record is acknowledged to Raft only after an fdatasync
//!   covers it. At open, a torn or corrupt tail (a crash mid-write) is cut off at the last whole record.
//! - `raft-vote`: the last vote, replaced atomically (temporary file, fdatasync, rename, directory fsync)
//!   before the vote is acknowledged.
//!
//! Entries are also kept in memory: the quorum's log is small, and openraft purges what snapshots cover.
//! When the file holds much more than the live entries it is rewritten (atomically) from memory.
//!
//! The quorum runs on its own thread: these blocking writes never stall a shard. A failing disk stops the
//! process (as everywhere in shardlog: a failed fsync is never retried).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{Entry, LogId, RaftLogReader, StorageError, Vote};
use shardlog_net::peer::{PeerFrameReader, decode_message, encode_frame, encode_message};
use shardlog_storage::fatal;

use super::wire::{QuorumConfig, WireEntry, WireLogId, WireVote};

const LOG_FILE: &str = "raft-log";
const VOTE_FILE: &str = "raft-vote";

/// Record types in `raft-log` (peer-frame message types).
const RECORD_ENTRY: u16 = 1;
const RECORD_TRUNCATE: u16 = 2;
const RECORD_PURGE: u16 = 3;
const RECORD_VOTE: u16 = 4;

/// The largest record read back; an entry is one command, far below this.
const MAX_RECORD_BYTES: u32 = 64 << 20;
/// The log file is rewritten when it is this much larger than the entries it still holds.
const COMPACT_SLACK_BYTES: u64 = 16 << 20;
/// The raft log's blocks are reserved this far ahead of its end: many thousand entries on a full disk.
const PREALLOCATE_BYTES: u64 = 4 << 20;

#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct TruncateRecord {
    since: u64,
}

#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct PurgeRecord {
    upto: WireLogId,
}

#[derive(Debug)]
struct LogInner {
    dir: PathBuf,
    file: File,
    file_bytes: u64,
    /// Bytes from the file's start whose blocks are allocated (past its size, with FALLOC_FL_KEEP_SIZE):
    /// appends below this need no new block, so a disk another process fills does not stop the voter.
    allocated: u64,
    entries: BTreeMap<u64, Entry<QuorumConfig>>,
    /// Bytes the live entries take in the file (to decide when to compact).
    entry_bytes: BTreeMap<u64, u64>,
    last_purged: Option<LogId<u64>>,
    vote: Option<Vote<u64>>,
}

/// The log store handed to openraft. Clones share the same log.
#[derive(Debug, Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

/// What recovery found, for the start-up log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRecovery {
    pub entries: usize,
    /// Bytes cut from the end of the file (a torn write).
    pub cut_bytes: u64,
}

fn write_failure(op: &'static str, path: &Path, e: &std::io::Error) -> ! {
    fatal::disk_failure(op, path, e)
}

/// Replaces `path` with `bytes` so that a crash leaves the old or the new file, never a mix. The
/// temporary file (`<path>.tmp`) is kept afterwards as a spare with its blocks reserved, twice the size
/// written, and the next replacement writes over it in place: a disk another process has filled then
/// costs no new block, so a vote, a snapshot or the incarnation is still recorded.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create(true).truncate(false).open(&tmp)?;
        f.write_all(bytes)?;
        f.set_len(bytes.len() as u64)?;
        f.sync_data()
    })();
    if let Err(e) = written.and_then(|()| rename_in_place(&tmp, path)) {
        write_failure("replace file", path, &e);
    }
    // The replaced file's blocks were just freed: the spare takes them, if nothing else has.
    reserve_spare(path, bytes.len() as u64 * 2);
}

/// Reserves blocks for at least `bytes` (and one block) in the spare of `path` (`<path>.tmp`), which
/// [`replace_file`] writes the next version over. Its owner calls this when it opens, so that even the
/// first replacement finds room on a disk that has filled since. A failure leaves a smaller spare, which
/// the next replacement copes with if the disk has room then.
pub(crate) fn reserve_spare(path: &Path, bytes: u64) {
    if let Ok(spare) = OpenOptions::new().write(true).create(true).truncate(false).open(path.with_extension("tmp")) {
        let want = bytes.max(4096) as i64;
        // SAFETY: fallocate(2) on an open descriptor, mode 0 (allocate, grow the file to at least `want`).
        let _ = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&spare), 0, 0, want) };
    }
}

/// Like [`replace_file`] without a spare, with a failure before the rename left to the caller: the old
/// file is then as it was (and the temporary file is removed).
fn try_replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let written = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_data()
    })();
    if let Err(e) = written.and_then(|()| rename_in_place(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Renames the synced `tmp` over `path`, then syncs the directory. A failure past the rename is fatal:
/// the new file is in place, but a crash could still lose it.
fn rename_in_place(tmp: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(tmp, path)?;
    if let Err(e) = File::open(path.parent().unwrap_or(Path::new("."))).and_then(|d| d.sync_all()) {
        write_failure("sync the directory of", path, &e);
    }
    Ok(())
}

impl LogStore {
    /// The voter ids of the last membership entry in the log, if it holds one.
    pub fn last_membership_voters(&self) -> Option<Vec<u64>> {
        let inner = self.lock();
        inner.entries.values().rev().find_map(|e| match &e.payload {
            openraft::EntryPayload::Membership(m) => Some(m.voter_ids().collect()),
            _ => None,
        })
    }

    /// Opens (creating) the log in `dir`, replaying `raft-log` and cutting off a torn tail.
    pub fn open(dir: &Path) -> std::io::Result<(LogStore, LogRecovery)> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let created = !path.exists();
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(&path)?;
        if created {
            // The new file's name must survive a crash before anything in it is acknowledged.
            File::open(dir)?.sync_all()?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        reserve_spare(&dir.join(VOTE_FILE), 4096);
        let mut inner = LogInner {
            dir: dir.to_path_buf(),
            file,
            file_bytes: 0,
            allocated: 0,
            entries: BTreeMap::new(),
            entry_bytes: BTreeMap::new(),
            last_purged: None,
            vote: read_vote(&dir.join(VOTE_FILE))?,
        };
        let mut reader = PeerFrameReader::new(MAX_RECORD_BYTES);
        reader.extend(&bytes);
        let mut good = 0u64;
        loop {
            let frame = match reader.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    check_torn_tail(&path, &bytes[good as usize..], good, &e.to_string())?;
                    break;
                }
            };
            let record_bytes = (shardlog_net::peer::HEADER_BYTES + frame.body.len()) as u64;
            if inner.replay(frame.kind, &frame.body, record_bytes).is_err() {
                check_torn_tail(&path, &bytes[good as usize..], good, "unreadable record")?;
                break;
            }
            good += record_bytes;
        }
        let cut_bytes = bytes.len() as u64 - good;
        if cut_bytes > 0 {
            inner.file.set_len(good)?;
            inner.file.sync_data()?;
        }
        inner.file_bytes = good;
        let recovery = LogRecovery { entries: inner.entries.len(), cut_bytes };
        Ok((LogStore { inner: Arc::new(Mutex::new(inner)) }, recovery))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogInner> {
        self.inner.lock().expect("the raft log lock is never poisoned: nothing panics while holding it")
    }
}

/// A bad record is acceptable only as the log's last: a write the crash tore, never acknowledged. One
/// with records after it is damage to acknowledged entries, and the voter must not start on it.
fn check_torn_tail(path: &Path, rest: &[u8], at: u64, reason: &str) -> std::io::Result<()> {
    let header = shardlog_net::peer::HEADER_BYTES;
    let claimed_end = if rest.len() >= header {
        header as u64 + u32::from_be_bytes(rest[8..12].try_into().expect("4 bytes")) as u64
    } else {
        rest.len() as u64
    };
    if claimed_end >= rest.len() as u64 {
        tracing::warn!(path = %path.display(), at, reason, "raft log: cutting a torn last record");
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{}: damaged record at byte {at} ({reason}) with more records after it", path.display()),
    ))
}

fn read_vote(path: &Path) -> std::io::Result<Option<Vote<u64>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut reader = PeerFrameReader::new(MAX_RECORD_BYTES);
    reader.extend(&bytes);
    let invalid =
        |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {what}", path.display()));
    match reader.next_frame() {
        Ok(Some(frame)) if frame.kind == RECORD_VOTE => {
            let vote: WireVote = decode_message(&frame.body).map_err(|e| invalid(e.to_string()))?;
            Ok(Some(vote.into()))
        }
        other => Err(invalid(format!("not a vote record: {other:?}"))),
    }
}

impl LogInner {
    fn replay(&mut self, kind: u16, body: &[u8], record_bytes: u64) -> Result<(), ()> {
        match kind {
            RECORD_ENTRY => {
                let entry: WireEntry = decode_message(body).map_err(|_| ())?;
                let index = entry.log_id.index;
                self.entries.insert(index, entry.into());
                self.entry_bytes.insert(index, record_bytes);
            }
            RECORD_TRUNCATE => {
                let t: TruncateRecord = decode_message(body).map_err(|_| ())?;
                self.entries.split_off(&t.since);
                self.entry_bytes.split_off(&t.since);
            }
            RECORD_PURGE => {
                let p: PurgeRecord = decode_message(body).map_err(|_| ())?;
                self.drop_through(p.upto.into());
            }
            _ => return Err(()),
        }
        Ok(())
    }

    fn drop_through(&mut self, upto: LogId<u64>) {
        self.entries = self.entries.split_off(&(upto.index + 1));
        self.entry_bytes = self.entry_bytes.split_off(&(upto.index + 1));
        self.last_purged = Some(upto);
    }

    fn path(&self) -> PathBuf {
        self.dir.join(LOG_FILE)
    }

    /// Appends records and makes them durable.
    fn write_records(&mut self, records: &[u8]) {
        let path = self.path();
        let end = self.file_bytes + records.len() as u64;
        if end > self.allocated {
            let upto = end.next_multiple_of(PREALLOCATE_BYTES);
            let fd = std::os::fd::AsRawFd::as_raw_fd(&self.file);
            let (from, len) = (self.file_bytes as i64, (upto - self.file_bytes) as i64);
            // SAFETY: fallocate(2) on an open descriptor; KEEP_SIZE reserves blocks without changing the
            // file's size, so what the log reads back is unchanged.
            if unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, from, len) } == 0 {
                self.allocated = upto;
            } else {
                // A full disk (or a filesystem without fallocate): the write below may still find room.
                tracing::debug!(error = %std::io::Error::last_os_error(), "raft log preallocation failed");
            }
        }
        if let Err(e) = self.file.write_all(records) {
            write_failure("append to the raft log", &path, &e);
        }
        if let Err(e) = self.file.sync_data() {
            write_failure("fdatasync the raft log", &path, &e);
        }
        self.file_bytes += records.len() as u64;
    }

    /// Rewrites the file from memory when it mostly holds dropped records.
    fn compact_if_worth_it(&mut self) {
        let live: u64 = self.entry_bytes.values().sum();
        if self.file_bytes < live + COMPACT_SLACK_BYTES {
            return;
        }
        let mut bytes = Vec::with_capacity(live as usize + 64);
        if let Some(upto) = self.last_purged {
            bytes.extend(encode_frame(RECORD_PURGE, &encode_message(&PurgeRecord { upto: upto.into() })));
        }
        for entry in self.entries.values() {
            bytes.extend(encode_frame(RECORD_ENTRY, &encode_message(&WireEntry::from(entry))));
        }
        let path = self.path();
        if let Err(e) = try_replace_file(&path, &bytes) {
            // Nothing changed until the rename: the old file, whole, goes on being appended to.
            tracing::warn!(error = %e, path = %path.display(), "could not compact the raft log; keeping it as it is");
            return;
        }
        match OpenOptions::new().read(true).append(true).open(&path) {
            Ok(file) => self.file = file,
            Err(e) => write_failure("reopen the raft log", &path, &e),
        }
        self.file_bytes = bytes.len() as u64;
        self.allocated = 0;
    }

    fn last_log_id(&self) -> Option<LogId<u64>> {
        self.entries.values().next_back().map(|e| e.log_id).or(self.last_purged)
    }
}

impl RaftLogReader<QuorumConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<QuorumConfig>>, StorageError<u64>> {
        Ok(self.lock().entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<QuorumConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<QuorumConfig>, StorageError<u64>> {
        let inner = self.lock();
        Ok(LogState { last_purged_log_id: inner.last_purged, last_log_id: inner.last_log_id() })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let mut inner = self.lock();
        let bytes = encode_frame(RECORD_VOTE, &encode_message(&WireVote::from(vote)));
        replace_file(&inner.dir.join(VOTE_FILE), &bytes);
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.lock().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<QuorumConfig>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<QuorumConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.lock();
        let mut records = Vec::new();
        for entry in entries {
            let record = encode_frame(RECORD_ENTRY, &encode_message(&WireEntry::from(&entry)));
            inner.entry_bytes.insert(entry.log_id.index, record.len() as u64);
            inner.entries.insert(entry.log_id.index, entry);
            records.extend(record);
        }
        inner.write_records(&records);
        drop(inner);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut inner = self.lock();
        inner.write_records(&encode_frame(RECORD_TRUNCATE, &encode_message(&TruncateRecord { since: log_id.index })));
        inner.entries.split_off(&log_id.index);
        inner.entry_bytes.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut inner = self.lock();
        inner.write_records(&encode_frame(RECORD_PURGE, &encode_message(&PurgeRecord { upto: log_id.into() })));
        inner.drop_through(log_id);
        inner.compact_if_worth_it();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::wire::WirePayload;

    fn entry_record(term: u64, index: u64) -> Vec<u8> {
        let entry = WireEntry { log_id: WireLogId { term, node: 1, index }, payload: WirePayload::Blank };
        encode_frame(RECORD_ENTRY, &encode_message(&entry))
    }

    fn terms(store: &mut LogStore) -> Vec<(u64, u64)> {
        let entries = futures_lite::future::block_on(store.try_get_log_entries(..)).unwrap();
        entries.iter().map(|e| (e.log_id.index, e.log_id.leader_id.term)).collect()
    }

    #[test]
    fn a_replaced_file_leaves_a_spare_with_its_blocks_reserved_which_the_next_replacement_writes_over() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft-vote");
        replace_file(&path, &[7u8; 40]);
        assert_eq!(std::fs::read(&path).unwrap(), [7u8; 40]);
        let spare = std::fs::metadata(path.with_extension("tmp")).unwrap();
        assert!(spare.blocks() * 512 >= 4096, "the spare holds at least a block: {} sectors", spare.blocks());
        let inode = spare.ino();
        replace_file(&path, &[9u8; 30]);
        assert_eq!(std::fs::read(&path).unwrap(), [9u8; 30], "the old spare's longer tail is cut off");
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode, "the spare became the file");
        assert!(path.with_extension("tmp").exists(), "and a new spare is there");
    }

    #[test]
    fn opening_the_log_reserves_the_vote_files_spare_before_any_vote() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let _store = LogStore::open(dir.path()).unwrap();
        let spare = std::fs::metadata(dir.path().join(VOTE_FILE).with_extension("tmp")).unwrap();
        assert!(spare.blocks() * 512 >= 4096, "a block reserved: {} sectors", spare.blocks());
    }

    #[test]
    fn replay_applies_truncations_and_cuts_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        for index in 1..=3 {
            bytes.extend(entry_record(1, index));
        }
        // A new leader overwrote index 3: the truncation record, then its entry.
        bytes.extend(encode_frame(RECORD_TRUNCATE, &encode_message(&TruncateRecord { since: 3 })));
        bytes.extend(entry_record(2, 3));
        let good = bytes.len() as u64;
        let torn = entry_record(2, 4);
        bytes.extend(&torn[..torn.len() / 2]);
        std::fs::write(dir.path().join(LOG_FILE), &bytes).unwrap();

        let (mut store, recovery) = LogStore::open(dir.path()).unwrap();
        assert_eq!(recovery, LogRecovery { entries: 3, cut_bytes: torn.len() as u64 / 2 });
        assert_eq!(terms(&mut store), vec![(1, 1), (2, 1), (3, 2)]);
        assert_eq!(std::fs::metadata(dir.path().join(LOG_FILE)).unwrap().len(), good, "the torn tail is cut off");
        drop(store);

        let (mut again, recovery) = LogStore::open(dir.path()).unwrap();
        assert_eq!(recovery.cut_bytes, 0);
        assert_eq!(terms(&mut again), vec![(1, 1), (2, 1), (3, 2)]);
    }

    #[test]
    fn a_corrupt_last_record_is_cut_but_a_corrupt_record_before_others_stops_the_voter() {
        let dir = tempfile::tempdir().unwrap();
        let corrupt = |mut record: Vec<u8>| {
            let last = record.len() - 1;
            record[last] ^= 0xff;
            record
        };
        // Last record damaged (a torn sector): cut, the rest kept.
        let mut bytes = entry_record(1, 1);
        bytes.extend(corrupt(entry_record(1, 2)));
        std::fs::write(dir.path().join(LOG_FILE), &bytes).unwrap();
        let (mut store, recovery) = LogStore::open(dir.path()).unwrap();
        assert_eq!(terms(&mut store), vec![(1, 1)]);
        assert_eq!(recovery.cut_bytes, entry_record(1, 2).len() as u64);
        drop(store);

        // A damaged record with acknowledged records after it: refuse to start rather than lose them.
        let mut bytes = entry_record(1, 1);
        bytes.extend(corrupt(entry_record(1, 2)));
        bytes.extend(entry_record(1, 3));
        std::fs::write(dir.path().join(LOG_FILE), &bytes).unwrap();
        let err = LogStore::open(dir.path()).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
        assert_eq!(std::fs::read(dir.path().join(LOG_FILE)).unwrap(), bytes, "nothing was cut");
    }
}
