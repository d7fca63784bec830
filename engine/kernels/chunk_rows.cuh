// Which rows and keys of a prompt chunk one attention block owns (attention.cu, attention_sm90.cu),
// and the write of its normalized output. A batch of sequences, each with its own length:
// sequence s has n query tokens at positions pos0[s] .. pos0[s] + n - 1 and sees the cache rows
// 0 .. pos0[s] + n - 1; the `group` query heads sharing K/V head kvh are packed into rows (row r =
// token r / group, head r % group). Grid: (row tiles of ROWS, kv heads, sequences), the heaviest
// (latest) tiles first. No CUDA header.
#pragma once

#include "online_softmax.cuh"

struct ChunkRows {
    int s, kvh, group, rows, row0;  // sequence, K/V head, heads per K/V head, the chunk's rows, the block's first
    int p0, key_end, min_pos, tiles;  // first position; keys the block sees; keys every row sees; K/V tiles
    const int* tbl;  // the sequence's block table

    // the position of the block's row r
    __device__ __forceinline__ int position(int r) const { return p0 + (row0 + r) / group; }
    // whether a tile of `keys` keys from k0 holds keys some row may not see (the diagonal, or the end)
    __device__ __forceinline__ bool masked(int k0, int keys) const {
        return k0 + keys - 1 > min_pos || k0 + keys > key_end;
    }
};

// False when the block has no rows (the grid is sized for the longest sequence of the batch).
template <int ROWS, int KEYS>
__device__ __forceinline__ bool chunk_rows(ChunkRows& c, const int* __restrict__ q_start, const int* __restrict__ pos0,
                                           const int* __restrict__ table, const int* __restrict__ table_off, int heads,
                                           int kv_heads) {
    c.s = blockIdx.z;
    c.kvh = blockIdx.y;
    c.group = heads / kv_heads;
    const int n = q_start[c.s + 1] - q_start[c.s];
    c.rows = n * c.group;
    c.row0 = (gridDim.x - 1 - blockIdx.x) * ROWS;
    if (c.row0 >= c.rows) return false;
    c.p0 = pos0[c.s];
    c.tbl = table + table_off[c.s];
    c.key_end = c.p0 + min(n - 1, (c.row0 + ROWS - 1) / c.group) + 1;
    c.min_pos = c.p0 + c.row0 / c.group;
    c.tiles = (c.key_end + KEYS - 1) / KEYS;
    return true;
}

// The thread's two rows (r_a and r_a + 8 of the block; o in the accumulator layout of
// online_softmax.cuh over D columns) normalized by their sums and written as fp16 to out (tokens,
// heads, D).
template <int D>
__device__ __forceinline__ void write_rows(void* out, const float* o, const ChunkRows& c, const int* q_start,
                                           int heads, int r_a, RowState& ra, RowState& rb) {
    float inv_a, inv_b;
    row_sums(ra, rb, inv_a, inv_b);
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
        const int row = c.row0 + r_a + 8 * half_row;
        if (row >= c.rows) continue;
        const float inv = half_row ? inv_b : inv_a;
        const int tok = row / c.group, head = c.kvh * c.group + row % c.group;
        unsigned* dst = static_cast<unsigned*>(out) + ((unsigned long long)(q_start[c.s] + tok) * heads + head) * D / 2;
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn)
            dst[dn * 4 + t] = pack_f16x2(o[4 * dn + 2 * half_row] * inv, o[4 * dn + 2 * half_row + 1] * inv);
    }
}
