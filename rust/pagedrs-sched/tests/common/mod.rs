//! Helpers shared by the scheduler's integration tests: configurations,
//! requests, a step driver, and the invariant checks (pool consistency, no
//! write into a shared block, every block free when idle).

#![allow(dead_code)]

use pagedrs_sched::kv_cache::{blocks_for, extend_block_hashes, KvCacheGroupSpec, NULL_BLOCK};
use pagedrs_sched::scheduler::{
    AllocationPolicyKind, Finished, PreemptionMode, Request, SamplingConfig, Scheduler,
    SchedulerConfig, SchedulingPolicy, Status, StepBatch, StopConfig,
};

/// A paged configuration of `num_blocks` blocks of `block_size` tokens.
pub fn config(num_blocks: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_blocks,
        num_cpu_blocks: 0,
        block_size,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        // Capped so the pool holds one sequence of max_model_len tokens.
        max_model_len: 256.min(num_blocks * block_size),
        enable_chunked_prefill: true,
        enable_prefix_caching: false,
        preemption_mode: PreemptionMode::Recompute,
        allocation_policy: AllocationPolicyKind::Paged,
        kv_cache_groups: vec![KvCacheGroupSpec::FULL],
        scheduling_policy: SchedulingPolicy::Fcfs,
        speculative_config: None,
    }
}

/// Request `id` with a prompt of `prompt_len` distinct tokens.
pub fn request(id: u64, prompt_len: usize, max_tokens: usize) -> Request {
    request_with(
        id,
        (0..prompt_len as u32).map(|t| t + 10).collect(),
        max_tokens,
    )
}

/// Request `id` with prompt `token_ids`; token 2 stops it.
pub fn request_with(id: u64, token_ids: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(
        id,
        token_ids,
        SamplingConfig::default(),
        StopConfig {
            max_tokens,
            min_tokens: 0,
            stop_token_ids: vec![2],
        },
    )
}

/// Run one step sampling token `tok` for every row; return finished ids.
pub fn step(s: &mut Scheduler, tok: u32) -> Vec<u64> {
    s.schedule();
    let rows = s.num_sampled_tokens();
    s.update(&vec![tok; rows])
        .into_iter()
        .map(|f| f.id)
        .collect()
}

/// Every block's ref count equals the number of block tables holding it (in
/// the device pool, and in the CPU pool for swapped requests); free counts
/// match; no two running requests will write one block in the next step.
pub fn assert_pool_consistent(s: &Scheduler) {
    for cpu in [false, true] {
        let pool = if cpu {
            s.kv().cpu_pool()
        } else {
            s.kv().pool()
        };
        let mut counts = vec![0u32; pool.num_total()];
        for r in s.requests() {
            if (r.status == Status::Swapped) == cpu {
                for t in &r.block_tables {
                    for &b in t.live() {
                        counts[b as usize] += 1;
                    }
                }
            }
        }
        for (b, &c) in counts.iter().enumerate() {
            assert_eq!(
                pool.ref_count(b as u32),
                c,
                "ref count of block {b} (cpu: {cpu})"
            );
        }
        let used = counts.iter().filter(|&&c| c > 0).count();
        assert_eq!(
            pool.num_free() + used,
            pool.num_total(),
            "no leak (cpu: {cpu})"
        );
    }
}

/// After `schedule()`: each block written this step belongs to one request.
pub fn assert_no_shared_writes(s: &Scheduler) {
    let bs = s.config().block_size;
    let mut writer = std::collections::HashMap::new();
    for &(id, n) in s.scheduled() {
        let r = s.request(id).unwrap();
        for t in &r.block_tables {
            for pos in r.num_computed_tokens..r.num_computed_tokens + n {
                let block = t.blocks()[pos / bs];
                assert_ne!(block, NULL_BLOCK, "write behind the window");
                assert_eq!(
                    s.kv().pool().ref_count(block),
                    1,
                    "write into shared block {block}"
                );
                assert_eq!(*writer.entry(block).or_insert(id), id);
            }
        }
    }
}

/// With no live request, every device and CPU block is free.
pub fn assert_idle_frees_all(s: &Scheduler) {
    if s.is_idle() {
        let (pool, cpu) = (s.kv().pool(), s.kv().cpu_pool());
        assert_eq!(
            pool.num_free(),
            pool.num_total(),
            "idle: device blocks in use"
        );
        assert_eq!(cpu.num_free(), cpu.num_total(), "idle: CPU blocks in use");
    }
}

/// Each resident or swapped request holds, in every KV cache group, exactly
/// the blocks some query from its next token on can see: a full group every
/// block of its computed tokens, a sliding-window group those from the first
/// block its next query sees (nothing released that a query still sees,
/// nothing held that none will). Queued requests hold nothing.
pub fn assert_window_held(s: &Scheduler) {
    let bs = s.config().block_size;
    for r in s.requests() {
        for (g, t) in s.kv().groups().iter().zip(&r.block_tables) {
            if r.status == Status::Waiting {
                assert_eq!(t.len(), 0, "request {} is queued", r.id);
                continue;
            }
            let skip = g.num_skippable(r.num_computed_tokens, bs);
            assert_eq!(
                t.num_skipped(),
                skip,
                "request {} ({} computed) in group {g:?}",
                r.id,
                r.num_computed_tokens
            );
            assert!(t.len() >= blocks_for(r.num_computed_tokens, bs));
            assert!(t.live().iter().all(|&b| b != NULL_BLOCK));
        }
    }
}

/// The invariants that hold between any two calls: pool consistency, the
/// window held, and every block free when idle.
pub fn assert_invariants(s: &Scheduler) {
    assert_pool_consistent(s);
    assert_window_held(s);
    assert_idle_frees_all(s);
}

/// One step sampling `token` for every row, checking every invariant after
/// `schedule()` (including no shared writes) and after `update()`. Returns
/// the finished ids.
pub fn checked_step(s: &mut Scheduler, tok: u32) -> Vec<u64> {
    s.schedule();
    assert_no_shared_writes(s);
    assert_invariants(s);
    let rows = s.num_sampled_tokens();
    let finished = s
        .update(&vec![tok; rows])
        .into_iter()
        .map(|f| f.id)
        .collect();
    assert_invariants(s);
    finished
}

/// A scheduler of `slots` one-token blocks under `policy`.
pub fn reserving(policy: AllocationPolicyKind, slots: usize, max_model_len: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 4096,
        max_model_len,
        allocation_policy: policy,
        enable_prefix_caching: true, // forced off by a reserving policy
        ..config(slots, 1)
    })
    .unwrap()
}

/// Request `id` without stop tokens, with output length hint `expected`.
pub fn hinted(id: u64, prompt_len: usize, max_tokens: usize, expected: Option<usize>) -> Request {
    let mut r = request(id, prompt_len, max_tokens);
    r.stop.stop_token_ids.clear();
    r.expected_output_len = expected;
    r
}

/// Each running request's blocks are one contiguous run.
pub fn assert_contiguous(s: &Scheduler) {
    for r in s.requests().filter(|r| r.status == Status::Running) {
        let b = r.block_tables[0].blocks();
        assert!(
            b.windows(2).all(|w| w[1] == w[0] + 1),
            "request {} holds a non-contiguous reservation {b:?}",
            r.id
        );
    }
}

/// The rows of the step in flight: (request id, num_samples, drafts), in
/// the order `update()` takes them.
pub fn sampled_rows(s: &Scheduler) -> Vec<(u64, usize, Vec<u32>)> {
    let b = StepBatch::build(s);
    let mut at = 0;
    b.sample_request_ids
        .iter()
        .zip(&b.num_samples)
        .zip(&b.num_draft_tokens)
        .map(|((&id, &n), &d)| {
            let drafts = b.draft_token_ids[at..at + d as usize]
                .iter()
                .map(|&t| t as u32)
                .collect();
            at += d as usize;
            (id, n as usize, drafts)
        })
        .collect()
}

/// Apply the step in flight with `choose(scheduler, id, row, drafts)`
/// giving each row's accepted count (at most its drafts) and the token after
/// the accepted drafts (every sequence of a group's first sample gets that
/// token).
pub fn update_with(
    s: &mut Scheduler,
    mut choose: impl FnMut(&Scheduler, u64, usize, &[u32]) -> (usize, u32),
) -> Vec<Finished> {
    let (mut sampled, mut accepted) = (Vec::new(), Vec::new());
    for (row, (id, n, drafts)) in sampled_rows(s).into_iter().enumerate() {
        let (a, token) = choose(s, id, row, &drafts);
        let a = a.min(drafts.len());
        sampled.extend_from_slice(&drafts[..a]);
        sampled.extend(std::iter::repeat_n(token, n));
        accepted.push(a);
    }
    s.update_accepted(&sampled, Some(&accepted)).unwrap()
}

/// Between steps, no sequence holds a slot past its verified tokens (the
/// pending one included): rejected drafts gave theirs back.
pub fn assert_no_draft_slots_held(s: &Scheduler) {
    let bs = s.config().block_size;
    for r in s.requests().filter(|r| r.status == Status::Running) {
        assert!(r.draft_tokens.is_empty(), "request {} keeps drafts", r.id);
        for t in &r.block_tables {
            assert!(
                t.len() <= blocks_for(r.num_tokens(), bs),
                "request {} ({} tokens) holds {} blocks",
                r.id,
                r.num_tokens(),
                t.len()
            );
        }
    }
}

/// Only verified tokens are hashed: each request's block hashes are the
/// chained hashes of its full blocks of `token_ids` (never a draft), the
/// blocks it registered are computed, and every cached block it holds is
/// cached under its own hash of that block.
pub fn assert_hashes_verified(s: &Scheduler) {
    if !s.kv().prefix_caching() {
        return;
    }
    let bs = s.config().block_size;
    for r in s.requests() {
        let mut want = Vec::new();
        extend_block_hashes(&mut want, &r.token_ids, bs, &r.cache_salt);
        assert!(
            r.block_hashes.len() <= want.len()
                && r.block_hashes[..] == want[..r.block_hashes.len()],
            "request {}: block hashes over unverified tokens",
            r.id
        );
        if r.status != Status::Running {
            continue;
        }
        assert!(r.num_cached_blocks * bs <= r.num_computed_tokens);
        for (g, t) in r.block_tables.iter().enumerate() {
            for (i, &b) in t.blocks().iter().enumerate().skip(t.num_skipped()) {
                if let Some((group, hash)) = s.kv().pool().cached_key(b) {
                    assert_eq!(group, g as u32);
                    assert_eq!(Some(&hash), want.get(i), "request {} block {i}", r.id);
                    assert!(
                        (i + 1) * bs <= r.num_computed_tokens,
                        "cached block {i} not computed"
                    );
                }
            }
        }
    }
}

/// One step with speculation: `choose` as in [`update_with`], every
/// invariant checked after `schedule()` and after `update()`.
pub fn checked_spec_step(
    s: &mut Scheduler,
    choose: impl FnMut(&Scheduler, u64, usize, &[u32]) -> (usize, u32),
) -> Vec<Finished> {
    s.schedule();
    assert_no_shared_writes(s);
    assert_invariants(s);
    let finished = update_with(s, choose);
    assert_invariants(s);
    assert_no_draft_slots_held(s);
    assert_hashes_verified(s);
    finished
}

/// The "target model" of the speculation tests: the next token is a function
/// of the last two, so its rollouts soon cycle; 2 (the stop token) after two
/// equal tokens.
pub fn target(ctx: &[u32]) -> u32 {
    let n = ctx.len();
    let (a, b) = (ctx[n - 2], ctx[n - 1]);
    if a == b {
        2
    } else {
        (a * 5 + b * 3 + 1) % 13 + 3
    }
}

/// Accept what [`target`] would produce: the drafts it agrees with, then
/// its own token (a `choose` of [`update_with`]).
pub fn verify(s: &Scheduler, id: u64, _row: usize, drafts: &[u32]) -> (usize, u32) {
    let mut ctx = s.request(id).unwrap().token_ids.clone();
    let mut a = 0;
    while a < drafts.len() && target(&ctx) == drafts[a] {
        ctx.push(drafts[a]);
        a += 1;
    }
    (a, target(&ctx))
}

/// A scheduler over [`config`]`(num_blocks, block_size)` with prefix caching on.
pub fn prefix_cached(num_blocks: usize, block_size: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        enable_prefix_caching: true,
        ..config(num_blocks, block_size)
    })
    .unwrap()
}

/// Add the next `per_step` requests of `pending` (the ones arriving this
/// step); false when the scheduler is idle and none are left to arrive.
pub fn arrive(
    s: &mut Scheduler,
    pending: &mut impl ExactSizeIterator<Item = Request>,
    per_step: usize,
) -> bool {
    for r in pending.by_ref().take(per_step) {
        s.add(r).unwrap();
    }
    !(s.is_idle() && pending.len() == 0)
}
