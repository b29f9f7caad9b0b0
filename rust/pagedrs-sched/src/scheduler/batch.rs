//! The step's flat arrays handed to the model executor (ARCHITECTURE.md: never one
//! object per token or per block).

use super::scheduler::Scheduler;
use crate::kv_cache::NULL_BLOCK;

/// Block tables and slot mapping of one KV cache group.
///
/// `T` = scheduled tokens, `S` = scheduled sequences, `B` = the group's
/// widest block table in the step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupBatch {
    /// `[T]` KV cache slot (`block * block_size + offset`) for each token.
    pub slot_mapping: Vec<i64>,
    /// `[S, B]` physical block ids, row-major, padded with 0; blocks released
    /// behind a sliding window are 0 too (no query of the step sees them).
    pub block_tables: Vec<i32>,
    /// `B`, the block table width.
    pub max_blocks: usize,
}

/// Flat input of one model step.
///
/// `T` = scheduled tokens, `S` = scheduled sequences, `R` = sampled rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepBatch {
    /// `[T]` token ids to run.
    pub input_ids: Vec<i64>,
    /// `[T]` absolute positions of those tokens.
    pub positions: Vec<i64>,
    /// `[S + 1]` offsets of each sequence's tokens in `input_ids`.
    pub query_start_loc: Vec<i32>,
    /// `[S]` request id of each scheduled sequence.
    pub seq_request_ids: Vec<u64>,
    /// `[S]` LoRA adapter id of each scheduled sequence (0: the base model).
    pub seq_lora_ids: Vec<u64>,
    /// `[S]` context length (cached + new tokens) of each sequence after the step.
    pub seq_lens: Vec<i32>,
    /// One entry per KV cache group, in the scheduler's group order.
    pub groups: Vec<GroupBatch>,
    /// `[R]` index into the `T` tokens whose logits are sampled: the row's
    /// last scheduled token (its last draft token when it has drafts).
    pub logits_indices: Vec<i64>,
    /// `[R]` request id of each sampled row.
    pub sample_request_ids: Vec<u64>,
    /// `[R]` temperature (0 = greedy).
    pub temperature: Vec<f32>,
    /// `[R]` top-p.
    pub top_p: Vec<f32>,
    /// `[R]` top-k (-1 = off).
    pub top_k: Vec<i32>,
    /// `[R]` per-request seed (-1 = none).
    pub seed: Vec<i64>,
    /// `[R]` tokens generated so far by each sampled request.
    pub num_output_tokens: Vec<i64>,
    /// `[R]` tokens to sample from each row (n > 1 at a group's first sample).
    pub num_samples: Vec<i32>,
    /// `[R]` draft tokens of each row (speculative decoding; 0 without):
    /// the last `num_draft_tokens[r]` tokens of its sequence's chunk.
    pub num_draft_tokens: Vec<i32>,
    /// `[D = sum(num_draft_tokens)]` the draft tokens, row by row.
    pub draft_token_ids: Vec<i64>,
    /// `[R + D]` per row, the indices into the `T` tokens of its pending
    /// token and each of its drafts (`num_draft_tokens[r] + 1` consecutive
    /// tokens ending at `logits_indices[r]`): the logits at the j-th verify
    /// draft j + 1, the last give the token after the drafts. Equal to
    /// `logits_indices` without drafts.
    pub spec_logits_indices: Vec<i64>,
}

impl StepBatch {
    /// Build the arrays of the scheduler's last `schedule()`.
    pub fn build(sched: &Scheduler) -> Self {
        let bs = sched.config().block_size;
        let scheduled = sched.scheduled();
        let num_tokens: usize = scheduled.iter().map(|&(_, n)| n).sum();
        let num_groups = sched.kv().groups().len();
        let reqs: Vec<_> = scheduled
            .iter()
            .map(|(id, _)| sched.request(*id).expect("scheduled"))
            .collect();
        let mut b = StepBatch {
            input_ids: Vec::with_capacity(num_tokens),
            positions: Vec::with_capacity(num_tokens),
            query_start_loc: Vec::with_capacity(scheduled.len() + 1),
            seq_lens: Vec::with_capacity(scheduled.len()),
            groups: (0..num_groups)
                .map(|g| {
                    let max_blocks = reqs
                        .iter()
                        .map(|r| r.block_tables[g].len())
                        .max()
                        .unwrap_or(0);
                    GroupBatch {
                        slot_mapping: Vec::with_capacity(num_tokens),
                        block_tables: vec![0; scheduled.len() * max_blocks],
                        max_blocks,
                    }
                })
                .collect(),
            ..Default::default()
        };
        b.query_start_loc.push(0);
        for (row, (&(id, n), req)) in scheduled.iter().zip(&reqs).enumerate() {
            let start = req.num_computed_tokens;
            let end = start + n;
            let drafts = &req.draft_tokens;
            for pos in start..end {
                let token = match req.token_ids.get(pos) {
                    Some(&t) => t,
                    None => drafts[pos - req.num_tokens()],
                };
                b.input_ids.push(token as i64);
                b.positions.push(pos as i64);
            }
            for (group, table) in b.groups.iter_mut().zip(&req.block_tables) {
                for pos in start..end {
                    group.slot_mapping.push(table.slot(pos, bs));
                }
                let w = group.max_blocks;
                let blocks = table.blocks();
                let dst = &mut group.block_tables[row * w..row * w + blocks.len()];
                for (d, &blk) in dst.iter_mut().zip(blocks) {
                    *d = if blk == NULL_BLOCK { 0 } else { blk as i32 };
                }
            }
            b.query_start_loc.push(b.input_ids.len() as i32);
            b.seq_lens.push(end as i32);
            b.seq_request_ids.push(id);
            b.seq_lora_ids.push(req.lora_id);
            if end == req.num_tokens() + drafts.len() {
                let last = b.input_ids.len() as i64 - 1;
                let d = drafts.len() as i64;
                b.num_draft_tokens.push(d as i32);
                b.draft_token_ids.extend(drafts.iter().map(|&t| t as i64));
                b.spec_logits_indices.extend(last - d..=last);
                b.logits_indices.push(last);
                b.sample_request_ids.push(id);
                b.temperature.push(req.sampling.temperature);
                b.top_p.push(req.sampling.top_p);
                b.top_k.push(req.sampling.top_k);
                b.seed.push(req.sampling.seed);
                b.num_output_tokens.push(req.num_output_tokens() as i64);
                b.num_samples.push(req.num_samples() as i32);
            }
        }
        b
    }
}
