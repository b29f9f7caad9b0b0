//! Gathered low-rank products of multi-LoRA serving (Punica's SGMV, S-LoRA's
//! batched LoRA): the tokens of one step, each with its own adapter slot (or
//! none), get `out[t] += scaling[l] * B_l (A_l x[t])` beside the base
//! projection that wrote `out`.
//!
//! Tokens are taken in segments: the tokens of one slot, wherever they sit
//! in the step (a decode step's sequences of one adapter need not be
//! neighbours), cut into blocks of at most `MAX_SEGMENT_ROWS`, so each
//! adapter's matrices are read once per block, not once per token. A block
//! gathers its activation rows, shrinks (`h = x A_l^T`, `[rows, rank_l]`),
//! expands (`h B_l^T`, `[rows, N]`), scales and adds to its tokens' rows of
//! `out`. Both products are the dense kernel's tiles
//! (`crate::dense`: 8 float32 lanes of fused multiply-adds in one fixed
//! order, the same bits in every variant), so a token's result depends on
//! its own row and adapter alone: the same alone, in any batch, in any
//! segment cut or thread count (batch-invariant).
//!
//! Slots hold adapters of different ranks in one stack: slot `l` of `A`
//! (`[L, R, K]`) holds `A_l` `[rank_l, K]` in its first `rank_l * K` floats,
//! slot `l` of `B` (`[L, N, R]`) holds `B_l` `[N, rank_l]` in its first
//! `N * rank_l` floats; `R` is `max_lora_rank`. A token computes only its
//! adapter's rank.

mod sgmv;
#[cfg(test)]
mod tests;

pub use crate::dense::VARIANTS;
pub use sgmv::{lora_add, LoraArgs, MAX_SEGMENT_ROWS};
