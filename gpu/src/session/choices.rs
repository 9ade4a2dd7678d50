//! Kernels chosen by measuring them on the device (the default, `limits::CoopUse::Measured`;
//! `MGN_COOP=products` rules instead).
//!
//! Which of a mixed plan's convolutions run faster on the cooperative matrices than on the tiled
//! kernel depends on the shape and the GPU: on an H100 the tiles took ResNet-50's batch-4
//! forward to 0.75 of its time and lost on its batch-1 shape and every U-Net convolution
//! (docs/benchmarks/). Products won on the tiles on every shape measured there, but that is
//! one card. No rule written for one card is right on the next, so this is measured: when a
//! session opens, every convolution and product of halves that both kernels can run is
//! dispatched with each, on the session's own arena, and keeps the faster — by 3% over its
//! default (convolutions tiled, products on the tiles), so noise does not flip a choice.
//!
//! A verdict is keyed by the device (name and driver) and both kernels' generated sources,
//! which hold the shapes (offsets are in the parameter block), so steps of one shape are
//! measured once and a verdict is never applied to a kernel that changed. Verdicts are kept in
//! one file per device (`set_cache_dir`, else `MGN_CACHE`, else `~/.cache/mgn`:
//! `choices/<device>.tsv`), so the next session of any plan with those shapes opens without
//! measuring, and compiles only the kernel it keeps. `mgnc tune` opens a model's plans ahead of
//! time to fill that file, and an app that ships it beside its plan points `set_cache_dir` at
//! it (`mgn_runtime::set_cache_dir`), so its first session on that device and driver measures
//! nothing. A file that cannot be read is reported and measured again; it is replaced whole
//! (`mgn_ir::io::write_atomic`), so a crash never leaves half of one.
//!
//! The measurement runs before the first run of the plan: the steps measured read parameters
//! (uploaded) and values not yet computed, and write only their own results, which the first
//! run computes again. Only static plans are measured: a dynamic plan's kernels change with
//! its sizes.

use super::StepDispatch;
use crate::device::{Arena, Dispatch, GpuDevice, Kernel};
use crate::probe::Device;
use mgn_ir::hash;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Which kernel a convolution or a product keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chosen {
    Tiled,
    Tiles,
}

impl Chosen {
    fn word(self) -> &'static str {
        match self {
            Chosen::Tiled => "tiled",
            Chosen::Tiles => "tiles",
        }
    }
}

/// A measured step: which kernel it keeps, and each one's time per dispatch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub chosen: Chosen,
    pub tiled_us: f64,
    pub tiles_us: f64,
}

impl Verdict {
    /// The kernel that is not the plan's `default` must win by 3%: within that the default
    /// stays, so noise does not flip a choice from one session to the next.
    fn of(tiled: Duration, tiles: Duration, default: Chosen) -> Verdict {
        let (tiled_us, tiles_us) = (tiled.as_secs_f64() * 1e6, tiles.as_secs_f64() * 1e6);
        let chosen = match default {
            Chosen::Tiled if tiles_us < 0.97 * tiled_us => Chosen::Tiles,
            Chosen::Tiles if tiled_us < 0.97 * tiles_us => Chosen::Tiled,
            _ => default,
        };
        Verdict { chosen, tiled_us, tiles_us }
    }
}

/// A step both kernels run, with no verdict yet: the session's dispatch is its `default`
/// kernel's, `other` the other's.
pub(super) struct Contender {
    pub step: usize,
    pub key: u64,
    pub default: Chosen,
    pub other: StepDispatch,
}

/// One device's verdicts, as kept on disk, and the contenders a session found.
pub(super) struct Choosing {
    device: String,
    path: Option<PathBuf>,
    verdicts: HashMap<u64, Verdict>,
    pub contenders: Vec<Contender>,
    /// What the session measured: (step, verdict).
    pub measured: Vec<(usize, Verdict)>,
    /// The steps whose kernel a verdict already on file chose.
    pub known: usize,
    /// Whether the file is written even when nothing was measured (`write_always`).
    write_always: bool,
}

impl Choosing {
    /// The verdicts kept for `device`. A file that cannot be read is reported on stderr and
    /// its verdicts measured again.
    pub fn load(device: &Device) -> Choosing {
        Choosing::at(device, verdicts_file(&device.name))
    }

    fn at(device: &Device, path: Option<PathBuf>) -> Choosing {
        let verdicts = match path.as_deref().map(std::fs::read_to_string) {
            Some(Ok(text)) => parse(&text).unwrap_or_else(|e| {
                let p = path.as_deref().unwrap_or(Path::new("")).display();
                eprintln!("warning: {p}: {e}; its kernels are measured again");
                HashMap::new()
            }),
            _ => HashMap::new(),
        };
        let device = format!("{} ({})", device.name, device.driver);
        Choosing {
            device,
            path,
            verdicts,
            contenders: Vec::new(),
            measured: Vec::new(),
            known: 0,
            write_always: WRITE_ALWAYS.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The key of a step whose kernels are `tiled` and `tiles` on this device.
    pub fn key(&self, tiled: &str, tiles: &str) -> u64 {
        fnv1a(&[self.device.as_bytes(), tiled.as_bytes(), tiles.as_bytes()])
    }

    pub fn verdict(&self, key: u64) -> Option<Verdict> {
        self.verdicts.get(&key).copied()
    }

    /// Each contender of a distinct key dispatched with both kernels (`time_both`); the
    /// other kernel takes every step of that key where it wins. Saves the verdicts when it
    /// measured any; a file that cannot be written is reported on stderr and costs only the
    /// next session's measuring again.
    pub fn measure(
        &mut self,
        dev: &mut GpuDevice,
        arena: &Arena,
        kernels: &[Kernel],
        dispatch: &mut [Option<StepDispatch>],
    ) -> Result<(), String> {
        for c in std::mem::take(&mut self.contenders) {
            let verdict = match self.verdict(c.key) {
                Some(v) => v,
                None => {
                    let Some(default) = dispatch[c.step].as_ref() else { continue };
                    let a = (&kernels[default.kernel], default.params, default.groups);
                    let b = (&kernels[c.other.kernel], c.other.params, c.other.groups);
                    let (ta, tb) = time_both(dev, arena, a, b)?;
                    let v = match c.default {
                        Chosen::Tiled => Verdict::of(ta, tb, Chosen::Tiled),
                        Chosen::Tiles => Verdict::of(tb, ta, Chosen::Tiles),
                    };
                    self.verdicts.insert(c.key, v);
                    self.measured.push((c.step, v));
                    v
                }
            };
            if verdict.chosen != c.default {
                dispatch[c.step] = Some(c.other);
            }
        }
        // `mgnc tune` asks for the file even when nothing was measured (a device without
        // two kernels for any step): an app ships the folder whole.
        let wanted = !self.measured.is_empty() || (self.write_always && !self.on_file());
        if !wanted {
            return Ok(());
        }
        if let Some(Err(e)) = self.path.as_deref().map(|p| save(p, &self.device, &self.verdicts)) {
            eprintln!("warning: the measured kernels are not kept: {e}");
        }
        Ok(())
    }

    fn on_file(&self) -> bool {
        self.path.as_deref().is_some_and(Path::exists)
    }
}

/// The file of `device`'s verdicts (by its name), in `cache_dir`.
pub fn verdicts_file(device: &str) -> Option<PathBuf> {
    cache_dir().map(|d| d.join("choices").join(file_name(device)))
}

/// `write_always`'s setting, for the whole process.
static WRITE_ALWAYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether sessions opened from now on write their device's verdicts file when there is none
/// even if they measured nothing (`mgnc tune`: the folder an app ships then holds the device's
/// file, and says that device was tuned). Off by default, so that a session that has nothing
/// to measure leaves no file behind.
pub fn write_always(on: bool) {
    WRITE_ALWAYS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The folder `set_cache_dir` named, for the whole process.
static CACHE_DIR: std::sync::RwLock<Option<PathBuf>> = std::sync::RwLock::new(None);

/// Where sessions opened from now on keep and look up their verdicts: `Some(dir)` (an app's
/// shipped cache, `mgnc tune --cache`) over the environment's, `None` the environment's again.
pub fn set_cache_dir(dir: Option<PathBuf>) {
    *CACHE_DIR.write().unwrap_or_else(|e| e.into_inner()) = dir;
}

/// Where mgn keeps what it measured: the folder `set_cache_dir` named, else `MGN_CACHE`, else
/// `XDG_CACHE_HOME/mgn`, else `~/.cache/mgn`; none without a home.
pub fn cache_dir() -> Option<PathBuf> {
    #[cfg(test)]
    if let Some(dir) = FORCED_CACHE.with(|f| f.borrow().clone()) {
        return Some(dir);
    }
    if let Some(dir) = CACHE_DIR.read().unwrap_or_else(|e| e.into_inner()).clone() {
        return Some(dir);
    }
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("MGN_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("mgn")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("mgn")))
}

#[cfg(test)]
thread_local! {
    /// A test's cache folder, for its own thread.
    pub(crate) static FORCED_CACHE: std::cell::RefCell<Option<PathBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// A device's file: its name with anything but letters, digits, `-` and `_` as `_`.
fn file_name(device: &str) -> String {
    let slug: String = device
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    format!("{slug}.tsv")
}

/// The stable hash of the parts, each followed by a zero byte (so no two lists of parts run
/// together into the same bytes).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = hash::FNV_OFFSET;
    for part in parts {
        h = hash::fnv1a64_from(hash::fnv1a64_from(h, part), &[0]);
    }
    h
}

/// The verdicts of a file `save` wrote: after `#` comment lines, one line a key —
/// `key<TAB>tiled|tiles<TAB>µs tiled<TAB>µs tiles`. The first bad line is an error naming it.
fn parse(text: &str) -> Result<HashMap<u64, Verdict>, String> {
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let bad = || format!("line {} is not `key, tiled|tiles, µs, µs`: {line:?}", n + 1);
        let f: Vec<&str> = line.split('\t').collect();
        let [key, chosen, a, b] = f[..] else { return Err(bad()) };
        let key = u64::from_str_radix(key, 16).map_err(|_| bad())?;
        let chosen = match chosen {
            "tiled" => Chosen::Tiled,
            "tiles" => Chosen::Tiles,
            _ => return Err(bad()),
        };
        let us = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
        let (Some(tiled_us), Some(tiles_us)) = (us(a), us(b)) else { return Err(bad()) };
        out.insert(key, Verdict { chosen, tiled_us, tiles_us });
    }
    Ok(out)
}

/// Writes the verdicts to `path`, whole or not at all.
fn save(path: &Path, device: &str, verdicts: &HashMap<u64, Verdict>) -> Result<(), String> {
    let mut keys: Vec<&u64> = verdicts.keys().collect();
    keys.sort();
    let mut text = format!(
        "# mgn: kernels measured on {device}\n\
         # key\tkept\tµs tiled\tµs on the tiles\n"
    );
    for k in keys {
        let v = &verdicts[k];
        let line = format!("{k:016x}\t{}\t{:.2}\t{:.2}\n", v.chosen.word(), v.tiled_us, v.tiles_us);
        text.push_str(&line);
    }
    let failed = |e: std::io::Error| format!("{}: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    mgn_ir::io::write_atomic(path, text.as_bytes()).map_err(failed)
}

/// Each dispatch's time: both run once (their first run pays for what warms up), then three
/// rounds of `reps` dispatches of each, alternated; the least per dispatch of each. `reps`
/// makes a round about 2 ms of the slower one.
fn time_both(
    dev: &mut GpuDevice,
    arena: &Arena,
    a: Dispatch,
    b: Dispatch,
) -> Result<(Duration, Duration), String> {
    let mut once = |d: Dispatch, n: usize| -> Result<Duration, String> {
        let all = vec![d; n];
        let start = Instant::now();
        dev.run(arena, &all)?;
        Ok(start.elapsed() / n as u32)
    };
    let first = once(a, 1)?.max(once(b, 1)?);
    let reps = (Duration::from_millis(2).as_secs_f64() / first.as_secs_f64().max(1e-6))
        .clamp(2.0, 64.0) as usize;
    let (mut ta, mut tb) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        ta = ta.min(once(a, reps)?);
        tb = tb.min(once(b, reps)?);
    }
    Ok((ta, tb))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str, driver: &str) -> Device {
        Device {
            id: 0,
            name: name.into(),
            driver: driver.into(),
            software: false,
            rejected: None,
            limits: None,
            float16: true,
            cooperative_matrix: (0, 16),
            memory: None,
        }
    }

    fn verdict(chosen: Chosen) -> Verdict {
        Verdict { chosen, tiled_us: 12.5, tiles_us: 8.25 }
    }

    /// Verdicts written and read back are the same, for the same device only, and a key
    /// depends on the device, the driver and both kernels.
    #[test]
    fn verdicts_are_kept_per_device_and_kernel() {
        let dir = std::env::temp_dir().join(format!("mgn-choices-{}", std::process::id()));
        let path = dir.join(file_name("NVIDIA H200 / x"));
        assert!(path.ends_with("NVIDIA_H200___x.tsv"), "{}", path.display());
        let h200 = device("NVIDIA H200", "580.1");
        let mut c = Choosing::at(&h200, Some(path.clone()));
        let (k1, k2) = (c.key("tiled a", "tiles a"), c.key("tiled b", "tiles a"));
        assert_ne!(k1, k2);
        assert_ne!(k1, c.key("tiles a", "tiled a"));
        assert_ne!(
            k1,
            Choosing::at(&device("NVIDIA H200", "580.2"), None).key("tiled a", "tiles a")
        );
        c.verdicts.insert(k1, verdict(Chosen::Tiles));
        c.verdicts.insert(k2, verdict(Chosen::Tiled));
        save(&path, &c.device, &c.verdicts).unwrap();
        let again = Choosing::at(&h200, Some(path.clone()));
        assert_eq!(again.verdict(k1), Some(verdict(Chosen::Tiles)));
        assert_eq!(again.verdict(k2), Some(verdict(Chosen::Tiled)));
        assert_eq!(again.key("tiled a", "tiles a"), k1, "the same key in the next session");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "no partial file is left beside it");
        // A folder that cannot be made is an error naming the file.
        let blocked = path.join("under a file.tsv");
        let e = save(&blocked, &c.device, &c.verdicts).expect_err("a file is in the way");
        assert!(e.starts_with(&blocked.display().to_string()), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A file that is not one `save` writes loses its verdicts (they are measured again) and
    /// says which line is wrong.
    #[test]
    fn a_damaged_file_is_measured_again() {
        let good = "# mgn\n00000000000000ff\ttiles\t3.00\t2.00\n";
        assert_eq!(parse(good).unwrap()[&255].chosen, Chosen::Tiles);
        for bad in [
            "00ff\tfast\t3\t2",
            "00ff\ttiles\t3",
            "zz\ttiles\t3\t2",
            "00ff\ttiles\tNaN\t2",
            "00ff\ttiles\t3\t-1",
            "00ff tiles 3 2",
        ] {
            let e = parse(&format!("# mgn\n{bad}\n")).expect_err(bad);
            assert!(e.starts_with("line 2 is not"), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("mgn-choices-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.tsv");
        std::fs::write(&path, "00ff\ttiles\n").unwrap();
        assert!(Choosing::at(&device("d", "1"), Some(path)).verdicts.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The kernel that is not the default must win by 3% to be kept.
    #[test]
    fn the_other_kernel_wins_by_a_margin() {
        let us = Duration::from_micros;
        let (tiled, tiles) = (Chosen::Tiled, Chosen::Tiles);
        assert_eq!(Verdict::of(us(100), us(96), tiled).chosen, tiles);
        assert_eq!(Verdict::of(us(100), us(98), tiled).chosen, tiled);
        assert_eq!(Verdict::of(us(100), us(150), tiled).chosen, tiled);
        assert_eq!(Verdict::of(us(96), us(100), tiles).chosen, tiled);
        assert_eq!(Verdict::of(us(98), us(100), tiles).chosen, tiles);
        assert_eq!(Verdict::of(us(150), us(100), tiles).chosen, tiles);
        assert_eq!(Verdict::of(us(100), us(96), tiled).tiles_us, 96.0);
    }
}
