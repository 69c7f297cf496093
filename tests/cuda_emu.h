// Just enough of CUDA C to run wgmoe's CUDA kernels on the CPU (tests/cuda_emulated.rs):
// blocks run one after another; the threads of a block that synchronises run as coroutines
// on one OS thread, __syncthreads passing control round-robin to the next live
// thread, so a thread resumes only once every other one has reached the barrier (kernels
// without __syncthreads run their threads in a loop); __shared__ arrays are statics (one
// block at a time uses them). A launch takes its arguments as cuLaunchKernel
// does: an array of pointers to each argument's value. Not a CUDA implementation: no warp
// scheduling (a shuffle is an exchange among the whole block), no memory model beyond the
// barrier; it checks the kernels' logic and argument order.
#include <ucontext.h>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

struct uint3 { unsigned x, y, z; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

static uint3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

namespace emu {
// The block's threads as coroutines, each on a stack of its own. On x86-64 a switch saves
// the callee-saved registers on the running stack and loads the other stack (a few ns:
// ucontext's swapcontext makes a system call per switch, and the GPU-shaped kernels
// synchronise often); elsewhere ucontext.
static const unsigned MAIN = ~0u;  // the launching (not a kernel) thread
static std::vector<char> done;
static std::vector<std::unique_ptr<char[]>> stacks;
static const std::size_t STACK = 256 * 1024;
// The launch's thread body (run_now's Entry::run), called with the thread's index.
static void (*entry)(int);
// A coroutine's first code: the thread whose turn it is (threadIdx, set before every
// switch) runs the kernel; its body never returns here (it ends by passing control on).
static void trampoline() {
    entry((int)threadIdx.x);
    std::abort();
}
#if defined(__x86_64__)
static std::vector<void*> sp;
static void* main_sp;
// Save the running coroutine's registers on its stack and its stack pointer in *from,
// then resume the one whose stack pointer is `to`.
__attribute__((naked, noinline)) static void switch_stack(void** from, void* to) {
    asm volatile(
        "pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n pushq %r15\n"
        "subq $8, %rsp\n stmxcsr (%rsp)\n fnstcw 4(%rsp)\n"
        "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
        "ldmxcsr (%rsp)\n fldcw 4(%rsp)\n addq $8, %rsp\n"
        "popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n popq %rbp\n ret\n");
}
static inline void** slot(unsigned i) { return i == MAIN ? &main_sp : &sp[i]; }
static inline void jump(unsigned from, unsigned to) { switch_stack(slot(from), *slot(to)); }
// Thread t starts afresh at the trampoline: its stack as switch_stack leaves a suspended
// one (default MXCSR and x87 control word, six registers, the return address), the stack
// pointer 8 below a 16-byte boundary at the trampoline's entry as after a call.
static void prepare(unsigned t) {
    sp.resize(done.size());
    char* top = (char*)((uintptr_t)(stacks[t].get() + STACK) & ~(uintptr_t)15);
    void** p = (void**)(top - 72);
    std::memset(p, 0, 72);
    ((unsigned*)p)[0] = 0x1f80u;
    ((unsigned short*)p)[2] = 0x037f;
    p[7] = (void*)&trampoline;
    sp[t] = p;
}
#else
static std::vector<ucontext_t> uc;
static ucontext_t main_uc;
static inline ucontext_t* uctx(unsigned i) { return i == MAIN ? &main_uc : &uc[i]; }
static inline void jump(unsigned from, unsigned to) { swapcontext(uctx(from), uctx(to)); }
static void prepare(unsigned t) {
    uc.resize(done.size());
    getcontext(&uc[t]);
    uc[t].uc_stack.ss_sp = stacks[t].get();
    uc[t].uc_stack.ss_size = STACK;
    uc[t].uc_link = &main_uc;
    makecontext(&uc[t], (void (*)())trampoline, 0);
}
#endif

// Pass control from thread `from` to the next live thread (main when none is left).
static inline void yield_from(unsigned from, bool finished) {
    unsigned n = blockDim.x;
    for (unsigned k = 1; k <= n; k++) {
        unsigned j = (from + k) % n;
        if (!done[j] && (j != from || !finished)) {
            if (j == from) return;  // the only live thread: nothing to wait for
            threadIdx = uint3{j, 0, 0};
            jump(from, j);
            threadIdx = uint3{from, 0, 0};
            return;
        }
    }
    jump(from, MAIN);
}
}  // namespace emu

static inline void __syncthreads() { emu::yield_from(threadIdx.x, false); }

// A warp shuffle as the block's exchange: every thread of the block calls it together (the
// kernels shuffle in block-uniform control flow). The partner is lane ^ lane_mask within the
// thread's group of `width` lanes (a power of two up to the warp's 32), as on the device; a
// mask reaching outside the group is a kernel bug. One barrier per shuffle: successive
// shuffles alternate between two slot arrays, and a thread writes a slot array again only
// after every thread has passed the barrier of the shuffle in between, so after reading it.
static float emu_shfl_slots[2][1024];
static unsigned emu_shfl_phase[1024];
static inline float __shfl_xor_sync(unsigned, float v, int lane_mask, int width = 32) {
    if (width < 1 || width > 32 || (width & (width - 1)) != 0 || lane_mask < 0 || lane_mask >= width)
        std::abort();
    unsigned me = threadIdx.x, ph = emu_shfl_phase[me];
    emu_shfl_phase[me] = ph ^ 1u;
    emu_shfl_slots[ph][me] = v;
    __syncthreads();
    return emu_shfl_slots[ph][me ^ (unsigned)lane_mask];
}
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
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

// f32 to IEEE half bits, rounded to nearest even as PTX's cvt.rn.f16.f32 (the CUDA build:
// kernels/cuda/f16.cuh): overflow to infinity, subnormals rounded, NaN kept (quiet).
static inline unsigned int f32_to_f16(float f) {
    unsigned x;
    std::memcpy(&x, &f, 4);
    unsigned sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);
    // 65520 and above (infinity too) round to infinity.
    if (ax >= 0x477ff000u) return sign | 0x7c00u;
    if (ax >= 0x38800000u) {
        // Normal: rebias the exponent, round the 13 dropped bits to nearest even (a carry
        // into the exponent is the right result).
        unsigned h = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return sign | h;
    }
    // Below 2^-14: a multiple of 2^-24, (1.m) 2^(e - 127) = m24 2^(e - 150).
    unsigned e = ax >> 23, shift = 126u - e;
    if (shift > 24u) return sign;
    unsigned m = (ax & 0x7fffffu) | 0x800000u, h = m >> shift, rem = m & ((1u << shift) - 1u),
             half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return sign | h;
}

namespace emu {
template <typename... A, std::size_t... I>
void call(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_reference<A>::type*>(args[I])...);
}

// Run a launch now: its blocks one after another.
template <typename... A>
void run_now(void (*f)(A...), bool barriers, unsigned gx, unsigned gy, unsigned gz, unsigned block,
             void** args);

// Set by a fake driver that queues launches on its stream (tests/cuda_fake_driver.cpp):
// the launch's arguments are copied now, as cuLaunchKernel does, and it runs later.
extern "C" void wgmoe_emu_enqueue(void (*run)(void*), void* job) __attribute__((weak));

template <typename... A>
struct Job {
    void (*f)(A...);
    bool barriers;
    unsigned gx, gy, gz, block;
    std::tuple<typename std::remove_cv<typename std::remove_reference<A>::type>::type...> values;
    template <std::size_t... I>
    void run(std::index_sequence<I...>) {
        void* args[sizeof...(A) + 1] = {(void*)&std::get<I>(values)...};
        run_now(f, barriers, gx, gy, gz, block, args);
    }
    static void go(void* p) {
        Job* j = (Job*)p;
        j->run(std::index_sequence_for<A...>{});
        delete j;
    }
};

template <typename... A, std::size_t... I>
Job<A...>* capture(void (*f)(A...), void** args, std::index_sequence<I...>) {
    return new Job<A...>{f, false, 0, 0, 0, 0,
                         {*static_cast<typename std::remove_reference<A>::type*>(args[I])...}};
}

template <typename... A>
void launch(void (*f)(A...), bool barriers, unsigned gx, unsigned gy, unsigned gz, unsigned block,
            void** args) {
    if (wgmoe_emu_enqueue) {
        Job<A...>* j = capture(f, args, std::index_sequence_for<A...>{});
        j->barriers = barriers;
        j->gx = gx; j->gy = gy; j->gz = gz; j->block = block;
        wgmoe_emu_enqueue(&Job<A...>::go, j);
        return;
    }
    run_now(f, barriers, gx, gy, gz, block, args);
}

template <typename... A>
void run_now(void (*f)(A...), bool barriers, unsigned gx, unsigned gy, unsigned gz, unsigned block,
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
    // One coroutine per thread, restarted for every block.
    done.assign(block, 0);
    while (stacks.size() < block) stacks.emplace_back(new char[STACK]);
    static void (*kernel)(A...);
    static void** kernel_args;
    kernel = f;
    kernel_args = args;
    struct Entry {
        static void run(int t) {
            call(kernel, kernel_args, std::index_sequence_for<A...>{});
            done[t] = 1;
            yield_from((unsigned)t, true);
        }
    };
    entry = Entry::run;
    for (unsigned long b = 0; b < blocks; b++) {
        blockIdx = block_id(b);
        std::memset(emu_shfl_phase, 0, sizeof emu_shfl_phase);
        for (unsigned t = 0; t < block; t++) {
            done[t] = 0;
            prepare(t);
        }
        threadIdx = uint3{0, 0, 0};
        jump(MAIN, 0);
    }
}
}  // namespace emu
