//! A TCP collector's spool: the IPFIX messages it could not be given (exported while its
//! connection was down, or written and never acknowledged when the connection ended),
//! kept in a file in the order they came and sent before anything newer once it is back.
//! The file outlives the run: what is left in it at the end goes first in the next run
//! that spools to it.
//!
//! Invariant: the file is an IPFIX file (RFC 5655) that tools read on their own: a
//! templates message, then whole data messages; a message cut short by a full disk is cut
//! off again, and one cut short by a crash is dropped (and counted) when the file is
//! opened. Messages before `head` have been sent.
//!
//! Must never: grow past its bound (what does not fit is refused, for the caller to count
//! as lost), or send anything itself.

use stateplane_flows::ipfix::Decoder;
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub struct Spool {
    path: PathBuf,
    file: File,
    /// The bytes it may hold.
    max: u64,
    /// Where the next message to send starts, and where the file's whole messages end.
    head: u64,
    end: u64,
    /// Each waiting message's length and flow records, oldest first.
    waiting: VecDeque<(u32, u32)>,
    /// Flow records in `waiting`.
    records: u64,
    /// The templates message the file begins with: what a connection that resumes sending
    /// from the middle of the file needs first, and what the file is cut back to start
    /// with.
    templates: Vec<u8>,
}

/// What opening a spool found in it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    pub messages: u64,
    pub records: u64,
    /// Bytes at its end that were not whole messages (a crash mid-write), dropped.
    pub dropped_bytes: u64,
}

/// A message's length, from its header, if it has one that is plausible.
fn message_len(bytes: &[u8]) -> Option<usize> {
    let len = usize::from(u16::from_be_bytes([*bytes.get(2)?, *bytes.get(3)?]));
    (bytes.get(..2) == Some(&10u16.to_be_bytes()[..]) && len >= 16).then_some(len)
}

impl Spool {
    /// The spool of the collector at `addr` in `dir` (made if missing), holding at most
    /// `max` bytes; what a previous run left in it waits to be sent.
    pub fn open(
        dir: &Path,
        addr: &std::net::SocketAddr,
        max: u64,
    ) -> std::io::Result<(Spool, Found)> {
        std::fs::create_dir_all(dir)?;
        let name = format!("{}_{}.ipfix", addr.ip(), addr.port()).replace(':', "-");
        let path = dir.join(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut spool = Spool {
            path,
            file,
            max,
            head: 0,
            end: 0,
            waiting: VecDeque::new(),
            records: 0,
            templates: Vec::new(),
        };
        let found = spool.read_back()?;
        Ok((spool, found))
    }

    /// Indexes the whole messages the file holds (decoding them for their records), and
    /// cuts off what follows the last.
    fn read_back(&mut self) -> std::io::Result<Found> {
        let bytes = std::fs::read(&self.path)?;
        let mut decoder = Decoder::default();
        let mut at = 0;
        while let Some(len) = message_len(&bytes[at..]) {
            let Some(message) = bytes.get(at..at + len) else {
                break;
            };
            let Ok((_, records)) = decoder.decode(message) else {
                break;
            };
            if at == 0 && records.is_empty() {
                self.templates = message.to_vec();
            }
            self.waiting.push_back((len as u32, records.len() as u32));
            self.records += records.len() as u64;
            at += len;
        }
        let found = Found {
            messages: self.data_waiting(),
            records: self.records,
            dropped_bytes: (bytes.len() - at) as u64,
        };
        self.end = at as u64;
        self.file.set_len(self.end)?;
        if found.records == 0 {
            self.clear()?;
        }
        Ok(found)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Messages waiting that carry records (not the templates message).
    pub fn data_waiting(&self) -> u64 {
        self.waiting.iter().filter(|&&(_, r)| r > 0).count() as u64
    }

    /// Flow records waiting.
    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// Keeps `message` (with its `records`) after the others; an empty spool starts with
    /// `templates`, so that the file is readable on its own. False when it does not fit
    /// or cannot be written (nothing of it is kept then).
    pub fn push(&mut self, templates: &[u8], message: &[u8], records: u32) -> bool {
        // A templates message first is its own templates.
        let first = self.waiting.is_empty() && records > 0;
        let needed = message.len() as u64 + if first { templates.len() as u64 } else { 0 };
        if self.end + needed > self.max {
            return false;
        }
        let written = (if first {
            self.append(templates, 0)
        } else {
            Ok(())
        })
        .and_then(|()| self.append(message, records));
        match written {
            Ok(()) => true,
            Err(e) => {
                log::warn!("ipfix spool {}: {e}", self.path.display());
                // What a full disk let through of the message is cut off again.
                let _ = self.file.set_len(self.end);
                if first {
                    let _ = self.clear();
                }
                false
            }
        }
    }

    fn append(&mut self, message: &[u8], records: u32) -> std::io::Result<()> {
        if self.end == 0 && records == 0 {
            self.templates = message.to_vec();
        }
        self.file.write_all_at(message, self.end)?;
        self.end += message.len() as u64;
        self.waiting.push_back((message.len() as u32, records));
        self.records += u64::from(records);
        Ok(())
    }

    /// The oldest message waiting, with its records.
    pub fn front(&self) -> std::io::Result<Option<(Vec<u8>, u32)>> {
        let Some(&(len, records)) = self.waiting.front() else {
            return Ok(None);
        };
        let mut message = vec![0; len as usize];
        self.file.read_exact_at(&mut message, self.head)?;
        Ok(Some((message, records)))
    }

    /// The oldest message was sent: it is forgotten (and the file emptied with the last).
    pub fn pop(&mut self) -> std::io::Result<()> {
        if let Some((len, records)) = self.waiting.pop_front() {
            self.head += u64::from(len);
            self.records -= u64::from(records);
        }
        if self.records == 0 {
            self.clear()?;
        }
        Ok(())
    }

    /// The templates message the spool's data was made with.
    pub fn templates(&self) -> &[u8] {
        &self.templates
    }

    /// Forgets everything (a templates message alone is not worth keeping).
    fn clear(&mut self) -> std::io::Result<()> {
        self.waiting.clear();
        self.templates.clear();
        (self.head, self.end, self.records) = (0, 0, 0);
        self.file.set_len(0)
    }

    /// The end of a run: what was sent is cut from the file (its templates kept in
    /// front), so that the next run sends only what is left, and the file goes to the
    /// disk. Written beside it and renamed over it, so that a crash leaves one or the
    /// other whole.
    pub fn close(&mut self) -> std::io::Result<()> {
        if self.head > 0 && !self.is_empty() {
            let kept_from = self.head;
            let mut rest = vec![0; (self.end - kept_from) as usize];
            self.file.read_exact_at(&mut rest, kept_from)?;
            let mut next = self.path.as_os_str().to_owned();
            next.push(".next");
            let next = PathBuf::from(next);
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&next)?;
            let starts_with_templates = self.waiting.front().is_some_and(|&(_, r)| r == 0);
            if !starts_with_templates {
                std::io::Write::write_all(&mut file, &self.templates)?;
                self.waiting.push_front((self.templates.len() as u32, 0));
            }
            std::io::Write::write_all(&mut file, &rest)?;
            file.sync_data()?;
            std::fs::rename(&next, &self.path)?;
            self.end = (self.end - kept_from)
                + if starts_with_templates {
                    0
                } else {
                    self.templates.len() as u64
                };
            (self.file, self.head) = (file, 0);
        }
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_flows::ipfix::Encoder;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "stateplane-test-spool-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Messages of `n` records each, after their templates message.
    fn messages(n: usize, count: usize) -> (Vec<u8>, Vec<(Vec<u8>, u32)>) {
        use stateplane_flows::ipfix::{Features, TemplateRefresh};
        let mut enc = Encoder::new(1, Features::DEFAULT, false, 65_535, TemplateRefresh::ONCE);
        let mut all = Vec::new();
        for i in 0..count {
            let records = crate::export::tests::records(i as u16 * 100, n as u16);
            enc.encode_counted(&records, 1, &mut |m, r| all.push((m.to_vec(), r)));
            enc.finish_counted(&mut |m, r| all.push((m.to_vec(), r)));
        }
        let templates = all.remove(0);
        assert_eq!(templates.1, 0);
        (templates.0, all)
    }

    /// Messages come out in the order they went in; the file is an IPFIX file while it
    /// holds any; past its bound a message is refused; what is left at the end is there
    /// for the next open, and a message cut short (a crash) is dropped and counted.
    #[test]
    fn a_spool_keeps_messages_in_order_across_runs_and_within_its_bound() {
        let d = dir("order");
        let addr = "127.0.0.1:4739".parse().unwrap();
        let (templates, data) = messages(10, 3);
        let (mut spool, found) = Spool::open(&d, &addr, 1 << 20).unwrap();
        assert_eq!(found, Found::default());
        for (m, r) in &data {
            assert!(spool.push(&templates, m, *r));
        }
        assert_eq!((spool.data_waiting(), spool.records()), (3, 30));
        let on_disk = std::fs::read(spool.path()).unwrap();
        assert_eq!(&on_disk[..templates.len()], &templates[..]);
        let (first, records) = spool.front().unwrap().unwrap();
        assert_eq!((first, records), (templates.clone(), 0));
        spool.pop().unwrap();
        assert_eq!(spool.front().unwrap().unwrap(), data[0]);
        spool.pop().unwrap();
        spool.close().unwrap();
        drop(spool);

        // The next run finds what is left (the templates, then two messages), and drops a
        // half-written message after them.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("127.0.0.1_4739.ipfix"))
            .unwrap();
        std::io::Write::write_all(&mut file, &data[0].0[..40]).unwrap();
        drop(file);
        let (mut spool, found) = Spool::open(&d, &addr, 1 << 20).unwrap();
        assert_eq!(
            found,
            Found {
                messages: 2,
                records: 20,
                dropped_bytes: 40
            }
        );
        assert_eq!(spool.front().unwrap().unwrap(), (templates.clone(), 0));
        spool.pop().unwrap();
        assert_eq!(spool.front().unwrap().unwrap(), data[1]);
        spool.pop().unwrap();
        spool.pop().unwrap();
        assert!(spool.is_empty());
        assert_eq!(
            std::fs::metadata(spool.path()).unwrap().len(),
            0,
            "an empty spool is an empty file"
        );

        // Its bound: the templates and one message fit, the next does not.
        let max = (templates.len() + data[0].0.len()) as u64;
        let (mut small, _) = Spool::open(&dir("bound"), &addr, max).unwrap();
        assert!(small.push(&templates, &data[0].0, data[0].1));
        assert!(!small.push(&templates, &data[1].0, data[1].1));
        assert_eq!(small.records(), 10);
        let _ = std::fs::remove_dir_all(d);
        let _ = std::fs::remove_dir_all(dir("bound"));
    }

    /// A disk that takes nothing (`/dev/full`'s ENOSPC on every write): the message is
    /// refused and the spool stays as it was.
    #[test]
    fn a_full_disk_refuses_the_message_and_keeps_the_spool_whole() {
        let (templates, data) = messages(5, 1);
        let mut spool = Spool {
            path: PathBuf::from("/dev/full"),
            file: std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/full")
                .unwrap(),
            max: 1 << 20,
            head: 0,
            end: 0,
            waiting: VecDeque::new(),
            records: 0,
            templates: Vec::new(),
        };
        assert!(!spool.push(&templates, &data[0].0, data[0].1));
        assert!(spool.is_empty());
        assert_eq!(spool.front().unwrap(), None);
    }
}
