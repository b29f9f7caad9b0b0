//! KV cache manager layer (ARCHITECTURE.md): block pool, free block queue, block
//! tables, block hashes for prefix caching, allocation, sharing and swapping.

pub mod block_hash;
pub mod block_pool;
pub mod block_table;
pub mod free_queue;
pub mod manager;

pub use block_hash::{extend_block_hashes, BlockHash};
pub use block_pool::{BlockId, BlockPool};
pub use block_table::BlockTable;
pub use manager::{blocks_for, BlockCopy, KvCacheManager};
