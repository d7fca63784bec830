// The CUDA names engine/kernels' sources use, defined for the host's C++ compiler (tests/engine/kernels/host_cuda.py),
// and a grid run on the host: each block's threads as fibers (ucontext) that a scheduler runs in turn up to a barrier
// (__syncthreads, __syncwarp, a warp shuffle's exchange), so that kernels whose threads cooperate through shared
// memory and shuffles run as written. fp16 is _Float16; the intrinsics follow PTX's semantics. Not emulated:
// tensor-core and other inline PTX (a source guards its asm with __CUDA_ARCH__ and gives the host a plain form).
#pragma once
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

struct HostDim3 { unsigned x, y, z; };
HostDim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

typedef _Float16 __half;
struct __half2 { __half x, y; };
struct float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return (__half)f; }
inline __half __float2half_rn(float f) { return (__half)f; }
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __half2 __floats2half2_rn(float a, float b) { return {(__half)a, (__half)b}; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
#define __expf(x) expf(x)  // (the fast intrinsics: glibc declares names of its own for them)
#define __logf(x) logf(x)
#define __fdividef(a, b) ((a) / (b))
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {  // prmt's default mode: byte i of {y, x} by nibble i
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)(((((unsigned long long)hi << 32) | lo) << (shift & 31)) >> 32);
}
inline unsigned bytewise(unsigned a, unsigned b, int sign) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((((a >> (8 * i)) & 0xFF) + sign * ((b >> (8 * i)) & 0xFF)) & 0xFF) << (8 * i);
    return r;
}
inline unsigned __vadd4(unsigned a, unsigned b) { return bytewise(a, b, 1); }
inline unsigned __vsub4(unsigned a, unsigned b) { return bytewise(a, b, -1); }
inline int host_dp4a(unsigned a, int b, int c) {  // dp4a.u32.s32: unsigned bytes of a . signed bytes of b + c
    for (int i = 0; i < 4; ++i) c += (int)((a >> (8 * i)) & 0xFF) * (int)(signed char)((b >> (8 * i)) & 0xFF);
    return c;
}
template <class A, class B> inline std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <class A, class B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }
inline void __threadfence() {}
template <class T> inline T atomicAdd(T* p, T v) { const T old = *p; *p += v; return old; }
// (fibers: no two at once)
template <class T> inline T atomicMin(T* p, T v) { const T old = *p; *p = v < old ? v : old; return old; }

// ------------------------------------------------------------------ a block's threads as fibers
namespace host_grid {
enum State { RUN, AT_BLOCK, AT_WARP, DONE };
struct Fiber {
    ucontext_t ctx;  // its first entry (makecontext); after that it and the scheduler switch by _setjmp/_longjmp,
    jmp_buf jump;    // which save no signal mask (swapcontext's system call each switch was most of a run's time)
    std::vector<char> stack;
    HostDim3 tid;
    State state = RUN;
    bool started = false;
};
inline std::vector<std::unique_ptr<Fiber>> pool;  // every fiber made so far (stacks and contexts kept: a fiber is
// made once, with getcontext's and its first switch's system calls, and runs the blocks after it from where it left)
inline size_t active = 0;  // the running block's threads: pool[0 .. active)
inline ucontext_t scheduler;
inline jmp_buf scheduler_jump;
inline int current = -1;
inline void (*body)(void*) = nullptr;
inline void* body_arg = nullptr;
inline std::vector<unsigned long long> slots;  // a shuffle's values, one a thread
// The launch's dynamic shared memory: a static arena, so that it lies beside the kernels' static __shared__
// arrays (this library's .bss) and a 32-bit shared-space address can name either (host_smem_addr).
constexpr size_t ARENA = 256 * 1024;
alignas(128) inline unsigned char arena[ARENA];
constexpr size_t STACK = 64 * 1024;  // a thread's stack: its registers and local arrays

inline Fiber& fiber(size_t i) { return *pool[i]; }

// A fiber's whole life: the body of a block each time the scheduler starts it, then back to the scheduler.
inline void enter() {
    for (;;) {
        body(body_arg);
        fiber(current).state = DONE;
        if (!_setjmp(fiber(current).jump)) _longjmp(scheduler_jump, 1);  // (resumed here for the next block)
    }
}
inline void wait(State why) {
    fiber(current).state = why;
    if (!_setjmp(fiber(current).jump)) _longjmp(scheduler_jump, 1);
}
inline unsigned linear(const HostDim3& t) { return t.x + blockDim.x * (t.y + blockDim.y * t.z); }

// Releases every warp barrier that each of its live threads has reached; else the block's, if every live thread
// has reached it. Whether it released any.
inline bool release() {
    const size_t n = active;
    bool released = false;
    for (size_t w = 0; w < n; w += 32) {
        bool all = true, any = false;
        for (size_t i = w; i < std::min(n, w + 32); ++i) {
            all &= fiber(i).state == AT_WARP || fiber(i).state == DONE;
            any |= fiber(i).state == AT_WARP;
        }
        if (all && any) {
            for (size_t i = w; i < std::min(n, w + 32); ++i)
                if (fiber(i).state == AT_WARP) fiber(i).state = RUN;
            released = true;
        }
    }
    if (released) return true;
    bool all = true, any = false;
    for (size_t i = 0; i < n; ++i) all &= fiber(i).state == AT_BLOCK || fiber(i).state == DONE,
                                   any |= fiber(i).state == AT_BLOCK;
    if (!all || !any) return false;
    for (size_t i = 0; i < n; ++i)
        if (fiber(i).state == AT_BLOCK) fiber(i).state = RUN;
    return true;
}

inline void run_block() {
    const size_t n = (size_t)blockDim.x * blockDim.y * blockDim.z;
    while (pool.size() < n) {
        pool.push_back(std::make_unique<Fiber>());
        Fiber& f = *pool.back();
        f.stack.resize(STACK);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = STACK;
        f.ctx.uc_link = &scheduler;
        makecontext(&f.ctx, enter, 0);
    }
    active = n;
    slots.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
        Fiber& f = fiber(i);
        f.state = RUN;
        f.tid = {(unsigned)(i % blockDim.x), (unsigned)(i / blockDim.x % blockDim.y),
                 (unsigned)(i / blockDim.x / blockDim.y)};
    }
    for (;;) {
        bool ran = false;
        for (size_t i = 0; i < n; ++i) {
            Fiber& f = fiber(i);
            if (f.state != RUN) continue;
            current = (int)i, threadIdx = f.tid, ran = true;
            if (_setjmp(scheduler_jump)) continue;  // back from the fiber
            if (f.started) _longjmp(f.jump, 1);
            f.started = true;
            swapcontext(&scheduler, &f.ctx);
        }
        bool done = true;
        for (size_t i = 0; i < n; ++i) done &= fiber(i).state == DONE;
        if (done) return;
        if (!ran && !release()) {
            std::fprintf(stderr, "host grid: block (%u, %u, %u) deadlocked at a barrier\n", blockIdx.x, blockIdx.y,
                         blockIdx.z);
            std::abort();
        }
        if (ran) release();
    }
}

// A launch: every block of the grid in turn, body(arg) in each of its threads.
inline void launch(const unsigned* dims, void (*fn)(void*), void* arg) {
    gridDim = {dims[0], dims[1], dims[2]}, blockDim = {dims[3], dims[4], dims[5]};
    if (dims[6] > ARENA) {
        std::fprintf(stderr, "host grid: %u bytes of dynamic shared memory, more than the arena's %zu\n", dims[6],
                     ARENA);
        std::abort();
    }
    std::memset(arena, 0, dims[6]);
    body = fn, body_arg = arg;
    for (unsigned z = 0; z < gridDim.z; ++z)
        for (unsigned y = 0; y < gridDim.y; ++y)
            for (unsigned x = 0; x < gridDim.x; ++x) {
                blockIdx = {x, y, z};
                run_block();
            }
}

template <class... A, size_t... I>
void call(void (*fn)(A...), void** args, std::index_sequence<I...>) {
    fn(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

// A kernel called as the driver calls it: args[i] points at parameter i's value (cuLaunchKernel's kernelParams).
template <class... A>
void launch_kernel(void (*fn)(A...), const unsigned* dims, void** args) {
    struct Call { void (*fn)(A...); void** args; } c{fn, args};
    launch(dims,
           [](void* p) {
               auto* c = static_cast<Call*>(p);
               call(c->fn, c->args, std::index_sequence_for<A...>{});
           },
           &c);
}
}  // namespace host_grid

inline void __syncthreads() { host_grid::wait(host_grid::AT_BLOCK); }
inline void __syncwarp(unsigned = 0xffffffffu) { host_grid::wait(host_grid::AT_WARP); }

// A warp's exchange: each lane leaves its value, the warp meets, each reads its source lane's, the warp meets again.
template <class T>
inline T host_exchange(T v, unsigned src_lane) {
    static_assert(sizeof(T) <= 8, "a shuffle moves up to 8 bytes");
    const unsigned me = host_grid::linear(threadIdx), base = me & ~31u;
    std::memcpy(&host_grid::slots[me], &v, sizeof(T));
    __syncwarp();
    T r;
    std::memcpy(&r, &host_grid::slots[base + (src_lane & 31)], sizeof(T));
    __syncwarp();
    return r;
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int o) {
    return host_exchange(v, (host_grid::linear(threadIdx) & 31) ^ o);
}
template <class T> inline T __shfl_sync(unsigned, T v, int src) { return host_exchange(v, (unsigned)src); }
template <class T> inline T __shfl_down_sync(unsigned, T v, int d) {
    const unsigned lane = host_grid::linear(threadIdx) & 31;
    return host_exchange(v, lane + d < 32 ? lane + d : lane);
}

// ------------------------------------------------------------------ shared-space addresses, cp.async, mma.sync
// A shared-space address is a 32-bit offset from the dynamic arena (static __shared__ arrays lie within 2 GiB
// of it, in the same library); a copy lands at once (the kernels wait for it before reading, so an early copy is
// the same).
inline unsigned host_smem_addr(const void* p) {
    return (unsigned)(static_cast<const unsigned char*>(p) - host_grid::arena);
}
inline void host_copy16(unsigned dst, const void* src, bool valid) {
    unsigned char* d = host_grid::arena + (int)dst;
    if (valid) std::memcpy(d, src, 16);
    else std::memset(d, 0, 16);
}

// mma.sync m16n8k16 / m16n8k32 with 8-bit A (row) and B (col), s32 accumulators, as PTX lays the fragments out
// (lane = 4 g + c): A's register r holds 4 bytes of row g (r even) or g + 8 (r odd) at columns 4c.. (r < 2) or
// 16 + 4c.. (r >= 2); B's register r holds bytes k = 4c.. (r = 0) or 16 + 4c.. (r = 1) of column g; C's four
// are rows g, g, g + 8, g + 8 by columns 2c, 2c + 1. The warp's fragments are gathered (a warp barrier), each
// lane computes its own four sums, and the warp meets again before the slots are reused.
struct HostMmaFragments { unsigned a[4], b[2]; };
inline std::vector<HostMmaFragments> host_mma_slots;

inline void host_mma_8bit(int* c, const unsigned* a, const unsigned* b, int k, bool a_signed) {
    const unsigned me = host_grid::linear(threadIdx), base = me & ~31u, lane = me & 31u;
    if (host_mma_slots.size() < host_grid::active) host_mma_slots.resize(host_grid::active);
    HostMmaFragments& mine = host_mma_slots[me];
    std::memcpy(mine.a, a, sizeof(mine.a));
    std::memcpy(mine.b, b, sizeof(mine.b));
    __syncwarp();
    int A[16][32] = {}, B[32][8] = {};
    for (unsigned l = 0; l < 32; ++l) {
        const HostMmaFragments& f = host_mma_slots[base + l];
        const unsigned g = l >> 2, cc = l & 3;
        for (int r = 0; r < (k == 32 ? 4 : 2); ++r)
            for (int i = 0; i < 4; ++i) {
                const unsigned byte = (f.a[r] >> (8 * i)) & 0xFF;
                A[g + 8 * (r & 1)][4 * cc + i + 16 * (r >> 1)] = a_signed ? (int)(signed char)byte : (int)byte;
            }
        for (int r = 0; r < (k == 32 ? 2 : 1); ++r)
            for (int i = 0; i < 4; ++i) B[4 * cc + i + 16 * r][g] = (int)(signed char)((f.b[r] >> (8 * i)) & 0xFF);
    }
    __syncwarp();
    const unsigned g = lane >> 2, cc = lane & 3;
    for (int o = 0; o < 4; ++o) {
        const unsigned row = g + 8 * (o >> 1), col = 2 * cc + (o & 1);
        for (int j = 0; j < k; ++j) c[o] += A[row][j] * B[j][col];
    }
}

// mma.sync m16n8k16 row.col f32 += f16 x f16 (lane = 4 g + c): A's registers hold halves (row g, columns 2c,
// 2c + 1), (g + 8, the same), (g, 8 + 2c..), (g + 8, 8 + 2c..); B's hold (k = 2c, 2c + 1 | 8 + 2c.., column g);
// C's four rows g, g, g + 8, g + 8 by columns 2c, 2c + 1. The products summed in float, k in order.
struct HostHalfFragments { unsigned a[4], b[2]; };
inline std::vector<HostHalfFragments> host_half_slots;
inline float host_half(unsigned word, int i) { return (float)__half2float(reinterpret_cast<const __half*>(&word)[i]); }

inline void host_mma_f16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    const unsigned me = host_grid::linear(threadIdx), base = me & ~31u, lane = me & 31u;
    if (host_half_slots.size() < host_grid::active) host_half_slots.resize(host_grid::active);
    HostHalfFragments& mine = host_half_slots[me];
    std::memcpy(mine.a, a, sizeof(mine.a));
    mine.b[0] = b0, mine.b[1] = b1;
    __syncwarp();
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; ++l) {
        const HostHalfFragments& f = host_half_slots[base + l];
        const unsigned g = l >> 2, cc = l & 3;
        for (int r = 0; r < 4; ++r)
            for (int i = 0; i < 2; ++i) A[g + 8 * (r & 1)][2 * cc + i + 8 * (r >> 1)] = host_half(f.a[r], i);
        for (int r = 0; r < 2; ++r)
            for (int i = 0; i < 2; ++i) B[2 * cc + i + 8 * r][g] = host_half(f.b[r], i);
    }
    __syncwarp();
    const unsigned g = lane >> 2, cc = lane & 3;
    for (int o = 0; o < 4; ++o) {
        const unsigned row = g + 8 * (o >> 1), col = 2 * cc + (o & 1);
        for (int k = 0; k < 16; ++k) c[o] += A[row][k] * B[k][col];
    }
}

// ldmatrix.x4 (.trans): lanes 8i..8i+7 give the addresses of matrix i's eight rows (8 halves each); lane
// 4 g + c receives register i = matrix i's halves (row g, columns 2c, 2c + 1), or with trans (rows 2c, 2c + 1,
// column g).
inline std::vector<const __half*> host_row_slots;

inline void host_ldmatrix_x4(unsigned* r, const __half* p, bool trans) {
    const unsigned me = host_grid::linear(threadIdx), base = me & ~31u, lane = me & 31u;
    if (host_row_slots.size() < host_grid::active) host_row_slots.resize(host_grid::active);
    host_row_slots[me] = p;
    __syncwarp();
    const unsigned g = lane >> 2, cc = lane & 3;
    for (int i = 0; i < 4; ++i) {
        __half two[2];
        for (int j = 0; j < 2; ++j)
            two[j] = trans ? host_row_slots[base + 8 * i + 2 * cc + j][g]
                           : host_row_slots[base + 8 * i + g][2 * cc + j];
        std::memcpy(&r[i], two, 4);
    }
    __syncwarp();
}
