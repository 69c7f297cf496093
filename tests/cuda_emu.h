// Just enough of CUDA C to run wgmoe's CUDA kernels on the CPU (tests/cuda_emulated.rs):
// blocks run one after another, the threads of a block as OS threads with a barrier for
// __syncthreads (kernels without one run their threads in a loop), __shared__ arrays are
// statics (one block at a time uses them). A launch takes its arguments as cuLaunchKernel
// does: an array of pointers to each argument's value. Not a CUDA implementation: no warps,
// no memory model beyond the barrier; it checks the kernels' logic and argument order.
#include <barrier>
#include <cmath>
#include <math.h>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

struct uint3 { unsigned x, y, z; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }

static thread_local uint3 threadIdx, blockIdx;
static uint3 blockDim, gridDim;
static thread_local std::barrier<>* emu_block_barrier;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

static inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }

// IEEE half bits to f32, exactly (the CUDA build uses PTX's cvt: kernels/cuda/f16.cuh).
static inline float f16_to_f32(unsigned int word) {
    unsigned short h = (unsigned short)(word & 0xffffu);
    unsigned sign = (unsigned)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        int e = -1;
        do { e++; man <<= 1; } while ((man & 0x400u) == 0);
        bits = sign | ((unsigned)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

namespace emu {
template <typename... A, std::size_t... I>
void call(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_reference<A>::type*>(args[I])...);
}

template <typename... A>
void launch(void (*f)(A...), bool barriers, unsigned gx, unsigned gy, unsigned gz, unsigned block,
            void** args) {
    gridDim = uint3{gx, gy, gz};
    blockDim = uint3{block, 1, 1};
    auto block_id = [&](unsigned long b) {
        return uint3{(unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / gx / gy)};
    };
    unsigned long blocks = (unsigned long)gx * gy * gz;
    if (!barriers) {
        for (unsigned long b = 0; b < blocks; b++) {
            blockIdx = block_id(b);
            for (unsigned t = 0; t < block; t++) {
                threadIdx = uint3{t, 0, 0};
                call(f, args, std::index_sequence_for<A...>{});
            }
        }
        return;
    }
    std::vector<std::unique_ptr<std::barrier<>>> per_block;
    for (unsigned long b = 0; b < blocks; b++) per_block.emplace_back(new std::barrier<>(block));
    std::barrier<> between(block);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; t++) {
        threads.emplace_back([&, t] {
            for (unsigned long b = 0; b < blocks; b++) {
                blockIdx = block_id(b);
                threadIdx = uint3{t, 0, 0};
                emu_block_barrier = per_block[b].get();
                call(f, args, std::index_sequence_for<A...>{});
                // A thread that returned early no longer holds up the block's barriers.
                per_block[b]->arrive_and_drop();
                // The next block reuses the __shared__ statics.
                between.arrive_and_wait();
            }
        });
    }
    for (auto& th : threads) th.join();
}
}  // namespace emu
