//! Segment files opened on demand, with a bound on how many are open at once.
//!
//! A segment holds a [`FileHandle`]: its path and, while open, its file. [`OpenFiles::get`] returns the
//! open file, opening it first if need be; once more than `max_open` are open, the least recently used
//! ones that no operation is using are closed. One `OpenFiles` serves all the logs of one owner (a shard),
//! so the bound is per shard, however many partitions it holds.
//!
//! What it must never do: close a file under an operation. An operation holds a clone of the file's `Rc`
//! for as long as it uses it, and a file whose `Rc` is shared is not closed; so the bound can be passed
//! briefly by files in use, and is restored on a later open.

use std::cell::{Cell, RefCell};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};

use super::Fs;
use super::device_flush::DeviceFlush;

/// Default bound on open segment files per owner.
pub const DEFAULT_MAX_OPEN_FILES: usize = 4096;

/// Where a segment's file is, and the file while it is open.
#[derive(Debug)]
pub struct FileHandle<F: Fs>(Rc<Slot<F>>);

impl<F: Fs> Clone for FileHandle<F> {
    fn clone(&self) -> Self {
        FileHandle(self.0.clone())
    }
}

#[derive(Debug)]
struct Slot<F: Fs> {
    path: PathBuf,
    file: RefCell<Option<Rc<F::File>>>,
    last_used: Cell<u64>,
    /// Whether the slot is in `OpenFiles::open` (once at most).
    listed: Cell<bool>,
}

impl<F: Fs> FileHandle<F> {
    pub fn path(&self) -> &Path {
        &self.0.path
    }

    /// Whether two handles are the same segment's.
    pub fn same(&self, other: &Self) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }

    /// Whether the file is open now.
    pub fn is_open(&self) -> bool {
        self.0.file.borrow().is_some()
    }

    /// Closes the file if no operation is using it (it is opened again on the next use).
    pub fn close_if_unused(&self) {
        let mut file = self.0.file.borrow_mut();
        if file.as_ref().is_some_and(|f| Rc::strong_count(f) == 1) {
            *file = None;
        }
    }
}

/// The files open for one owner's logs. See the module documentation.
#[derive(Debug)]
pub struct OpenFiles<F: Fs> {
    fs: F,
    max_open: usize,
    /// Bumped on every use: a file's `last_used` orders it for closing.
    uses: Cell<u64>,
    /// Handles whose file was opened here (some may have been closed or dropped since).
    open: RefCell<Vec<Weak<Slot<F>>>>,
    opens: Cell<u64>,
    /// The flush of the device holding these files, where one covers many of them (see
    /// [`super::device_flush`]); `None`: each file is synced on its own.
    device: Option<Rc<DeviceFlush<F>>>,
}

impl<F: Fs> OpenFiles<F> {
    pub fn new(fs: F, max_open: usize) -> Rc<Self> {
        Self::with_device_flush(fs, max_open, None)
    }

    /// Like [`Self::new`], for files one device flush may make durable together.
    pub fn with_device_flush(fs: F, max_open: usize, device: Option<Rc<DeviceFlush<F>>>) -> Rc<Self> {
        assert!(max_open > 0, "at least one file must be allowed open");
        Rc::new(OpenFiles {
            fs,
            max_open,
            uses: Cell::new(0),
            open: RefCell::new(Vec::new()),
            opens: Cell::new(0),
            device,
        })
    }

    /// The device flush shared by these files, if there is one.
    pub fn device_flush(&self) -> Option<&Rc<DeviceFlush<F>>> {
        self.device.as_ref()
    }

    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// A handle for the file at `path`, not opened yet.
    pub fn handle(&self, path: PathBuf) -> FileHandle<F> {
        FileHandle(Rc::new(Slot { path, file: RefCell::new(None), last_used: Cell::new(0), listed: Cell::new(false) }))
    }

    /// A handle for a file the caller has just opened (or created).
    pub fn adopt(&self, path: PathBuf, file: F::File) -> FileHandle<F> {
        let handle = self.handle(path);
        self.install(&handle, Rc::new(file));
        handle
    }

    /// Like [`Self::adopt`], also returning the file: while the caller holds it, it is never closed
    /// (and so never reopened by path).
    pub fn adopt_pinned(&self, path: PathBuf, file: F::File) -> (FileHandle<F>, Rc<F::File>) {
        let handle = self.handle(path);
        let file = Rc::new(file);
        self.install(&handle, file.clone());
        (handle, file)
    }

    /// The handle's file, opened if it is not.
    pub async fn get(&self, handle: &FileHandle<F>) -> io::Result<Rc<F::File>> {
        handle.0.last_used.set(self.tick());
        if let Some(file) = handle.0.file.borrow().clone() {
            return Ok(file);
        }
        let opened = Rc::new(self.fs.open(&handle.0.path, false).await?);
        self.opens.set(self.opens.get() + 1);
        // Another task may have opened it while this one waited; keep theirs.
        if let Some(file) = handle.0.file.borrow().clone() {
            return Ok(file);
        }
        self.install(handle, opened.clone());
        Ok(opened)
    }

    /// Files open now (including any beyond the bound that are in use).
    pub fn open_count(&self) -> usize {
        self.open.borrow().iter().filter(|w| w.upgrade().is_some_and(|s| s.file.borrow().is_some())).count()
    }

    /// How many times a file was opened again after being closed (or first used after start).
    pub fn reopens(&self) -> u64 {
        self.opens.get()
    }

    fn tick(&self) -> u64 {
        self.uses.set(self.uses.get() + 1);
        self.uses.get()
    }

    fn install(&self, handle: &FileHandle<F>, file: Rc<F::File>) {
        *handle.0.file.borrow_mut() = Some(file);
        handle.0.last_used.set(self.tick());
        let mut open = self.open.borrow_mut();
        if !handle.0.listed.replace(true) {
            open.push(Rc::downgrade(&handle.0));
        }
        self.trim_list(&mut open);
    }

    /// Closes the least recently used files nothing is using while more than the bound are open: files
    /// an operation held past the bound (a burst of appends waiting for their flushes) are closed once it
    /// let them go, without waiting for the next open.
    pub fn trim(&self) {
        self.trim_list(&mut self.open.borrow_mut());
    }

    fn trim_list(&self, open: &mut Vec<Weak<Slot<F>>>) {
        if open.len() <= self.max_open {
            return;
        }
        // Over the bound: forget dropped and closed handles, then close the least recently used files
        // that nothing is using, down to 7/8 of the bound, so the sort is paid once per many opens.
        let forget = |w: &Weak<Slot<F>>| match w.upgrade() {
            Some(s) if s.file.borrow().is_some() => true,
            Some(s) => {
                s.listed.set(false);
                false
            }
            None => false,
        };
        open.retain(forget);
        if open.len() <= self.max_open {
            return;
        }
        let mut slots: Vec<Rc<Slot<F>>> = open.iter().filter_map(Weak::upgrade).collect();
        slots.sort_by_key(|s| s.last_used.get());
        let mut excess = slots.len() - (self.max_open - self.max_open / 8).max(1);
        for slot in &slots {
            if excess == 0 {
                break;
            }
            let mut file = slot.file.borrow_mut();
            if file.as_ref().is_some_and(|f| Rc::strong_count(f) == 1) {
                *file = None;
                excess -= 1;
            }
        }
        open.retain(forget);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::sim::SimFs;
    use futures_lite::future::block_on;

    #[test]
    fn files_held_past_the_bound_are_closed_by_a_trim_once_let_go() {
        let fs = SimFs::new();
        block_on(async {
            fs.create_dir_all(Path::new("/d")).await.unwrap();
            let files = OpenFiles::new(fs.clone(), 2);
            let (mut handles, mut held) = (Vec::new(), Vec::new());
            for i in 0..4 {
                let path = PathBuf::from(format!("/d/{i}"));
                let (handle, file) = files.adopt_pinned(path.clone(), fs.open(&path, true).await.unwrap());
                handles.push(handle);
                held.push(file);
            }
            assert_eq!(files.open_count(), 4, "every file in use: none may be closed");
            files.trim();
            assert_eq!(files.open_count(), 4, "still in use");
            held.clear();
            files.trim();
            assert!(files.open_count() <= 2, "let go: back within the bound ({})", files.open_count());
            assert!(handles[3].is_open(), "the most recently used stays open");
        });
    }

    #[test]
    fn least_recently_used_unused_files_are_closed_beyond_the_bound() {
        let fs = SimFs::new();
        block_on(async {
            fs.create_dir_all(Path::new("/d")).await.unwrap();
            let files = OpenFiles::new(fs.clone(), 2);
            let mut handles = Vec::new();
            for i in 0..3 {
                let path = PathBuf::from(format!("/d/{i}"));
                handles.push(files.adopt(path.clone(), fs.open(&path, true).await.unwrap()));
            }
            // Three opened, bound two: the least recently used (the first) was closed.
            assert_eq!(files.open_count(), 2);
            assert!(!handles[0].is_open() && handles[1].is_open() && handles[2].is_open());
            // Using the first opens it again and closes the next least recently used, the second...
            let in_use = files.get(&handles[0]).await.unwrap();
            assert!(handles[0].is_open() && !handles[1].is_open());
            // ...but a file in use is never closed: the bound is passed until it is released.
            files.get(&handles[1]).await.unwrap();
            assert!(handles[0].is_open(), "the file in use stays open");
            assert!(!handles[2].is_open());
            drop(in_use);
            files.get(&handles[2]).await.unwrap();
            assert_eq!(files.open_count(), 2);
            assert_eq!(files.reopens(), 3);
            // Closing when idle and reopening on use, again and again, lists a file once.
            for _ in 0..10 {
                handles[2].close_if_unused();
                files.get(&handles[2]).await.unwrap();
            }
            assert!(files.open.borrow().len() <= 2, "{} entries", files.open.borrow().len());
        });
    }
}
