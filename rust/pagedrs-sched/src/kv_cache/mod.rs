//! KV cache manager layer (ARCHITECTURE.md): block pool, free block queue, block
//! tables, KV cache groups, block hashes for prefix caching, allocation,
//! sharing, sliding-window release and swapping.

pub mod block;
pub mod block_hash;
pub mod block_pool;
pub mod block_table;
pub mod events;
pub mod free_queue;
pub mod group;
pub mod manager;
pub mod prefix_cache;

pub use block::{blocks_for, BlockId};
pub use block_hash::{extend_block_hashes, hash_extra_keys, BlockHash};
pub use block_pool::BlockPool;
pub use block_table::{BlockTable, NULL_BLOCK};
pub use events::{KvEvent, KvEventLog};
pub use group::KvCacheGroupSpec;
pub use manager::{BlockCopy, KvCacheManager};
pub use prefix_cache::CachedPrefix;
