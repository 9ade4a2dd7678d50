//! The device against the CPU: kernels, uploads, zeros, folded grids, bad WGSL.

use super::*;
use crate::limits::fold_grid;

/// Needs a Vulkan device (lavapipe in CI, where `MGN_REQUIRE_GPU=1` makes its absence a
/// failure); elsewhere says so and passes.
fn device() -> Option<GpuDevice> {
    crate::testing::or_skip(GpuDevice::open())
}

const ADD: &str = "@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
let i = gid.x + (gid.y + gid.z * groups.y) * groups.x * 64u;
let n = params.p[0].x;
if (i >= n) { return; }
let a = bitcast<f32>(arena[params.p[0].y + i]);
let b = bitcast<f32>(arena[params.p[0].z + i]);
arena[params.p[0].w + i] = bitcast<u32>(a + b);
}
";

#[test]
fn a_kernel_runs_over_the_arena_and_matches_the_cpu() {
    let Some(mut dev) = device() else { return };
    let add = dev.kernel("add", ADD).expect("valid WGSL");
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let arena = dev.arena(3 * n).expect("fits");
    dev.write(&arena, 0, &a.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).expect("uploads");
    dev.write(&arena, n, &b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).expect("uploads");
    let mut params = [0u32; 32];
    params[..4].copy_from_slice(&[n as u32, 0, n as u32, 2 * n as u32]);
    let groups = fold_grid(n.div_ceil(64) as u64, &dev.limits).expect("fits");
    dev.run(&arena, &[(&add, params, groups)]).expect("runs");
    let out: Vec<f32> =
        dev.read(&arena, 2 * n, n).expect("reads").into_iter().map(f32::from_bits).collect();
    for i in 0..n {
        assert_eq!(out[i], a[i] + b[i], "element {i}");
    }
    // A tensor with a zero-sized axis reads back as nothing (it has no staging).
    assert_eq!(dev.read(&arena, 0, 0).expect("reads nothing"), Vec::<u32>::new());
    // Zeroed on the device before the uploads of the same submission land.
    let job = Submission {
        zeros: vec![(1, n - 2)],
        uploads: vec![(3, &[7u32, 8][..])],
        ..Default::default()
    };
    dev.submit(&arena, &job).expect("zeroes and uploads");
    let got = dev.read(&arena, 0, n).expect("reads");
    assert_eq!(got[0], a[0].to_bits(), "before the zeros");
    assert_eq!(&got[1..6], &[0, 0, 7, 8, 0], "zeros, then the upload over them");
    assert!(got[6..n - 1].iter().all(|&w| w == 0));
    assert_eq!(got[n - 1], a[n - 1].to_bits(), "after the zeros");
    let past = Submission { zeros: vec![(3 * n - 1, 2)], ..Default::default() };
    let e = dev.submit(&arena, &past).unwrap_err();
    assert!(e.contains("runs past the arena"), "{e}");
}

#[test]
fn grids_past_65535_workgroups_fold_and_cover_every_element() {
    let Some(mut dev) = device() else { return };
    // One invocation per workgroup, so 70,000 elements need 70,000 workgroups: more than
    // one dimension holds under the Vulkan floor.
    let body = "@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
let i = wg.x + (wg.y + wg.z * groups.y) * groups.x;
if (i >= params.p[0].x) { return; }
arena[i] = arena[i] + i + 1u;
}
";
    let k = dev.kernel("fill", body).expect("valid WGSL");
    let n = 70_000usize;
    let arena = dev.arena(n + 16).expect("fits");
    let mut params = [0u32; 32];
    params[0] = n as u32;
    let groups = fold_grid(n as u64, &dev.limits).expect("fits");
    assert!(groups[1] > 1 || dev.limits.max_workgroups[0] as usize >= n);
    dev.run(&arena, &[(&k, params, groups)]).expect("runs");
    let out = dev.read(&arena, 0, n + 16).expect("reads");
    for (i, v) in out.iter().enumerate() {
        assert_eq!(
            *v,
            if i < n { i as u32 + 1 } else { 0 },
            "element {i}: each written exactly once, nothing past the end"
        );
    }
}

#[test]
fn invalid_wgsl_is_an_error_naming_the_kernel() {
    let Some(mut dev) = device() else { return };
    let Err(e) =
        dev.kernel("broken", "@compute @workgroup_size(1) fn main() { let x: f32 = arena[0]; }")
    else {
        panic!("must fail")
    };
    assert!(e.starts_with("kernel `broken`"), "{e}");
}

/// An upload past both halves of the staging buffer streams through them: tensors split across
/// halves, a zeroed range under an upload, and the arena's words all as written.
#[test]
fn a_large_upload_streams_through_the_staging_halves() {
    let Some(mut dev) = device() else { return };
    let half = super::queue::STAGE_WORDS;
    let n = 2 * half + half / 2 + 7;
    let arena = dev.arena(n + 16).expect("fits");
    let a: Vec<u32> = (0..half + 3).map(|i| i as u32 ^ 0x5555).collect();
    let b: Vec<u32> = (0..n - a.len()).map(|i| (i as u32).wrapping_mul(2_654_435_761)).collect();
    let job = Submission {
        zeros: vec![(n, 16), (0, 8)],
        uploads: vec![(0, &a[..]), (a.len(), &b[..])],
        ..Default::default()
    };
    dev.submit(&arena, &job).expect("streams");
    let got = dev.read(&arena, 0, n + 16).expect("reads");
    assert!(got[..a.len()] == a[..], "the first tensor, across the first half's end");
    assert!(got[a.len()..n] == b[..], "the second, through both halves and a third fill");
    assert!(got[n..].iter().all(|&w| w == 0), "zeroed past the uploads");
}

/// A submission that outlasts the queue's patience is an error, and leaves the device `hung`:
/// every later submission is refused, and the arena and the device are leaked rather than
/// destroyed under the kernel that may still be running (which crashed lavapipe's threads).
#[test]
fn a_submission_that_outlasts_its_patience_leaves_the_device_untouched() {
    const SPIN: &str = "@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
var acc = f32(gid.x);
for (var j = 0u; j < params.p[0].x; j++) { acc = acc * 0.999 + 1.0; }
arena[gid.x] = bitcast<u32>(acc);
}
";
    let Some(mut dev) = device() else { return };
    let spin = dev.kernel("spin", SPIN).expect("valid WGSL");
    let arena = dev.arena(64 * 256).expect("fits");
    let run = |dev: &mut GpuDevice, n: u32| {
        let mut params = [0u32; 32];
        params[0] = n;
        let start = std::time::Instant::now();
        dev.run(&arena, &[(&spin, params, [256, 1, 1])]).map(|()| start.elapsed())
    };
    // As many iterations as take about 200 ms on this device, measured.
    let mut n = 1000u32;
    loop {
        let took = run(&mut dev, n).expect("runs").as_secs_f64();
        if took > 0.05 || n >= 1 << 30 {
            n = ((n as f64) * (0.2 / took).max(1.0)).min(u32::MAX as f64) as u32;
            break;
        }
        n = n.saturating_mul(8);
    }
    dev.queue.set_patience(std::time::Duration::from_millis(1));
    let err = run(&mut dev, n).expect_err("outlasts a millisecond");
    assert!(err.contains("did not finish within 0.001 s"), "{err}");
    assert!(dev.hung());
    let err = dev.read(&arena, 0, 1).expect_err("no more work");
    assert!(err.contains("an earlier submission did not finish"), "{err}");
    assert!(dev.arena(4).is_err(), "no new arena either");
    dev.free(arena);
    drop(dev);
}

/// The kernels' half conversions (`crate::halves::FUNCTIONS`) give the CPU's values bit for
/// bit — round to nearest even, f16's overflow at 65,520, its subnormals, infinities and NaN —
/// over a sweep of f32 bit patterns (every exponent, sign and rounding case) and every f16.
#[test]
fn half_conversions_match_the_cpu_bit_for_bit() {
    const CONVERT: &str = "@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
let i = gid.x + (gid.y + gid.z * groups.y) * groups.x * 64u;
if (i >= params.p[0].x) { return; }
let b = arena[i];
arena[params.p[0].y + i] = bitcast<u32>(mgn_f16_round(bitcast<f32>(b)));
arena[params.p[0].z + i] = bitcast<u32>(mgn_f16_value(b & 0xffffu));
arena[params.p[0].w + i] = mgn_bf16(bitcast<f32>(b));
arena[params.p[1].x + i] = mgn_f16(bitcast<f32>(b));
}
";
    let Some(mut dev) = device() else { return };
    let convert = dev.kernel("convert", CONVERT).expect("valid WGSL");
    // Every f16, and f32s of every sign, exponent and rounding case (the rounding probe's).
    let bits = super::rounding::cases();
    let n = bits.len();
    let arena = dev.arena(5 * n).expect("fits");
    dev.write(&arena, 0, &bits).expect("uploads");
    let mut params = [0u32; 32];
    params[..5].copy_from_slice(&[n as u32, n as u32, 2 * n as u32, 3 * n as u32, 4 * n as u32]);
    let groups = fold_grid(n.div_ceil(64) as u64, &dev.limits).expect("fits");
    dev.run(&arena, &[(&convert, params, groups)]).expect("runs");
    let got = dev.read(&arena, n, 4 * n).expect("reads");
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for (i, &b) in bits.iter().enumerate() {
        let x = f32::from_bits(b);
        let want = half::f16::from_f32(x);
        let rounded = f32::from_bits(got[i]);
        assert!(same(rounded, want.to_f32()), "f16 rounding of {b:#010x}: {:#010x}", got[i]);
        let h = half::f16::from_bits(b as u16).to_f32();
        assert!(
            same(f32::from_bits(got[n + i]), h),
            "f16 {:#06x}: {:#010x}",
            b & 0xffff,
            got[n + i]
        );
        let bf = half::bf16::from_f32(x);
        let bf_got = half::bf16::from_bits(got[2 * n + i] as u16);
        assert!(
            got[2 * n + i] < 1 << 16 && same(bf_got.to_f32(), bf.to_f32()),
            "bf16 rounding of {b:#010x}: {:#06x}",
            got[2 * n + i]
        );
        let h_got = half::f16::from_bits(got[3 * n + i] as u16);
        assert!(
            got[3 * n + i] < 1 << 16 && same(h_got.to_f32(), want.to_f32()),
            "f16 bits of {b:#010x}: {:#06x}",
            got[3 * n + i]
        );
    }
}

/// Kernels compiled while the arena is made and filled come back in order, a bad one as its own
/// error among good ones, and the fill is in the arena.
#[test]
fn kernels_compile_in_order_while_the_arena_fills() {
    let Some(mut dev) = device() else { return };
    let sources: Vec<(String, String)> = (0..6)
        .map(|i| {
            let body = if i == 3 { "not wgsl".to_string() } else { ADD.replace("64u", "64u ") };
            (format!("k{i}"), body)
        })
        .collect();
    let data: Vec<u32> = (0..100).collect();
    let fill = Submission { uploads: vec![(10, &data[..])], ..Default::default() };
    let (kernels, arena, _) = dev.kernels_and_arena(&sources, 200, &fill);
    let arena = arena.expect("allocated and filled");
    for (i, k) in kernels.iter().enumerate() {
        match (i, k) {
            (3, Err(e)) => assert!(e.starts_with("kernel `k3`"), "{e}"),
            (_, Ok(k)) => assert_eq!(k.name, format!("k{i}")),
            (_, Err(e)) => panic!("kernel {i}: {e}"),
        }
    }
    assert_eq!(dev.read(&arena, 10, 100).expect("reads"), data);
    assert_eq!(dev.read(&arena, 0, 10).expect("reads"), vec![0; 10]);
}

/// The half types' conversions go into the kernels that call them, and only those: an f32
/// kernel is the prelude and its body.
#[test]
fn only_kernels_that_convert_halves_carry_the_conversions() {
    let source = |body: &str| compile::source(body, F16Rounding::SOFTWARE);
    assert_eq!(source(ADD), format!("{}{ADD}", compile::PRELUDE));
    let half = ADD.replace("bitcast<f32>(arena[params.p[0].y + i])", "mgn_f16_value(arena[i])");
    assert!(source(&half).contains(crate::halves::FUNCTIONS));
    let bf = ADD.replace("bitcast<u32>(a + b)", "mgn_bf16(a + b)");
    assert!(source(&bf).contains(crate::halves::FUNCTIONS));
    assert!(naga::front::wgsl::parse_str(&source(&half)).is_ok());
}

/// The f16 rounding functions a body calls are defined for the device's rounding, each way on
/// its own; a body rounded in hardware in a register gets the `enable f16` an f32 kernel lacks,
/// once, and every combination is WGSL naga accepts.
#[test]
fn rounding_functions_are_defined_for_the_device() {
    let rounded = ADD.replace("a + b", "mgn_f16_rounded(a) + b");
    let staged = format!(
        "enable f16;\n{}",
        ADD.replace("bitcast<u32>(a + b)", "bitcast<u32>(f32(mgn_f16_staged(a)) + b)")
    );
    for (staged_hw, rounded_hw) in [(false, false), (true, false), (false, true), (true, true)] {
        let rounding = F16Rounding { staged: staged_hw, rounded: rounded_hw };
        let src = compile::source(&rounded, rounding);
        assert_eq!(src.contains("return f32(f16(x));"), rounded_hw, "{src}");
        assert_eq!(src.contains("return mgn_f16_round(x);"), !rounded_hw, "{src}");
        assert_eq!(src.matches("enable f16;").count(), rounded_hw as usize, "{src}");
        assert!(!src.contains("mgn_f16_staged"), "defined only where called: {src}");
        let src = compile::source(&staged, rounding);
        assert_eq!(src.contains("return f16(x);"), staged_hw, "{src}");
        assert_eq!(src.contains("return f16(mgn_f16_round(x));"), !staged_hw, "{src}");
        assert_eq!(src.matches("enable f16;").count(), 1, "{src}");
        // The software functions go only where a definition or the body calls them.
        let software_only_in = |body: &str, hardware: bool| {
            compile::source(body, rounding).contains(crate::halves::FUNCTIONS) != hardware
        };
        assert!(software_only_in(&rounded, rounded_hw), "{rounding:?}");
        assert!(software_only_in(&staged, staged_hw), "{rounding:?}");
        for body in [&rounded, &staged] {
            let full = compile::source(body, rounding);
            naga::front::wgsl::parse_str(&full).unwrap_or_else(|e| panic!("{e}\n{full}"));
        }
    }
}

/// The rounding probe runs only for a kernel that rounds to f16: compiling f32 kernels leaves
/// it undecided, and the first kernel that rounds decides it.
#[test]
fn only_a_kernel_that_rounds_to_f16_runs_the_rounding_probe() {
    let Some(mut dev) = device() else { return };
    dev.kernel("add", ADD).expect("valid WGSL");
    dev.kernels(&[("add".into(), ADD.into())]).into_iter().for_each(|k| drop(k.expect("valid")));
    assert_eq!(dev.f16_rounding, None, "an f32 kernel runs no probe");
    let rounded = ADD.replace("a + b", "mgn_f16_rounded(a) + b");
    dev.kernel("rounded", &rounded).expect("valid WGSL");
    assert!(dev.f16_rounding.is_some(), "a kernel that rounds decides the rounding");
}
