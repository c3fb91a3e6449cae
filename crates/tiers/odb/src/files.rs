//! Files the agent serves by reference (FILE, see `proto`): a sender on this host that would
//! copy a file's range into the arena (nginx's `sendfile` of a static file) registers the
//! file once and sends references to its ranges; a FETCH of one is answered with `sendfile`
//! from the agent's own descriptor, so neither the sender nor the agent copies the bytes.
//!
//! Limits and rules, all explicit:
//! - only files under the configured roots (`--files DIR`, none by default: the feature is
//!   off) are opened, after their path is resolved (no symlink or `..` leads out);
//! - the file the agent opens must be the one the sender saw: device, inode, size and
//!   modification time equal to the sender's `fstat`; a fetch checks size and mtime again,
//!   so a file changed since its reference was made fails the fetch (the receiver's
//!   connection fails) rather than delivering other bytes. A change inside one `sendfile`
//!   is seen as it is by nginx's own `sendfile`;
//! - at most [`FILE_NOS`] files are held open; registering one more closes the oldest, whose
//!   references then fail their MAC (a new key per registration).

use crate::proto::*;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One registered file.
pub struct Served {
    pub file: File,
    ident: FileIdent,
    key: [u8; 16],
}

impl Served {
    /// Whether the file is still the version registered (size and mtime).
    fn unchanged(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|m| ident_of(&m) == self.ident)
    }
}

fn ident_of(m: &std::fs::Metadata) -> FileIdent {
    FileIdent {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec(),
    }
}

pub struct FileTable {
    roots: Vec<PathBuf>,
    slots: Vec<Option<Arc<Served>>>,
    by_ident: HashMap<FileIdent, u32>,
    next: u32,
}

impl FileTable {
    /// Serves files under `roots` (resolved now; a root that does not exist is an error).
    pub fn new(roots: &[PathBuf]) -> std::io::Result<FileTable> {
        let roots = roots
            .iter()
            .map(|r| {
                r.canonicalize().map_err(|e| {
                    std::io::Error::new(e.kind(), format!("--files {}: {e}", r.display()))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(FileTable {
            roots,
            slots: Vec::new(),
            by_ident: HashMap::new(),
            next: 0,
        })
    }

    /// FILE: the number and key of the file at `path` if it is under a root and is the
    /// version `ident` names; else ST_UNKNOWN (the sender then copies, as before).
    pub fn register(&mut self, ident: FileIdent, path: &[u8]) -> Result<(u32, [u8; 16]), u8> {
        if let Some(&no) = self.by_ident.get(&ident) {
            let s = self.slots[no as usize].as_ref().expect("a registered slot");
            return Ok((no, s.key));
        }
        let file = self.open_under_roots(path).ok_or(ST_UNKNOWN)?;
        let meta = file.metadata().map_err(|_| ST_UNKNOWN)?;
        if !meta.is_file() || ident_of(&meta) != ident {
            return Err(ST_UNKNOWN);
        }
        let no = self.next;
        self.next = (self.next + 1) % FILE_NOS;
        if self.slots.len() <= no as usize {
            self.slots.resize(no as usize + 1, None);
        }
        if let Some(old) = self.slots[no as usize].take() {
            self.by_ident.remove(&old.ident);
        }
        let key = crate::random::random_u128().to_le_bytes();
        self.slots[no as usize] = Some(Arc::new(Served { file, ident, key }));
        self.by_ident.insert(ident, no);
        Ok((no, key))
    }

    fn open_under_roots(&self, path: &[u8]) -> Option<File> {
        let real = Path::new(std::ffi::OsStr::from_bytes(path))
            .canonicalize()
            .ok()?;
        if !self.roots.iter().any(|r| real.starts_with(r)) {
            return None;
        }
        File::open(real).ok()
    }

    /// A FETCH of a file range: the file, where in it, and how much; ST_UNKNOWN for a forged
    /// or stale id, a range outside the reference or the file, or a file changed since.
    pub fn check_fetch(&self, id: u128, off: u64, len: u64) -> Result<(Arc<Served>, u64), u8> {
        let (no, start, rlen) = file_id_parts(id).ok_or(ST_UNKNOWN)?;
        let s = self
            .slots
            .get(no as usize)
            .and_then(|s| s.as_ref())
            .filter(|s| file_id_valid(id, &s.key))
            .ok_or(ST_UNKNOWN)?;
        let in_ref = len > 0 && off.checked_add(len).is_some_and(|e| e <= rlen as u64);
        if !in_ref || start + rlen as u64 > s.ident.size || !s.unchanged() {
            return Err(ST_UNKNOWN);
        }
        Ok((s.clone(), start + off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(p: &Path) -> FileIdent {
        ident_of(&std::fs::metadata(p).unwrap())
    }

    #[test]
    fn files_are_served_only_under_the_roots_and_as_the_sender_saw_them() {
        let dir = std::env::temp_dir().join(format!("odb-files-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let inside = root.join("a.bin");
        let outside = dir.join("secret");
        std::fs::write(&inside, vec![7u8; 10000]).unwrap();
        std::fs::write(&outside, b"no").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let mut t = FileTable::new(std::slice::from_ref(&root)).unwrap();
        let bytes = |p: &Path| p.as_os_str().as_bytes().to_vec();

        let (no, key) = t.register(ident(&inside), &bytes(&inside)).unwrap();
        assert_eq!(t.register(ident(&inside), &bytes(&inside)), Ok((no, key)));
        let id = file_buf_id(no, 4096, 4096, &key);
        let (s, at) = t.check_fetch(id, 100, 200).unwrap();
        assert_eq!(at, 4196);
        assert_eq!(s.file.metadata().unwrap().len(), 10000);
        assert_eq!(
            t.check_fetch(id, 4000, 200).err(),
            Some(ST_UNKNOWN),
            "past the ref"
        );
        assert_eq!(
            t.check_fetch(id ^ 1, 0, 1).err(),
            Some(ST_UNKNOWN),
            "forged"
        );
        let beyond = file_buf_id(no, 8192, 4096, &key);
        assert_eq!(
            t.check_fetch(beyond, 0, 1).err(),
            Some(ST_UNKNOWN),
            "past the file"
        );

        let via_link = root.join("link");
        assert_eq!(
            t.register(ident(&outside), &bytes(&via_link)),
            Err(ST_UNKNOWN)
        );
        assert_eq!(
            t.register(ident(&outside), &bytes(&outside)),
            Err(ST_UNKNOWN)
        );
        let dotdot = root.join("../secret");
        assert_eq!(
            t.register(ident(&outside), &bytes(&dotdot)),
            Err(ST_UNKNOWN)
        );
        let mut wrong = ident(&inside);
        wrong.size += 1;
        assert_eq!(
            t.register(wrong, &bytes(&inside)),
            Err(ST_UNKNOWN),
            "another version"
        );

        // changed after the reference was made: the fetch fails, no other bytes go out
        std::fs::write(&inside, vec![8u8; 20000]).unwrap();
        assert_eq!(t.check_fetch(id, 100, 200).err(), Some(ST_UNKNOWN));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_roots_no_file_is_served() {
        let mut t = FileTable::new(&[]).unwrap();
        let p = std::env::current_exe().unwrap();
        let path = p.as_os_str().as_bytes().to_vec();
        assert_eq!(t.register(ident(&p), &path), Err(ST_UNKNOWN));
    }
}
