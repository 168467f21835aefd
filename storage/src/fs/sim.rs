//! An in-memory file layer that keeps what was written apart from what is durable, for crash tests.
//!
//! It models a disk with a volatile write cache under a journalling filesystem, as Linux's ext4 and XFS
//! behave (not POSIX, which promises nothing across files):
//! - A completed write is in the device's cache until a flush: an `fdatasync` of any file flushes the
//!   whole device, so it carries every direct write completed before it, of every file, to the media.
//!   Writes through the page cache are not on the device at all until their own file's `fdatasync`.
//! - What a file's blocks hold is only visible through its metadata: its size, and which blocks hold
//!   written data (an allocated block never written, like a hole, reads as zeros). A file's metadata is
//!   durable at its own `fdatasync`; a crash may also find later changes committed (the journal commits
//!   on its own too), each in order, up to some point, and then their data with them.
//! - Directory entries are durable at `sync_dir`.
//!
//! [`SimFs::crash`] returns the file system a machine would find after losing power: the durable
//! directory entries; for each file its metadata committed up to a point chosen by a seed; and of the
//! writes after that point, those flushed to the media, plus any subset of the others, 512-byte sector by
//! sector, in any order — where the committed metadata lets them show. A write into blocks that were not
//! written before, or past the size, is lost with the metadata that would have shown it, even when its
//! data reached the media.
//!
//! Direct writes assert the alignment rules, so the log's O_DIRECT discipline is checked here too.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::{ALIGN, Fs, SegmentFile};

/// The unit a power loss keeps or loses whole.
const SECTOR: u64 = 512;

fn block_of(pos: u64) -> u64 {
    pos / ALIGN
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        pos: u64,
        bytes: Vec<u8>,
        /// A direct write (on the device once it completes) rather than one into the page cache.
        direct: bool,
        /// A device flush began after it completed: its bytes are on the media.
        on_media: bool,
        /// The file's size when it was made, and which of the blocks it touches held written data then:
        /// its sectors in those blocks, below that size, need no metadata to be seen.
        len_before: u64,
        written_before: Vec<bool>,
    },
    /// A change of size (a truncation, or an allocation that grows the file with unwritten blocks).
    SetLen { len: u64 },
}

impl Op {
    /// Applies the operation whole, metadata and data.
    fn apply(&self, data: &mut Vec<u8>, written: &mut BTreeSet<u64>) {
        match self {
            Op::Write { pos, bytes, .. } => {
                let end = *pos as usize + bytes.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*pos as usize..end].copy_from_slice(bytes);
                if !bytes.is_empty() {
                    written.extend(block_of(*pos)..=block_of(end as u64 - 1));
                }
            }
            Op::SetLen { len } => {
                data.resize(*len as usize, 0);
                written.retain(|b| b * ALIGN < *len);
            }
        }
    }
}

#[derive(Debug, Default)]
struct Inode {
    /// The current contents, and the blocks that hold written data now.
    data: Vec<u8>,
    written: BTreeSet<u64>,
    /// The contents and written blocks as of the last `fdatasync`.
    durable: Vec<u8>,
    durable_written: BTreeSet<u64>,
    /// What happened since, in order.
    pending: Vec<Op>,
}

impl Inode {
    /// What a power loss leaves of this file (see the module documentation).
    fn after_power_loss(&self, rng: &mut SimRng) -> Inode {
        let committed = rng.up_to(self.pending.len() as u64) as usize;
        let mut data = self.durable.clone();
        let mut written = self.durable_written.clone();
        for op in &self.pending[..committed] {
            op.apply(&mut data, &mut written);
        }
        // Past the committed point: blocks whose mapping changed (given up by a truncation, or newly
        // allocated by a write) show nothing written into them afterwards.
        let mut remapped_from = u64::MAX;
        let mut remapped = BTreeSet::new();
        let mut flushed: Vec<(u64, &[u8])> = Vec::new();
        let mut maybe: Vec<(usize, u64, &[u8])> = Vec::new();
        let mut flushed_last: BTreeMap<u64, usize> = BTreeMap::new();
        for (i, op) in self.pending[committed..].iter().enumerate() {
            match op {
                Op::SetLen { len } => remapped_from = remapped_from.min(block_of(*len)),
                Op::Write { pos, bytes, on_media, len_before, written_before, .. } => {
                    let first_block = block_of(*pos);
                    let mut at = *pos;
                    while at < pos + bytes.len() as u64 {
                        let sector_end = ((at / SECTOR + 1) * SECTOR).min(pos + bytes.len() as u64);
                        let block = block_of(at);
                        let piece = &bytes[(at - pos) as usize..(sector_end - pos) as usize];
                        let was_written = written_before[(block - first_block) as usize];
                        if !was_written {
                            remapped.insert(block);
                        } else if sector_end <= *len_before
                            && block < remapped_from
                            && !remapped.contains(&block)
                            && written.contains(&block)
                            && sector_end <= data.len() as u64
                        {
                            if *on_media {
                                flushed.push((at, piece));
                                flushed_last.insert(at / SECTOR, i);
                            } else if rng.next_u64() & 1 == 1 {
                                maybe.push((i, at, piece));
                            }
                        }
                        at = sector_end;
                    }
                }
            }
        }
        for (at, piece) in flushed {
            data[at as usize..at as usize + piece.len()].copy_from_slice(piece);
        }
        // The unflushed sectors that made it land in any order, but none lands under a flushed one
        // written after it.
        for j in (1..maybe.len()).rev() {
            maybe.swap(j, rng.up_to(j as u64) as usize);
        }
        for (i, at, piece) in maybe {
            if flushed_last.get(&(at / SECTOR)).is_none_or(|&last| last < i) {
                data[at as usize..at as usize + piece.len()].copy_from_slice(piece);
            }
        }
        written.retain(|b| b * ALIGN < data.len() as u64);
        Inode {
            data: data.clone(),
            written: written.clone(),
            durable: data,
            durable_written: written,
            pending: Vec::new(),
        }
    }

    /// A device flush: every direct write completed so far is on the media.
    fn flush_device(&mut self) {
        for op in &mut self.pending {
            if let Op::Write { direct: true, on_media, .. } = op {
                *on_media = true;
            }
        }
    }
}

type InodeRef = Rc<RefCell<Inode>>;

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<PathBuf, InodeRef>,
    durable_files: BTreeMap<PathBuf, InodeRef>,
    dirs: BTreeSet<PathBuf>,
    fail_fsync: bool,
    /// A full disk: no file may grow.
    full: bool,
    /// The disk's size: the files' current lengths together may not grow past it (`None`: no limit).
    capacity: Option<u64>,
    /// Whether an fdatasync flushes the device for every file (see [`SimFs::set_device_flush`]).
    no_device_flush: Option<String>,
    /// How many times an fdatasync yields before it takes effect (see [`SimFs::set_sync_polls`]).
    sync_polls: u32,
    fsyncs: u64,
    writes: u64,
    reads: u64,
    read_bytes: u64,
}

/// A simulated disk. Clones share the same state.
#[derive(Debug, Default, Clone)]
pub struct SimFs {
    state: Rc<RefCell<State>>,
}

/// An open simulated file.
#[derive(Debug)]
pub struct SimFile {
    inode: InodeRef,
    state: Rc<RefCell<State>>,
}

impl SimFile {
    /// ENOSPC when the file would end past its current length at `end` and the disk is full or has not
    /// that much room left.
    fn check_space(&self, end: u64) -> io::Result<()> {
        let len = self.inode.borrow().data.len() as u64;
        let state = self.state.borrow();
        if end > len && (state.full || state.free() < end - len) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }
}

impl State {
    /// Bytes the files may still grow by together.
    fn free(&self) -> u64 {
        if self.full {
            return 0;
        }
        let Some(capacity) = self.capacity else { return u64::MAX };
        // A file renamed over or removed in the current namespace no longer takes room.
        let mut seen = BTreeSet::new();
        let used: u64 = (self.files.values())
            .filter(|inode| seen.insert(Rc::as_ptr(inode)))
            .map(|inode| inode.borrow().data.len() as u64)
            .sum();
        capacity.saturating_sub(used)
    }

    /// Every file's direct writes completed so far reach the media (all files: open, removed or not).
    fn flush_device(&self, except: &InodeRef) {
        let mut seen = BTreeSet::new();
        for inode in self.files.values().chain(self.durable_files.values()) {
            if !Rc::ptr_eq(inode, except) && seen.insert(Rc::as_ptr(inode)) {
                inode.borrow_mut().flush_device();
            }
        }
    }
}

/// A deterministic generator for crash choices (SplitMix64).
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..=max`.
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == u64::MAX { self.next_u64() } else { self.next_u64() % (max + 1) }
    }
}

impl SimFs {
    pub fn new() -> Self {
        SimFs::default()
    }

    /// Number of `fdatasync` calls so far.
    pub fn fsync_count(&self) -> u64 {
        self.state.borrow().fsyncs
    }

    /// Number of writes so far.
    pub fn write_count(&self) -> u64 {
        self.state.borrow().writes
    }

    /// Number of reads so far.
    pub fn read_count(&self) -> u64 {
        self.state.borrow().reads
    }

    /// Bytes returned by reads so far.
    pub fn read_bytes(&self) -> u64 {
        self.state.borrow().read_bytes
    }

    /// Makes every later `fdatasync` yield `polls` times before it takes effect, so that other tasks run
    /// while it is under way. (It then covers what they wrote meanwhile too: kinder than a disk, whose
    /// flush covers what completed before it was submitted.)
    pub fn set_sync_polls(&self, polls: u32) {
        self.state.borrow_mut().sync_polls = polls;
    }

    /// Makes every later `fdatasync` fail with EIO.
    pub fn fail_fsyncs(&self) {
        self.state.borrow_mut().fail_fsync = true;
    }

    /// Fills the disk (`true`) or frees space again: while it is full, a write or allocation that would
    /// make a file longer fails with ENOSPC, and nothing of it happens.
    pub fn set_full(&self, full: bool) {
        self.state.borrow_mut().full = full;
    }

    /// Gives the disk a size (`None`: unlimited): a write or allocation that would make the files
    /// together longer fails with ENOSPC, and nothing of it happens.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state.borrow_mut().capacity = bytes;
    }

    /// The current (not necessarily durable) contents of a file.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        self.state.borrow().files.get(path).map(|i| i.borrow().data.clone())
    }

    /// Replaces a file's contents durably (to model damage found after a crash).
    pub fn set_contents(&self, path: &Path, bytes: Vec<u8>) {
        let state = self.state.borrow();
        let inode = state.files.get(path).expect("no such file");
        let mut inode = inode.borrow_mut();
        let written: BTreeSet<u64> = (0..(bytes.len() as u64).div_ceil(ALIGN)).collect();
        inode.data = bytes.clone();
        inode.durable = bytes;
        inode.written = written.clone();
        inode.durable_written = written;
        inode.pending.clear();
    }

    /// Makes the filesystem one where an fdatasync of one file is not known to flush the device for the
    /// others (`Some(why)`), as [`Fs::device_flush_check`] reports it; `None` (the default): it is.
    pub fn set_device_flush(&self, unsupported: Option<String>) {
        self.state.borrow_mut().no_device_flush = unsupported;
    }

    /// The file system as found after a power loss at this instant (see the module documentation).
    /// Directory entries not made durable by `sync_dir` are gone.
    pub fn crash(&self, rng: &mut SimRng) -> SimFs {
        let state = self.state.borrow();
        let mut survivors: BTreeMap<*const RefCell<Inode>, InodeRef> = BTreeMap::new();
        let mut files = BTreeMap::new();
        for (path, inode) in &state.durable_files {
            let key = Rc::as_ptr(inode);
            let survivor =
                survivors.entry(key).or_insert_with(|| Rc::new(RefCell::new(inode.borrow().after_power_loss(rng))));
            files.insert(path.clone(), survivor.clone());
        }
        let new_state = State {
            durable_files: files.clone(),
            files,
            dirs: state.dirs.clone(),
            no_device_flush: state.no_device_flush.clone(),
            ..State::default()
        };
        SimFs { state: Rc::new(RefCell::new(new_state)) }
    }

    fn not_found(path: &Path) -> io::Error {
        io::Error::new(io::ErrorKind::NotFound, format!("{}: no such file", path.display()))
    }
}

impl SimFile {
    /// A write the current contents show at once and a crash may lose until it is flushed (and, where
    /// it needs the file's metadata, until the file's next fdatasync).
    fn record_write(&self, pos: u64, bytes: Vec<u8>, direct: bool) {
        self.state.borrow_mut().writes += 1;
        let mut inode = self.inode.borrow_mut();
        let inode = &mut *inode;
        let end = pos + bytes.len() as u64;
        let written_before = if bytes.is_empty() {
            Vec::new()
        } else {
            (block_of(pos)..=block_of(end - 1)).map(|b| inode.written.contains(&b)).collect()
        };
        let op = Op::Write { pos, bytes, direct, on_media: false, len_before: inode.data.len() as u64, written_before };
        op.apply(&mut inode.data, &mut inode.written);
        inode.pending.push(op);
    }

    fn set_len(&self, len: u64) {
        let op = Op::SetLen { len };
        let mut inode = self.inode.borrow_mut();
        let inode = &mut *inode;
        op.apply(&mut inode.data, &mut inode.written);
        inode.pending.push(op);
    }
}

impl SegmentFile for SimFile {
    type Buf = Vec<u8>;

    fn alloc(&self, len: usize) -> Vec<u8> {
        assert!((len as u64).is_multiple_of(ALIGN), "direct write length {len} is not aligned");
        vec![0xAA; len]
    }

    async fn write_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()> {
        assert!(
            pos.is_multiple_of(ALIGN) && (buf.len() as u64).is_multiple_of(ALIGN),
            "unaligned direct write at {pos}"
        );
        self.check_space(pos + buf.len() as u64)?;
        self.record_write(pos, buf, true);
        Ok(())
    }

    async fn write_shared(&self, buf: Rc<Vec<u8>>, pos: u64) -> io::Result<()> {
        self.write_at(buf.as_ref().clone(), pos).await
    }

    fn write_cached(&self, pos: u64, bytes: &[u8]) -> io::Result<()> {
        self.check_space(pos + bytes.len() as u64)?;
        self.record_write(pos, bytes.to_vec(), false);
        Ok(())
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let inode = self.inode.borrow();
        let start = (pos as usize).min(inode.data.len());
        let end = (pos as usize).saturating_add(len).min(inode.data.len());
        let mut state = self.state.borrow_mut();
        state.reads += 1;
        state.read_bytes += (end - start) as u64;
        Ok(inode.data[start..end].to_vec())
    }

    async fn fdatasync(&self) -> io::Result<()> {
        let polls = self.state.borrow().sync_polls;
        for _ in 0..polls {
            futures_lite::future::yield_now().await;
        }
        let mut state = self.state.borrow_mut();
        state.fsyncs += 1;
        if state.fail_fsync {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        let mut inode = self.inode.borrow_mut();
        let inode = &mut *inode;
        for op in std::mem::take(&mut inode.pending) {
            op.apply(&mut inode.durable, &mut inode.durable_written);
        }
        debug_assert_eq!(inode.durable, inode.data);
        debug_assert_eq!(inode.durable_written, inode.written);
        // The flush that ends it is the whole device's (unless the filesystem is set up otherwise).
        if state.no_device_flush.is_none() {
            state.flush_device(&self.inode);
        }
        Ok(())
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.set_len(len);
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.inode.borrow().data.len() as u64)
    }

    async fn allocate(&self, size: u64) -> io::Result<()> {
        // The size change is metadata like a truncation's: durable at the next sync, lost in a crash.
        if size > self.inode.borrow().data.len() as u64 {
            self.check_space(size)?;
            self.set_len(size);
        }
        Ok(())
    }
}

impl Fs for SimFs {
    type File = SimFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        let mut state = self.state.borrow_mut();
        let parent = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        if !state.dirs.contains(&parent) {
            return Err(Self::not_found(&parent));
        }
        let inode = match state.files.get(path) {
            Some(inode) => inode.clone(),
            None if create => {
                let inode: InodeRef = Rc::default();
                state.files.insert(path.to_path_buf(), inode.clone());
                inode
            }
            None => return Err(Self::not_found(path)),
        };
        Ok(SimFile { inode, state: self.state.clone() })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        self.state.borrow_mut().files.remove(path).map(|_| ()).ok_or_else(|| Self::not_found(path))
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut guard = self.state.borrow_mut();
        let state = &mut *guard;
        if state.dirs.contains(from) {
            // Directories are modelled as always durable: a directory rename moves its files in both the
            // current and the durable namespace at once.
            let moved = |p: &PathBuf| p.strip_prefix(from).ok().map(|rest| to.join(rest));
            state.dirs = state.dirs.iter().map(|d| moved(d).unwrap_or_else(|| d.clone())).collect();
            for map in [&mut state.files, &mut state.durable_files] {
                *map = std::mem::take(map).into_iter().map(|(p, i)| (moved(&p).unwrap_or(p), i)).collect();
            }
            return Ok(());
        }
        let inode = state.files.remove(from).ok_or_else(|| Self::not_found(from))?;
        state.files.insert(to.to_path_buf(), inode);
        Ok(())
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        if !state.dirs.contains(path) {
            return Err(Self::not_found(path));
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(path);
        state.durable_files.retain(|p, _| !in_dir(p));
        let current: Vec<_> =
            state.files.iter().filter(|(p, _)| in_dir(p)).map(|(p, i)| (p.clone(), i.clone())).collect();
        state.durable_files.extend(current);
        Ok(())
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        let mut p = Some(path);
        while let Some(dir) = p {
            state.dirs.insert(dir.to_path_buf());
            p = dir.parent();
        }
        Ok(())
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state.borrow_mut();
        if state.files.keys().any(|p| p.parent() == Some(path)) {
            return Err(io::Error::new(io::ErrorKind::DirectoryNotEmpty, format!("{} is not empty", path.display())));
        }
        state.dirs.remove(path);
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let state = self.state.borrow();
        if !state.dirs.contains(path) {
            return Err(Self::not_found(path));
        }
        let mut names: Vec<String> = state
            .files
            .keys()
            .chain(state.dirs.iter())
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn exists(&self, path: &Path) -> bool {
        let state = self.state.borrow();
        state.files.contains_key(path) || state.dirs.contains(path)
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.state.borrow().dirs.contains(path)
    }

    fn free_bytes(&self, _path: &Path) -> io::Result<u64> {
        Ok(self.state.borrow().free())
    }

    fn device_flush_check(&self, _dir: &Path) -> Result<(), String> {
        self.state.borrow().no_device_flush.clone().map_or(Ok(()), Err)
    }

    fn alloc_kept(&self, len: usize) -> Vec<u8> {
        assert!((len as u64).is_multiple_of(ALIGN), "direct write length {len} is not aligned");
        vec![0xAA; len]
    }
}
