//! KV cache manager layer (DESIGN.md): block pool, block tables, allocation.

pub mod block_pool;
pub mod block_table;
pub mod manager;

pub use block_pool::{BlockId, BlockPool};
pub use block_table::BlockTable;
pub use manager::{blocks_for, KvCacheManager};
