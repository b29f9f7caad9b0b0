//! The free block queue: a doubly linked list over block ids.
//!
//! Blocks are taken from the head and returned to the tail, so the free blocks
//! that still hold a cached prefix are evicted least recently used first. A
//! prefix-cache hit removes a free block from the middle in O(1).

use super::block::BlockId;

const NIL: BlockId = BlockId::MAX;

/// Intrusive doubly linked list of free block ids.
#[derive(Debug, Clone)]
pub struct FreeQueue {
    prev: Vec<BlockId>,
    next: Vec<BlockId>,
    linked: Vec<bool>,
    head: BlockId,
    tail: BlockId,
    len: usize,
}

impl FreeQueue {
    /// A queue holding every block `0..num_blocks` in order.
    pub fn new(num_blocks: usize) -> Self {
        let n = num_blocks as BlockId;
        let mut q = Self {
            prev: (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect(),
            next: (0..n)
                .map(|i| if i + 1 == n { NIL } else { i + 1 })
                .collect(),
            linked: vec![true; num_blocks],
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            len: num_blocks,
        };
        if n == 0 {
            q.linked.clear();
        }
        q
    }

    /// Number of queued blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no block is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Take the head (least recently freed) block.
    pub fn pop_front(&mut self) -> Option<BlockId> {
        if self.head == NIL {
            return None;
        }
        let b = self.head;
        self.remove(b);
        Some(b)
    }

    /// Append `block` at the tail.
    ///
    /// # Panics
    /// If the block is already queued.
    pub fn push_back(&mut self, block: BlockId) {
        let i = block as usize;
        assert!(!self.linked[i], "block {block} is already free");
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.next[self.tail as usize] = block;
        }
        self.tail = block;
        self.linked[i] = true;
        self.len += 1;
    }

    /// Unlink `block` from wherever it is in the queue.
    ///
    /// # Panics
    /// If the block is not queued.
    pub fn remove(&mut self, block: BlockId) {
        let i = block as usize;
        assert!(self.linked[i], "block {block} is not in the free queue");
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.linked[i] = false;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_middle_removal() {
        let mut q = FreeQueue::new(4);
        q.remove(2);
        assert_eq!(q.pop_front(), Some(0));
        q.push_back(0);
        assert_eq!(q.len(), 3);
        let order: Vec<_> = std::iter::from_fn(|| q.pop_front()).collect();
        assert_eq!(order, vec![1, 3, 0]);
        assert!(q.is_empty());
        q.push_back(2);
        assert_eq!(q.pop_front(), Some(2));
    }
}
