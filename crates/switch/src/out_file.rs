//! A file a run writes once, at its end (a summary, the collector's dump), that appears
//! whole or not at all, and whose folder is checked before the run starts.
//!
//! Owns: the file beside the path (`.NAME.partial`), made and removed at the check so
//! that a folder this user cannot write is refused before any work, and made again only to
//! write the contents, then renamed onto the path. A reader (`stateplane report`, a script
//! polling for the file) never sees half of one, a run killed before its end (SIGKILL, the
//! host gone) leaves nothing behind, and a run that cannot start leaves what was at the
//! path as it was.
//!
//! Must never: leave the file beside the path behind, or write at the path itself.

use std::io::Write;
use std::path::{Path, PathBuf};

pub struct OutFile {
    /// The flag or setting that named the path, for errors.
    flag: &'static str,
    path: PathBuf,
    partial: PathBuf,
}

impl OutFile {
    /// The file `flag` names at `path`, once a file beside it could be made (and removed
    /// again); the error names the flag and the fix.
    pub fn checked(flag: &'static str, path: &Path) -> Result<OutFile, String> {
        let name = path.file_name().map_or_else(
            || std::ffi::OsString::from("out"),
            std::ffi::OsStr::to_os_string,
        );
        let mut partial_name = std::ffi::OsString::from(".");
        partial_name.push(&name);
        partial_name.push(".partial");
        let file = OutFile {
            flag,
            path: path.to_path_buf(),
            partial: path.with_file_name(partial_name),
        };
        std::fs::File::create(&file.partial)
            .and_then(|_| std::fs::remove_file(&file.partial))
            .map_err(|e| {
                format!(
                    "{}: give a path in a folder this user can write",
                    file.error(e)
                )
            })?;
        Ok(file)
    }

    /// The path it is written to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes what `contents` writes into the file beside the path, then renames it onto
    /// the path; on an error, nothing is left beside it and the path is as it was.
    pub fn write(
        self,
        contents: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<(), String> {
        let written = std::fs::File::create(&self.partial).and_then(|file| {
            let mut out = std::io::BufWriter::new(file);
            contents(&mut out)
                .and_then(|()| out.flush())
                .and_then(|()| std::fs::rename(&self.partial, &self.path))
        });
        written.map_err(|e| {
            let _ = std::fs::remove_file(&self.partial);
            self.error(e)
        })
    }

    fn error(&self, e: std::io::Error) -> String {
        format!("{} {}: {e}", self.flag, self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_that_cannot_be_written_is_refused_before_and_a_write_is_whole() {
        let dir = std::env::temp_dir().join(format!("stateplane-out-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = OutFile::checked("--dump", &dir.join("no/such/folder.csv"))
            .err()
            .unwrap();
        assert!(err.starts_with("--dump "), "{err}");
        assert!(
            err.contains("give a path in a folder this user can write"),
            "{err}"
        );

        let path = dir.join("x.csv");
        std::fs::write(&path, "before").unwrap();
        let file = OutFile::checked("--dump", &path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "before");
        // A write that fails leaves the path as it was and nothing beside it.
        let failed = file.write(|out| {
            out.write_all(b"half")?;
            Err(std::io::Error::other("the source went away"))
        });
        assert!(failed.unwrap_err().contains("the source went away"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "before");
        let file = OutFile::checked("--dump", &path).unwrap();
        file.write(|out| out.write_all(b"whole")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "whole");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "only the file itself: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
