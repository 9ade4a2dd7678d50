//! The three convolutions as implicit GEMMs (`gemm.rs`): what each operand's loader gathers
//! and how each result is stored.

use super::gemm::{fetch, implicit_gemm, takes_coop, Gemm, Loader};
use super::ConvDims;
use crate::kernels::{load, store, KernelSource, Operand, Target};

/// Forward as a GEMM per group: M = output channels, N = samples × output positions,
/// K = input channels × taps; A is the weight (contiguous along K), B the im2col of the input,
/// staged along N so that neighbouring invocations read neighbouring pixels. With `post`, each
/// result goes to `mgn_epilogue(index, value)` (a fused program the caller defines) instead.
// The operands, the output and how it is stored (split ranges, through an epilogue) are the
// forward's own; a struct of them would be built at three call sites only to be taken apart.
#[allow(clippy::too_many_arguments)]
pub(super) fn conv_tiled(
    c: &ConvDims,
    x: &Operand,
    w: &Operand,
    bias: Option<&Operand>,
    out: &Operand,
    target: Target,
    splits: usize,
    post: bool,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let (hw, l, kk) = (h * wd, oh * ow, kh * kw);
    let k = cin_g * kk;
    let split_depth = (splits > 1).then(|| split_depth(k, splits));
    let gm = Gemm { groups: c.g, m: cout_g, n: c.n * l, k, k_end: None, split_depth };
    // A pointwise convolution reads the input plane as it is: no window arithmetic.
    let pointwise = kk == 1 && [sh, sw, ph, pw] == [1, 1, 0, 0];
    let loaders = |w: &Operand, x: &Operand| {
        let a = Loader {
            k_fast: true,
            pre: String::new(),
            body: fetch(w, &format!("(g * {cout_g}u + m0 + r) * {}u + k", gm.k)),
            operand: w.clone(),
        };
        let b = Loader {
            k_fast: false,
            pre: format!(
                "let bn = n0 + fb;
    let bp = bn % {l}u;
    let bx = ((bn / {l}u) * {cin}u + g * {cin_g}u) * {hw}u;
    let bih = i32((bp / {ow}u) * {sh}u) - {ph};
    let biw = i32((bp % {ow}u) * {sw}u) - {pw};"
            ),
            body: if pointwise {
                fetch(x, &format!("bx + k * {hw}u + bp"))
            } else {
                format!(
                    "let t = k % {kk}u;
                let ih = bih + i32((t / {kw}u) * {dh}u);
                let iw = biw + i32((t % {kw}u) * {dw}u);
                if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) {{
                    {xv}
                }}",
                    xv = fetch(x, &format!("bx + (k / {kk}u) * {hw}u + u32(ih) * {wd}u + u32(iw)")),
                )
            },
            operand: x.clone(),
        };
        (a, b)
    };
    let (mut a, mut b) = loaders(w, x);
    // On cooperative matrices, an operand held as halves (an inference plan's weight) is
    // staged as it is loaded, through the f16 view.
    if takes_coop(&gm, &a, &b, target) && (w.packs_halves() || x.packs_halves()) {
        let viewed = |o: &Operand| Operand { f16_view: o.packs_halves(), ..o.clone() };
        (a, b) = loaders(&viewed(w), &viewed(x));
    }
    let plus =
        bias.map_or(String::new(), |b| format!(" + {}", load(b, &format!("g * {cout_g}u + m"))));
    let at = format!(
        "{}((n / {l}u) * {cout}u + g * {cout_g}u + m) * {l}u + n % {l}u",
        range(c.n * cout * l, splits)
    );
    let epilogue = match post {
        // The fused program stores (`kernels::conv::forward`).
        true => format!("mgn_epilogue({at}, acc{plus});"),
        false => store(out, &at, &format!("acc{plus}")),
    };
    implicit_gemm(&gm, &a, &b, &epilogue, target)
}

/// The input gradient as a GEMM per group (a transposed convolution): M = input channels,
/// N = samples × input positions, K = output channels × taps. B gathers, for input position
/// (ih, iw) and tap (kh, kw), the dy at the output position that tap came from, when
/// ih + p − kh·d is a whole multiple of the stride inside the output (zero otherwise).
pub(super) fn conv_grad_input_tiled(
    c: &ConvDims,
    dy: &Operand,
    w: &Operand,
    out: &Operand,
    target: Target,
    splits: usize,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let (hw, l, kk) = (h * wd, oh * ow, kh * kw);
    let k = cout_g * kk;
    let split_depth = (splits > 1).then(|| split_depth(k, splits));
    let gm = Gemm { groups: c.g, m: cin_g, n: c.n * hw, k, k_end: None, split_depth };
    let a = Loader {
        k_fast: true,
        pre: String::new(),
        body: fetch(
            w,
            &format!("((g * {cout_g}u + k / {kk}u) * {cin_g}u + m0 + r) * {kk}u + k % {kk}u"),
        ),
        operand: w.clone(),
    };
    // A stride of 1 needs no divisibility test (and no division).
    let on_grid =
        |t: &str, s: usize| if s == 1 { String::new() } else { format!(" && {t} % {s} == 0") };
    let b = Loader {
        k_fast: false,
        pre: format!(
            "let bn = n0 + fb;
    let bp = bn % {hw}u;
    let bdy = ((bn / {hw}u) * {cout}u + g * {cout_g}u) * {l}u;
    let bih = i32(bp / {wd}u) + {ph};
    let biw = i32(bp % {wd}u) + {pw};"
        ),
        body: format!(
            "let t = k % {kk}u;
                let th = bih - i32((t / {kw}u) * {dh}u);
                let tw = biw - i32((t % {kw}u) * {dw}u);
                if (th >= 0 && tw >= 0{gh}{gw}) {{
                    let y = u32(th) / {sh}u;
                    let x = u32(tw) / {sw}u;
                    if (y < {oh}u && x < {ow}u) {{
                        {dyv}
                    }}
                }}",
            gh = on_grid("th", sh),
            gw = on_grid("tw", sw),
            dyv = fetch(dy, &format!("bdy + (k / {kk}u) * {l}u + y * {ow}u + x")),
        ),
        operand: dy.clone(),
    };
    let epilogue = store(
        out,
        &format!(
            "{}((n / {hw}u) * {cin}u + g * {cin_g}u + m) * {hw}u + n % {hw}u",
            range(c.n * cin * hw, splits)
        ),
        "acc",
    );
    implicit_gemm(&gm, &a, &b, &epilogue, target)
}

/// The input gradient of a strided convolution (dilation 1), one GEMM per group and *phase*:
/// input positions `(ih, iw)` with the same `(ih mod s_h, iw mod s_w)` receive dy through the
/// same taps — `kh ≡ ih + p_h (mod s_h)`, likewise for `kw` — so each phase's GEMM runs over
/// those taps alone (at most `⌈k_h/s_h⌉·⌈k_w/s_w⌉` per output channel) instead of testing every
/// tap at every position and discarding the ones off the stride grid (¾ of them at stride 2). A
/// phase that no tap reaches (a 1×1 kernel at stride 2: three phases of four) skips its K loop
/// and stores zeros. M = input channels, N = samples × the phase's positions (the largest phase's
/// count; positions past the image are neither read nor stored), K = output channels × taps.
pub(super) fn conv_grad_input_phased(
    c: &ConvDims,
    dy: &Operand,
    w: &Operand,
    out: &Operand,
    target: Target,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [sh, sw]) = (c.inp, c.k, c.stride);
    if c.dilation != [1, 1] || sh * sw == 1 {
        return None;
    }
    let (cin, cin_g, cout_g, hw) = (c.cin, c.cin_g(), c.cout_g(), h * wd);
    let phases = sh * sw;
    let (qh, qw) = (h.div_ceil(sh), wd.div_ceil(sw));
    let taps = kh.div_ceil(sh) * kw.div_ceil(sw);
    let gm = Gemm {
        groups: c.g * phases,
        m: cin_g,
        n: c.n * qh * qw,
        k: cout_g * taps,
        k_end: Some(format!("select(0u, {}u, a_live)", cout_g * taps)),
        split_depth: None,
    };
    // The loaders decode the phase from the group and the tap from k (`phase_tap`).
    let (a, b) = (phase_weights(c, w), phase_dy(c, dy));
    let epilogue = format!(
        "let eq = n % {pq}u;
            let e_ih = (eq / {qw}u) * {sh}u + a_rh;
            let e_iw = (eq % {qw}u) * {sw}u + a_rw;
            if (e_ih < {h}u && e_iw < {wd}u) {{
                {st}
            }}",
        pq = qh * qw,
        st = store(
            out,
            &format!(
                "((n / {}u) * {cin}u + a_g * {cin_g}u + m) * {hw}u + e_ih * {wd}u + e_iw",
                qh * qw
            ),
            "acc"
        ),
    );
    implicit_gemm(&gm, &a, &b, &epilogue, target)
}

/// WGSL decoding depth `k` of a phase's GEMM into the output channel `co` and the phase's tap
/// (`kh_`, `kw_`; past the kernel for the phases with fewer taps than the most).
fn phase_tap(c: &ConvDims, k: &str) -> String {
    let ([kh, kw], [sh, sw]) = (c.k, c.stride);
    let (tw, taps) = (kw.div_ceil(sw), kh.div_ceil(sh) * kw.div_ceil(sw));
    format!(
        "let co = {k} / {taps}u;\n                \
         let tt = {k} % {taps}u;\n                \
         let kh_ = a_kh0 + (tt / {tw}u) * {sh}u;\n                \
         let kw_ = a_kw0 + (tt % {tw}u) * {sw}u;"
    )
}

/// A of the phased input gradient: the weights of the phase's taps. Its `pre` decodes the
/// workgroup's group into the conv group `a_g` and the phase (`a_rh`, `a_rw`), its first taps,
/// and whether any tap reaches it — from the group alone, so uniform, as the K loop bound must
/// be; B and the epilogue use them.
fn phase_weights(c: &ConvDims, w: &Operand) -> Loader {
    let ([kh, kw], [sh, sw], [ph, pw]) = (c.k, c.stride, c.padding);
    let (cin_g, cout_g, kk, phases) = (c.cin_g(), c.cout_g(), kh * kw, sh * sw);
    Loader {
        k_fast: true,
        pre: format!(
            "let a_g = g / {phases}u;
    let a_rh = (g % {phases}u) / {sw}u;
    let a_rw = g % {sw}u;
    let a_kh0 = (a_rh + {ph}u) % {sh}u;
    let a_kw0 = (a_rw + {pw}u) % {sw}u;
    let a_live = a_kh0 < {kh}u && a_kw0 < {kw}u;"
        ),
        body: format!(
            "{tap}
                if (kh_ < {kh}u && kw_ < {kw}u) {{
                    {wv}
                }}",
            tap = phase_tap(c, "k"),
            wv = fetch(
                w,
                &format!(
                    "((a_g * {cout_g}u + co) * {cin_g}u + m0 + r) * {kk}u + kh_ * {kw}u + kw_"
                )
            ),
        ),
        operand: w.clone(),
    }
}

/// B of the phased input gradient: the dy each tap of the phase came from, for the phase's
/// input positions.
fn phase_dy(c: &ConvDims, dy: &Operand) -> Loader {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw]) = (c.stride, c.padding);
    let (cout, cout_g, l) = (c.cout, c.cout_g(), oh * ow);
    let (qh, qw) = (h.div_ceil(sh), wd.div_ceil(sw));
    Loader {
        k_fast: false,
        pre: format!(
            "let bn = n0 + fb;
    let bq = bn % {pq}u;
    let b_ih = (bq / {qw}u) * {sh}u + a_rh;
    let b_iw = (bq % {qw}u) * {sw}u + a_rw;
    let b_in = b_ih < {h}u && b_iw < {wd}u;
    let bdy = ((bn / {pq}u) * {cout}u + a_g * {cout_g}u) * {l}u;",
            pq = qh * qw,
        ),
        body: format!(
            "{tap}
                let ty = i32(b_ih) + {ph} - i32(kh_);
                let tx = i32(b_iw) + {pw} - i32(kw_);
                if (b_in && kh_ < {kh}u && kw_ < {kw}u && ty >= 0 && tx >= 0) {{
                    let y = u32(ty) / {sh}u;
                    let x = u32(tx) / {sw}u;
                    if (y < {oh}u && x < {ow}u) {{
                        {dyv}
                    }}
                }}",
            tap = phase_tap(c, "k"),
            dyv = fetch(dy, &format!("bdy + co * {l}u + y * {ow}u + x")),
        ),
        operand: dy.clone(),
    }
}

/// The weight gradient as a GEMM per group: M = output channels, N = input channels × taps,
/// K = samples × output positions — a long reduction, which the tile chooser splits across
/// the workgroup's invocations when there are few tiles. Both operands are contiguous along K
/// (dy by output position, the im2col of x by pixel), so both stage along K. With `splits`
/// above 1, K is also cut across workgroups into that many ranges (`Gemm::split_depth`, see
/// `split_depth`), each range's gradient stored apart: `out` is `[splits, ..w]`.
pub(super) fn conv_grad_weight_tiled(
    c: &ConvDims,
    x: &Operand,
    dy: &Operand,
    out: &Operand,
    target: Target,
    splits: usize,
) -> Option<KernelSource> {
    let ([h, wd], [kh, kw], [oh, ow]) = (c.inp, c.k, c.out);
    let ([sh, sw], [ph, pw], [dh, dw]) = (c.stride, c.padding, c.dilation);
    let (cin, cout, cin_g, cout_g) = (c.cin, c.cout, c.cin_g(), c.cout_g());
    let (hw, l, kk) = (h * wd, oh * ow, kh * kw);
    let k = c.n * l;
    let split_depth = (splits > 1).then(|| split_depth(k, splits));
    let gm = Gemm { groups: c.g, m: cout_g, n: cin_g * kk, k, k_end: None, split_depth };
    let a = Loader {
        k_fast: true,
        pre: String::new(),
        body: fetch(
            dy,
            &format!("((k / {l}u) * {cout}u + g * {cout_g}u + m0 + r) * {l}u + k % {l}u"),
        ),
        operand: dy.clone(),
    };
    let b = Loader {
        k_fast: true,
        pre: String::new(),
        body: format!(
            "let p = k % {l}u;
                let col = n0 + r;
                let t = col % {kk}u;
                let ih = i32((p / {ow}u) * {sh}u + (t / {kw}u) * {dh}u) - {ph};
                let iw = i32((p % {ow}u) * {sw}u + (t % {kw}u) * {dw}u) - {pw};
                if (ih >= 0 && ih < {h} && iw >= 0 && iw < {wd}) {{
                    {xv}
                }}",
            xv = fetch(
                x,
                &format!(
                    "((k / {l}u) * {cin}u + g * {cin_g}u + col / {kk}u) * {hw}u + \
                     u32(ih) * {wd}u + u32(iw)"
                )
            ),
        ),
        operand: x.clone(),
    };
    let range = range(c.cout * cin_g * kk, splits);
    let epilogue = store(out, &format!("{range}(g * {cout_g}u + m) * {}u + n", gm.n), "acc");
    implicit_gemm(&gm, &a, &b, &epilogue, target)
}

/// With a K split, where range `sp`'s slice of `[splits, ..out]` starts (`each` elements per
/// slice), as a prefix of the epilogue's index.
fn range(each: usize, splits: usize) -> String {
    if splits > 1 {
        format!("sp * {each}u + ")
    } else {
        String::new()
    }
}

/// The depth of each of `splits` ranges of a K this long, as the split weight gradient's
/// kernel cuts it (and the CPU reference of its partial sums): a multiple of every tile's
/// `bk`. `k.div_ceil(depth)` ranges are non-empty, at most `splits`.
pub(crate) fn split_depth(k: usize, splits: usize) -> usize {
    k.div_ceil(splits.max(1)).div_ceil(super::gemm::SPLIT_ALIGN) * super::gemm::SPLIT_ALIGN
}
