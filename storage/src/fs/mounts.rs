//! Which filesystem a directory is on, and whether an fdatasync there flushes the device (see
//! [`super::device_flush`]), from `/proc/self/mountinfo`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The filesystem type and its superblock options (the fields after ` - ` in a mountinfo line) of the
/// mount whose device is `major:minor`.
fn find_mount(mountinfo: &str, major: u64, minor: u64) -> Option<(String, String)> {
    let device = format!("{major}:{minor}");
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.nth(2)? != device {
            return None;
        }
        let (_, after) = line.split_once(" - ")?;
        let mut after = after.split(' ');
        let fs_type = after.next()?.to_string();
        let _source = after.next()?;
        Some((fs_type, after.next().unwrap_or("").to_string()))
    })
}

/// Whether on a filesystem of this type and these options an fdatasync of a file with no metadata to
/// commit still flushes the device's write cache (Linux's ext4 and XFS do: `blkdev_issue_flush` when the
/// journal has nothing to send a barrier for). `Err` says why not, or why it is not known.
fn check_filesystem(fs_type: &str, options: &str) -> Result<(), String> {
    if fs_type != "ext4" && fs_type != "xfs" {
        return Err(format!(
            "a {fs_type} filesystem (only ext4 and XFS are known to flush the device at every fdatasync)"
        ));
    }
    for option in options.split(',') {
        match option {
            "nobarrier" | "barrier=0" => {
                return Err(format!("{fs_type} mounted with {option}: no fdatasync flushes the device"));
            }
            "data=journal" => return Err("ext4 with data=journal: data goes through the journal".to_string()),
            _ => {}
        }
    }
    Ok(())
}

/// The check for the filesystem holding `dir` (see [`super::Fs::device_flush_check`]).
pub(super) fn check_dir(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let dev = meta.dev();
    let (fs_type, options) = find_mount(&mountinfo, libc::major(dev) as u64, libc::minor(dev) as u64)
        .ok_or_else(|| format!("no mount of {} in /proc/self/mountinfo", dir.display()))?;
    check_filesystem(&fs_type, &options)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
30 22 0:25 / /tmp rw,nosuid shared:9 - tmpfs tmpfs rw,size=1024k
31 22 253:16 / /data rw,noatime - xfs /dev/vdb rw,attr2,inode64,noquota
32 22 8:2 / /fast rw master:3 - ext4 /dev/sda2 rw,nobarrier,data=ordered
33 22 8:3 / /journal rw - ext4 /dev/sda3 rw,data=journal
";

    #[test]
    fn a_directory_is_found_on_its_device_and_judged_by_its_filesystem_and_options() {
        let judge = |major, minor| {
            let (fs_type, options) = find_mount(MOUNTINFO, major, minor).expect("mounted");
            check_filesystem(&fs_type, &options)
        };
        assert_eq!(judge(8, 1), Ok(()));
        assert_eq!(judge(253, 16), Ok(()));
        assert!(judge(0, 25).unwrap_err().contains("tmpfs"));
        assert!(judge(8, 2).unwrap_err().contains("nobarrier"));
        assert!(judge(8, 3).unwrap_err().contains("data=journal"));
        assert_eq!(find_mount(MOUNTINFO, 9, 9), None);
    }

    #[test]
    fn the_directory_this_test_runs_in_is_checked_without_error_or_with_a_reason() {
        // Whatever the host's filesystem, the check answers (it never fails to parse a real mountinfo).
        match check_dir(Path::new(".")) {
            Ok(()) => {}
            Err(why) => assert!(!why.contains("no mount"), "{why}"),
        }
    }
}
