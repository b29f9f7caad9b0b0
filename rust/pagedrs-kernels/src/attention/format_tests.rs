//! Tests of the CPU attention kernels over every KV cache format: each variant
//! against dense attention over the values the entries hold, batch
//! invariance (a sequence alone and in a batch give the same bits), and the
//! layout of the entries `write_kv` stores.

use super::cache::{write_kv, CacheShape};
use super::convert::{bf16_to_f32, f32_to_bf16};
use super::format::{Bf16, Fp8E4m3, Fp8E5m2, KvElem, Q8};
use super::paged_decode::{DecodeJob, DecodeOptions};
use super::tests::{check_variants_with, Layer};

fn every_variant<E: KvElem>() {
    let sinks = [0.5, -1.0, 2.0, 0.0, 3.0, -0.25];
    for head_dim in [8, 64, 128] {
        for block_size in [1, 16] {
            let lens = [1, 3, block_size as i32 + 2, 2 * block_size as i32 + 1, 37];
            for options in [
                DecodeOptions::default(),
                DecodeOptions {
                    sliding_window: Some(6),
                    softcap: Some(1.5),
                    sinks: Some(&sinks[..]),
                },
            ] {
                for bf16_query in [false, true] {
                    check_variants_with::<E>(head_dim, block_size, &lens, options, bf16_query);
                }
            }
        }
    }
}

#[test]
fn every_format_and_variant_matches_dense_attention() {
    every_variant::<f32>();
    every_variant::<Bf16>();
    every_variant::<Q8>();
    every_variant::<Fp8E4m3>();
    every_variant::<Fp8E5m2>();
}

/// Each sequence of a batch alone (its own table row and length) gives the
/// bits it gets in the batch, on a 3-thread pool.
fn batch_invariant<E: KvElem>(bf16_query: bool) {
    let (hkv, hq, d, bs) = (2, 8, 64, 16);
    let lens = [1i32, 17, 40, 5, 64, 33];
    let width = 4;
    let shape = CacheShape {
        num_blocks: lens.len() * width,
        num_kv_heads: hkv,
        block_size: bs,
        head_dim: d,
    };
    let n = shape.num_blocks * hkv * bs * d;
    let kc: Vec<f32> = (0..n).map(|i| (i as f32 * 0.013).sin()).collect();
    let vc: Vec<f32> = (0..n).map(|i| (i as f32 * 0.007).cos()).collect();
    let layer = Layer::<E>::new(&kc, &vc, d);
    let tables: Vec<i32> = (0..lens.len() * width)
        .map(|i| ((i * 5 + 1) % shape.num_blocks) as i32)
        .collect();
    let mut q: Vec<f32> = (0..lens.len() * hq * d)
        .map(|i| (i as f32 * 0.29).sin())
        .collect();
    if bf16_query {
        q.iter_mut().for_each(|x| *x = bf16_to_f32(f32_to_bf16(*x)));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let run = |q: &[f32], tables: &[i32], lens: &[i32]| {
        let mut job = DecodeJob::new(
            q,
            &layer.key,
            &layer.value,
            shape,
            tables,
            width,
            lens,
            0.125,
        )
        .with_options(DecodeOptions::default());
        if bf16_query {
            job = job.with_bf16_query();
        }
        let mut out = vec![0.0f32; q.len()];
        pool.install(|| job.run_on_rayon(&mut out));
        out
    };
    let batch = run(&q, &tables, &lens);
    let per = hq * d;
    for s in 0..lens.len() {
        let alone = run(
            &q[s * per..(s + 1) * per],
            &tables[s * width..(s + 1) * width],
            &lens[s..s + 1],
        );
        let same = alone
            .iter()
            .zip(&batch[s * per..(s + 1) * per])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{} seq {s}: alone != in the batch", E::NAME);
    }
}

#[test]
fn a_sequence_alone_and_in_a_batch_gives_the_same_bits() {
    for bf16_query in [false, true] {
        batch_invariant::<f32>(bf16_query);
        batch_invariant::<Bf16>(bf16_query);
        batch_invariant::<Q8>(bf16_query);
        batch_invariant::<Fp8E4m3>(bf16_query);
        batch_invariant::<Fp8E5m2>(bf16_query);
    }
}

#[test]
fn int8_entries_hold_values_and_their_scale() {
    let d = 4;
    let shape = CacheShape {
        num_blocks: 2,
        num_kv_heads: 1,
        block_size: 2,
        head_dim: d,
    };
    let e = Q8::entry_size(d);
    assert_eq!(e, 6);
    let mut kc = vec![Q8(0); shape.len_of::<Q8>()];
    let mut vc = vec![Q8(0); shape.len_of::<Q8>()];
    let key = [1.0, -2.54, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0];
    let value = [3.0, 2.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0];
    write_kv(&key, &value, &mut kc, &mut vc, shape, &[3, 0]);
    // Slot 3: block 1, offset 1; the scale bf16(2.54 / 127) in its last bytes.
    let entry = &kc[3 * e..4 * e];
    let scale = bf16_to_f32(f32_to_bf16(2.54 / 127.0));
    assert_eq!(Q8::scale(entry, d), scale);
    assert_eq!(entry[1], Q8(-127));
    for (x, q) in key[..d].iter().zip(&entry[..d]) {
        assert!((x - q.0 as f32 * scale).abs() <= scale / 2.0 + 1e-7);
    }
    // An all-zero row: scale 0 and zero values.
    assert!(kc[..e].iter().all(|&q| q == Q8(0)));
    assert_eq!(
        vc[3 * e + 3],
        Q8((-1.0f32 / bf16_to_f32(f32_to_bf16(3.0 / 127.0))).round() as i8)
    );
}

#[test]
fn bfloat16_input_writes_what_its_float32_widening_writes() {
    let shape = CacheShape {
        num_blocks: 2,
        num_kv_heads: 2,
        block_size: 2,
        head_dim: 8,
    };
    let k32: Vec<f32> = (0..32)
        .map(|i| bf16_to_f32(f32_to_bf16(i as f32 * 0.77 - 9.0)))
        .collect();
    let k16: Vec<Bf16> = k32.iter().map(|&x| Bf16(f32_to_bf16(x))).collect();
    let slots = [2, 1];
    let (mut a, mut b) = (
        vec![Q8(0); shape.len_of::<Q8>()],
        vec![Q8(0); shape.len_of::<Q8>()],
    );
    let (mut c, mut e) = (a.clone(), b.clone());
    write_kv(&k32, &k32, &mut a, &mut b, shape, &slots);
    write_kv(&k16, &k16, &mut c, &mut e, shape, &slots);
    assert_eq!((a, b), (c, e));
    let (mut a, mut b) = (vec![Bf16(0); shape.len_of::<Bf16>()], vec![Bf16(0); 64]);
    write_kv(&k16, &k16, &mut a, &mut b, shape, &slots);
    // Slot 2: block 1 (32 elements a block), offset 0; token 0, head 0.
    assert_eq!(&a[32..40], &k16[..8]);
}

#[test]
fn bfloat16_queries_over_bfloat16_caches_take_avx512_bf16_where_the_cpu_has_it() {
    let names = |v: Vec<(&'static str, super::kernel::AttendFn<Bf16>)>| -> Vec<&'static str> {
        v.into_iter().map(|(n, _)| n).collect()
    };
    let with = names(super::kernel::variants::<Bf16>(64, true));
    assert!(!names(super::kernel::variants::<Bf16>(64, false)).contains(&"avx512_bf16"));
    assert!(!names(super::kernel::variants::<Bf16>(24, true)).contains(&"avx512_bf16"));
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx512_bf16() {
        assert_eq!(with[0], "avx512_bf16");
    }
    assert_eq!(with.last(), Some(&"portable"));
}

/// Every token of two prompts (lengths 37 and 20, queries in order) gives
/// the same bits run in tiles of consecutive tokens as run one query at a
/// time, for `hkv` KV heads of `group` query heads each.
fn tiles_match_single_queries<E: KvElem>(
    bf16_query: bool,
    (hkv, group, d, bs): (usize, usize, usize, usize),
    options: DecodeOptions,
) {
    let prompts = [37usize, 20];
    let width = 37usize.div_ceil(bs);
    let shape = CacheShape {
        num_blocks: prompts.len() * width,
        num_kv_heads: hkv,
        block_size: bs,
        head_dim: d,
    };
    let n = shape.num_blocks * hkv * bs * d;
    let kc: Vec<f32> = (0..n).map(|i| (i as f32 * 0.017).sin()).collect();
    let vc: Vec<f32> = (0..n).map(|i| (i as f32 * 0.011).cos()).collect();
    let layer = Layer::<E>::new(&kc, &vc, d);
    let tables: Vec<i32> = (0..prompts.len() * width)
        .map(|i| ((i * 7 + 3) % shape.num_blocks) as i32)
        .collect();
    let (mut rows, mut lens) = (Vec::new(), Vec::new());
    for (s, &len) in prompts.iter().enumerate() {
        for t in 0..len {
            rows.push(s as i32);
            lens.push(t as i32 + 1);
        }
    }
    let hq = hkv * group;
    let mut q: Vec<f32> = (0..rows.len() * hq * d)
        .map(|i| (i as f32 * 0.31).sin())
        .collect();
    if bf16_query {
        q.iter_mut().for_each(|x| *x = bf16_to_f32(f32_to_bf16(*x)));
    }
    let tiles = super::tile::query_tiles(&rows, &lens);
    assert!(tiles.len() < rows.len(), "the prompts form tiles");
    let run = |tiled: bool| {
        let mut job = DecodeJob::new(
            &q,
            &layer.key,
            &layer.value,
            shape,
            &tables,
            width,
            &lens,
            0.125,
        )
        .with_options(options)
        .with_query_rows(&rows);
        if tiled {
            job = job.with_tiles(&tiles);
        }
        if bf16_query {
            job = job.with_bf16_query();
        }
        let mut out = vec![0.0f32; q.len()];
        job.run_on_rayon(&mut out);
        out
    };
    let (tiled, single) = (run(true), run(false));
    let same = tiled
        .iter()
        .zip(&single)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        same,
        "{} bf16_query={bf16_query} hkv={hkv} group={group} d={d} bs={bs}: tiles differ",
        E::NAME
    );
}

#[test]
fn prefill_tiles_give_each_token_its_single_query_bits() {
    let sinks = [
        0.5f32, -1.0, 2.0, 0.0, 3.0, -0.25, 1.0, 0.25, -2.0, 0.75, 1.5, -0.5,
    ];
    for dims in [
        (3, 3, 64, 16),
        (2, 4, 64, 8),
        (2, 6, 64, 16),
        (2, 2, 128, 16),
        (1, 1, 64, 32),
    ] {
        let heads = dims.0 * dims.1;
        for options in [
            DecodeOptions::default(),
            DecodeOptions {
                sliding_window: Some(11),
                softcap: Some(1.5),
                sinks: Some(&sinks[..heads]),
            },
        ] {
            for bf16_query in [false, true] {
                tiles_match_single_queries::<f32>(bf16_query, dims, options);
                tiles_match_single_queries::<Bf16>(bf16_query, dims, options);
                tiles_match_single_queries::<Q8>(bf16_query, dims, options);
                tiles_match_single_queries::<Fp8E4m3>(bf16_query, dims, options);
            }
        }
    }
}

#[test]
fn int8_caches_take_the_integer_kernel_where_the_cpu_has_it() {
    let names = |v: Vec<(&'static str, super::kernel::AttendFn<Q8>)>| -> Vec<&'static str> {
        v.into_iter().map(|(n, _)| n).collect()
    };
    for bf16_query in [false, true] {
        let found = names(super::kernel::variants::<Q8>(64, bf16_query));
        #[cfg(target_arch = "x86_64")]
        if super::avx512_int8::detected() {
            assert_eq!(found[0], "avx512_vnni");
            assert!(super::kernel::tile_variant::<Q8>(128, bf16_query).is_some());
        }
        assert!(!names(super::kernel::variants::<Q8>(24, bf16_query)).contains(&"avx512_vnni"));
        assert_eq!(found.last(), Some(&"portable"));
    }
    let bf16: Vec<&str> = super::kernel::variants::<Bf16>(64, true)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(!bf16.contains(&"avx512_vnni"));
}

/// Every variant's tile kernel gives each query of a tile (consecutive
/// positions of one 37-token prompt, `group` query heads on one KV head) the
/// bits its single-query kernel gives it: the portable and AVX2 variants,
/// and group sizes whose outputs do not fit in registers, included.
fn variant_tiles_match_single_queries<E: KvElem>(
    (d, bs, group): (usize, usize, usize),
    options: DecodeOptions,
    bf16_query: bool,
) {
    use super::cache::{Caches, HeadQuery};
    use super::tile::{Tile, TileOut, MAX_TILE};
    let len = 37usize;
    let shape = CacheShape {
        num_blocks: len.div_ceil(bs),
        num_kv_heads: 1,
        block_size: bs,
        head_dim: d,
    };
    let n = shape.num_blocks * bs * d;
    let kc: Vec<f32> = (0..n).map(|i| (i as f32 * 0.017).sin()).collect();
    let vc: Vec<f32> = (0..n).map(|i| (i as f32 * 0.011).cos()).collect();
    let layer = Layer::<E>::new(&kc, &vc, d);
    let table: Vec<i32> = (0..shape.num_blocks as i32).rev().collect();
    let mut q: Vec<f32> = (0..len * group * d)
        .map(|i| (i as f32 * 0.31).sin())
        .collect();
    if bf16_query {
        q.iter_mut().for_each(|x| *x = bf16_to_f32(f32_to_bf16(*x)));
    }
    let caches = Caches::new(&layer.key[..], &layer.value[..], shape);
    let item = group * d;
    let query = |t: usize| HeadQuery {
        q: &q[t * item..(t + 1) * item],
        table: &table,
        seq_len: t + 1,
        kv_head: 0,
        scale: 0.125,
        start: options
            .sliding_window
            .map_or(0, |w| (t + 1).saturating_sub(w)),
        softcap: options.softcap.unwrap_or(0.0),
        sinks: options.sinks.map_or(&[][..], |s| &s[..group]),
    };
    for variant in super::kernel::compiled::<E>(d, bf16_query) {
        let (mut single, mut tiled) = (vec![0.0f32; q.len()], vec![0.0f32; q.len()]);
        let mut scratch = Vec::new();
        for (t, o) in single.chunks_exact_mut(item).enumerate() {
            (variant.single)(query(t), caches, o, &mut scratch);
        }
        for first in (0..len).step_by(MAX_TILE) {
            let queries: Vec<HeadQuery> = (first..len.min(first + MAX_TILE)).map(query).collect();
            let out = TileOut {
                base: tiled[first * item..].as_mut_ptr(),
                stride: item,
                len: item,
            };
            // SAFETY: `variant` runs on this CPU; query `i`'s output is row
            // `first + i` of `tiled`.
            let tile = Tile {
                queries: &queries,
                caches,
                out,
            };
            unsafe { (variant.tile)(tile, &mut scratch) };
        }
        let same = tiled
            .iter()
            .zip(&single)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let name = variant.name;
        assert!(
            same,
            "{} {name} d={d} bs={bs} group={group}: tiles differ",
            E::NAME
        );
    }
}

#[test]
fn every_variant_runs_tiles_in_its_single_query_bits() {
    let sinks = [0.5f32, -1.0, 2.0, 0.0, 3.0, -0.25];
    for dims in [
        (8, 4, 2),
        (64, 16, 3),
        (64, 1, 6),
        (128, 16, 2),
        (128, 8, 3),
    ] {
        for options in [
            DecodeOptions::default(),
            DecodeOptions {
                sliding_window: Some(11),
                softcap: Some(1.5),
                sinks: Some(&sinks[..dims.2]),
            },
        ] {
            for bf16_query in [false, true] {
                variant_tiles_match_single_queries::<f32>(dims, options, bf16_query);
                variant_tiles_match_single_queries::<Bf16>(dims, options, bf16_query);
                variant_tiles_match_single_queries::<Q8>(dims, options, bf16_query);
                variant_tiles_match_single_queries::<Fp8E5m2>(dims, options, bf16_query);
            }
        }
    }
}
