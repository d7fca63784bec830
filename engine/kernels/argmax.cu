// The picks on the device. The greedy one: the index of the largest logit, the first one on ties (as
// numpy.argmax), so that a decode graph ends with its token and only 8 bytes come back; one block a row,
// each thread scanning a strided slice, then (value, index) pairs reduced. Below it, temperature draws and the
// rows' log-probabilities.
#include "pdl.cuh"

constexpr int ARGMAX_THREADS = 1024;

__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

// logits: (rows, n) fp32 -> out (rows,): each row's index of its first maximum (a block a row).
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_first(const float* __restrict__ logits, long long* __restrict__ out, int n) {
    after_producer();
    logits += (size_t)blockIdx.x * n;
    out += blockIdx.x;
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    float v = -__int_as_float(0x7f800000);  // -inf
    int i = n;
    for (int j = threadIdx.x; j < n; j += ARGMAX_THREADS) better(v, i, logits[j], j);
    for (int off = 16; off > 0; off >>= 1)
        better(v, i, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, i, off));
    if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = i;
    __syncthreads();
    if (threadIdx.x >= 32) return;
    v = sv[threadIdx.x], i = si[threadIdx.x];
    for (int off = 16; off > 0; off >>= 1)
        better(v, i, __shfl_xor_sync(0xffffffffu, v, off), __shfl_xor_sync(0xffffffffu, i, off));
    if (threadIdx.x == 0) *out = i < n ? i : 0;
}

// ---------------------------------------------------------------- temperature draws, a batch's rows at once
// engine/runner/batch_draws.py: pick_keys makes each row's sort keys, one radix sort of every row's keys
// orders each row's candidates (the row in the keys' top bits keeps the rows apart: a sort of unique keys is
// a permutation, no arithmetic), pick_draw draws each row's token in a block of its own. A row's token
// depends on its logits, its parameters and its uniform only, never on the other rows or their number.
// The NumPy reference, operation for operation: batch_draws.draw_segmented.

constexpr int KEY_THREADS = 256;
constexpr int DRAW_THREADS = 1024;

// logits (rows, n) fp32, params (rows, PICK_PARAMS) fp64 -> scaled (rows, n) = logits / temperature, and keys
// (rows, n) uint64: row << (32 + bits) | the value's descending-order key << bits | the index (bits: the
// vocabulary's index bits). Within a row, ascending keys are sampler.descending_order's order.
constexpr int PICK_PARAMS = 5;  // temperature, top_k, top_p, min_p, u (the draw's uniform)
extern "C" __global__ void __launch_bounds__(KEY_THREADS)
pick_keys(const float* __restrict__ logits, const double* __restrict__ params, float* __restrict__ scaled,
          unsigned long long* __restrict__ keys, int n, int bits) {
    after_producer();
    const int row = blockIdx.y, j = blockIdx.x * KEY_THREADS + threadIdx.x;
    if (j >= n) return;
    const size_t at = (size_t)row * n + j;
    const float s = __fdiv_rn(logits[at], (float)params[row * PICK_PARAMS]);  // IEEE, as NumPy's (fast math aside)
    scaled[at] = s;
    unsigned int b = __float_as_uint(-s);
    if (b == 0x80000000u) b = 0u;  // -0.0 is 0.0
    const unsigned int ordered = (b >> 31) ? ~b : (b | 0x80000000u);
    keys[at] = ((unsigned long long)row << (32 + bits)) | ((unsigned long long)ordered << bits) | (unsigned long long)j;
}

// A candidate's weight: exp(s - best) rounded to fp32 from fp64 (--use_fast_math would make expf the
// approximate __expf; NumPy's float32 exp is within an ulp of this).
__device__ __forceinline__ float weight(float s, float best) { return (float)exp((double)(s - best)); }

// One block a row, over the row's sorted keys (`stride` apart: a row's n keys, or pick_top's TOP_MAX): the
// candidates are the first top_k (0: all n), weighing
// e_i = exp(s_i - s_0). Their cumulative sums are fp64 in a fixed order: thread t's slice of consecutive
// candidates summed in order, the slices' sums scanned (Hillis-Steele, a fixed tree), and cum_i = the slice's
// offset + its running sum to i. min-p keeps the candidates with e_i >= min_p (at least one), top-p the
// first whose cum reaches top_p * total; the token is the first kept candidate whose cum exceeds
// u * (the kept mass), as sampler.draw_index.
extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
pick_draw(const float* __restrict__ scaled, const unsigned long long* __restrict__ keys,
          const double* __restrict__ params, long long* __restrict__ out, int n, int bits, int stride) {
    after_producer();
    __shared__ double part[DRAW_THREADS];
    __shared__ int over, reach, pick;
    __shared__ double kept;
    const int row = blockIdx.x, t = threadIdx.x;
    scaled += (size_t)row * n;
    keys += (size_t)row * stride;  // (n: every key sorted; TOP_MAX: pick_top's first top_k)
    params += row * PICK_PARAMS;
    const unsigned long long index = (1ull << bits) - 1ull;
    const int top_k = (int)params[1];
    const double top_p = params[2], u = params[4];
    const float min_p = (float)params[3];
    const int m = top_k > 0 && top_k < n ? top_k : n;
    const int slice = (m + DRAW_THREADS - 1) / DRAW_THREADS;
    const int lo = min(m, t * slice), hi = min(m, lo + slice);
    const float best = scaled[keys[0] & index];
    if (t == 0) over = 0, reach = m, pick = m;
    double sum = 0.0;
    int heavy = 0;
    for (int i = lo; i < hi; i++) {
        const float e = weight(scaled[keys[i] & index], best);
        sum += (double)e;
        heavy += e >= min_p;
    }
    part[t] = sum;
    __syncthreads();
    atomicAdd(&over, heavy);  // (an integer count: any order)
    for (int off = 1; off < DRAW_THREADS; off <<= 1) {
        const double add = t >= off ? part[t - off] : 0.0;
        __syncthreads();
        part[t] += add;
        __syncthreads();
    }
    const double offset = t ? part[t - 1] : 0.0, total = part[DRAW_THREADS - 1];
    // top-p: the first candidate whose cum reaches top_p * total
    if (top_p < 1.0) {
        const double x = top_p * total;
        double cum = offset;
        for (int i = lo; i < hi; i++) {
            cum += (double)weight(scaled[keys[i] & index], best);
            if (cum >= x) { atomicMin(&reach, i); break; }
        }
    }
    __syncthreads();
    int keep = min_p > 0.0f ? max(1, over) : m;
    if (top_p < 1.0) keep = min(keep, reach + 1);
    keep = min(keep, m);
    // the kept mass: the total, or the cum of the last kept candidate
    if (t == 0) kept = total;
    __syncthreads();
    if (keep < m && lo <= keep - 1 && keep - 1 < hi) {
        double cum = offset;
        for (int i = lo; i < keep; i++) cum += (double)weight(scaled[keys[i] & index], best);
        kept = cum;
    }
    __syncthreads();
    const double y = u * kept;
    double cum = offset;
    for (int i = lo; i < hi; i++) {
        cum += (double)weight(scaled[keys[i] & index], best);
        if (cum > y) { atomicMin(&pick, i); break; }
    }
    __syncthreads();
    if (t == 0) out[row] = (long long)(keys[min(pick, keep - 1)] & index);
}

// A row's top_k smallest keys in order without sorting all n: where every row of a draw has 0 < top_k <=
// TOP_MAX (the servers' default top_k is 40), pick_draw reads only those, so one block a row finds them
// (engine/kernels/argmax_launch.py pick_rows, top=True), where the radix sort of every row's keys took most of a
// 64-row draw's ~1.6 ms. The keys of a row are unique, so its m smallest are one set in one order whatever finds
// them: the same keys, the same token as after the sort. A radix select over the key's bits below the row's, 8
// bits a round from the top: each round counts the keys under the digits chosen so far by their next digit
// (a histogram a warp in shared memory, a thread's run of equal digits counted once), and the digit where the
// count reaches the m-th is chosen; it ends once the chosen digit's keys are exactly the ones still wanted (a
// float's top byte is shared by most logits: its round costs a read, its later ones few atomics). The keys at
// or below the threshold, m of them, are gathered and sorted in shared memory (a bitonic sort of TOP_MAX).
constexpr int TOP_MAX = 256;
constexpr int TOP_THREADS = 1024;
constexpr int TOP_WARPS = TOP_THREADS / 32;

// keys (rows, n) from pick_keys, params (rows, PICK_PARAMS) with 0 < top_k <= TOP_MAX -> top (rows, TOP_MAX):
// each row's min(top_k, n) smallest keys ascending, the rest ~0.
extern "C" __global__ void __launch_bounds__(TOP_THREADS)
pick_top(const unsigned long long* __restrict__ keys, const double* __restrict__ params,
         unsigned long long* __restrict__ top, int n, int bits) {
    after_producer();
    __shared__ int hist[TOP_WARPS][256];
    __shared__ unsigned long long cand[TOP_MAX];
    __shared__ int digit, still, last, count;
    const int row = blockIdx.x, t = threadIdx.x, warp = t / 32;
    keys += (size_t)row * n;
    top += (size_t)row * TOP_MAX;
    const int m = max(1, min((int)params[row * PICK_PARAMS + 1], n));
    const int width = 32 + bits;  // a key's bits below its row's
    const unsigned long long low = (1ull << width) - 1ull;
    unsigned long long prefix = 0ull, threshold = low;  // the digits chosen so far; the keys kept: <= threshold
    int want = m;  // of the keys under `prefix`, how many are still to be kept
    for (int shift = (width + 7) / 8 * 8 - 8; shift >= 0; shift -= 8) {
        for (int i = t; i < TOP_WARPS * 256; i += TOP_THREADS) hist[i / 256][i % 256] = 0;
        __syncthreads();
        const unsigned long long above = prefix >> (shift + 8);
        int run = -1, runs = 0;  // the thread's run of keys with one digit, counted once
        for (int j = t; j < n; j += TOP_THREADS) {
            const unsigned long long v = keys[j] & low;
            if ((v >> (shift + 8)) != above) continue;
            const int d = (int)((v >> shift) & 255ull);
            if (d != run) {
                if (runs) atomicAdd(&hist[warp][run], runs);
                run = d, runs = 0;
            }
            runs++;
        }
        if (runs) atomicAdd(&hist[warp][run], runs);
        __syncthreads();
        if (t < 256) {  // the digit's count over the warps
            int sum = 0;
            for (int w = 0; w < TOP_WARPS; w++) sum += hist[w][t];
            hist[0][t] = sum;
        }
        __syncthreads();
        if (t == 0) {
            int before = 0, d = 0;
            while (d < 255 && before + hist[0][d] < want) before += hist[0][d++];
            digit = d, still = want - before, last = hist[0][d] == want - before;
        }
        __syncthreads();
        prefix |= (unsigned long long)digit << shift;
        want = still;
        const bool done = last || shift == 0;
        __syncthreads();  // (every thread has read them before the next round writes them)
        if (done) {
            threshold = prefix | ((1ull << shift) - 1ull);
            break;
        }
    }
    if (t == 0) count = 0;
    for (int i = t; i < TOP_MAX; i += TOP_THREADS) cand[i] = ~0ull;
    __syncthreads();
    for (int j = t; j < n; j += TOP_THREADS) {
        const unsigned long long key = keys[j];
        if ((key & low) <= threshold) {
            const int at = atomicAdd(&count, 1);
            if (at < TOP_MAX) cand[at] = key;
        }
    }
    __syncthreads();
    for (int size = 2; size <= TOP_MAX; size <<= 1) {  // bitonic, ascending
        for (int half = size / 2; half > 0; half >>= 1) {
            if (t < TOP_MAX / 2) {
                const int i = 2 * t - (t & (half - 1)), j = i + half;
                const unsigned long long a = cand[i], b = cand[j];
                if ((a > b) == ((i & size) == 0)) cand[i] = b, cand[j] = a;
            }
            __syncthreads();
        }
    }
    for (int i = t; i < TOP_MAX; i += TOP_THREADS) top[i] = cand[i];
}

// ---------------------------------------------------------------- log-probabilities, a step's rows at once
// engine/runner/logprob_rows.py: for each row, the log-partition logz = peak + log(sum_j exp(x_j - peak)) in
// fp64 and its token's log-probability x[token] - logz, where each request asked for them; one launch and one
// copy back a step instead of a row's logits copied to the host and summed there (~0.4 ms a row of a 128K
// vocabulary). One block a row: thread t sums exp(x_j - peak) over j = t, t + LOGZ_THREADS, ... in order,
// then the threads' sums meet in a fixed tree, so a row's figures depend on its logits and token alone.
constexpr int LOGZ_THREADS = 256;

// logits (rows, n) fp32, tokens (rows,) int64 -> out (rows, 2) fp64: logz, x[token] - logz.
extern "C" __global__ void __launch_bounds__(LOGZ_THREADS)
row_logprobs(const float* __restrict__ logits, const long long* __restrict__ tokens, double* __restrict__ out,
             int n) {
    after_producer();
    __shared__ double part[LOGZ_THREADS];
    __shared__ float peaks[LOGZ_THREADS];
    const int row = blockIdx.x, t = threadIdx.x;
    logits += (size_t)row * n;
    float peak = -__int_as_float(0x7f800000);  // -inf
    for (int j = t; j < n; j += LOGZ_THREADS) peak = fmaxf(peak, logits[j]);
    peaks[t] = peak;
    __syncthreads();
    for (int half = LOGZ_THREADS / 2; half > 0; half >>= 1) {  // (a maximum: any order gives its bits)
        if (t < half) peaks[t] = fmaxf(peaks[t], peaks[t + half]);
        __syncthreads();
    }
    const double top = (double)peaks[0];
    double sum = 0.0;
    for (int j = t; j < n; j += LOGZ_THREADS) sum += exp((double)logits[j] - top);
    part[t] = sum;
    __syncthreads();
    for (int half = LOGZ_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) part[t] += part[t + half];
        __syncthreads();
    }
    if (t == 0) {
        const double logz = top + log(part[0]);
        out[2 * row] = logz;
        out[2 * row + 1] = (double)logits[tokens[row]] - logz;
    }
}
