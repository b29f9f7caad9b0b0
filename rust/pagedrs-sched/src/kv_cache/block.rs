//! A physical KV block: its id in a block pool, and how many blocks hold a
//! number of token states.

/// Index of a physical block in the device (or CPU) block pool.
pub type BlockId = u32;

/// Number of blocks needed to hold `num_tokens` token states.
#[inline]
pub fn blocks_for(num_tokens: usize, block_size: usize) -> usize {
    num_tokens.div_ceil(block_size)
}
