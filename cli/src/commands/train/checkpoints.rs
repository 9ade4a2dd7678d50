//! Writing training checkpoints: never with non-finite parameters, always atomically (the
//! runtime writes a temporary file and renames it), with the run's place in the data in the
//! metadata; periodic ones (`--save-every`) beside `--save` as `NAME.step-N.safetensors`, the
//! `--keep` newest kept.

use super::order::Order;
use mgn_ir::tensor::Data;
use mgn_runtime::session::{SaveOptions, Session};
use std::path::{Path, PathBuf};

/// Saves `session` to `path` with the training metadata of `order`, after checking that every
/// parameter is finite: a checkpoint never holds what a diverged step left. `aliases`
/// (`--save-aliases`) writes each alias of a tied weight as a copy too.
pub fn save(
    session: &mut Session,
    order: &Order,
    path: &Path,
    aliases: bool,
) -> Result<(), String> {
    session.sync_from_device().map_err(|e| e.to_string())?;
    if let Some(name) = first_non_finite(session) {
        return Err(format!(
            "after training step {} the parameter `{name}` is not finite (NaN or infinite), so \
             {} was not saved",
            session.step,
            path.display()
        ));
    }
    // The place in the data: skipped steps (loss scaling) took their batches too.
    let metadata = order.metadata(session.batches_done());
    session.save_checkpoint_as(path, &SaveOptions { metadata, aliases }).map_err(|e| e.to_string())
}

/// The first parameter holding a NaN or an infinity.
fn first_non_finite(session: &Session) -> Option<&str> {
    session.params.iter().zip(&session.plan.params).find_map(|(t, spec)| {
        let bad = match &t.data {
            Data::F32(v) => v.iter().any(|x| !x.is_finite()),
            Data::F64(v) => v.iter().any(|x| !x.is_finite()),
            Data::I32(_) => false,
            Data::Packed(_) => t.dequantized().iter().any(|x| !x.is_finite()),
        };
        bad.then_some(spec.name.as_str())
    })
}

/// `dir/NAME.safetensors` → (`dir`, `NAME`): where periodic checkpoints go and their stem.
fn stem(save: &Path) -> (PathBuf, String) {
    let dir = match save.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = save.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = name.strip_suffix(".safetensors").unwrap_or(&name).to_string();
    (dir, stem)
}

/// Removes the temporary files a killed writer (`kill -9`) left of this run's checkpoint names
/// (`--save` and its periodic ones), so they do not stay until a later save of the same name.
pub fn remove_stale_temporaries(save: &Path) {
    let (dir, stem) = stem(save);
    mgn_ir::io::remove_temporaries_of(&dir, &stem);
}

/// The periodic checkpoint of `step` for `--save save`: `NAME.step-STEP.safetensors` beside it.
pub fn periodic_path(save: &Path, step: u64) -> PathBuf {
    let (dir, stem) = stem(save);
    dir.join(format!("{stem}.step-{step}.safetensors"))
}

/// The periodic checkpoints of `--save save` on disk: (step, path), oldest first.
fn periodic_files(save: &Path) -> Vec<(u64, PathBuf)> {
    let (dir, stem) = stem(save);
    let prefix = format!("{stem}.step-");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix(&prefix)?.strip_suffix(".safetensors")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// After the periodic checkpoint of `step` is written: deletes all but the `keep` newest of
/// those up to `step`. Newer ones (left by another run that went further) are not this run's
/// and stay. Returns what could not be deleted, as warnings.
pub fn prune(save: &Path, step: u64, keep: usize) -> Vec<String> {
    let ours: Vec<(u64, PathBuf)> =
        periodic_files(save).into_iter().filter(|(s, _)| *s <= step).collect();
    let extra = ours.len().saturating_sub(keep);
    ours[..extra]
        .iter()
        .filter_map(|(_, p)| {
            std::fs::remove_file(p)
                .err()
                .map(|e| format!("cannot delete the old checkpoint {}: {e}", p.display()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_names_sit_beside_save_and_pruning_keeps_the_newest_of_this_run() {
        assert_eq!(
            periodic_path(Path::new("out/mlp.safetensors"), 40),
            Path::new("out/mlp.step-40.safetensors")
        );
        assert_eq!(periodic_path(Path::new("ckpt"), 5), Path::new("./ckpt.step-5.safetensors"));
        let dir = std::env::temp_dir().join(format!("mgnc-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let save = dir.join("m.safetensors");
        for step in [5, 10, 15, 20, 900] {
            std::fs::write(periodic_path(&save, step), b"x").unwrap();
        }
        std::fs::write(dir.join("m.step-x.safetensors"), b"not one").unwrap();
        std::fs::write(dir.join("other.step-5.safetensors"), b"not ours").unwrap();
        assert!(prune(&save, 15, 2).is_empty());
        let steps: Vec<u64> = periodic_files(&save).iter().map(|(s, _)| *s).collect();
        assert_eq!(steps, vec![10, 15, 20, 900]);
        assert!(dir.join("m.step-x.safetensors").exists());
        assert!(dir.join("other.step-5.safetensors").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
