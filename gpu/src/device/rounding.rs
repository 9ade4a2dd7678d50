//! Whether this device's f32 → f16 conversion rounds as the CPU does, so kernels may round
//! with one instruction instead of the dozen of `halves::FUNCTIONS`.
//!
//! The mixed policy rounds every element of a rounded view as a product stages it, and the tests
//! and gates hold the GPU to the CPU's rounding bit for bit (to nearest, ties to even; f16's
//! subnormals; overflow to infinity from 65,520 on; NaN stays NaN). Vulkan leaves a conversion's
//! rounding mode and f16 subnormals to the implementation, so no device is trusted on its word:
//! once per device and process, when the first kernel that rounds to f16 is compiled
//! (`GpuDevice::f16_rounding`; an f32 plan never runs it), a probe converts a sweep of f32s that
//! covers every rounding case (`cases`) both ways kernels convert — into an f16 held in workgroup
//! memory (a staged panel) and back to f32 in a register (a rounded view read by an f32 kernel) —
//! and compares each result with the CPU's. Each way rounds in hardware only on a device that
//! matched in every case that way (`F16Rounding`); every other, or a probe that fails to run, keeps
//! the software rounding. The two ways differ in practice: Mesa 26.1's lavapipe stages f16s exactly
//! but folds `f32(f16(x))` into `x`. `MGN_MIN_SPEC=1` (f16 is no guaranteed feature) and
//! `MGN_F16_ROUNDING=software` keep the software rounding too.

use super::{Arena, GpuDevice};
use crate::halves::F16Rounding;
use crate::limits::fold_grid;

/// The rounding kernels use on `dev`: probed once per device and process.
pub(super) fn of(dev: &mut GpuDevice) -> F16Rounding {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static PROBED: OnceLock<Mutex<HashMap<(u32, String), F16Rounding>>> = OnceLock::new();
    if !dev.info.float16 || crate::limits::min_spec_requested() || software_requested() {
        return F16Rounding::SOFTWARE;
    }
    let key = (dev.info.id, dev.info.name.clone());
    let probed = PROBED.get_or_init(Default::default);
    if let Some(&r) = probed.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return r;
    }
    let r = probe(dev).map_or(F16Rounding::SOFTWARE, |p| p.verdict());
    probed.lock().unwrap_or_else(|e| e.into_inner()).insert(key, r);
    r
}

/// Whether `MGN_F16_ROUNDING=software` asks for the software rounding on every device.
pub fn software_requested() -> bool {
    std::env::var("MGN_F16_ROUNDING").is_ok_and(|v| v.eq_ignore_ascii_case("software"))
}

/// The inputs (f32 bits) whose conversion was not the CPU's, each way (at most a few).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Probed {
    pub staged: Vec<u32>,
    pub rounded: Vec<u32>,
}

impl Probed {
    fn verdict(&self) -> F16Rounding {
        F16Rounding { staged: self.staged.is_empty(), rounded: self.rounded.is_empty() }
    }
}

/// The probe: both conversions applied to `cases()` on the device; an error where it could
/// not run.
pub(crate) fn probe(dev: &mut GpuDevice) -> Result<Probed, String> {
    probe_with(dev, PROBE)
}

/// `probe` with the kernel `source` (a test's conversion that is wrong on purpose).
pub(crate) fn probe_with(dev: &mut GpuDevice, source: &str) -> Result<Probed, String> {
    let kernel = dev.kernel("f16_rounding_probe", source)?;
    let bits = cases();
    let n = bits.len();
    let arena = dev.arena(3 * n)?;
    let ran = run(dev, &arena, &kernel, &bits);
    dev.free(arena);
    let got = ran?;
    let same = |a: u32, b: f32| a == b.to_bits() || (f32::from_bits(a).is_nan() && b.is_nan());
    let want: Vec<f32> =
        bits.iter().map(|&b| half::f16::from_f32(f32::from_bits(b)).to_f32()).collect();
    let wrong = |from: usize| -> Vec<u32> {
        let off = (0..n).filter(|&i| !same(got[from + i], want[i]));
        off.map(|i| bits[i]).take(8).collect()
    };
    Ok(Probed { staged: wrong(0), rounded: wrong(n) })
}

fn run(
    dev: &mut GpuDevice,
    arena: &Arena,
    kernel: &super::Kernel,
    bits: &[u32],
) -> Result<Vec<u32>, String> {
    let n = bits.len();
    dev.write(arena, 0, bits)?;
    let mut params = [0u32; 32];
    params[0] = n as u32;
    let groups = fold_grid(n.div_ceil(64) as u64, &dev.limits).map_err(|e| e.to_string())?;
    dev.run(arena, &[(kernel, params, groups)])?;
    dev.read(arena, n, 2 * n)
}

/// Element `i` of the `n` inputs converted through workgroup memory into word `n + i`, and
/// through a register into word `2n + i`. Every invocation reaches the barrier.
pub(crate) const PROBE: &str = "enable f16;
var<workgroup> staged: array<f16, 64>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + (gid.y + gid.z * groups.y) * groups.x * 64u;
    let n = params.p[0].x;
    let x = bitcast<f32>(arena[min(i, n - 1u)]);
    staged[lid] = f16(x);
    workgroupBarrier();
    if (i >= n) { return; }
    arena[n + i] = bitcast<u32>(f32(staged[lid]));
    arena[2u * n + i] = bitcast<u32>(f32(f16(x)));
}
";

/// f32 bit patterns covering every case of rounding to f16 (and to bf16, whose tests use them
/// too): every 16-bit pattern in the low half; for both signs and every exponent, mantissas
/// whose dropped bits sit just below, at and just above half a unit — a unit of every width an
/// f16 result may keep, normal (13 bits dropped) or subnormal (up to 24) — with the kept last
/// bit even and odd, and with the bits above it clear, set (a carry into the exponent) or
/// mixed; a pseudo-random sweep; and the range's edges by hand.
pub(crate) fn cases() -> Vec<u32> {
    let mut bits: Vec<u32> = (0..1u32 << 16).map(|h| h | (h.wrapping_mul(40503) << 16)).collect();
    for top in 0..512u32 {
        for dropped in 13..=24u32 {
            let unit = 1u32 << dropped;
            let above = [0, 0x7f_ffff & !(2 * unit - 1), 0x55_5555 & !(2 * unit - 1)];
            for high in above {
                for last in [0, unit] {
                    for low in [unit / 2 - 1, unit / 2, unit / 2 + 1, 1, unit - 1] {
                        bits.push((top << 23) | ((high | last | low) & 0x7f_ffff));
                    }
                }
            }
        }
    }
    bits.extend((0..1u32 << 16).map(|i| i.wrapping_mul(16411).rotate_left(i % 32)));
    for edge in
        [0x477fefffu32, 0x477ff000, 0x477ff001, 0x38800000, 0x387fffff, 0x33000000, 0x33000001]
    {
        bits.extend([edge, edge | 0x8000_0000, edge + 0x1000, edge - 0x1000]);
    }
    bits.extend([0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0x7f80_0001, 1]);
    bits.push(0x807f_ffff);
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> Option<GpuDevice> {
        crate::testing::or_skip(GpuDevice::open())
    }

    /// The device's rounding is the probe's verdict, way by way. On CI's lavapipe (LLVM
    /// converts to nearest even) the probe passes both ways, so its kernels round in hardware
    /// and the tests under `MGN_MIN_SPEC=1` in software: both paths run there.
    #[test]
    fn the_device_rounds_in_hardware_only_where_the_probe_passes() {
        let Some(mut dev) = device() else { return };
        let probed = probe(&mut dev).expect("the probe runs");
        let eligible =
            dev.info.float16 && !crate::limits::min_spec_requested() && !software_requested();
        let want = if eligible { probed.verdict() } else { F16Rounding::SOFTWARE };
        assert_eq!(dev.f16_rounding(), want, "probe: {probed:x?}");
        if dev.info.software && dev.info.float16 {
            assert_eq!(
                probed.staged,
                Vec::<u32>::new(),
                "lavapipe stages f16s rounded to nearest even"
            );
        }
    }

    /// Conversions that differ from the CPU's in one class of cases each — toward zero, f16's
    /// subnormals flushed, overflow saturated at 65,504, ties away from zero — each fail the
    /// probe both ways: its cases reach every class.
    #[test]
    fn the_probe_catches_a_conversion_wrong_in_any_one_class() {
        let Some(mut dev) = device() else { return };
        if !dev.info.float16 {
            eprintln!("skipped: the device has no f16 (nothing to probe)");
            return;
        }
        let wrong = [
            // Toward zero: drop the 13 bits an f16 keeps none of (normal results).
            "f16(bitcast<f32>(bitcast<u32>(x) & 0xffffe000u))",
            "select(f16(x), f16(0.0), abs(x) < 6.1035156e-5)",
            "select(f16(x), f16(sign(x) * 65504.0), abs(x) >= 65520.0 && abs(x) < 1e38)",
            // Ties away from zero: an exact tie nudged up a little before converting.
            "f16(select(x, bitcast<f32>(bitcast<u32>(x) + 1u), \
             (bitcast<u32>(x) & 0x1fffu) == 0x1000u))",
        ];
        for convert in wrong {
            let source = PROBE.replace("f16(x)", &format!("({convert})"));
            let found = probe_with(&mut dev, &source).expect("runs");
            assert!(!found.staged.is_empty(), "the probe's staging missed `{convert}`");
            assert!(!found.rounded.is_empty(), "the probe's round trip missed `{convert}`");
        }
    }
}
