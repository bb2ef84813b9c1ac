//! A flow file that outlives a full disk: IPFIX messages or CSV/JSON lines are held in
//! memory and written whole; a write the disk refuses is cut back off the file, the units
//! are held (up to [`FileOut::HOLD_MAX`] bytes) and written when the disk takes them
//! again. What does not fit while it refuses is lost and counted.
//!
//! Invariant: the file holds whole units only (`end` is where the last whole one ends),
//! so a reader never meets half a line or half a message, whatever the disk did.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct FileOut {
    path: PathBuf,
    file: File,
    /// Where the file's whole units end.
    end: u64,
    /// Units not yet written: their bytes, and where each ends in them with its flow
    /// records.
    held: Vec<u8>,
    held_units: Vec<(usize, u32)>,
    /// Units, bytes and flow records in the file.
    pub units: u64,
    pub bytes: u64,
    pub records: u64,
    /// Units (and their records) that found no room while the disk refused.
    pub lost: u64,
    pub records_lost: u64,
    /// Why the disk refuses writes, while it does.
    pub refusing: Option<String>,
    /// Times the disk took writes again after refusing them.
    pub recovered: u64,
}

impl FileOut {
    /// What is held before it is written, while the disk takes writes.
    const HOLD: usize = 1 << 20;
    /// What may be held while the disk refuses writes.
    pub const HOLD_MAX: usize = 64 << 20;

    pub fn create(path: &Path) -> std::io::Result<FileOut> {
        Ok(FileOut {
            path: path.to_path_buf(),
            file: File::create(path)?,
            end: 0,
            held: Vec::new(),
            held_units: Vec::new(),
            units: 0,
            bytes: 0,
            records: 0,
            lost: 0,
            records_lost: 0,
            refusing: None,
            recovered: 0,
        })
    }

    /// One unit (a message or a line) with its flow records.
    pub fn write(&mut self, unit: &[u8], records: u32) {
        if self.held.len() + unit.len() > Self::HOLD_MAX {
            self.lost += 1;
            self.records_lost += u64::from(records);
            return;
        }
        self.held.extend_from_slice(unit);
        self.held_units.push((self.held.len(), records));
        if self.held.len() >= Self::HOLD && self.refusing.is_none() {
            self.flush();
        }
    }

    /// Writes what is held. When the disk refuses part of it, the units it took whole
    /// stay, the file is cut back to the last of them, and the rest stays held.
    pub fn flush(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut done = 0;
        let result = loop {
            if done == self.held.len() {
                break Ok(());
            }
            match self
                .file
                .write_at(&self.held[done..], self.end + done as u64)
            {
                Ok(0) => break Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        let whole = self.held_units.partition_point(|&(end, _)| end <= done);
        let kept = whole
            .checked_sub(1)
            .map_or(0, |last| self.held_units[last].0);
        if kept < done {
            // What the disk took of a unit it did not take whole is cut off again.
            let _ = self.file.set_len(self.end + kept as u64);
        }
        self.end += kept as u64;
        self.units += whole as u64;
        self.bytes += kept as u64;
        self.records += (self.held_units[..whole].iter())
            .map(|&(_, r)| u64::from(r))
            .sum::<u64>();
        self.held.drain(..kept);
        self.held_units.drain(..whole);
        self.held_units.iter_mut().for_each(|(end, _)| *end -= kept);
        match result {
            Ok(()) => {
                if let Some(cause) = self.refusing.take() {
                    self.recovered += 1;
                    log::info!(
                        "{}: written again after the disk refused ({cause}); {} units lost \
                         meanwhile",
                        self.path.display(),
                        self.lost
                    );
                }
            }
            Err(e) => {
                if self.refusing.is_none() {
                    log::warn!(
                        "{}: {e}; holding what comes (up to {} MiB) until the disk takes it, \
                         past that it is lost and counted",
                        self.path.display(),
                        Self::HOLD_MAX >> 20
                    );
                }
                self.refusing = Some(e.to_string());
            }
        }
    }

    /// The end: what is held is written if the disk takes it, else lost and counted;
    /// the error if so.
    pub fn finish(&mut self) -> Option<String> {
        self.flush();
        let cause = self.refusing.clone()?;
        self.lost += self.held_units.len() as u64;
        self.records_lost += (self.held_units.iter())
            .map(|&(_, r)| u64::from(r))
            .sum::<u64>();
        self.held.clear();
        self.held_units.clear();
        Some(format!(
            "the disk refuses writes ({cause}): {} units and {} flow records lost",
            self.lost, self.records_lost
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tmpfs of `kib` KiB mounted on a directory of its own, unmounted when dropped: a
    /// disk that really fills.
    struct SmallDisk(PathBuf);

    impl SmallDisk {
        fn mount(name: &str, kib: u64) -> SmallDisk {
            let dir = std::env::temp_dir().join(format!(
                "stateplane-test-disk-{}-{name}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let out = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
                .arg(&dir)
                .output()
                .expect("mount (util-linux) runs");
            assert!(
                out.status.success(),
                "mounting a small tmpfs needs root: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            SmallDisk(dir)
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A disk that fills mid-run: the file keeps whole lines only, what comes while it
    /// is full is held and written once room is made, nothing is lost; past the hold's
    /// bound lines are lost and counted; a disk still full at the end is an error that
    /// says what was lost.
    #[test]
    fn a_full_disk_holds_lines_and_writes_them_when_room_returns() {
        let disk = SmallDisk::mount("full", 256);
        let filler = disk.0.join("filler");
        let path = disk.0.join("flows.csv");
        let mut out = FileOut::create(&path).unwrap();
        let line = |i: u32| format!("{i:08},198.18.0.1,198.18.0.2,17,4242,53,1,100\n");
        let mut n = 0;
        for _ in 0..100 {
            out.write(line(n).as_bytes(), 1);
            n += 1;
        }
        out.flush();
        assert_eq!(out.records, 100);
        // The disk fills: only a few bytes are left.
        let free = 256 * 1024 - std::fs::metadata(&path).unwrap().len() - 4096;
        let _ = std::fs::write(&filler, vec![0u8; free as usize]);
        for _ in 0..5_000 {
            out.write(line(n).as_bytes(), 1);
            n += 1;
        }
        out.flush();
        assert!(out.refusing.is_some(), "the disk is full");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with('\n'), "whole lines only");
        assert_eq!(out.records as usize, text.lines().count());
        // Room again: everything held is written, in order.
        std::fs::remove_file(&filler).unwrap();
        out.flush();
        assert_eq!((out.refusing.as_deref(), out.recovered), (None, 1));
        assert_eq!(out.finish(), None);
        let text = std::fs::read_to_string(&path).unwrap();
        let numbers: Vec<u32> = text.lines().map(|l| l[..8].parse().unwrap()).collect();
        assert_eq!(numbers, (0..n).collect::<Vec<_>>());
        assert_eq!((out.records, out.lost), (u64::from(n), 0));
    }

    /// Past the hold's bound, what comes is lost and counted; still full at the end, what
    /// is held is lost too, and the end says so.
    #[test]
    fn a_disk_full_to_the_end_loses_what_is_held_and_says_so() {
        let placeholder =
            std::env::temp_dir().join(format!("stateplane-test-disk-{}", std::process::id()));
        let mut out = FileOut::create(&placeholder).unwrap();
        std::fs::remove_file(&placeholder).unwrap();
        // Every write refused with ENOSPC.
        out.file = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let unit = vec![b'x'; 1 << 16];
        let fits = FileOut::HOLD_MAX / unit.len();
        for _ in 0..fits + 10 {
            out.write(&unit, 3);
            out.flush();
        }
        assert_eq!((out.lost, out.records_lost), (10, 30));
        let error = out.finish().unwrap_or_default();
        assert!(error.contains("No space left on device"), "{error}");
        assert_eq!(out.lost as usize, fits + 10);
        assert_eq!(out.records, 0);
    }
}
