// NVDEC's frames (NV12: 8-bit, P016: 10/12-bit in 16-bit words) to interleaved RGB, uint8 HWC.
// One thread a pixel; chroma taken from the pixel's 2x2 block (as FFmpeg's unscaled yuv420p -> rgb24
// path does, so the GPU matches the CPU reference). Coefficients come from the host per the stream's
// matrix and range: y' = (Y - yo) * ys, c' = C - 128, R = y' + crv*v', G = y' - cgu*u' - cgv*v',
// B = y' + cbu*u' (the chroma factors scaled by the range's chroma scale already).

template <typename T, int SHIFT>
__device__ __forceinline__ void yuv_rgb(const T* __restrict__ luma, const T* __restrict__ chroma, int pitch,
                                        int h, int w, unsigned char* __restrict__ out, float ys, float yo,
                                        float crv, float cgu, float cgv, float cbu) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y;
    if (x >= w || y >= h) return;
    const float Y = (float)(luma[(long long)y * pitch + x] >> SHIFT);
    const long long c = (long long)(y >> 1) * pitch + (x & ~1);
    const float U = (float)(chroma[c] >> SHIFT) - 128.0f;
    const float V = (float)(chroma[c + 1] >> SHIFT) - 128.0f;
    const float l = (Y - yo) * ys;
    const float r = l + crv * V, g = l - cgu * U - cgv * V, b = l + cbu * U;
    unsigned char* o = out + ((long long)y * w + x) * 3;
    o[0] = (unsigned char)fminf(fmaxf(rintf(r), 0.0f), 255.0f);
    o[1] = (unsigned char)fminf(fmaxf(rintf(g), 0.0f), 255.0f);
    o[2] = (unsigned char)fminf(fmaxf(rintf(b), 0.0f), 255.0f);
}

#ifdef KEEP_nv12_rgb
extern "C" __global__ void nv12_rgb(const unsigned char* luma, const unsigned char* chroma, int pitch, int h, int w,
                                    unsigned char* out, float ys, float yo, float crv, float cgu, float cgv, float cbu) {
    yuv_rgb<unsigned char, 0>(luma, chroma, pitch, h, w, out, ys, yo, crv, cgu, cgv, cbu);
}
#endif

#ifdef KEEP_p016_rgb
extern "C" __global__ void p016_rgb(const unsigned short* luma, const unsigned short* chroma, int pitch, int h, int w,
                                    unsigned char* out, float ys, float yo, float crv, float cgu, float cgv, float cbu) {
    yuv_rgb<unsigned short, 8>(luma, chroma, pitch, h, w, out, ys, yo, crv, cgu, cgv, cbu);
}
#endif
