// IEEE half bits to f32, exactly, and f32 to half bits rounded to nearest even, with PTX's
// cvt (no cuda_fp16.h needed at run time). Joined before common.cuh; the CPU emulation of
// the tests (tests/cuda_emu.h) has its own.
__device__ __forceinline__ float f16_to_f32(unsigned int bits) {
    unsigned short h = (unsigned short)(bits & 0xffffu);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned int f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return (unsigned int)h;
}
