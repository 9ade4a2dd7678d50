//! Each shape takes its kernel, and every kernel validates within the Vulkan floor (without a
//! device). The numbers are checked against the CPU in `tests_matmul.rs`.

use super::*;
use crate::kernels::{validate, Target};
use mgn_ir::DType;

fn floor(width: u32) -> Target {
    Target::floor(width)
}

fn operand(offset: usize, shape: &[usize]) -> Operand {
    Operand::at(offset, shape, DType::F32)
}

/// Bytes of workgroup memory the kernel declares.
fn shared_bytes(body: &str) -> usize {
    body.lines()
        .filter(|l| l.starts_with("var<workgroup>"))
        .map(|l| {
            let count: usize =
                l.rsplit(", ").next().unwrap().trim_end_matches(">;").parse().unwrap();
            count * if l.contains("vec4<f32>") { 16 } else { 4 }
        })
        .sum()
}

/// a, b and the product's shapes, and a line only the expected kernel has.
type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a str);

#[test]
fn each_shape_takes_its_kernel_and_every_kernel_validates_within_the_floor() {
    let cases: [Case; 9] = [
        (&[130, 70], &[70, 129], &[130, 129], "mm_a"),
        (&[4, 256, 512], &[512, 1024], &[4, 256, 1024], "mm_a"),
        (&[2, 132, 9, 10], &[132, 10, 9], &[2, 132, 9, 9], "mm_a"),
        (&[1, 576], &[576, 1536], &[1, 1536], "let col"),
        (&[576], &[576, 49152], &[49152], "let col"),
        (&[3, 1, 7], &[7, 20], &[3, 1, 20], "let col"),
        (&[50, 300], &[300], &[50], "let row"),
        (&[300], &[300], &[], "let row"),
        (&[2, 3, 5, 7], &[2, 1, 7, 2], &[2, 3, 5, 2], "let row"),
    ];
    for width in [64, 128, 256] {
        for (a, b, out, marker) in cases {
            let what = format!("{a:?} × {b:?} at width {width}");
            let src = generate(
                &[operand(3, a), operand(100_000, b)],
                &operand(7_000_000, out),
                floor(width),
            )
            .unwrap();
            assert!(src.body.contains(marker), "{what}: expected the kernel with `{marker}`");
            let declared = src.width.unwrap_or(width);
            assert!(declared <= width, "{what}: {declared} invocations a workgroup");
            assert!(src.body.contains(&format!("@workgroup_size({declared})")), "{what}");
            assert_eq!(src.invocations % declared as u64, 0, "{what}");
            assert!(
                src.body.contains(&format!(
                    "if (g >= {}u) {{ return; }}",
                    src.invocations / declared as u64
                )),
                "{what}"
            );
            assert!(
                shared_bytes(&src.body) <= 16 * 1024,
                "{what}: {} bytes of shared memory",
                shared_bytes(&src.body)
            );
            validate(&src.body).unwrap_or_else(|e| panic!("{what}: {e}\n{}", src.body));
        }
    }
}

#[test]
fn integer_and_scalar_operands_are_refused() {
    let ints = Operand { dtype: DType::I32, ..operand(0, &[2, 2]) };
    assert!(generate(&[ints.clone(), ints.clone()], &ints, floor(256)).is_err());
    let (a, b) = (operand(0, &[]), operand(1, &[3]));
    assert!(generate(&[a, b], &operand(4, &[3]), floor(256)).is_err());
}

/// The tile chooser: 8×8 outputs an invocation while that gives enough tiles over a deep
/// enough k, with 16-deep panels where the device's shared memory holds them and 8-deep ones
/// within the floor; else 4×4 with 16-deep panels; a device narrower than 256 invocations gets
/// its own width.
#[test]
fn the_tile_follows_the_count_of_tiles_and_the_shared_memory() {
    let kernel = |a: &[usize], b: &[usize], target: Target| {
        let out = [a[0], b[1]];
        generate(&[operand(0, a), operand(10_000_000, b)], &operand(20_000_000, &out), target)
            .unwrap()
    };
    // Whisper's fc1: 144 tiles of 128×128, fewer than two an SM.
    let fc1 = kernel(&[1500, 384], &[384, 1536], floor(256));
    assert!(fc1.body.contains("var c3_0") && !fc1.body.contains("var c4_0"), "4×4 outputs each");
    assert!(fc1.body.contains("let a15_0"), "16-deep panels");
    // 4096²: 1,024 tiles of 128×128, 8 deep within the floor and 16 deep with 48 KiB.
    let square = kernel(&[4096, 4096], &[4096, 4096], floor(256));
    assert!(square.body.contains("var c7_1") && !square.body.contains("let a8_0"), "8×8, 8 deep");
    let roomy = Target { width: 256, shared_bytes: 48 << 10, coop: None };
    let square = kernel(&[4096, 4096], &[4096, 4096], roomy);
    assert!(square.body.contains("var c7_1") && square.body.contains("let a15_0"), "16 deep");
    assert!(shared_bytes(&square.body) > 16 << 10 && shared_bytes(&square.body) <= 48 << 10);
    // 4096² outputs over k = 64 (an attention's scores): plenty of tiles, too shallow for 8×8.
    let scores = kernel(&[4096, 64], &[64, 4096], roomy);
    assert!(scores.body.contains("var c3_0") && !scores.body.contains("var c4_0"), "4×4");
    for width in [64, 128] {
        let k = kernel(&[1500, 384], &[384, 1536], floor(width));
        assert_eq!(k.width, None);
        assert!(k.body.contains(&format!("@workgroup_size({width})")));
    }
}

/// Products of f16 operands take the cooperative-matrix kernel on a device that has one (at the
/// H200's 16×16 tiles and subgroups of 32, and lavapipe's 8×8 and 8), in every layout the
/// tiled kernel reads: the kernel validates and translates to SPIR-V here, though no device
/// of this machine runs it. Other products, and skinny ones, keep their kernels.
#[test]
fn half_products_take_cooperative_matrices_where_the_device_has_them() {
    use crate::kernels::Coop;
    let half = |offset: usize, shape: &[usize], rounded: bool| Operand {
        rounded,
        ..Operand::at(offset, shape, DType::F16)
    };
    let (m, k, n) = (130, 70, 129);
    let big = Coop { tile: 16, subgroup: 32, everywhere: true };
    for coop in [big, Coop { tile: 8, subgroup: 8, everywhere: true }] {
        let target = Target { width: 256, shared_bytes: 32 << 10, coop: Some(coop) };
        for (layout, rounded) in [
            (Layout::PLAIN, false),
            (Layout { ta: true, tb: true, alpha: 0.5, splits: 1 }, true),
            (Layout { tb: true, splits: 3, ..Layout::PLAIN }, false),
        ] {
            let a = if layout.ta { [k, m] } else { [m, k] };
            let b = if layout.tb { [n, k] } else { [k, n] };
            let out = operand(9_000_000, &[layout.splits, m, n]);
            let inputs = [half(0, &a, rounded), half(1_000_000, &b, !rounded)];
            let what = format!("{coop:?} {layout:?}");
            let src = generate_layout(&inputs, &out, target, layout).unwrap();
            assert!(src.body.contains("coopMultiplyAdd"), "{what}");
            // The wide grid's eight subgroups fit 256 invocations and 32 KiB; at 16 KiB, the
            // 2×2 grid's four at 16×16 tiles (the wide one's panels take 22 KiB there).
            let declared = src.width.expect("a workgroup of eight subgroups");
            assert_eq!(declared, 8 * coop.subgroup, "{what}");
            let floor = Target { shared_bytes: 16 << 10, ..target };
            let small = generate_layout(&inputs, &out, floor, layout).unwrap();
            let subgroups = if coop.tile == 16 { 4 } else { 8 };
            assert_eq!(small.width, Some(subgroups * coop.subgroup), "{what}");
            assert_eq!(src.invocations % declared as u64, 0, "{what}");
            crate::kernels::check::spirv(&src.body)
                .unwrap_or_else(|e| panic!("{what}: {e}\n{}", src.body));
        }
        let f32s = [operand(0, &[m, k]), operand(1_000_000, &[k, n])];
        let plain = generate(&f32s, &operand(9_000_000, &[m, n]), target).unwrap();
        assert!(!plain.body.contains("coop"), "f32 operands keep the tiled kernel");
        let bf16 = Operand { dtype: DType::BF16, ..half(0, &[m, k], false) };
        let b = [bf16.clone(), Operand { offset: 1_000_000, shape: vec![k, n], ..bf16 }];
        let bf = generate(&b, &operand(9_000_000, &[m, n]), target).unwrap();
        assert!(!bf.body.contains("coop"), "bf16 has no cooperative type here");
        let row = [half(0, &[1, k], false), half(1_000_000, &[k, n], false)];
        let skinny = generate(&row, &operand(9_000_000, &[1, n]), target).unwrap();
        assert!(!skinny.body.contains("coop"), "one row keeps the few-rows kernel");
    }
    // By default every f16 product takes the tiles, whether its operands are held as halves
    // (an inference plan's weights) or rounded views (a training plan's products); a rounded
    // view is staged through the device's rounding (`mgn_f16_staged`).
    for (a_rounded, b_rounded) in [(true, true), (true, false), (false, true), (false, false)] {
        let chosen = Coop { everywhere: false, ..big };
        let target = Target { width: 256, shared_bytes: 32 << 10, coop: Some(chosen) };
        let inputs = [half(0, &[1500, 384], a_rounded), half(1_000_000, &[384, 64], b_rounded)];
        let src = generate(&inputs, &operand(9_000_000, &[1500, 64]), target).unwrap();
        let what = format!("rounded views: A {a_rounded}, B {b_rounded}");
        assert!(src.body.contains("coopMultiplyAdd"), "{what}");
        assert_eq!(src.body.contains("mgn_f16_staged("), a_rounded || b_rounded, "{what}");
        crate::kernels::check::spirv(&src.body).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // The tiled kernel rounds a rounded view in a register (`mgn_f16_rounded`), valid with
    // either rounding.
    let inputs = [half(0, &[1500, 384], true), half(1_000_000, &[384, 64], true)];
    let tiled = generate(&inputs, &operand(9_000_000, &[1500, 64]), floor(256)).unwrap();
    assert!(tiled.body.contains("mgn_f16_rounded("));
    crate::kernels::check::spirv(&tiled.body).unwrap();
}
