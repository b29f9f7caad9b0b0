//! A mixture-of-experts layer's routed experts over quantized expert stacks,
//! one call per layer and step (`run_experts`).
//!
//! A GGUF MoE layer stores its experts as three stacks (llama.cpp's
//! `ffn_gate_exps` / `ffn_up_exps` `[E, I, H]` and `ffn_down_exps`
//! `[E, H, I]`); expert `e`'s gate and up are rows `e * I .. (e + 1) * I` of
//! the first two, its down rows `e * H .. (e + 1) * H` of the third
//! (`ExpertStacks::expert`). A step's `T` tokens each name `k` experts and
//! their routing weights. The call:
//! 1. quantizes the `T` hidden rows once (`QuantActs`, per row) and groups
//!    the `T * k` (token, expert) slots by expert, ascending, each expert's
//!    slots in token order;
//! 2. runs gate and up of every hit expert over its rows as one parallel
//!    loop (`run_projections`: each expert's weights read once for all its
//!    tokens; its row count picks the few-rows or panel path as in
//!    `run_projection`, except that rows up to `max_passes` few-rows tiles
//!    run as that many passes of few-rows tiles);
//! 3. `h = silu(gate) * up` (`silu`: torch's CPU `silu` bit for bit), each
//!    row quantized once;
//! 4. down for every hit expert, again one parallel loop;
//! 5. per token, `out = 0.0 + y_e1 * w_1 + y_e2 * w_2 + ...` over its experts
//!    in ascending expert id, each product and sum rounded to float32.
//!
//! Each output's operations are those of one `run_projection` call per
//! expert and projection followed by the same element-wise float32 math,
//! so the result does not depend on the other tokens of the step, the
//! thread count or the kernel variant.

use std::ops::Range;

use super::act::{ActQuant, QuantActs};
use super::driver::{run_projections, Part, Projection};
use super::format::{Layout, QuantWeight};
use super::kernel;
use crate::attention::omp;
use crate::cpu_features::Variant;

/// The three quantized expert stacks of one MoE layer.
#[derive(Clone, Copy, Debug)]
pub struct ExpertStacks<'a> {
    /// `[E * I, H]`.
    pub gate: QuantWeight<'a>,
    /// `[E * I, H]`.
    pub up: QuantWeight<'a>,
    /// `[E * H, I]`.
    pub down: QuantWeight<'a>,
    /// `E`.
    pub num_experts: usize,
}

impl<'a> ExpertStacks<'a> {
    /// The stacks, or the reason their shapes do not split into
    /// `num_experts` experts (`gate`, `up` `[E * I, H]`, `down` `[E * H, I]`).
    pub fn new(
        gate: QuantWeight<'a>,
        up: QuantWeight<'a>,
        down: QuantWeight<'a>,
        num_experts: usize,
    ) -> Result<Self, String> {
        let e = num_experts;
        if e == 0
            || gate.n != up.n
            || gate.k != up.k
            || !gate.n.is_multiple_of(e)
            || down.n != e * gate.k
            || down.k * e != gate.n
        {
            return Err(format!(
                "expert stacks gate [{}, {}], up [{}, {}], down [{}, {}] are not \
                 [{e} * I, H], [{e} * I, H], [{e} * H, I]",
                gate.n, gate.k, up.n, up.k, down.n, down.k
            ));
        }
        Ok(Self {
            gate,
            up,
            down,
            num_experts,
        })
    }

    /// `H`.
    pub fn hidden(&self) -> usize {
        self.gate.k
    }

    /// `I`.
    pub fn intermediate(&self) -> usize {
        self.down.k
    }

    /// Expert `e`'s `(gate, up, down)` weights: views of the stacks' rows.
    pub fn expert(&self, e: usize) -> (QuantWeight<'a>, QuantWeight<'a>, QuantWeight<'a>) {
        let (h, i) = (self.hidden(), self.intermediate());
        (
            rows(&self.gate, e * i..(e + 1) * i),
            rows(&self.up, e * i..(e + 1) * i),
            rows(&self.down, e * h..(e + 1) * h),
        )
    }
}

/// Rows `r` of `w` (the file's rows layout: expert stacks are not
/// repacked).
fn rows<'a>(w: &QuantWeight<'a>, r: Range<usize>) -> QuantWeight<'a> {
    assert_eq!(w.layout, Layout::Rows, "rows of a panel weight");
    let b = w.qtype.row_bytes(w.k);
    let scales = if w.scales.is_empty() {
        w.scales
    } else {
        &w.scales[r.clone()]
    };
    QuantWeight {
        qtype: w.qtype,
        n: r.len(),
        k: w.k,
        data: &w.data[r.start * b..r.end * b],
        scales,
        layout: Layout::Rows,
    }
}

/// The output buffer shared by parallel work that writes disjoint cells.
struct Shared(*mut f32);
// SAFETY: every user writes cells no other work item writes, of a buffer
// borrowed mutably for the whole parallel loop.
unsafe impl Sync for Shared {}

/// `out = sum_j weights[t, j] * expert_{ids[t, j]}(x[t])` per token `t`,
/// the experts SwiGLU (`down(silu(gate x) * up x)`); the order of the
/// operations is the module docs'.
///
/// Args: `x` float32 `[T, H]`; `ids` `[T, top_k]` expert ids; `weights`
/// float32 `[T, top_k]` routing weights; `out` float32 `[T, H]`
/// (overwritten); activations quantized as `scheme`; in `variant` on
/// `threads` threads (torch's OpenMP team, rayon's pool without one).
///
/// Errors: sizes that do not match, or an expert id outside `0..E`.
#[allow(clippy::too_many_arguments)]
pub fn run_experts(
    stacks: &ExpertStacks,
    x: &[f32],
    top_k: usize,
    ids: &[i64],
    weights: &[f32],
    out: &mut [f32],
    scheme: ActQuant,
    variant: Variant,
    threads: usize,
) -> Result<(), String> {
    let (e, h, inter) = (stacks.num_experts, stacks.hidden(), stacks.intermediate());
    if top_k == 0 || !x.len().is_multiple_of(h) {
        return Err(format!("x of {} values is not [T, {h}]", x.len()));
    }
    let t = x.len() / h;
    if ids.len() != t * top_k || weights.len() != t * top_k || out.len() != t * h {
        return Err(format!(
            "ids ({}), weights ({}) and out ({}) values are not [{t}, {top_k}], \
             [{t}, {top_k}], [{t}, {h}]",
            ids.len(),
            weights.len(),
            out.len()
        ));
    }
    if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i as usize >= e) {
        return Err(format!("expert id {bad} outside 0..{e}"));
    }
    // Slots (t * top_k + j) grouped by expert, ascending; each expert's in
    // slot order (a counting sort, stable).
    let mut start = vec![0usize; e + 1];
    for &i in ids {
        start[i as usize + 1] += 1;
    }
    for i in 0..e {
        start[i + 1] += start[i];
    }
    let mut next = start.clone();
    let mut slots = vec![0usize; ids.len()];
    for (s, &i) in ids.iter().enumerate() {
        slots[next[i as usize]] = s;
        next[i as usize] += 1;
    }
    let n = slots.len();
    let tokens: Vec<usize> = slots.iter().map(|s| s / top_k).collect();
    let hit: Vec<usize> = (0..e).filter(|&i| start[i + 1] > start[i]).collect();
    let weights_of: Vec<_> = hit.iter().map(|&i| stacks.expert(i)).collect();

    // Gate and up: `[n, 2I]`, row `r` slot `slots[r]`'s token.
    let acts = QuantActs::from_f32(scheme, t, h, x).gather(&tokens);
    let mut gate_up = vec![0.0f32; n * 2 * inter];
    let gu_parts: Vec<[Part; 2]> = weights_of
        .iter()
        .map(|(g, u, _)| {
            [
                Part { weight: *g, col: 0 },
                Part {
                    weight: *u,
                    col: inter,
                },
            ]
        })
        .collect();
    {
        let mut projections = Vec::with_capacity(hit.len());
        let mut rest = gate_up.as_mut_slice();
        for (parts, &i) in gu_parts.iter().zip(&hit) {
            let rows = start[i]..start[i + 1];
            rest = push_passes(
                &mut projections,
                parts,
                &acts,
                rows,
                rest,
                2 * inter,
                variant,
            );
        }
        run_projections(&mut projections, variant, threads);
    }

    // h = silu(gate) * up, `[n, I]`.
    let mut act = vec![0.0f32; n * inter];
    {
        let base = Shared(act.as_mut_ptr());
        let (base, gate_up) = (&base, &gate_up);
        let run = |r: usize| {
            let gu = &gate_up[r * 2 * inter..(r + 1) * 2 * inter];
            // SAFETY: row `r` of `act` (`[n, I]`) is written by this item only.
            let o = unsafe { std::slice::from_raw_parts_mut(base.0.add(r * inter), inter) };
            silu_mul(&gu[..inter], &gu[inter..], o);
        };
        if !omp::parallel_for(threads, n, &run) {
            use rayon::prelude::*;
            (0..n).into_par_iter().for_each(run);
        }
    }
    let acts = QuantActs::from_f32(scheme, n, inter, &act);
    drop(act);

    // Down: `[n, H]`.
    let mut down = vec![0.0f32; n * h];
    let down_parts: Vec<[Part; 1]> = weights_of
        .iter()
        .map(|(_, _, d)| [Part { weight: *d, col: 0 }])
        .collect();
    {
        let mut projections = Vec::with_capacity(hit.len());
        let mut rest = down.as_mut_slice();
        for (parts, &i) in down_parts.iter().zip(&hit) {
            let rows = start[i]..start[i + 1];
            rest = push_passes(&mut projections, parts, &acts, rows, rest, h, variant);
        }
        run_projections(&mut projections, variant, threads);
    }

    // Each token's rows in ascending expert id (the slots' order).
    let mut of_token = vec![Vec::with_capacity(top_k); t];
    for (r, &s) in slots.iter().enumerate() {
        of_token[s / top_k].push((r, weights[s]));
    }
    let base = Shared(out.as_mut_ptr());
    let (base, down, of_token) = (&base, &down, &of_token);
    let run = |tok: usize| {
        // SAFETY: row `tok` of `out` (`[T, H]`) is written by this item only.
        let o = unsafe { std::slice::from_raw_parts_mut(base.0.add(tok * h), h) };
        o.fill(0.0);
        for &(r, w) in &of_token[tok] {
            for (o, &y) in o.iter_mut().zip(&down[r * h..(r + 1) * h]) {
                *o += y * w;
            }
        }
    };
    if !omp::parallel_for(threads, t, &run) {
        use rayon::prelude::*;
        (0..t).into_par_iter().for_each(run);
    }
    Ok(())
}

/// The most few-rows passes an expert's rows are split into before they run
/// the many-rows path as one, per activation quantization. Measured on a
/// Qwen3-30B-A3B-shaped layer of 32 experts at 16 tokens (AMD EPYC Zen 5,
/// one thread): int16, 2 passes (Q4_K gate/up up to 6 rows, Q6_K down up
/// to 4) ran in 0.75x the panels' time, more passes gained less and 8 ran
/// slower; int8's panels (`vpdpbusd`) beat the passes (1.6x faster).
fn max_passes(scheme: ActQuant) -> usize {
    match scheme {
        ActQuant::Int16 => 2,
        ActQuant::Int8 => 1,
    }
}

/// Pushes the projections of one expert's `rows` of `acts` over `parts`,
/// their outputs the first `rows.len() * ld` values of `out`; returns the
/// rest of `out`. Rows that the many-rows path would run, up to
/// `max_passes` times the parts' few-rows tile, run as passes of few-rows
/// tiles instead (each pass reads the expert's weights again, from cache
/// when the item's weights fit).
fn push_passes<'p, 'w>(
    projections: &mut Vec<Projection<'p, 'w>>,
    parts: &'p [Part<'w>],
    acts: &'p QuantActs,
    rows: Range<usize>,
    out: &'p mut [f32],
    ld: usize,
    variant: Variant,
) -> &'p mut [f32] {
    let few = parts
        .iter()
        .map(|p| kernel::few_rows(variant, p.weight.qtype))
        .min()
        .unwrap_or(usize::MAX);
    let n = rows.len();
    let step = if n > few && n <= few.saturating_mul(max_passes(acts.scheme)) {
        few
    } else {
        n.max(1)
    };
    let mut rest = out;
    for first in rows.clone().step_by(step) {
        let pass = first..(first + step).min(rows.end);
        let (mine, tail) = rest.split_at_mut(pass.len() * ld);
        rest = tail;
        projections.push(Projection {
            parts,
            acts,
            rows: pass,
            out: mine,
            ld,
        });
    }
    rest
}

/// `o = silu(g) * u` element-wise, `silu(x) = x / (1 + exp(-x))` with
/// `exp` SLEEF's `expf_u10` (`sleef_expf`): torch's CPU `silu` of float32
/// (its vectorized kernel) bit for bit, in AVX2 where the CPU runs it (the
/// same bits).
///
/// Panics if the slices' lengths differ.
pub fn silu_mul(g: &[f32], u: &[f32], o: &mut [f32]) {
    assert!(g.len() == u.len() && u.len() == o.len(), "silu_mul sizes");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2_fma() {
        // SAFETY: the CPU runs AVX2 and FMA; the slices have one length.
        done = unsafe { avx2::silu_mul(g, u, o) };
    }
    for i in done..o.len() {
        o[i] = silu(g[i]) * u[i];
    }
}

/// `x / (1 + sleef_expf(-x))`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + sleef_expf(-x))
}

/// SLEEF's `expf_u10` (the algorithm of its vector versions, which torch's
/// `Vectorized<float>::exp` calls): `q = round(d / ln 2)`, a two-part
/// reduction `s = d - q ln 2`, a degree-6 polynomial in fused
/// multiply-adds, scaled by `2^q` in two steps; 0 below -104, infinity
/// above 100.
#[inline(always)]
pub fn sleef_expf(d: f32) -> f32 {
    let q = (d * R_LN2).round_ties_even();
    if d.is_nan() {
        return d;
    }
    if d < -104.0 {
        return 0.0;
    }
    if d > 100.0 {
        return f32::INFINITY;
    }
    let s = q.mul_add(-L2U, d);
    let s = q.mul_add(-L2L, s);
    let mut u = P[0];
    for &c in &P[1..] {
        u = u.mul_add(s, c);
    }
    let u = 1.0 + (s * s).mul_add(u, s);
    let q = q as i32;
    u * pow2i(q >> 1) * pow2i(q - (q >> 1))
}

/// `1 / ln 2`.
const R_LN2: f32 = std::f32::consts::LOG2_E;
/// `ln 2`'s upper part (exact in a few bits, so that `q * L2U` is exact).
const L2U: f32 = 0.693_145_75_f32;
/// `ln 2 - L2U`.
const L2L: f32 = 1.428_606_8e-6_f32;
/// The polynomial's coefficients, highest degree first.
const P: [f32; 6] = [
    0.000_198_527_62,
    0.001_393_043_6,
    0.008_333_361,
    0.041_666_485,
    0.166_666_67,
    0.5,
];

/// `2^q` for `q` in `-126..=127`.
#[inline(always)]
fn pow2i(q: i32) -> f32 {
    f32::from_bits(((q + 0x7f) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{L2L, L2U, P, R_LN2};
    use std::arch::x86_64::*;

    /// `super::silu_mul` over the whole 8-value groups of the slices; the
    /// number of values done.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul(g: &[f32], u: &[f32], o: &mut [f32]) -> usize {
        let n = o.len() / 8 * 8;
        for i in (0..n).step_by(8) {
            let x = _mm256_loadu_ps(g.as_ptr().add(i));
            let up = _mm256_loadu_ps(u.as_ptr().add(i));
            let e = expf(_mm256_sub_ps(_mm256_setzero_ps(), x));
            let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(o.as_mut_ptr().add(i), _mm256_mul_ps(s, up));
        }
        n
    }

    /// `super::sleef_expf` of 8 values.
    #[inline(always)]
    unsafe fn expf(d: __m256) -> __m256 {
        let q = _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(d, _mm256_set1_ps(R_LN2))));
        let qf = _mm256_cvtepi32_ps(q);
        let s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-L2U), d);
        let s = _mm256_fmadd_ps(qf, _mm256_set1_ps(-L2L), s);
        let mut u = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            u = _mm256_fmadd_ps(u, s, _mm256_set1_ps(c));
        }
        let u = _mm256_add_ps(
            _mm256_set1_ps(1.0),
            _mm256_fmadd_ps(_mm256_mul_ps(s, s), u, s),
        );
        let half = _mm256_srai_epi32::<1>(q);
        let u = _mm256_mul_ps(
            _mm256_mul_ps(u, pow2i(half)),
            pow2i(_mm256_sub_epi32(q, half)),
        );
        let low = _mm256_cmp_ps::<_CMP_LT_OQ>(d, _mm256_set1_ps(-104.0));
        let u = _mm256_andnot_ps(low, u);
        let high = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_set1_ps(100.0), d);
        let u = _mm256_blendv_ps(u, _mm256_set1_ps(f32::INFINITY), high);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(d, d);
        _mm256_blendv_ps(u, d, nan)
    }

    /// `2^q` per lane.
    #[inline(always)]
    unsafe fn pow2i(q: __m256i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            q,
            _mm256_set1_epi32(0x7f),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::driver::run_projection;
    use crate::quant::format::QuantType;
    use crate::quant::kernel::VARIANTS;
    use crate::quant::random::random_weight;
    use crate::test_data::Rng;

    /// The per-expert loop the module replaces: for each hit expert in
    /// ascending id, its tokens' rows quantized, gate/up by one
    /// `run_projection`, `silu(gate) * up` element by element, down by
    /// another, then `out[t] += y * w` per row.
    fn per_expert(
        s: &ExpertStacks,
        x: &[f32],
        top_k: usize,
        ids: &[i64],
        weights: &[f32],
        scheme: ActQuant,
    ) -> Vec<f32> {
        let (h, inter) = (s.hidden(), s.intermediate());
        let t = x.len() / h;
        let mut out = vec![0.0f32; t * h];
        for e in 0..s.num_experts {
            let hits: Vec<(usize, f32)> = (0..t * top_k)
                .filter(|&i| ids[i] as usize == e)
                .map(|i| (i / top_k, weights[i]))
                .collect();
            if hits.is_empty() {
                continue;
            }
            let xs: Vec<f32> = hits
                .iter()
                .flat_map(|&(tok, _)| x[tok * h..(tok + 1) * h].iter().copied())
                .collect();
            let (g, u, d) = s.expert(e);
            let acts = QuantActs::from_f32(scheme, hits.len(), h, &xs);
            let mut gu = vec![0.0f32; hits.len() * 2 * inter];
            let parts = [
                Part { weight: g, col: 0 },
                Part {
                    weight: u,
                    col: inter,
                },
            ];
            run_projection(&parts, &acts, &mut gu, 2 * inter, Variant::Portable, 1);
            let mut a = vec![0.0f32; hits.len() * inter];
            for r in 0..hits.len() {
                for i in 0..inter {
                    let gv = gu[r * 2 * inter + i];
                    a[r * inter + i] = gv / (1.0 + sleef_expf(-gv)) * gu[r * 2 * inter + inter + i];
                }
            }
            let acts = QuantActs::from_f32(scheme, hits.len(), inter, &a);
            let mut y = vec![0.0f32; hits.len() * h];
            run_projection(
                &[Part { weight: d, col: 0 }],
                &acts,
                &mut y,
                h,
                Variant::Portable,
                1,
            );
            for (r, &(tok, w)) in hits.iter().enumerate() {
                for j in 0..h {
                    out[tok * h + j] += y[r * h + j] * w;
                }
            }
        }
        out
    }

    struct Case {
        gate: (Vec<u8>, Vec<f32>),
        up: (Vec<u8>, Vec<f32>),
        down: (Vec<u8>, Vec<f32>),
        types: [QuantType; 3],
        e: usize,
        h: usize,
        inter: usize,
    }

    impl Case {
        fn new(types: [QuantType; 3], e: usize, h: usize, inter: usize, rng: &mut Rng) -> Self {
            Case {
                gate: random_weight(types[0], e * inter, h, rng),
                up: random_weight(types[1], e * inter, h, rng),
                down: random_weight(types[2], e * h, inter, rng),
                types,
                e,
                h,
                inter,
            }
        }

        fn stacks(&self) -> ExpertStacks<'_> {
            let (e, h, i) = (self.e, self.h, self.inter);
            fn w(t: QuantType, n: usize, k: usize, b: &(Vec<u8>, Vec<f32>)) -> QuantWeight<'_> {
                QuantWeight::new(t, n, k, &b.0, &b.1).unwrap()
            }
            let [tg, tu, td] = self.types;
            ExpertStacks::new(
                w(tg, e * i, h, &self.gate),
                w(tu, e * i, h, &self.up),
                w(td, e * h, i, &self.down),
                e,
            )
            .unwrap()
        }
    }

    /// `t` tokens' random distinct top-k ids and positive weights.
    fn routing(t: usize, e: usize, top_k: usize, rng: &mut Rng) -> (Vec<i64>, Vec<f32>) {
        let mut ids = Vec::new();
        for _ in 0..t {
            let mut mine: Vec<i64> = Vec::new();
            while mine.len() < top_k {
                let i = (rng.next() % e as u64) as i64;
                if !mine.contains(&i) {
                    mine.push(i);
                }
            }
            ids.extend(mine);
        }
        let weights = (0..t * top_k).map(|_| rng.uniform().abs() + 0.01).collect();
        (ids, weights)
    }

    #[test]
    fn experts_match_the_per_expert_loop_bit_for_bit() {
        let mut rng = Rng(7);
        let cases = [
            [QuantType::Q4K, QuantType::Q4K, QuantType::Q6K],
            [QuantType::Q4_0, QuantType::Q8_0, QuantType::Q5_1],
            [QuantType::Int8, QuantType::Int8, QuantType::Int8],
        ];
        for types in cases {
            let case = Case::new(types, 8, 256, 256, &mut rng);
            let s = case.stacks();
            for scheme in [ActQuant::Int16, ActQuant::Int8] {
                for t in [1usize, 3, 16, 40] {
                    let x: Vec<f32> = (0..t * 256).map(|_| rng.uniform()).collect();
                    let (ids, w) = routing(t, 8, 3, &mut rng);
                    let want = per_expert(&s, &x, 3, &ids, &w, scheme);
                    for variant in VARIANTS.available() {
                        for threads in [1, 3] {
                            let mut out = vec![f32::NAN; t * 256];
                            run_experts(&s, &x, 3, &ids, &w, &mut out, scheme, variant, threads)
                                .unwrap();
                            let same = out
                                .iter()
                                .zip(&want)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{types:?} {scheme:?} t={t} {variant:?} x{threads}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_token_alone_and_in_a_batch_gives_the_same_bits() {
        let mut rng = Rng(11);
        let case = Case::new(
            [QuantType::Q4K, QuantType::Q4K, QuantType::Q6K],
            16,
            256,
            256,
            &mut rng,
        );
        let s = case.stacks();
        let t = 16;
        let x: Vec<f32> = (0..t * 256).map(|_| rng.uniform()).collect();
        let (ids, w) = routing(t, 16, 4, &mut rng);
        let variant = VARIANTS.best();
        let mut all = vec![0.0f32; t * 256];
        run_experts(&s, &x, 4, &ids, &w, &mut all, ActQuant::Int16, variant, 2).unwrap();
        for tok in 0..t {
            let mut one = vec![0.0f32; 256];
            let (xs, is, ws) = (
                &x[tok * 256..][..256],
                &ids[tok * 4..][..4],
                &w[tok * 4..][..4],
            );
            run_experts(&s, xs, 4, is, ws, &mut one, ActQuant::Int16, variant, 1).unwrap();
            assert!(one
                .iter()
                .zip(&all[tok * 256..])
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn bad_ids_and_sizes_are_errors() {
        let mut rng = Rng(3);
        let case = Case::new([QuantType::Q8_0; 3], 4, 64, 32, &mut rng);
        let s = case.stacks();
        let x = vec![0.5f32; 2 * 64];
        let mut out = vec![0.0f32; 2 * 64];
        let v = Variant::Portable;
        let err = run_experts(
            &s,
            &x,
            1,
            &[0, 4],
            &[1.0, 1.0],
            &mut out,
            ActQuant::Int16,
            v,
            1,
        );
        assert!(err.unwrap_err().contains("expert id 4"));
        let err = run_experts(
            &s,
            &x,
            2,
            &[0, 1],
            &[1.0, 1.0],
            &mut out,
            ActQuant::Int16,
            v,
            1,
        );
        assert!(err.is_err());
        assert!(ExpertStacks::new(s.gate, s.up, s.gate, 4).is_err());
    }

    #[test]
    fn silu_vector_and_scalar_agree() {
        let mut rng = Rng(5);
        let mut g: Vec<f32> = (0..4096).map(|_| rng.uniform() * 30.0).collect();
        g.extend([
            0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 103.9, -103.9, 104.5, -104.5, 150.0,
        ]);
        g.extend([
            -150.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e30,
            -1e30,
            f32::MIN_POSITIVE,
        ]);
        let u: Vec<f32> = (0..g.len()).map(|_| rng.uniform()).collect();
        let mut o = vec![0.0f32; g.len()];
        silu_mul(&g, &u, &mut o);
        for i in 0..g.len() {
            let want = silu(g[i]) * u[i];
            assert!(
                o[i].to_bits() == want.to_bits() || (o[i].is_nan() && want.is_nan()),
                "{}",
                g[i]
            );
        }
        assert_eq!(sleef_expf(0.0), 1.0);
        assert_eq!(sleef_expf(-200.0), 0.0);
        assert_eq!(sleef_expf(200.0), f32::INFINITY);
    }
}
