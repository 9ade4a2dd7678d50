//! Files in and out. Reading: every file mgn reads (sources, checkpoints, data, inputs, plans)
//! is opened by [`read_regular`], which never blocks and never reads without end. Writing never
//! leaves a half-written file behind, nor temporary files that pile up.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

/// Reads the whole of a regular file of at most `limit` bytes. The rule for every file mgn
/// reads, whatever it holds:
///
/// - only a regular file (after following links): a directory, a named pipe, a device or a
///   socket is refused by its kind before it is opened, so a FIFO without a writer cannot block
///   and `/dev/zero` cannot be read without end;
/// - opened without blocking (`O_NONBLOCK`), and checked again once open, so a file swapped for
///   a FIFO in between is refused too;
/// - its size is read first and checked against `limit`; then exactly that many bytes are read,
///   and the file must end there: a kernel file that reports 0 bytes but streams (`/proc/kmsg`,
///   whose read would wait for the next kernel message) or one that grows while it is read is
///   refused, never waited on.
///
/// The error is a reason, to follow "cannot read `…`: ".
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let (file, len) = open_regular(path, limit)?;
    read_whole(file, len)
}

/// The rest of [`read_regular`] on a file [`open_regular`] opened, from its start: exactly
/// `len` bytes, and the file must end there.
pub fn read_whole(mut file: File, len: u64) -> Result<Vec<u8>, String> {
    use std::io::Seek;
    file.rewind().map_err(|e| reason(&e))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len as usize)
        .map_err(|_| format!("the file is too large to hold in memory ({len} bytes)"))?;
    (&mut file).take(len).read_to_end(&mut bytes).map_err(|e| reason(&e))?;
    if (bytes.len() as u64) < len {
        return Err(format!(
            "the file ended after {} of its {len} bytes (it shrank while it was read)",
            bytes.len()
        ));
    }
    let mut more = [0u8; 1];
    match file.read(&mut more) {
        Ok(0) => Ok(bytes),
        Ok(_) => Err(format!(
            "the file holds more than the {len} bytes it reports (a kernel file, or one \
             growing while it is read); only regular files of a known size are read"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(format!(
            "the file reports {len} bytes but does not end there (a kernel file such as \
             /proc/kmsg); only regular files of a known size are read"
        )),
        Err(e) => Err(reason(&e)),
    }
}

/// Opens a regular file of at most `limit` bytes for reading, without blocking, and returns it
/// with its size (the checks of [`read_regular`], for readers that read a part first, such as
/// a checkpoint's header).
pub fn open_regular(path: &Path, limit: u64) -> Result<(File, u64), String> {
    check_regular(&std::fs::metadata(path).map_err(|e| reason(&e))?, limit)?;
    let file = open_nonblocking(path).map_err(|e| reason(&e))?;
    let meta = file.metadata().map_err(|e| reason(&e))?;
    check_regular(&meta, limit)?;
    Ok((file, meta.len()))
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

/// A regular file within `limit` bytes; anything else is refused with its kind.
fn check_regular(meta: &std::fs::Metadata, limit: u64) -> Result<(), String> {
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err("it is a directory, not a file".into());
    }
    if !kind.is_file() {
        return Err(format!("it is {}, not a regular file", special_kind(&kind)));
    }
    if meta.len() > limit {
        return Err(too_large(Some(meta.len()), limit));
    }
    Ok(())
}

/// The reason for a file over `limit` bytes (`None`: its length is not known, only that it is
/// over).
pub fn too_large(len: Option<u64>, limit: u64) -> String {
    let len = len.map_or_else(|| format!("over {limit}"), |n| n.to_string());
    format!("the file is too large ({len} bytes; the limit is {limit} bytes)")
}

#[cfg(unix)]
fn special_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a named pipe (FIFO)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special_kind(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

/// A short reason for an I/O error, to follow "cannot read `…`: ".
pub fn reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    }
}

/// Writes `bytes` to a temporary file next to `path` (`.NAME.tmpPID`), flushes it to disk,
/// renames it over `path` and flushes the directory, so the rename survives a power loss: a
/// crash at any point leaves either the old file or the new one, never a mix.
///
/// A writer killed mid-write leaves its temporary file behind; each write first removes those
/// of the same target that are abandoned (see [`remove_abandoned_temporaries`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let prefix = format!(".{}.tmp", name.to_string_lossy());
    remove_abandoned_temporaries(dir, &prefix);
    let tmp = dir.join(format!("{prefix}{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A temporary file untouched this long is abandoned, whatever process its PID names now
/// (PIDs are reused): a live writer writes its bytes, syncs and renames without pausing.
const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// A temporary file whose writer has exited is abandoned once untouched this long. The grace
/// keeps the file of a writer this host cannot see (another PID namespace, another machine on
/// a shared disk), which is written to continuously, from being taken for a dead one's.
const GONE_GRACE: Duration = Duration::from_secs(60);

/// Removes the abandoned temporary files `PREFIX<PID>` in `dir` (regular files only, never this
/// process's own): those untouched for [`ABANDONED_AFTER`], and, where the host lists its
/// processes in `/proc`, those whose writer has exited and that are untouched for
/// [`GONE_GRACE`]. A running writer's file is never removed (were one wrongly taken for
/// abandoned, its own rename would fail and report it; no file is ever torn). Best effort:
/// what cannot be read or removed stays.
fn remove_abandoned_temporaries(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let own = std::process::id();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(digits) = file_name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(pid) = digits.parse::<u32>() else { continue };
        // The entry's own metadata: a symbolic link is not followed, and not a regular file.
        let Ok(meta) = entry.metadata() else { continue };
        if pid == own || !meta.is_file() {
            continue;
        }
        let Some(idle) = meta.modified().ok().and_then(|t| t.elapsed().ok()) else { continue };
        if idle >= ABANDONED_AFTER || (idle >= GONE_GRACE && process_gone(pid)) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Removes, in `dir`, the temporary files of every target whose name starts with `stem` (a
/// checkpoint `NAME.safetensors` and its periodic `NAME.step-N.safetensors`) left by writers that
/// have exited — at once, without [`GONE_GRACE`]: called when a run that is about to write
/// those names starts, so a temporary a `kill -9` left does not wait for a later save of the
/// same name. Another live writer of the same names would be a second run on the same
/// checkpoint, whose files are kept. Best effort, as [`remove_abandoned_temporaries`].
pub fn remove_temporaries_of(dir: &Path, stem: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let own = std::process::id();
    let prefix = format!(".{stem}");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some((_, digits)) = rest.rsplit_once(".tmp") else { continue };
        let Ok(pid) = digits.parse::<u32>() else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        if pid == own || !meta.is_file() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let idle = meta.modified().ok().and_then(|t| t.elapsed().ok()).unwrap_or_default();
        if idle >= ABANDONED_AFTER || process_gone(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether process `pid` has certainly exited: where `/proc` lists processes (Linux), it has no
/// entry there; elsewhere this is never known, and only [`ABANDONED_AFTER`] applies.
fn process_gone(pid: u32) -> bool {
    let proc = Path::new("/proc");
    proc.join("self").exists() && !proc.join(pid.to_string()).exists()
}

/// Flushes a directory's entries (a rename in it) to disk. File systems that cannot sync a
/// directory say so with `EINVAL`; that is not an error of the write.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        other => other,
    }
}

/// Elsewhere (Windows) a directory cannot be opened as a file; the rename is flushed with it.
#[cfg(not(unix))]
fn sync_dir(_: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_starting_run_removes_its_names_temporaries_whose_writers_are_gone() {
        let d = scratch("start");
        let dead = u32::MAX - 1; // no such process
        let own = std::process::id();
        for name in [
            format!(".m.safetensors.tmp{dead}"),
            format!(".m.step-40.safetensors.tmp{dead}"),
            format!(".m.safetensors.tmp{own}"),
            format!(".other.safetensors.tmp{dead}"),
            "m.safetensors".to_string(),
        ] {
            touch(&d, &name, Duration::ZERO);
        }
        remove_temporaries_of(&d, "m");
        let own_tmp = format!(".m.safetensors.tmp{own}");
        let other_tmp = format!(".other.safetensors.tmp{dead}");
        let mut want = vec![own_tmp, other_tmp, "m.safetensors".to_string()];
        want.sort();
        assert_eq!(entries(&d), want);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn regular_files_are_read_whole_and_others_refused_by_kind() {
        let d = scratch("read");
        std::fs::write(d.join("a"), b"abc").unwrap();
        std::fs::write(d.join("empty"), b"").unwrap();
        assert_eq!(read_regular(&d.join("a"), 3).unwrap(), b"abc");
        assert_eq!(read_regular(&d.join("empty"), 0).unwrap(), b"");
        assert!(read_regular(&d.join("a"), 2).unwrap_err().contains("too large (3 bytes"));
        assert_eq!(read_regular(&d.join("none"), 9).unwrap_err(), "no such file");
        assert!(read_regular(&d, 9).unwrap_err().contains("a directory"));
        let fifo = std::ffi::CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(read_regular(&d.join("fifo"), 9).unwrap_err().contains("named pipe (FIFO)"));
        assert!(read_regular(Path::new("/dev/zero"), 9).unwrap_err().contains("character device"));
        // Reports 0 bytes, holds more: refused rather than read to an unknown end.
        let e = read_regular(Path::new("/proc/self/status"), 1 << 20).unwrap_err();
        assert!(e.contains("holds more than the 0 bytes"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mgn-io-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// Creates `name` in `dir`, last modified `ago` in the past.
    fn touch(dir: &Path, name: &str, ago: Duration) {
        let f = std::fs::File::create(dir.join(name)).unwrap();
        f.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[test]
    fn a_write_removes_abandoned_temporaries_of_its_target_only() {
        let dir = scratch("stale");
        let target = dir.join("ck.safetensors");
        let (hours, minutes, now) =
            (Duration::from_secs(2 * 3600), Duration::from_secs(5 * 60), Duration::ZERO);
        // Running processes: the one that started this test, and init.
        let alive = std::os::unix::process::parent_id();
        // A PID above Linux's largest (2^22): its process is certainly gone.
        let gone = 4_000_000_001u32;
        // Untouched for hours: abandoned, whatever process its PID names now (PIDs are reused).
        touch(&dir, ".ck.safetensors.tmp1", hours);
        // Its writer has exited (killed mid-write) and nothing has touched it for minutes.
        touch(&dir, &format!(".ck.safetensors.tmp{gone}"), minutes);
        // Being written right now, by a running process or one this host cannot see (another
        // PID namespace, another machine on a shared disk): left alone.
        touch(&dir, &format!(".ck.safetensors.tmp{alive}"), now);
        touch(&dir, &format!(".ck.safetensors.tmp{}", gone + 1), now);
        // Another target's temporary file, and names that only look alike: left alone.
        touch(&dir, &format!(".other.safetensors.tmp{gone}"), hours);
        touch(&dir, ".ck.safetensors.tmpx1", hours);
        touch(&dir, ".ck.safetensors.tmp+1", hours);
        touch(&dir, ".ck.safetensors.tmp1.tmp2", hours);
        std::fs::create_dir(dir.join(format!(".ck.safetensors.tmp{}", gone + 2))).unwrap();
        let before = entries(&dir);

        write_atomic(&target, b"new").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let mut removed: Vec<String> = vec![".ck.safetensors.tmp1".into()];
        if Path::new("/proc/self").exists() {
            removed.push(format!(".ck.safetensors.tmp{gone}"));
        }
        let mut want: Vec<String> = before.into_iter().filter(|n| !removed.contains(n)).collect();
        want.push("ck.safetensors".into());
        want.sort();
        assert_eq!(entries(&dir), want);
        let _ = std::fs::remove_dir_all(dir);
    }
}
