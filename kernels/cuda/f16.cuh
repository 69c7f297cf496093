// IEEE half bits to f32, exactly, with PTX's cvt (no cuda_fp16.h needed at run time).
// Joined before common.cuh; the CPU emulation of the tests (tests/cuda_emu.h) has its own.
__device__ __forceinline__ float f16_to_f32(unsigned int bits) {
    unsigned short h = (unsigned short)(bits & 0xffffu);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
