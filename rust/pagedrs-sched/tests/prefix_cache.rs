//! Prefix caching: cached blocks reused across requests, shared prefixes
//! allocated once, cache salts separating tenants.

mod common;

use common::*;

#[test]
fn prefix_cache_reuses_blocks_and_skips_prefill() {
    let mut s = prefix_cached(32, 4);
    let prompt: Vec<u32> = (100..110).collect(); // 10 tokens: 2 full blocks + 2
    s.add(request_with(1, prompt.clone(), 1)).unwrap();
    assert_eq!(s.schedule(), &[(1, 10)]);
    s.update(&[5]);
    assert_eq!(s.kv().pool().num_cached(), 2);
    // Same prompt again: 8 tokens cached, only 2 computed.
    s.add(request_with(2, prompt.clone(), 1)).unwrap();
    assert_eq!(s.schedule(), &[(2, 2)]);
    assert_eq!(s.stats().prefix_cache_hits, 8);
    assert_eq!(s.stats().prefix_cache_queries, 20);
    s.update(&[5]);
    // An exact multiple of the block size, fully cached: the last token is
    // still computed, in a fresh block (the cached last block is not reused).
    s.add(request_with(3, prompt[..8].to_vec(), 1)).unwrap();
    s.schedule();
    s.update(&[5]);
    s.add(request_with(4, prompt[..8].to_vec(), 1)).unwrap();
    assert_eq!(s.schedule(), &[(4, 4)]);
    s.update(&[5]);
    assert_pool_consistent(&s);
    assert_eq!(s.kv().pool().num_free(), 32);
}

#[test]
fn requests_sharing_a_prefix_allocate_it_once() {
    let mut s = prefix_cached(64, 4);
    let prefix: Vec<u32> = (100..116).collect(); // 4 full blocks
    s.add(request_with(0, [prefix.clone(), vec![1, 2]].concat(), 8))
        .unwrap();
    s.schedule();
    s.update(&[7]);
    for id in 1..5u64 {
        s.add(request_with(
            id,
            [prefix.clone(), vec![id as u32 + 50; 3]].concat(),
            8,
        ))
        .unwrap();
    }
    s.schedule();
    // 5 requests: 4 shared prefix blocks + 1 own block each.
    assert_eq!(s.kv().pool().num_total() - s.kv().pool().num_free(), 4 + 5);
    let first = s.request(1).unwrap().block_tables[0].blocks()[..4].to_vec();
    for id in 0..5u64 {
        assert_eq!(
            &s.request(id).unwrap().block_tables[0].blocks()[..4],
            &first[..]
        );
    }
}

#[test]
fn cache_salt_separates_tenants() {
    let mut s = prefix_cached(32, 4);
    let prompt: Vec<u32> = (100..110).collect();
    let salted = |id, salt: &str| {
        let mut r = request_with(id, prompt.clone(), 1);
        r.cache_salt = salt.as_bytes().to_vec();
        r
    };
    s.add(salted(1, "a")).unwrap();
    s.schedule();
    s.update(&[5]);
    s.add(salted(2, "b")).unwrap();
    s.schedule();
    s.update(&[5]);
    assert_eq!(s.stats().prefix_cache_hits, 0);
    s.add(salted(3, "a")).unwrap();
    s.schedule();
    s.update(&[5]);
    assert_eq!(s.stats().prefix_cache_hits, 8);
}
