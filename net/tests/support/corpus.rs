//! The fuzz target's seed corpus of malformed frames (`net/fuzz/malformed-frames/`), shared by the net
//! and broker tests (the broker's include this file by path).

use std::path::Path;

/// Every corpus file, sorted by name: (file name, bytes). `net_dir` is the `net` package's directory.
pub fn malformed_frames(net_dir: &Path) -> Vec<(String, Vec<u8>)> {
    let dir = net_dir.join("fuzz/malformed-frames");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}
