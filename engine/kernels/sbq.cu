// Issue 48's third probe, in its second form: Q4_K (and Q6_K) weights against rows of x in the order the issue
// names, integer sums over a whole super-block and one float step after, a chain an output or a segment of k (its
// super-blocks added in order). The engine's matvec takes it for Q4_K / Q6_K matrices with $STRATA_SBQ=1 (off by
// default: engine/kernels/matvec_launch.py sbq_matvec); tools/device/sbq_check.py checks and times it.
// Measured on an H100 (bench/HISTORY.md, twenty-sixth session): exact, every row its solo bits; faster than mmq.cu
// only where a launch fills the chip (the 8B shape's gate/up 1.2-1.55x at 8-64 rows), slower elsewhere: a 4,096-row
// matrix's tiles are 256 warps over the whole of k, the Q6_K tile kernel 2-6x slower (its super-block's 2-byte
// loads), the solo kernel 1.1-1.4x. The tile kernel then took 255 registers and spilled at 8 n-tiles (ptxas, sm_90).
// Its second form (twenty-seventh session; on an H100 a forward's matmuls 1.42x today's at 64 rows, 0.9x at one): x's
// rows as 32-bit offsets from one pointer and the outputs' columns' scales shuffled from the lane that reads that row
// (188 registers, no spill), the min term B by two mmas (x's unit sums kept as two bytes each, Q8K below) where 16
// IMADs a pair of outputs took it: a super-block's trip 947 instructions at 8 n-tiles against 1,297
// (tools/device/sass_counts.py); the grid's y splits x's rows among warps (8 NT a warp), so a 4,096-row matrix at 64
// rows can take 4-8 times the warps; and a fixed split of k (the kernels' seg: super-blocks a segment, a choice of the
// matrix's shape, never of the rows): a chain a segment, the chains added in order from 0, by the solo kernel itself
// and by sbq_sum_parts after the tile kernel's segments (the grid's z), so a row keeps its bits alone and among 64
// while a 4,096-row matrix's tiles fill the SMs at any number of rows. The solo kernel then took 8 lanes a
// super-block and 26 shuffles a round of 4 (the integers' sums, then five values of each super-block to every lane
// for its float step); now SBQ_SOLO_LANES lanes (4: 8 super-blocks a round, two shuffle levels of the integers' sums)
// and lane 0 takes the float steps from shared memory (twenty-ninth session, an H100, one row: the gate/up 28.8 us
// at 4 lanes, 31.3 at 8, 36.4 at 2, the dp4a kernel 27.5; the Q6_K head 280.6 / 248.8 / 295.2 against 168.3; every
// count the same bits).
//   quantize_q8k(x, out, blocks)           x (blocks * 256,) fp16 -> Q8K blocks (q8k.cuh): one float scale a
//                                          super-block; for rows no producer wrote them for (a decode step's norms,
//                                          SwiGLU and flash-decoding write theirs as they store the rows)
//   sbq_<T>_n1[_f32](w, x, y, m, k, seg)   y (m,) = W (m, k) . x (one row of k / 256 Q8K blocks): a warp a row
//   sbq_<T>_t<NT>[_f32](w, x, y, m, k, ldy, nb, seg, part)  y (nb, m; rows ldy apart) for nb <= 8 NT grid.y rows
//                                          of x, int8 tensor cores, k's segment blockIdx.z (into part (gridDim.z,
//                                          nb, m) float32 when there are several); T: Q4_K or Q6_K (value d sc_g
//                                          (q - 32), a scale g every 16 values: A = sum_g sc_g sum_{i in g} (q_i -
//                                          32) q'_i, no min term, |A| < 1.4e8); y in fp16, or float32 with _f32
//   sbq_sum_parts[_f32](part, y, m, nb, ldy, parts)  y = 0 + part[0] + part[1] + ... (the segments' chains)
//   sbq_Q6_KP_*                            Q6_K repacked into 212-byte blocks (two bytes of padding: every field
//                                          4-byte aligned, plain loads where the file's 210 take load_a2's shifts)
//
// A super-block's value for (weight row r, x row b): with Q4_K's value d sc_j q - dmin m_j (sub-block j's 6-bit
// scale and min) and x's dx q', it is dx (d A - dmin B), A = sum_j sc_j sum_{i in j} q_i q'_i and B = sum_j m_j
// sum_{i in j} q'_i: integers (|A| < 3.1e7, |B| < 2.2e6), exact in any order. So the solo kernel sums them across
// its lanes and the tile kernel with mma.sync's integers, each as suits it, and both take the same float step,
// sb_step, a super-block at a time in order: every row of x has the same bits alone or among 64. Where mmq.cu adds a
// float term for every (weight row, x row, unit of 32) into 32 chains split across warps, the tile kernel here adds
// an IMAD for each (the sub-block's scale times the mma's integers) and a float step every 8 units, and a warp owns
// its 16 weight rows by 8 NT rows of x over the whole of k (no reduction across warps). The price is x's form: one
// scale per 256 values (llama.cpp's CPU Q8_K) where quantize_q8 keeps one per 32 (bench/HISTORY.md: 0.00185 nats
// of KL against 0.00043 on the Qwen2.5-Coder-1.5B fixture). NumPy reference: tools/device/sbq_check.py.
#include "quant_blocks.cuh"
#include "pdl.cuh"
#include "q8k.cuh"

__device__ __forceinline__ int unit_sum(const Q8K& x, int j) { return (int)x.sums_lo[j] + 128 * (int)x.sums_hi[j]; }

// Sub-block j's (0..7) 6-bit scale and min of a Q4_K super-block, as integers: quant_blocks.cuh's scale_min_k4 gives
// them as floats. When this order lands, scale_min_k4 should become a call of this one (a change to the header
// every loaded kernel includes, so it waits for their device checks).
__device__ __forceinline__ void scale_min_int(int j, unsigned s03, unsigned s47, unsigned s811, int& sc, int& mn) {
    if (j < 4) {
        sc = byte_at(s03, j) & 63, mn = byte_at(s47, j) & 63;
    } else {
        sc = (byte_at(s811, j - 4) & 0xF) | ((byte_at(s03, j - 4) >> 6) << 4);
        mn = (byte_at(s811, j - 4) >> 4) | ((byte_at(s47, j - 4) >> 6) << 4);
    }
}

__device__ __forceinline__ void sbq_store(float* y, size_t i, float v) { y[i] = v; }
__device__ __forceinline__ void sbq_store(__half* y, size_t i, float v) { y[i] = __float2half(v); }

// The one float step of a super-block, the same expression in every kernel: acc + dx (d A - dmin B), its inner
// part (sb_inner) made apart where the solo kernel's integers are.
__device__ __forceinline__ float sb_inner(float d, float dmin, int a, int b) {
    return __fmaf_rn(d, (float)a, -__fmul_rn(dmin, (float)b));
}
__device__ __forceinline__ float sb_step(float acc, float dx, float d, float dmin, int a, int b) {
    return __fmaf_rn(dx, sb_inner(d, dmin, a, b), acc);
}

// A warp a super-block (q8k.cuh's store_q8k), from x's fp16 values.
extern "C" __global__ void quantize_q8k(const __half* __restrict__ x, Q8K* __restrict__ out, int blocks) {
    after_producer();
    const int block = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (block >= blocks) return;
    const __half* v = x + (size_t)block * 256 + 8 * lane;
    float f[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = __half2float(v[i]);
    store_q8k(out + block, f, lane);
}

#ifndef SBQ_SOLO_LANES
#define SBQ_SOLO_LANES 4  // the solo kernel's lanes a super-block (8, 4 or 2): 32 / SBQ_SOLO_LANES super-blocks a round
#endif
constexpr int kSoloLanes = SBQ_SOLO_LANES, kSoloBlocks = 32 / SBQ_SOLO_LANES, kSoloWarps = 8;  // (the most a block)
static_assert(kSoloLanes == 2 || kSoloLanes == 4 || kSoloLanes == 8, "SBQ_SOLO_LANES: 2, 4 or 8");

// The float steps of a solo round's super-blocks p .. p + n - 1, taken in order by the lane that calls it from
// their (dx, inner) pairs: sb_step's acc + dx inner, inner = sb_inner (d A - dmin B, made by the lane that holds
// the super-block's integers); at the end of each segment (end: the current one's, seg super-blocks on from
// the last, the last segment shorter) its chain is added to the total (sum) and a new chain starts.
__device__ __forceinline__ void chain_steps(float& acc, float& sum, int& end, int p, int n, int blocks, int seg,
                                            const float2* steps) {
    for (int q = 0; q < n; ++q) {
        acc = __fmaf_rn(steps[q].x, steps[q].y, acc);
        if (p + q + 1 == end) sum = __fadd_rn(sum, acc), acc = 0.f, end = min(end + seg, blocks);
    }
}

// A warp's tile: 16 weight rows (rows past m read the last, not stored) by the 8 NT rows of x from col0 = 8 NT
// blockIdx.y (past nb: the last) over all of k: where its rows are, and its outputs' sums (accumulator o: row g + 8
// (o / 2), column col0 + 2c + o % 2). A launch's grid.y splits x's rows among warps (more warps, the weights read
// once a split): no output's sum changes.
// x's rows are offsets from one pointer (32-bit, a register each: NT = 8 with a pointer per row spilled), and lane
// (g, c) reads only its B column's row 8t + g: the outputs' columns' scales come from lanes 4 (2c + e) (column_d).
template <int NT>
struct Tile {
    int row0, col0, g, c;
    const u8 *wa, *wb;  // weight rows row0 + g and row0 + g + 8
    const Q8K* x;
    int xg[NT];         // x's row 8t + g (B's column) at x + xg[t] + sb
    float acc[NT][4];
    __device__ __forceinline__ bool at(const u8* w, const Q8K* x_, int m, int nb, int blocks, int block_bytes) {
        const int lane = threadIdx.x & 31;
        row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 16, col0 = 8 * NT * blockIdx.y;
        g = lane >> 2, c = lane & 3, x = x_;
        const size_t rb = (size_t)blocks * block_bytes;
        wa = w + (size_t)min(row0 + g, m - 1) * rb, wb = w + (size_t)min(row0 + g + 8, m - 1) * rb;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            xg[t] = min(col0 + 8 * t + g, nb - 1) * blocks;
            acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
        }
        return row0 < m;
    }
    __device__ __forceinline__ const Q8K& xb(int t, int sb) const { return x[xg[t] + sb]; }
    // The scale d of x's row 8t + 2c + e (output column 2c + e) in super-block sb, from the lane whose B column it is.
    __device__ __forceinline__ float column_d(float dg, int e) const {
        return __shfl_sync(0xFFFFFFFFu, dg, 4 * (2 * c + e));
    }
    template <typename Out>  // whole: the output (0 + the chain, as the solo kernel's total), else a segment's chain
    __device__ __forceinline__ void store(Out* y, int m, int nb, int ldy, bool whole) const {
#pragma unroll
        for (int t = 0; t < NT; ++t)
#pragma unroll
            for (int o = 0; o < 4; ++o) {
                const int row = row0 + g + 8 * (o >> 1), col = col0 + 8 * t + 2 * c + (o & 1);
                if (row < m && col < nb) sbq_store(y, (size_t)col * ldy + row, whole ? __fadd_rn(0.f, acc[t][o])
                                                                                      : acc[t][o]);
            }
    }
};

// mma.sync m16n8k32 u8 x s8 -> s32 into a zero accumulator: A's rows g and g + 8 (lo: k slots 4c.., hi: 16 + 4c..),
// B's column g the same slots; c[o]: row g + 8 (o / 2), column 2c + o % 2. The callers put a unit's values 8c .. 8c
// + 7 in lane c's slots (lo, then hi) for A and B alike: the integer sum of the unit, whatever the slots.
__device__ __forceinline__ void sbq_mma(int* c, unsigned glo, unsigned g8lo, unsigned ghi, unsigned g8hi, unsigned b0,
                                        unsigned b1) {
    c[0] = c[1] = c[2] = c[3] = 0;
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(glo), "r"(g8lo), "r"(ghi), "r"(g8hi), "r"(b0), "r"(b1));
#else
    const unsigned a[4] = {glo, g8lo, ghi, g8hi}, bs[2] = {b0, b1};
    host_mma_8bit(c, a, bs, 32, false);
#endif
}

// mma.sync m16n8k16 s8 x s8 -> s32 into a zero accumulator: A's rows g and g + 8 at k slots 4c .. 4c + 3, B's column
// g the same slots.
__device__ __forceinline__ void sbq_mma16(int* c, unsigned g, unsigned g8, unsigned b) {
    c[0] = c[1] = c[2] = c[3] = 0;
#ifdef __CUDA_ARCH__
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(g), "r"(g8), "r"(b));
#else
    const unsigned a[4] = {g, g8, 0, 0}, bs[2] = {b, 0};
    host_mma_8bit(c, a, bs, 16, true);
#endif
}

// A kind's part of the kernels below: BYTES a super-block; solo(blk, xb, i, ...) lane i's integers a, b of one
// super-block against x's (the solo kernel sums them over its 8 lanes) and the block's d, dmin; add(tile, ba, bb,
// sb) super-block sb of a warp's two rows (ba, bb: rows g and g + 8) into its tile's sums, float step included.
//
// Q4_K: lane i of the solo kernel takes bytes 16 i .. 16 i + 15 of the nibbles (chunk c = i / 2: values 16 h .. 16 h
// + 15, h = i % 2, of units 2c (low) and 2c + 1 (high)) and unit i's min term; the tile kernel a unit an mma an
// n-tile and an IMAD an output, then the min terms and the float step.
struct SbqQ4K {
    static constexpr int BYTES = 144;
    __device__ static void solo(const u8* blk, const Q8K& xb, int i, int& a, int& b, float& d, float& dmin) {
        const int c = i >> 1, h = i & 1;
        const uint4 head = *reinterpret_cast<const uint4*>(blk);  // d, dmin, scales[12]
        const uint4 qs = *reinterpret_cast<const uint4*>(blk + 16 + 16 * i);
        const int4 x0 = *reinterpret_cast<const int4*>(xb.q + 64 * c + 16 * h);
        const int4 x1 = *reinterpret_cast<const int4*>(xb.q + 64 * c + 32 + 16 * h);
        const unsigned qw[4] = {qs.x, qs.y, qs.z, qs.w};
        const int xw0[4] = {x0.x, x0.y, x0.z, x0.w}, xw1[4] = {x1.x, x1.y, x1.z, x1.w};
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t)
            s0 = dp4a(qw[t] & 0x0F0F0F0Fu, xw0[t], s0), s1 = dp4a((qw[t] >> 4) & 0x0F0F0F0Fu, xw1[t], s1);
        int sc0, m0, sc1, m1, sci, mi;
        scale_min_int(2 * c, head.y, head.z, head.w, sc0, m0);
        scale_min_int(2 * c + 1, head.y, head.z, head.w, sc1, m1);
        scale_min_int(i, head.y, head.z, head.w, sci, mi);
        a = sc0 * s0 + sc1 * s1, b = mi * unit_sum(xb, i);
        const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&head.x));
        d = dm.x, dmin = dm.y;
    }
    template <int NT>
    __device__ static void add(Tile<NT>& tile, const u8* ba, const u8* bb, int sb) {
        const int c = tile.c;
        const uint4 ha = *reinterpret_cast<const uint4*>(ba), hb = *reinterpret_cast<const uint4*>(bb);
        int A[NT][4];
        unsigned mina = 0u, minb = 0u;  // rows g and g + 8's mins of units 4c .. 4c + 3 (lanes c < 2; else 0)
#pragma unroll
        for (int t = 0; t < NT; ++t) A[t][0] = A[t][1] = A[t][2] = A[t][3] = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // unit j: lane c takes its values 8c .. 8c + 7 (one 8-byte load a row)
            const int sh = (j & 1) * 4;
            const uint2 qa = *reinterpret_cast<const uint2*>(ba + 16 + 32 * (j >> 1) + 8 * c);
            const uint2 qb = *reinterpret_cast<const uint2*>(bb + 16 + 32 * (j >> 1) + 8 * c);
            const unsigned alo = (qa.x >> sh) & 0x0F0F0F0Fu, ahi = (qa.y >> sh) & 0x0F0F0F0Fu;
            const unsigned blo = (qb.x >> sh) & 0x0F0F0F0Fu, bhi = (qb.y >> sh) & 0x0F0F0F0Fu;
            int sca, scb, ma, mb;
            scale_min_int(j, ha.y, ha.z, ha.w, sca, ma);
            scale_min_int(j, hb.y, hb.z, hb.w, scb, mb);
            if ((j >> 2) == c) mina |= (unsigned)ma << (8 * (j & 3)), minb |= (unsigned)mb << (8 * (j & 3));
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const uint2 xv = *reinterpret_cast<const uint2*>(tile.xb(t, sb).q + 32 * j + 8 * c);
                int s[4];
                sbq_mma(s, alo, blo, ahi, bhi, xv.x, xv.y);
                A[t][0] += sca * s[0], A[t][1] += sca * s[1], A[t][2] += scb * s[2], A[t][3] += scb * s[3];
            }
        }
        const float2 da = __half22float2(*reinterpret_cast<const __half2*>(&ha.x));
        const float2 db = __half22float2(*reinterpret_cast<const __half2*>(&hb.x));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            // B = sum_j m_j sum_j(q') of each output: the mins (16 rows by 8 units) times the unit sums' low and high
            // parts (8 units by 8 rows of x) in two mmas, k = the units (slots 8..15 zero)
            const Q8K& xr = tile.xb(t, sb);
            const unsigned lo = c < 2 ? *reinterpret_cast<const unsigned*>(xr.sums_lo + 4 * c) : 0u;
            const unsigned hi = c < 2 ? *reinterpret_cast<const unsigned*>(xr.sums_hi + 4 * c) : 0u;
            int bl[4], bh[4];
            sbq_mma16(bl, mina, minb, lo);
            sbq_mma16(bh, mina, minb, hi);
            const float dg = xr.d;
#pragma unroll
            for (int o = 0; o < 4; ++o) {
                const float2 dm = o < 2 ? da : db;
                tile.acc[t][o] = sb_step(tile.acc[t][o], tile.column_d(dg, o & 1), dm.x, dm.y, A[t][o],
                                         bl[o] + 128 * bh[o]);
            }
        }
    }
};

// Q6_K {ql[128], qh[64], scales[16] int8, d} (quant_blocks.cuh): values 32 u + l (u = 4 hh + kq) of a super-block
// take 4 low bits from ql[64 hh + 32 (kq & 1) + l] (high nibbles for kq >= 2) and 2 high bits from qh[32 hh + l] >>
// 2 kq. Four of them, l .. l + 3, as the bytes q (0..63).
__device__ __forceinline__ unsigned q6_word(unsigned lo, unsigned hi, int kq) {  // from a word of ql and one of qh
    return ((lo >> (4 * (kq >> 1))) & 0x0F0F0F0Fu) | (((hi >> (2 * kq)) & 0x03030303u) << 4);
}
// WORDS words of a Q6_K block's quants (an offset a multiple of 4 within it) from blocks of B bytes: the file's 210
// are 2-byte aligned (load_a2's aligned words and funnel shifts), a repacked 212 (two bytes of padding a block) 4-byte
// aligned (plain loads).
template <int B, int WORDS>
__device__ __forceinline__ void q6_load(const u8* p, unsigned (&w)[WORDS]) {
    if constexpr (B % 4 == 0) {
#pragma unroll
        for (int i = 0; i < WORDS; ++i) w[i] = reinterpret_cast<const unsigned*>(p)[i];
    } else {
        load_a2(p, w);
    }
}
template <int B>
__device__ __forceinline__ unsigned q6_bytes(const u8* blk, int u, int l) {
    const int hh = u >> 2, kq = u & 3;
    unsigned lo[1], hi[1];
    q6_load<B>(blk + 64 * hh + 32 * (kq & 1) + l, lo);
    q6_load<B>(blk + 128 + 32 * hh + l, hi);
    return q6_word(lo[0], hi[0], kq);
}
__device__ __forceinline__ int q6_scale(const u8* blk, int g) {
    return (int)reinterpret_cast<const signed char*>(blk)[192 + g];
}

// Q6_K: lane i of the solo kernel takes unit i, its two 16-value groups' sums of q q' less 32 sum q' (dp4a) times
// their scales; the tile kernel a 16-value group an mma an n-tile (lane c its values 4c .. 4c + 3, centered) and an
// IMAD an output by the group's scale. No min term. B: a block's bytes (210 as in the file; 212 repacked).
template <int B>
struct SbqQ6KB {
    static constexpr int BYTES = B;
    __device__ static void solo(const u8* blk, const Q8K& xb, int i, int& a, int& b, float& d, float& dmin) {
        const int hh = i >> 2, kq = i & 3;
        unsigned ql[8], qh[8];  // unit i's 32 low-bit and high-bit bytes
        q6_load<B>(blk + 64 * hh + 32 * (kq & 1), ql);
        q6_load<B>(blk + 128 + 32 * hh, qh);
        const int* xw = reinterpret_cast<const int*>(xb.q + 32 * i);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            int s = 0, z = 0;
#pragma unroll
            for (int t = 4 * e; t < 4 * e + 4; ++t)
                s = dp4a(q6_word(ql[t], qh[t], kq), xw[t], s), z = dp4a(0x01010101u, xw[t], z);
            a += q6_scale(blk, 2 * i + e) * (s - 32 * z);
        }
        b = 0, d = __half2float(*reinterpret_cast<const __half*>(blk + 208)), dmin = 0.f;
    }
    template <int NT>
    __device__ static void add(Tile<NT>& tile, const u8* ba, const u8* bb, int sb) {
        const int c = tile.c;
        int A[NT][4];
#pragma unroll
        for (int t = 0; t < NT; ++t) A[t][0] = A[t][1] = A[t][2] = A[t][3] = 0;
#pragma unroll 4
        for (int gr = 0; gr < 16; ++gr) {  // group gr: values 16 gr .. 16 gr + 15 (unit gr / 2, its half gr % 2)
            const int u = gr >> 1, l = 16 * (gr & 1) + 4 * c;
            const unsigned qa = Q6_K::centered(q6_bytes<B>(ba, u, l)), qb = Q6_K::centered(q6_bytes<B>(bb, u, l));
            const int sca = q6_scale(ba, gr), scb = q6_scale(bb, gr);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const unsigned xv = *reinterpret_cast<const unsigned*>(tile.xb(t, sb).q + 16 * gr + 4 * c);
                int s[4];
                sbq_mma16(s, qa, qb, xv);
                A[t][0] += sca * s[0], A[t][1] += sca * s[1], A[t][2] += scb * s[2], A[t][3] += scb * s[3];
            }
        }
        const float da = __half2float(*reinterpret_cast<const __half*>(ba + 208));
        const float db = __half2float(*reinterpret_cast<const __half*>(bb + 208));
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float dg = tile.xb(t, sb).d;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float dx = tile.column_d(dg, e);
                tile.acc[t][e] = sb_step(tile.acc[t][e], dx, da, 0.f, A[t][e], 0);
                tile.acc[t][2 + e] = sb_step(tile.acc[t][2 + e], dx, db, 0.f, A[t][2 + e], 0);
            }
        }
    }
};

// The solo kernel: a warp a row; a round takes kSoloBlocks super-blocks, SBQ_SOLO_LANES lanes each (lane l = L sb +
// j of super-block p + sb takes K::solo's parts 8 / L j .. 8 / L (j + 1) - 1: few lanes a super-block, few
// shuffles a byte), the lanes' integers summed by shuffles (exact in any order), then the super-block's first lane
// writes its (dx, inner) to shared memory and lane 0 takes the round's float steps in order (chain_steps: sb_step's
// arithmetic, split where the integers are), a chain a segment of seg super-blocks, the chains added in order from
// 0 (sbq_sum_parts' order). Every lane count gives every row the same bits.
template <class K, typename Out>
__device__ __forceinline__ void sbq_solo(const u8* __restrict__ w, const Q8K* __restrict__ x, Out* __restrict__ y,
                                         int m, int k, int seg) {
    __shared__ float2 steps[kSoloWarps][kSoloBlocks];  // (a warp's round: its super-blocks' dx, inner)
    constexpr int parts = 8 / kSoloLanes;
    const int warp = threadIdx.x >> 5, row = blockIdx.x * (blockDim.x >> 5) + warp, lane = threadIdx.x & 31;
    const int sbl = lane / kSoloLanes, j = lane % kSoloLanes, blocks = k >> 8;
    after_producer();
    if (row >= m) return;
    const u8* wr = w + (size_t)row * blocks * K::BYTES;
    float acc = 0.f, sum = 0.f;
    int end = min(seg, blocks);
    for (int p = 0; p < blocks; p += kSoloBlocks) {
        const int sb = p + sbl;
        int a = 0, b = 0;
        float d = 0.f, dmin = 0.f, dx = 0.f;
        if (sb < blocks) {
#pragma unroll
            for (int t = 0; t < parts; ++t) {
                int at = 0, bt = 0;  // (K::solo adds into a where it sums in parts)
                K::solo(wr + (size_t)sb * K::BYTES, x[sb], parts * j + t, at, bt, d, dmin);
                a += at, b += bt;
            }
            dx = x[sb].d;
        }
#pragma unroll
        for (int o = kSoloLanes / 2; o; o >>= 1)
            a += __shfl_xor_sync(0xFFFFFFFFu, a, o), b += __shfl_xor_sync(0xFFFFFFFFu, b, o);
        if (j == 0) steps[warp][sbl] = make_float2(dx, sb_inner(d, dmin, a, b));
        __syncwarp();
        if (lane == 0) chain_steps(acc, sum, end, p, min(kSoloBlocks, blocks - p), blocks, seg, steps[warp]);
        __syncwarp();
    }
    if (lane == 0) sbq_store(y, row, sum);
}

// The tile kernel: a warp a Tile (any number of warps a block) over segment blockIdx.z of k (seg super-blocks, the
// last one shorter), its super-blocks added in order (K::add). One segment (gridDim.z 1): y = 0 + the chain, as the
// solo kernel's; more: each chain into part (gridDim.z, nb, m) float32, which sbq_sum_parts adds in order.
template <class K, int NT, typename Out>
__device__ __forceinline__ void sbq_tiles(const u8* __restrict__ w, const Q8K* __restrict__ x, Out* __restrict__ y,
                                          int m, int k, int ldy, int nb, int seg, float* __restrict__ part) {
    const int blocks = k >> 8, first = blockIdx.z * seg, end = min(blocks, first + seg);
    after_producer();
    Tile<NT> tile;
    if (!tile.at(w, x, m, nb, blocks, K::BYTES)) return;
    for (int sb = first; sb < end; ++sb)
        K::add(tile, tile.wa + (size_t)sb * K::BYTES, tile.wb + (size_t)sb * K::BYTES, sb);
    if (gridDim.z == 1) {
        tile.store(y, m, nb, ldy, true);
    } else {
        tile.store(part + (size_t)blockIdx.z * nb * m, m, nb, m, false);
    }
}

// y (nb, m; rows ldy apart) = 0 + part[0] + part[1] + ... in order: the segments' chains of sbq_tiles (part (parts,
// nb, m) float32), the solo kernel's total. A thread an output.
template <typename Out>
__device__ __forceinline__ void sum_parts(const float* __restrict__ part, Out* __restrict__ y, int m, int nb, int ldy,
                                          int parts) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    after_producer();
    if (i >= m * nb) return;
    float sum = 0.f;
    for (int s = 0; s < parts; ++s) sum = __fadd_rn(sum, part[(size_t)s * m * nb + i]);
    sbq_store(y, (size_t)(i / m) * ldy + i % m, sum);
}
extern "C" __global__ void sbq_sum_parts(const float* part, __half* y, int m, int nb, int ldy, int parts) {
    sum_parts(part, y, m, nb, ldy, parts);
}
extern "C" __global__ void sbq_sum_parts_f32(const float* part, float* y, int m, int nb, int ldy, int parts) {
    sum_parts(part, y, m, nb, ldy, parts);
}

// Each kind's kernels with fp16 out and with float32 out (_f32), as the engine's matvecs.
#define SBQ_NT(T, K, NT, SUFFIX, Out)                                                                               \
    extern "C" __global__ void sbq_##T##_t##NT##SUFFIX(const u8* w, const Q8K* x, Out* y, int m, int k, int ldy,    \
                                                       int nb, int seg, float* part) {                              \
        sbq_tiles<K, NT>(w, x, y, m, k, ldy, nb, seg, part);                                                        \
    }
#define SBQ(T, K, SUFFIX, Out)                                                                                      \
    extern "C" __global__ void sbq_##T##_n1##SUFFIX(const u8* w, const Q8K* x, Out* y, int m, int k, int seg) {     \
        sbq_solo<K>(w, x, y, m, k, seg);                                                                            \
    }                                                                                                               \
    SBQ_NT(T, K, 1, SUFFIX, Out) SBQ_NT(T, K, 2, SUFFIX, Out) SBQ_NT(T, K, 4, SUFFIX, Out) SBQ_NT(T, K, 8, SUFFIX, Out)
SBQ(Q4_K, SbqQ4K, , __half)
SBQ(Q4_K, SbqQ4K, _f32, float)
SBQ(Q6_K, SbqQ6KB<210>, , __half)
SBQ(Q6_K, SbqQ6KB<210>, _f32, float)
SBQ(Q6_KP, SbqQ6KB<212>, , __half)  // Q6_K repacked into 212-byte blocks (tools/device/sbq_check.py repack_q6k)
SBQ(Q6_KP, SbqQ6KB<212>, _f32, float)
