//! `mgnc info`: every GPU device, its limits and features, which one the GPU backend takes (and
//! whether `--backend auto` takes it too, which it does not for a software rasterizer), and —
//! when none can be used — the one-sentence reason.

use mgn_gpu::device::rounding::software_requested;
use mgn_gpu::device::GpuDevice;
use mgn_gpu::halves::F16Rounding;
use mgn_gpu::limits::{coop_use, min_spec_requested, CoopUse, DeviceLimits};
use mgn_gpu::probe::{choose, devices, Device};

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn limits_line(l: &DeviceLimits) -> String {
    format!(
        "workgroups {}×{}×{}, {} invocations, {} shared memory, {} per storage binding, {} \
         storage buffers per stage, {} parameter block",
        l.max_workgroups[0],
        l.max_workgroups[1],
        l.max_workgroups[2],
        l.max_invocations,
        size(l.max_shared_memory as u64),
        size(l.max_storage_buffer_range),
        l.max_storage_buffers,
        size(l.max_parameter_block as u64)
    )
}

fn json_device(d: &Device, chosen: bool) -> serde_json::Value {
    serde_json::json!({
        "id": d.id,
        "name": d.name,
        "driver": d.driver,
        "software": d.software,
        "usable": d.rejected.is_none(),
        "rejected": d.rejected,
        "chosen": chosen,
        "float16": d.float16,
        "cooperative_matrix": {
            "f32_tile": d.cooperative_matrix.0,
            "f16_tile": d.cooperative_matrix.1,
            // Which steps take the tiles, or why none do (null: the device has none).
            "used_by": coop_users(
                d.cooperative_matrix.1,
                d.limits.and_then(|l| l.coop_tile()),
                min_spec_requested(),
                coop_use(),
            )
            .map_or_else(|why| format!("none: {why}").into(), serde_json::Value::from),
        },
        "limits": d.limits.map(|l| serde_json::json!({
            "max_workgroups": l.max_workgroups,
            "max_invocations": l.max_invocations,
            "max_shared_memory": l.max_shared_memory,
            "max_storage_buffer_range": l.max_storage_buffer_range,
            "max_storage_buffers": l.max_storage_buffers,
            "max_parameter_block": l.max_parameter_block,
        })),
    })
}

pub fn run(json: bool) -> u8 {
    let min_spec = min_spec_requested();
    let listed = devices();
    let chosen = listed.as_ref().map_err(Clone::clone).and_then(|ds| choose(ds).map(|d| d.id));
    if json {
        println!("{}", json_report(&listed, &chosen, min_spec));
        return 0;
    }
    match &listed {
        Ok(ds) => {
            println!("GPU devices:");
            for d in ds {
                let mark = if chosen.as_ref().is_ok_and(|c| *c == d.id) { "*" } else { " " };
                let kind = if d.software { "software" } else { "hardware" };
                let status = match &d.rejected {
                    None => "usable".to_string(),
                    Some(why) => format!("not usable: {why}"),
                };
                println!(
                    "{mark} {:#06x}  {}  ({}, {kind}) — {status}",
                    d.id,
                    d.name,
                    if d.driver.is_empty() { "unknown driver" } else { &d.driver }
                );
                if let Some(l) = &d.limits {
                    println!("      limits: {}", limits_line(l));
                }
                let coop = match d.cooperative_matrix {
                    (0, 0) => "no".to_string(),
                    (f32t, f16t) => format!("f32 tiles {f32t}, f16 tiles {f16t}"),
                };
                let subgroups = match d.limits.map(|l| l.subgroup_size) {
                    Some(0) | None => "vary by pipeline".to_string(),
                    Some(n) => format!("of {n}"),
                };
                let uses = coop_uses(d, min_spec);
                let float16 = if d.float16 { "yes" } else { "no" };
                println!(
                    "      features: float16 {float16}, cooperative matrix {coop}{uses}, \
                     subgroups {subgroups}"
                );
            }
        }
        Err(why) => println!("GPU devices: none ({why})"),
    }
    if min_spec {
        println!(
            "MGN_MIN_SPEC=1: kernels are sized for Vulkan's guaranteed floor: {}",
            limits_line(&DeviceLimits::MIN_SPEC)
        );
    }
    match &chosen {
        Ok(id) => {
            let d = listed
                .as_ref()
                .ok()
                .and_then(|ds| ds.iter().find(|d| d.id == *id))
                .expect("chosen from the list");
            println!(
                "GPU backend's device: {} (what `--backend vulkan` runs on; set MGN_DEVICE to an \
                 ID or part of a name to choose another)",
                d.name
            );
            if let Some(r) = f16_rounding() {
                println!("f16 rounding: {}", rounding_line(r, min_spec));
            }
            if d.software {
                println!(
                    "note: {} is a software rasterizer, so `--backend auto` runs on the CPU \
                     backend instead",
                    d.name
                );
            } else {
                println!("`--backend auto` runs on it too");
            }
        }
        Err(why) => println!("no GPU can be used: {why}; mgnc runs on the CPU backend"),
    }
    println!(
        "CPU backend: {} threads",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    0
}

/// `info --json`: every device, the chosen one or why none, and how it rounds to f16.
fn json_report(
    listed: &Result<Vec<Device>, String>,
    chosen: &Result<u32, String>,
    min_spec: bool,
) -> serde_json::Value {
    let is_chosen = |d: &Device| chosen.as_ref().is_ok_and(|c| *c == d.id);
    let devices: Vec<serde_json::Value> = listed
        .as_ref()
        .map(|ds| ds.iter().map(|d| json_device(d, is_chosen(d))).collect())
        .unwrap_or_default();
    serde_json::json!({
        "devices": devices,
        "chosen": chosen.as_ref().ok(),
        "reason": chosen.as_ref().err(),
        "min_spec": min_spec,
        // Each way kernels round to f16 on the chosen device (null: it has no f16).
        "f16_rounding": chosen.as_ref().ok().and_then(|_| f16_rounding()).map(|r| match r {
            Ok(r) => serde_json::json!({
                "staged": if r.staged { "hardware" } else { "software" },
                "rounded": if r.rounded { "hardware" } else { "software" },
            }),
            Err(e) => format!("unknown: {e}").into(),
        }),
        "cpu_threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    })
}

/// How kernels on the chosen device round f32s to f16, when it has f16 (`None`): opening it
/// runs the probe (`mgn_gpu::device::rounding`).
fn f16_rounding() -> Option<Result<F16Rounding, String>> {
    let (info, _) = GpuDevice::chosen().ok()?;
    info.float16.then(|| GpuDevice::open().map(|mut d| d.f16_rounding()).map_err(|e| e.to_string()))
}

/// `info`'s line on the chosen device's f16 rounding, each way kernels round.
fn rounding_line(r: Result<F16Rounding, String>, min_spec: bool) -> String {
    let way = |hardware: bool| if hardware { "one instruction" } else { "in software" };
    match r {
        Ok(F16Rounding { staged: false, rounded: false }) if min_spec => {
            "in software (MGN_MIN_SPEC=1)".into()
        }
        Ok(F16Rounding { staged: false, rounded: false }) if software_requested() => {
            "in software (MGN_F16_ROUNDING=software)".into()
        }
        Ok(r) => format!(
            "into f16 panels {}, f32 round trips {} (one instruction where the device's \
             conversion gave the CPU's result in every rounding case)",
            way(r.staged),
            way(r.rounded)
        ),
        Err(e) => format!("unknown: {e}"),
    }
}

/// What `info` adds to a device's cooperative matrices: which steps use them, or why none do.
fn coop_uses(d: &Device, min_spec: bool) -> String {
    let tile = d.limits.and_then(|l| l.coop_tile());
    match (coop_users(d.cooperative_matrix.1, tile, min_spec, coop_use()), tile) {
        (Ok(Some(users)), Some(t)) => format!(" ({users} use {t}×{t} tiles)"),
        (Ok(_), _) => String::new(),
        (Err(why), _) => format!(" (unused: {why})"),
    }
}

/// Which steps take a device's cooperative matrices (`Ok(None)`: it has none), or why none do.
fn coop_users(
    f16_tile: u32,
    usable: Option<u32>,
    min_spec: bool,
    choice: CoopUse,
) -> Result<Option<&'static str>, &'static str> {
    match (usable, choice) {
        _ if f16_tile == 0 => Ok(None),
        _ if min_spec => Err("MGN_MIN_SPEC=1"),
        (Some(_), CoopUse::Everywhere) => Ok(Some("f16 products and convolutions")),
        (Some(_), CoopUse::Measured) => {
            Ok(Some("f16 products and convolutions measured faster on them"))
        }
        (Some(_), _) => Ok(Some("f16 products")),
        (None, CoopUse::Off) => Err("MGN_COOP=0"),
        (None, _) => Err("the subgroup size varies"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `info` says of a device's cooperative matrices, for each `MGN_COOP` and device.
    #[test]
    fn info_says_which_steps_take_the_tiles_or_why_none_do() {
        let (by_shape, all, off) = (CoopUse::ByShape, CoopUse::Everywhere, CoopUse::Off);
        assert_eq!(coop_users(0, None, false, by_shape), Ok(None));
        assert_eq!(coop_users(16, Some(16), false, by_shape), Ok(Some("f16 products")));
        let everything = Ok(Some("f16 products and convolutions"));
        assert_eq!(coop_users(16, Some(16), false, all), everything);
        let measured = Ok(Some("f16 products and convolutions measured faster on them"));
        assert_eq!(coop_users(16, Some(16), false, CoopUse::Measured), measured);
        assert_eq!(coop_users(16, Some(16), true, by_shape), Err("MGN_MIN_SPEC=1"));
        assert_eq!(coop_users(16, None, false, off), Err("MGN_COOP=0"));
        assert_eq!(coop_users(16, None, false, by_shape), Err("the subgroup size varies"));
    }

    /// What `info` says of the chosen device's f16 rounding, each way on its own.
    #[test]
    fn info_says_how_each_rounding_to_f16_is_done() {
        let h100 = rounding_line(Ok(F16Rounding { staged: true, rounded: false }), false);
        assert!(h100.starts_with("into f16 panels one instruction, f32 round trips in software"));
        let floor = rounding_line(Ok(F16Rounding::SOFTWARE), true);
        assert_eq!(floor, "in software (MGN_MIN_SPEC=1)");
        assert_eq!(rounding_line(Err("no device".into()), false), "unknown: no device");
    }
}
