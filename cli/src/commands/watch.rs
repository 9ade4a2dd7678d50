//! `mgnc build FILE --watch`: build, then build again whenever the model or a file it imports
//! changes, until Ctrl-C.
//!
//! The watched set is every file the build read from disk (the program's source map) plus the
//! `use "…"` files it could not read yet, recomputed after every build so new imports are
//! picked up. Editors often save by writing a new file and renaming it over the old one, which
//! replaces the inode, so the files' directories are watched and events are filtered by path.
//! One save makes a burst of events; the build starts once they have been quiet for 100 ms.

use super::build::{self, BuildArgs};
use mgn_compiler::front::Program;
use mgn_compiler::source::{normalize, Origin};
use mgn_syntax::ast::{Item, UseSource};
use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime};

/// How long the events of one save must have stopped before a build starts.
const QUIET: Duration = Duration::from_millis(100);
/// A stream of events that never goes quiet still gets a build this often.
const MAX_DELAY: Duration = Duration::from_secs(2);

enum Msg {
    Fs(notify::Result<notify::Event>),
    Stop,
}

/// A watched file: its directory (canonical, as events name it) and its name.
type Target = (PathBuf, OsString);

pub fn run(a: &BuildArgs) -> u8 {
    let (tx, rx) = mpsc::channel();
    let stop = tx.clone();
    // Fails only if a handler is already installed; Ctrl-C then keeps its default (exit).
    let _ = ctrlc::set_handler(move || {
        let _ = stop.send(Msg::Stop);
    });
    let mut watcher = match notify::recommended_watcher(move |event| {
        let _ = tx.send(Msg::Fs(event));
    }) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: cannot watch files: {e}");
            return super::EXIT_ERRORS;
        }
    };
    // The model's directory is watched before the first build reads the model.
    let mut dirs: HashSet<PathBuf> = HashSet::new();
    if let Some((d, _)) = target(&a.file) {
        if watcher.watch(&d, RecursiveMode::NonRecursive).is_ok() {
            dirs.insert(d);
        }
    }
    loop {
        let started = SystemTime::now();
        let (_, files) = build::build(a);
        // Where events will name each file, and how to show it.
        let targets: HashMap<Target, PathBuf> =
            files.iter().filter_map(|f| Some((target(f)?, f.clone()))).collect();
        let wanted: HashSet<PathBuf> = targets.keys().map(|(d, _)| d.clone()).collect();
        for d in dirs.difference(&wanted) {
            let _ = watcher.unwatch(d);
        }
        let mut missed = None;
        for d in wanted.difference(&dirs) {
            if let Err(e) = watcher.watch(d, RecursiveMode::NonRecursive) {
                eprintln!("warning: cannot watch `{}`: {e}", d.display());
            }
            // A file in a directory watched only now may have changed while it was read.
            missed = missed.or_else(|| {
                targets
                    .iter()
                    .find(|((dir, _), f)| dir == d && changed_since(f, started))
                    .map(|(_, f)| f.clone())
            });
        }
        dirs = wanted;
        if targets.is_empty() {
            eprintln!("error: cannot watch `{}`: its directory cannot be read", a.file.display());
            return super::EXIT_ERRORS;
        }
        let changed = match missed {
            Some(f) => f,
            None => {
                let n = targets.len();
                eprintln!(
                    "watching {n} file{} for changes (Ctrl-C stops)",
                    if n == 1 { "" } else { "s" }
                );
                match next_change(&rx, &targets) {
                    Some(f) => f,
                    None => return 0,
                }
            }
        };
        eprintln!("\n{} changed; building again", changed.display());
    }
}

/// The files a build of `program` depends on: every file read from disk, and the files that
/// its `use "…"` items name, so an import that does not exist yet is built once it appears.
pub fn watched_files(program: &Program) -> Vec<PathBuf> {
    let mut out = BTreeSet::new();
    for (_, f) in program.sources.files() {
        if let Origin::Path(p) = &f.origin {
            out.insert(p.clone());
        }
    }
    for m in &program.modules {
        if let Origin::Path(p) = &program.sources.get(m.file).origin {
            let base = p.parent().unwrap_or(Path::new(""));
            for item in &m.ast.items {
                if let Item::Use(u) = item {
                    if let UseSource::File { path, .. } = &u.source {
                        out.insert(normalize(&base.join(path)));
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

fn target(file: &Path) -> Option<Target> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some((std::fs::canonicalize(dir).ok()?, file.file_name()?.to_os_string()))
}

fn changed_since(file: &Path, t: SystemTime) -> bool {
    // File times come from a coarse clock: a write just after `t` may be stamped a little
    // before it. A spurious extra build is harmless; a missed one is not.
    let t = t.checked_sub(Duration::from_millis(50)).unwrap_or(t);
    std::fs::metadata(file).and_then(|m| m.modified()).is_ok_and(|m| m >= t)
}

/// Waits for a change to one of the targets, then until events stop for `QUIET`. `None` on
/// Ctrl-C.
fn next_change(rx: &Receiver<Msg>, targets: &HashMap<Target, PathBuf>) -> Option<PathBuf> {
    let first = loop {
        match rx.recv() {
            Ok(Msg::Fs(Ok(event))) => {
                if let Some(f) = affected(&event, targets) {
                    break f;
                }
            }
            Ok(Msg::Fs(Err(e))) => eprintln!("warning: watching files: {e}"),
            Ok(Msg::Stop) | Err(_) => return None,
        }
    };
    let burst = Instant::now();
    let mut last = Instant::now();
    loop {
        let left = QUIET.saturating_sub(last.elapsed());
        if left.is_zero() || burst.elapsed() >= MAX_DELAY {
            return Some(first);
        }
        match rx.recv_timeout(left) {
            Ok(Msg::Fs(Ok(event))) => {
                if affected(&event, targets).is_some() {
                    last = Instant::now();
                }
            }
            Ok(Msg::Fs(Err(_))) => {}
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return None,
            Err(RecvTimeoutError::Timeout) => return Some(first),
        }
    }
}

/// The watched file an event changes, if any. Opening a file (the build's own reads) and
/// access-time updates are not changes.
fn affected(event: &notify::Event, targets: &HashMap<Target, PathBuf>) -> Option<PathBuf> {
    let change = match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        _ => true,
    };
    if !change {
        return None;
    }
    event.paths.iter().find_map(|p| {
        let key = (p.parent()?.to_path_buf(), p.file_name()?.to_os_string());
        targets.get(&key).cloned()
    })
}
