// Paged KV rows (engine/kv.py): a layer's pool is (blocks, kv_heads, 1 << block_log2, d), and a
// sequence's position p of K/V head h is row p & (B - 1) of block tbl[p >> block_log2], tbl being
// that sequence's block table. The row's offset from the pool's start, in elements. No CUDA header.
#pragma once

__device__ __forceinline__ unsigned long long kv_row(const int* __restrict__ tbl, int p, int h, int kv_heads,
                                                     int block_log2, int d) {
    return ((((unsigned long long)tbl[p >> block_log2] * kv_heads + h) << block_log2) + (p & ((1 << block_log2) - 1))) * d;
}
