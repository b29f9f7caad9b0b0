//! Prefix-cache events as Python objects (`KVCacheEvent`), and the block hash
//! function routers use to name a request's blocks as the engine does.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use pagedrs_sched::kv_cache::{extend_block_hashes, hash_extra_keys, BlockHash, KvEvent};

/// One change to the device pool's prefix cache, drained by
/// `Scheduler.take_kv_events()`.
///
/// `kind` is "stored" (full blocks became cached: `block_hashes` in chain
/// order, the first following `parent_block_hash`, None for a sequence's
/// first block; `token_ids` the blocks' tokens, `block_size` per block),
/// "removed" (cached blocks were evicted: `block_hashes`; `parent_block_hash`
/// None, `token_ids` empty) or "all_cleared" (every cached block dropped;
/// no hashes). Hashes are the 32-byte SHA-256 block hashes of
/// `block_hashes()`. `group` is the KV cache group whose blocks changed (0
/// for every model of one attention type).
#[pyclass(frozen, module = "pagedrs._core", name = "KVCacheEvent")]
pub struct PyKVCacheEvent {
    /// "stored", "removed" or "all_cleared".
    #[pyo3(get)]
    kind: &'static str,
    /// KV cache group index.
    #[pyo3(get)]
    group: u32,
    hashes: Vec<BlockHash>,
    parent: Option<BlockHash>,
    /// Token ids of the stored blocks (`len(block_hashes) * block_size`).
    #[pyo3(get)]
    token_ids: Vec<u32>,
    /// Tokens per block.
    #[pyo3(get)]
    block_size: usize,
    /// The LoRA adapter id (`lora_int_id`) of the stored blocks' sequence;
    /// None for the base model and for other kinds.
    #[pyo3(get)]
    lora_id: Option<u64>,
}

impl PyKVCacheEvent {
    /// The Python form of `event` in a pool of `block_size`-token blocks.
    pub fn new(event: KvEvent, block_size: usize) -> Self {
        let (kind, group, hashes, parent, token_ids, lora_id) = match event {
            KvEvent::Stored {
                group,
                block_hashes,
                parent_block_hash,
                token_ids,
                lora_id,
            } => (
                "stored",
                group,
                block_hashes,
                parent_block_hash,
                token_ids,
                lora_id,
            ),
            KvEvent::Removed {
                group,
                block_hashes,
            } => ("removed", group, block_hashes, None, Vec::new(), None),
            KvEvent::AllCleared => ("all_cleared", 0, Vec::new(), None, Vec::new(), None),
        };
        Self {
            kind,
            group,
            hashes,
            parent,
            token_ids,
            block_size,
            lora_id,
        }
    }
}

#[pymethods]
impl PyKVCacheEvent {
    /// The 32-byte SHA-256 hashes of the blocks, in chain order.
    #[getter]
    fn block_hashes<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.hashes.iter().map(|h| PyBytes::new(py, h)).collect()
    }

    /// Hash of the block before the first stored one (None: none, or not
    /// a "stored" event).
    #[getter]
    fn parent_block_hash<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.parent.as_ref().map(|h| PyBytes::new(py, h))
    }

    fn __repr__(&self) -> String {
        format!(
            "KVCacheEvent(kind={:?}, group={}, blocks={}, tokens={}, block_size={})",
            self.kind,
            self.group,
            self.hashes.len(),
            self.token_ids.len(),
            self.block_size
        )
    }
}

/// The block hashes the engine names a request's full blocks by: SHA-256
/// chained over the token ids (little-endian u32) and, in the first block,
/// the UTF-8 cache salt and the LoRA adapter (`lora_id` > 0: the byte 0xFF
/// and the id as 8 little-endian bytes). Only full blocks are hashed.
///
/// Args:
///     token_ids: the request's token ids (prompt, then any outputs).
///     block_size: tokens per block (the engine's `block_size`).
///     cache_salt: the request's cache salt, or None.
///     lora_id: the request's `LoRARequest.lora_int_id`, 0 for the base model.
/// Returns:
///     one 32-byte hash per full block, `len(token_ids) // block_size`.
/// Raises:
///     ValueError: block_size is 0.
///     OverflowError: a token id outside [0, 2**32).
#[pyfunction]
#[pyo3(signature = (token_ids, block_size, cache_salt = None, lora_id = 0))]
pub fn block_hashes<'py>(
    py: Python<'py>,
    token_ids: Vec<u32>,
    block_size: usize,
    cache_salt: Option<&str>,
    lora_id: u64,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be positive"));
    }
    let mut hashes = Vec::new();
    let extra = hash_extra_keys(cache_salt.unwrap_or("").as_bytes(), lora_id);
    py.detach(|| extend_block_hashes(&mut hashes, &token_ids, block_size, &extra));
    Ok(hashes.iter().map(|h| PyBytes::new(py, h)).collect())
}
