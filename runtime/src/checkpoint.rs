//! Checkpoint files: each written whole or not at all, and checked when read, so that a file
//! torn by a crash or a full disk is told from a good one and the one before it is used
//! (ARCHITECTURE.md §11).
//!
//! A file holds magic bytes naming the format, the iteration it was taken at, the length of its
//! payload, the payload, and a CRC-32 of everything before it. It is written to a temporary
//! name, flushed to the disk, renamed into place and the directory flushed too: a reader sees
//! the old set of files or the new one, never half a file under a checkpoint's name.

use std::fs::{self, File};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use pserver_core::Value;
use pserver_core::wire::ShardCopy;
use thiserror::Error;

/// The first bytes of a checkpoint file.
const MAGIC: &[u8; 8] = b"PSCKv1\0\0";

/// Bytes around the payload: the magic, the iteration, the length, and the checksum.
const FRAMING: usize = 8 + 8 + 8 + 4;

/// A directory of checkpoint files, one per iteration taken (`ckpt-ITERATION.bin`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointDir {
    dir: PathBuf,
}

/// A checkpoint read back whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The iteration it was taken at.
    pub iteration: u64,
    /// What was written.
    pub payload: Vec<u8>,
    /// Its file.
    pub path: PathBuf,
}

/// Why a checkpoint file was not taken.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// It could not be read.
    #[error("cannot read it: {0}")]
    Io(#[from] io::Error),
    /// It does not start as a checkpoint does.
    #[error("not a checkpoint file (wrong magic bytes)")]
    NotACheckpoint,
    /// It is shorter or longer than its header says: torn.
    #[error("torn: {got} bytes where its header says {expected}")]
    Torn {
        /// The bytes the header implies.
        expected: u64,
        /// The bytes there are.
        got: u64,
    },
    /// Its bytes do not match their checksum.
    #[error("corrupt: its checksum does not match its bytes")]
    Corrupt,
    /// Its header names another iteration than its file name.
    #[error("it holds iteration {inside}, but is named for {named}")]
    Misnamed {
        /// The iteration its name gives.
        named: u64,
        /// The iteration its header gives.
        inside: u64,
    },
    /// It reads back whole, but its payload is not one this reader can use.
    #[error("whole, but {0}")]
    Unusable(String),
}

/// Files that did not read back whole, with why.
pub type Refused = Vec<(PathBuf, CheckpointError)>;

/// What [`CheckpointDir::latest`] found: the newest good checkpoint, and every newer file it
/// refused, with why, for the caller to say.
#[derive(Debug, Default)]
pub struct Latest {
    /// The newest checkpoint that reads back whole, if any.
    pub found: Option<Checkpoint>,
    /// Newer files that did not, newest first.
    pub refused: Refused,
}

impl CheckpointDir {
    /// The checkpoints in `dir`, which is created if it does not exist.
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(CheckpointDir { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file_of(&self, iteration: u64) -> PathBuf {
        self.dir.join(format!("ckpt-{iteration:020}.bin"))
    }

    /// Writes the checkpoint of `iteration` holding `payload`, atomically: written to a
    /// temporary file, flushed, renamed into place, and the directory flushed. A checkpoint of
    /// the same iteration written before is replaced.
    pub fn write(&self, iteration: u64, payload: &[u8]) -> io::Result<PathBuf> {
        Ok(self.write_with(iteration, |out| out.write_all(payload))?.0)
    }

    /// [`CheckpointDir::write`], the payload being what `payload` writes: streamed to the
    /// file as it is made, never held whole in memory, and checksummed on the way. Returns the
    /// file and the payload's bytes.
    pub fn write_with(
        &self,
        iteration: u64,
        payload: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> io::Result<(PathBuf, u64)> {
        let path = self.file_of(iteration);
        let temporary = self.dir.join(format!(".ckpt-{iteration:020}.tmp"));
        let mut head = [0u8; FRAMING - 4];
        head[..8].copy_from_slice(MAGIC);
        head[8..16].copy_from_slice(&iteration.to_le_bytes());
        // Small fields batched into few writes; a block of values as big as the buffer goes
        // to the file as it is. A store's leaves hold a few thousand rows, so their blocks
        // are tens of kilobytes: through a buffer of a megabyte, every byte of the model was
        // copied once more (an eighth of a checkpoint's time).
        let mut out =
            BufWriter::with_capacity(WRITE_BUFFER, WrittenBack::new(File::create(&temporary)?));
        // The length is known once the payload is written: a placeholder until then.
        out.write_all(&head)?;
        let mut summed = Summed {
            out: &mut out,
            sum: crc32fast::Hasher::new(),
            len: 0,
        };
        payload(&mut summed)?;
        let (payload_sum, len) = (summed.sum, summed.len);
        head[16..24].copy_from_slice(&len.to_le_bytes());
        let mut sum = crc32fast::Hasher::new();
        sum.update(&head);
        sum.combine(&payload_sum);
        out.write_all(&sum.finalize().to_le_bytes())?;
        let mut file = out
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?
            .file;
        file.seek(SeekFrom::Start(16))?;
        file.write_all(&head[16..24])?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temporary, &path)?;
        // The rename is durable only once the directory is.
        File::open(&self.dir)?.sync_all()?;
        Ok((path, len))
    }

    /// The iterations of the checkpoint files in the directory, newest first (whether or not
    /// they read back whole).
    pub fn iterations(&self) -> io::Result<Vec<u64>> {
        let mut found: Vec<u64> = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let iteration: Option<u64> = name
                .to_str()
                .and_then(|n| n.strip_prefix("ckpt-")?.strip_suffix(".bin")?.parse().ok());
            found.extend(iteration);
        }
        found.sort_unstable_by(|a, b| b.cmp(a));
        Ok(found)
    }

    /// Reads the checkpoint of `iteration`, checking its length and checksum.
    pub fn read(&self, iteration: u64) -> Result<Checkpoint, CheckpointError> {
        let path = self.file_of(iteration);
        let bytes = fs::read(&path)?;
        let head = bytes.get(..24).ok_or(CheckpointError::Torn {
            expected: FRAMING as u64,
            got: bytes.len() as u64,
        })?;
        if &head[..8] != MAGIC {
            return Err(CheckpointError::NotACheckpoint);
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&head[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let (inside, len) = (word(8), word(16));
        let expected = len.saturating_add(FRAMING as u64);
        if bytes.len() as u64 != expected {
            return Err(CheckpointError::Torn {
                expected,
                got: bytes.len() as u64,
            });
        }
        let (body, sum) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != sum {
            return Err(CheckpointError::Corrupt);
        }
        if inside != iteration {
            return Err(CheckpointError::Misnamed {
                named: iteration,
                inside,
            });
        }
        Ok(Checkpoint {
            iteration,
            payload: body[24..].to_vec(),
            path,
        })
    }

    /// Every checkpoint that reads back whole, newest first, and every file that does not,
    /// with why: what a server offers when a job resumes.
    pub fn good(&self) -> io::Result<(Vec<u64>, Refused)> {
        self.good_for(|_| Ok(()))
    }

    /// [`CheckpointDir::good`], a checkpoint counting only if `usable` accepts its payload
    /// (a server's: [`usable_shards`]).
    pub fn good_for(
        &self,
        usable: impl Fn(&[u8]) -> Result<(), String>,
    ) -> io::Result<(Vec<u64>, Refused)> {
        let mut good = Vec::new();
        let mut refused = Vec::new();
        for iteration in self.iterations()? {
            let read = self.read(iteration).and_then(|checkpoint| {
                usable(&checkpoint.payload).map_err(CheckpointError::Unusable)
            });
            match read {
                Ok(()) => good.push(iteration),
                Err(why) => refused.push((self.file_of(iteration), why)),
            }
        }
        Ok((good, refused))
    }

    /// Removes every checkpoint but the newest `keep`: the one before the newest stays, for a
    /// newest that turns out torn or that other servers never completed.
    pub fn retain_newest(&self, keep: usize) -> io::Result<()> {
        for iteration in self.iterations()?.into_iter().skip(keep) {
            fs::remove_file(self.file_of(iteration))?;
        }
        Ok(())
    }

    /// The newest checkpoint that reads back whole; every newer file that does not is
    /// refused, with why.
    pub fn latest(&self) -> io::Result<Latest> {
        let mut latest = Latest::default();
        for iteration in self.iterations()? {
            match self.read(iteration) {
                Ok(checkpoint) => {
                    latest.found = Some(checkpoint);
                    break;
                }
                Err(why) => latest.refused.push((self.file_of(iteration), why)),
            }
        }
        Ok(latest)
    }
}

/// The checkpoint writer's buffer: smaller than a leaf's block of values
/// ([`pserver_core::store::OrderedStore`]), which goes to the file unbuffered.
const WRITE_BUFFER: usize = 16 << 10;

/// Magic bytes of a server's checkpoint payload: its shards, their rows run by run.
const SHARDS_MAGIC: &[u8; 8] = b"PSSHARD2";

/// Magic bytes of the payloads of earlier versions, which held each shard's rows as one
/// block.
const SHARDS_MAGIC_V1: &[u8; 8] = b"PSSHARD1";

/// Bytes written to a checkpoint file between two requests to the disk to start writing them.
const WRITEBACK_EVERY: u64 = 8 << 20;

/// A file written front to back whose every few megabytes are handed to the disk as soon as
/// they are written, so that the flush at the end waits for the last of them, not for the
/// whole file: on a model of 1 GB the flush was a third of a checkpoint's time, after the
/// writing and not beside it.
struct WrittenBack {
    file: File,
    written: u64,
    handed: u64,
}

impl WrittenBack {
    fn new(file: File) -> Self {
        WrittenBack {
            file,
            written: 0,
            handed: 0,
        }
    }
}

impl Write for WrittenBack {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.handed >= WRITEBACK_EVERY {
            start_writeback(&self.file, self.handed, self.written - self.handed);
            self.handed = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Asks the disk to start writing `len` bytes of `file` from `offset`, without waiting.
/// Only a head start: what fails here fails again, and is reported, in the flush that
/// follows.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is open while `file` is borrowed, and the call reads and
    // writes no memory of this process.
    let _ = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
}

/// Elsewhere the flush at the end writes the whole file.
#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

/// Lowers the calling thread's CPU priority (nice 10), for a thread that writes checkpoints:
/// on a machine whose cores training keeps busy, the write takes the time they leave rather
/// than a share of theirs. The next cut waits for it if it has not finished by then.
#[cfg(target_os = "linux")]
pub(crate) fn in_background() {
    // SAFETY: gettid and setpriority read and write no memory of this process; the thread id
    // is this thread's own.
    let _ = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE)
    };
}

/// Elsewhere the writer runs at the process's priority.
#[cfg(not(target_os = "linux"))]
pub(crate) fn in_background() {}

/// The nice value of a thread that writes checkpoints: about a tenth of the CPU share of a
/// thread at the default 0 when both want a core.
#[cfg(target_os = "linux")]
const BACKGROUND_NICE: libc::c_int = 10;

/// A writer that counts and checksums what goes through it.
struct Summed<'a, W: Write> {
    out: &'a mut W,
    sum: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> Write for Summed<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.sum.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Writes a server's shards ([`pserver_core::events::ServerEvent::CheckpointDue`]) as the checkpoint of
/// `cut` in `dir`: magic bytes, the value type's size, then the shards as the wire encodes
/// them, streamed to the file. Returns the file and its payload's bytes.
pub fn write_shards<V: Value>(
    dir: &CheckpointDir,
    cut: u64,
    shards: &[ShardCopy<V>],
) -> io::Result<(PathBuf, u64)> {
    dir.write_with(cut, |out| {
        out.write_all(SHARDS_MAGIC)?;
        out.write_all(&[V::SIZE as u8])?;
        // Straight to the file from the store's own leaves, shared with the copies: the
        // values go as the blocks they are in, and neither a copy of the model nor its
        // encoding is ever held whole in memory.
        postcard::to_io(shards, out)
            .map(drop)
            .map_err(|e| io::Error::other(format!("cannot encode the shards: {e}")))
    })
}

/// The shards a checkpoint's payload holds ([`write_shards`]).
pub fn shards_of<V: Value>(payload: &[u8]) -> Result<Vec<ShardCopy<V>>, String> {
    postcard::from_bytes(shards_body::<V>(payload)?)
        .map_err(|e| format!("cannot decode the shards: {e}"))
}

/// Whether a checkpoint's payload holds a server's shards in the form this reader decodes,
/// of this job's value type: what a server offers to resume from.
pub fn usable_shards<V: Value>(payload: &[u8]) -> Result<(), String> {
    shards_body::<V>(payload).map(drop)
}

/// The encoded shards of a payload, after its magic bytes and value size.
fn shards_body<V: Value>(payload: &[u8]) -> Result<&[u8], String> {
    if payload.starts_with(SHARDS_MAGIC_V1) {
        return Err("written by an earlier pserver, in a form this one does not read".into());
    }
    let rest = payload
        .strip_prefix(SHARDS_MAGIC)
        .ok_or("not a server's checkpoint (wrong magic bytes)")?;
    let (&size, rest) = rest.split_first().ok_or("no value size")?;
    if usize::from(size) != V::SIZE {
        return Err(format!(
            "holds values of {size} bytes, but this job's are {}",
            V::SIZE
        ));
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> CheckpointDir {
        let dir = std::env::temp_dir().join(format!("pserver-ckpt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        CheckpointDir::new(dir).unwrap()
    }

    #[test]
    fn a_checkpoint_reads_back_as_written_and_the_newest_is_taken() {
        let dir = scratch("whole");
        dir.write(3, b"three").unwrap();
        dir.write(10, b"ten").unwrap();
        dir.write(7, b"").unwrap();
        assert_eq!(dir.iterations().unwrap(), [10, 7, 3]);
        let latest = dir.latest().unwrap();
        let found = latest.found.unwrap();
        assert_eq!((found.iteration, &found.payload[..]), (10, &b"ten"[..]));
        assert!(latest.refused.is_empty());
        assert_eq!(dir.read(7).unwrap().payload, b"");
        let _ = fs::remove_dir_all(dir.path());
    }

    #[test]
    fn a_torn_or_corrupt_checkpoint_is_refused_and_the_one_before_is_used() {
        let dir = scratch("torn");
        dir.write(1, b"first").unwrap();
        let second = dir.write(2, b"second, a longer one").unwrap();
        let third = dir.write(3, b"third").unwrap();
        // The newest torn short, as a crash mid-write without the rename would not leave it
        // but a full disk or a copy might; the one before flipped a bit.
        let bytes = fs::read(&third).unwrap();
        fs::write(&third, &bytes[..bytes.len() - 3]).unwrap();
        let mut bytes = fs::read(&second).unwrap();
        bytes[30] ^= 0x10;
        fs::write(&second, &bytes).unwrap();
        // A temporary file left by a crash is no checkpoint.
        fs::write(dir.path().join(".ckpt-00000000000000000004.tmp"), b"half").unwrap();
        let latest = dir.latest().unwrap();
        assert_eq!(latest.found.map(|c| c.payload), Some(b"first".to_vec()));
        let why: Vec<String> = latest.refused.iter().map(|(_, e)| e.to_string()).collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].starts_with("torn: "), "{why:?}");
        assert!(why[1].starts_with("corrupt"), "{why:?}");
        let _ = fs::remove_dir_all(dir.path());
    }

    #[test]
    fn a_file_named_for_another_iteration_or_of_another_kind_is_refused() {
        let dir = scratch("misnamed");
        let five = dir.write(5, b"five").unwrap();
        fs::copy(&five, dir.path().join(format!("ckpt-{:020}.bin", 9))).unwrap();
        assert!(matches!(
            dir.read(9),
            Err(CheckpointError::Misnamed {
                named: 9,
                inside: 5
            })
        ));
        fs::write(dir.path().join(format!("ckpt-{:020}.bin", 12)), [0u8; 40]).unwrap();
        assert!(matches!(dir.read(12), Err(CheckpointError::NotACheckpoint)));
        assert_eq!(dir.latest().unwrap().found.map(|c| c.iteration), Some(5));
        let _ = fs::remove_dir_all(dir.path());
    }

    /// A payload of several write-back steps, written in pieces of uneven sizes, reads back
    /// whole.
    #[test]
    fn a_checkpoint_handed_to_the_disk_as_it_is_written_reads_back_whole() {
        let dir = scratch("written-back");
        let payload: Vec<u8> = (0..3 * WRITEBACK_EVERY + 12_345)
            .map(|i| (i % 251) as u8)
            .collect();
        let (_, len) = dir
            .write_with(4, |out| {
                for piece in payload.chunks(700_001) {
                    out.write_all(piece)?;
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(len, payload.len() as u64);
        assert_eq!(&dir.read(4).unwrap().payload[..], &payload[..]);
        let _ = fs::remove_dir_all(dir.path());
    }

    #[test]
    fn shards_read_back_as_written_and_an_earlier_form_is_named() {
        use pserver_core::store::{OrderedStore, ParamStore};
        let mut store = OrderedStore::<f32>::new(1, 2);
        for k in [3, 4, 5, 90] {
            store.row_mut(k).0[0] = k as f32;
        }
        let range = pserver_core::KeyRange::new(0, 100).unwrap();
        let shard = ShardCopy {
            range,
            seq: 7,
            rows: store.shared_rows_in(range, 1, 2),
            pending: Vec::new(),
            applied_below: 2,
            dedupe: Vec::new(),
            clocks: Vec::new(),
        };
        let dir = scratch("shards");
        write_shards(&dir, 2, std::slice::from_ref(&shard)).unwrap();
        let read = dir.read(2).unwrap();
        assert_eq!(shards_of::<f32>(&read.payload), Ok(vec![shard]));
        assert!(
            shards_of::<f64>(&read.payload)
                .unwrap_err()
                .contains("4 bytes")
        );
        let mut earlier = read.payload.to_vec();
        earlier[..8].copy_from_slice(SHARDS_MAGIC_V1);
        assert!(
            shards_of::<f32>(&earlier)
                .unwrap_err()
                .contains("earlier pserver")
        );
        // Whole but of the earlier form: not offered, and said why.
        dir.write(1, &earlier).unwrap();
        assert_eq!(dir.good().unwrap().0, vec![2, 1]);
        let (good, refused) = dir.good_for(usable_shards::<f32>).unwrap();
        assert_eq!(good, vec![2]);
        assert!(
            matches!(&refused[..], [(_, CheckpointError::Unusable(why))] if why.contains("earlier pserver")),
            "{refused:?}"
        );
        assert!(dir.good_for(usable_shards::<f64>).unwrap().0.is_empty());
        let _ = fs::remove_dir_all(dir.path());
    }
}
