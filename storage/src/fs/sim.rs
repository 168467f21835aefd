//! An in-memory file layer that keeps what was written apart from what is durable, for crash tests.
//!
//! Each file records its durable contents (as of its last `fdatasync`) and the writes and truncations made
//! since. Each directory records its durable entries (as of its last `sync_dir`) apart from its current ones.
//! [`SimFs::crash`] returns the file system a machine would find after losing power: the durable directory
//! entries, each file's durable contents, and, chosen by a seed, a prefix of the unsynced operations of
//! each file with the last of them torn at a random byte.
//!
//! Direct writes assert the alignment rules, so the log's O_DIRECT discipline is checked here too. Writes
//! through the page cache are, like direct ones, lost or torn by a power loss until synced.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::{ALIGN, Fs, SegmentFile};

#[derive(Debug, Clone)]
enum Op {
    Write { pos: u64, bytes: Vec<u8> },
    Truncate { len: u64 },
}

impl Op {
    fn apply(&self, data: &mut Vec<u8>) {
        match self {
            Op::Write { pos, bytes } => {
                let end = *pos as usize + bytes.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*pos as usize..end].copy_from_slice(bytes);
            }
            Op::Truncate { len } => data.resize(*len as usize, 0),
        }
    }
}

#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Op>,
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
        inode.data = bytes.clone();
        inode.durable = bytes;
        inode.pending.clear();
    }

    /// The file system as found after a power loss at this instant. Directory entries not made durable by
    /// `sync_dir` are gone; every file keeps its durable contents plus, chosen by `rng`, a prefix of its
    /// unsynced operations, the last of which may be torn at any byte.
    pub fn crash(&self, rng: &mut SimRng) -> SimFs {
        let state = self.state.borrow();
        let mut survivors: BTreeMap<*const RefCell<Inode>, InodeRef> = BTreeMap::new();
        let mut files = BTreeMap::new();
        for (path, inode) in &state.durable_files {
            let key = Rc::as_ptr(inode);
            let survivor = survivors.entry(key).or_insert_with(|| {
                let inode = inode.borrow();
                let mut data = inode.durable.clone();
                let keep = rng.up_to(inode.pending.len() as u64) as usize;
                for (i, op) in inode.pending.iter().take(keep).enumerate() {
                    match op {
                        Op::Write { pos, bytes } if i + 1 == keep => {
                            let torn = rng.up_to(bytes.len() as u64) as usize;
                            Op::Write { pos: *pos, bytes: bytes[..torn].to_vec() }.apply(&mut data);
                        }
                        other => other.apply(&mut data),
                    }
                }
                Rc::new(RefCell::new(Inode { data: data.clone(), durable: data, pending: Vec::new() }))
            });
            files.insert(path.clone(), survivor.clone());
        }
        let new_state = State { durable_files: files.clone(), files, dirs: state.dirs.clone(), ..State::default() };
        SimFs { state: Rc::new(RefCell::new(new_state)) }
    }

    fn not_found(path: &Path) -> io::Error {
        io::Error::new(io::ErrorKind::NotFound, format!("{}: no such file", path.display()))
    }
}

impl SimFile {
    /// A write the current contents show at once and a crash may lose until the next fdatasync.
    fn record_write(&self, pos: u64, bytes: Vec<u8>) {
        self.state.borrow_mut().writes += 1;
        let op = Op::Write { pos, bytes };
        let mut inode = self.inode.borrow_mut();
        op.apply(&mut inode.data);
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
        self.record_write(pos, buf);
        Ok(())
    }

    async fn write_shared(&self, buf: Rc<Vec<u8>>, pos: u64) -> io::Result<()> {
        self.write_at(buf.as_ref().clone(), pos).await
    }

    fn write_cached(&self, pos: u64, bytes: &[u8]) -> io::Result<()> {
        self.check_space(pos + bytes.len() as u64)?;
        self.record_write(pos, bytes.to_vec());
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
        let mut state = self.state.borrow_mut();
        state.fsyncs += 1;
        if state.fail_fsync {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        let mut inode = self.inode.borrow_mut();
        let pending = std::mem::take(&mut inode.pending);
        for op in &pending {
            op.apply(&mut inode.durable);
        }
        debug_assert_eq!(inode.durable, inode.data);
        Ok(())
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        let op = Op::Truncate { len };
        let mut inode = self.inode.borrow_mut();
        op.apply(&mut inode.data);
        inode.pending.push(op);
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        Ok(self.inode.borrow().data.len() as u64)
    }

    async fn allocate(&self, size: u64) -> io::Result<()> {
        // The size change is metadata like a truncation's: durable at the next sync, lost in a crash.
        if size > self.inode.borrow().data.len() as u64 {
            self.check_space(size)?;
            self.truncate(size).await?;
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

    fn alloc_kept(&self, len: usize) -> Vec<u8> {
        assert!((len as u64).is_multiple_of(ALIGN), "direct write length {len} is not aligned");
        vec![0xAA; len]
    }
}
